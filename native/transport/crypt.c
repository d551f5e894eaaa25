/* transport/crypt.c -- AES-256-GCM records on a TCP connection, keys from
 * HKDF, both from OpenSSL's libcrypto loaded at run time (see crypt.h). */
#define _GNU_SOURCE
#include "transport/crypt.h"

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/param.h"
#include "base/status.h"
#include "transport/transport.h"

/* The few constants of OpenSSL 3's headers this file needs (stable ABI). */
#define CTRL_GCM_GET_TAG 0x10
#define CTRL_GCM_SET_TAG 0x11
#define PKEY_HKDF 1036 /* NID_hkdf */

/* The libcrypto entry points used, declared here instead of included, so that
 * the build needs no OpenSSL headers (nccl4py does the same with libcuda). */
typedef struct {
  void *(*ctx_new)(void);
  void (*ctx_free)(void *ctx);
  const void *(*aes_256_gcm)(void);
  int (*enc_init)(void *ctx, const void *cipher, void *engine, const uint8_t *key, const uint8_t *iv);
  int (*enc_update)(void *ctx, uint8_t *out, int *outl, const uint8_t *in, int inl);
  int (*enc_final)(void *ctx, uint8_t *out, int *outl);
  int (*dec_init)(void *ctx, const void *cipher, void *engine, const uint8_t *key, const uint8_t *iv);
  int (*dec_update)(void *ctx, uint8_t *out, int *outl, const uint8_t *in, int inl);
  int (*dec_final)(void *ctx, uint8_t *out, int *outl);
  int (*ctx_ctrl)(void *ctx, int type, int arg, void *ptr);
  void *(*pkey_ctx_new_id)(int id, void *engine);
  void (*pkey_ctx_free)(void *pctx);
  int (*derive_init)(void *pctx);
  int (*set_hkdf_md)(void *pctx, const void *md);
  int (*set1_hkdf_salt)(void *pctx, const uint8_t *salt, int n);
  int (*set1_hkdf_key)(void *pctx, const uint8_t *key, int n);
  int (*add1_hkdf_info)(void *pctx, const uint8_t *info, int n);
  int (*derive)(void *pctx, uint8_t *out, size_t *n);
  const void *(*sha256)(void);
  void (*cleanse)(void *p, size_t n);
} evp_t;

/* Resolved once per process and never written after, like the parameter
 * cache: the dynamic loader keeps one copy of libcrypto per process anyway
 * (Python's own ssl module may have loaded it already). */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static evp_t evp;
static int evp_ok;
static char evp_why[400];

static void load(void) {
  const char *name = coll_param_str(COLL_PARAM_CRYPTO_LIB);
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    snprintf(evp_why, sizeof evp_why, "cannot load %s (%s)", name, dlerror());
    return;
  }
  struct { const char *sym; void **slot; } syms[] = {
      {"EVP_CIPHER_CTX_new", (void **)&evp.ctx_new},
      {"EVP_CIPHER_CTX_free", (void **)&evp.ctx_free},
      {"EVP_aes_256_gcm", (void **)&evp.aes_256_gcm},
      {"EVP_EncryptInit_ex", (void **)&evp.enc_init},
      {"EVP_EncryptUpdate", (void **)&evp.enc_update},
      {"EVP_EncryptFinal_ex", (void **)&evp.enc_final},
      {"EVP_DecryptInit_ex", (void **)&evp.dec_init},
      {"EVP_DecryptUpdate", (void **)&evp.dec_update},
      {"EVP_DecryptFinal_ex", (void **)&evp.dec_final},
      {"EVP_CIPHER_CTX_ctrl", (void **)&evp.ctx_ctrl},
      {"EVP_PKEY_CTX_new_id", (void **)&evp.pkey_ctx_new_id},
      {"EVP_PKEY_CTX_free", (void **)&evp.pkey_ctx_free},
      {"EVP_PKEY_derive_init", (void **)&evp.derive_init},
      {"EVP_PKEY_CTX_set_hkdf_md", (void **)&evp.set_hkdf_md},
      {"EVP_PKEY_CTX_set1_hkdf_salt", (void **)&evp.set1_hkdf_salt},
      {"EVP_PKEY_CTX_set1_hkdf_key", (void **)&evp.set1_hkdf_key},
      {"EVP_PKEY_CTX_add1_hkdf_info", (void **)&evp.add1_hkdf_info},
      {"EVP_PKEY_derive", (void **)&evp.derive},
      {"EVP_sha256", (void **)&evp.sha256},
      {"OPENSSL_cleanse", (void **)&evp.cleanse},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    *syms[i].slot = dlsym(h, syms[i].sym);
    if (!*syms[i].slot) {
      /* OpenSSL 1.1 has the HKDF setters as macros only: 3.0 is needed. */
      snprintf(evp_why, sizeof evp_why, "%s has no %s (OpenSSL 3 is needed)", name, syms[i].sym);
      return;
    }
  }
  evp_ok = 1;
}

const char *coll_crypt_lib_error(void) {
  pthread_once(&load_once, load);
  return evp_ok ? NULL : evp_why;
}

int coll_crypt_wanted(void) { return strcmp(coll_param_str(COLL_PARAM_ENCRYPT), "1") == 0; }

coll_result_t coll_crypt_load(coll_comm_t *comm) {
  const char *why = coll_crypt_lib_error();
  if (!why) return COLL_SUCCESS;
  return coll_error(comm, COLL_SYSTEM_ERROR,
                    "rank %d: COLLECTIVES_ENCRYPT=1 needs OpenSSL's libcrypto, but %s; install "
                    "OpenSSL 3 (libssl3, openssl-libs), point COLLECTIVES_CRYPTO_LIB at it, or "
                    "unset COLLECTIVES_ENCRYPT on every rank", comm->rank, why);
}

int coll_crypt_hkdf(const uint8_t *ikm, size_t nikm, const uint8_t *salt, size_t nsalt,
                    const uint8_t *info, size_t ninfo, uint8_t *out, size_t nout) {
  if (coll_crypt_lib_error()) return -1;
  void *p = evp.pkey_ctx_new_id(PKEY_HKDF, NULL);
  size_t n = nout;
  /* No salt means RFC 5869's default (zeros); OpenSSL refuses a NULL one. */
  int ok = p && evp.derive_init(p) > 0 && evp.set_hkdf_md(p, evp.sha256()) > 0 &&
           (nsalt == 0 || evp.set1_hkdf_salt(p, salt, (int)nsalt) > 0) &&
           evp.set1_hkdf_key(p, ikm, (int)nikm) > 0 &&
           (ninfo == 0 || evp.add1_hkdf_info(p, info, (int)ninfo) > 0) &&
           evp.derive(p, out, &n) > 0 && n == nout;
  if (p) evp.pkey_ctx_free(p);
  return ok ? 0 : -1;
}

/* ---- one direction of a connection ---- */

typedef struct {
  void *ctx;       /* EVP_CIPHER_CTX holding this direction's key */
  uint8_t key[32]; /* kept for the next rekey */
  uint8_t iv[12];
  uint64_t seq;    /* records sealed (or opened) so far */
} dir_t;

static void nonce(const dir_t *d, uint64_t seq, uint8_t out[12]) {
  memcpy(out, d->iv, 12);
  for (int i = 0; i < 8; i++) out[4 + i] ^= (uint8_t)(seq >> (8 * i));
}

static int dir_init(dir_t *d, int sealing) {
  d->ctx = evp.ctx_new();
  if (!d->ctx) return -1;
  return (sealing ? evp.enc_init : evp.dec_init)(d->ctx, evp.aes_256_gcm(), NULL, d->key, NULL) > 0
             ? 0 : -1;
}

/* The key after every COLL_CRYPT_REKEY records (crypt.h), on both ends alike. */
static int rekey(dir_t *d, int sealing) {
  static const char label[] = "collectives rekey";
  uint8_t next[32];
  if (coll_crypt_hkdf(d->key, 32, NULL, 0, (const uint8_t *)label, sizeof label - 1, next, 32))
    return -1;
  memcpy(d->key, next, 32);
  evp.cleanse(next, sizeof next);
  return (sealing ? evp.enc_init : evp.dec_init)(d->ctx, NULL, NULL, d->key, NULL) > 0 ? 0 : -1;
}

static void put32(uint8_t *b, uint32_t v) {
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

enum { FAULT_NONE, FAULT_FLIP, FAULT_REPLAY, FAULT_LENGTH };
/* COLLECTIVES_ENCRYPT_FAULT=rekey (tests, on every rank): keys change every
 * few records instead of every COLL_CRYPT_REKEY, so that both ends' rekeying
 * in step is exercised. */
#define REKEY_FAULT_EVERY 3
/* The record a fault (COLLECTIVES_ENCRYPT_FAULT, tests only) hits: late
 * enough that the link is in use, early enough for any test. */
#define FAULT_AT 3

struct coll_crypt {
  int peer, sock;
  dir_t tx, rx;
  /* Sending: records sealed whose bytes the kernel has not all taken. */
  uint8_t *sbuf;
  size_t scap, slen, soff;
  int pending;  /* sbuf[soff, slen) is owed to the peer: the kernel took the rest */
  uint8_t held; /* the last plaintext byte sealed there, reported unsent */
  int blocked;  /* the socket was full: ask poll() before sealing more */
  /* Receiving: raw bytes [rpos, rfill) of rbuf not yet opened, and the opened
   * plaintext [pt_off, pt_end) not yet handed out. */
  uint8_t *rbuf;
  size_t rcap, rfill, rpos, pt_off, pt_end;
  int fault, fault_done;
  uint64_t rekey_every; /* COLL_CRYPT_REKEY, or REKEY_FAULT_EVERY */
  uint8_t *saved; /* FAULT_REPLAY: the record before FAULT_AT, as sent */
  size_t saved_len;
};

static coll_result_t derive(coll_comm_t *comm, dir_t *d, int from, int to, int sock,
                            const uint8_t salt[32]) {
  static const char label[] = "collectives aead v1";
  uint8_t info[sizeof label - 1 + 16 + 9], okm[44];
  size_t n = sizeof label - 1;
  memcpy(info, label, n);
  memcpy(info + n, comm->id, 16);
  put32(info + n + 16, (uint32_t)from);
  put32(info + n + 20, (uint32_t)to);
  info[n + 24] = (uint8_t)sock;
  if (coll_crypt_hkdf(comm->link_key, COLL_KEY_BYTES, salt, 32, info, sizeof info, okm, sizeof okm))
    return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: HKDF in libcrypto failed", comm->rank);
  memcpy(d->key, okm, 32);
  memcpy(d->iv, okm + 32, 12);
  evp.cleanse(okm, sizeof okm);
  return COLL_SUCCESS;
}

void coll_crypt_free(coll_crypt_t *c) {
  if (!c) return;
  if (c->tx.ctx) evp.ctx_free(c->tx.ctx);
  if (c->rx.ctx) evp.ctx_free(c->rx.ctx);
  evp.cleanse(c->tx.key, 32);
  evp.cleanse(c->rx.key, 32);
  free(c->sbuf);
  free(c->rbuf);
  free(c->saved);
  free(c);
}

coll_result_t coll_crypt_attach(coll_link_t *link, int k) {
  if (link->crypt) return COLL_SUCCESS;
  link->crypt = calloc((size_t)k, sizeof *link->crypt);
  if (!link->crypt)
    return coll_error(link->comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", link->comm->rank);
  link->ncrypt = k;
  return COLL_SUCCESS;
}

void coll_crypt_drop(coll_link_t *link) {
  for (int i = 0; link->crypt && i < link->ncrypt; i++) coll_crypt_free(link->crypt[i]);
  free(link->crypt);
  link->crypt = NULL;
  link->ncrypt = 0;
}

coll_result_t coll_crypt_new(coll_comm_t *comm, int peer, int sock, int nsocks, int dialer,
                             const uint8_t nonce_c[16], const uint8_t nonce_a[16],
                             coll_crypt_t **out) {
  COLL_CHECK(coll_crypt_load(comm));
  coll_crypt_t *c = calloc(1, sizeof *c);
  if (!c) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
  c->peer = peer;
  c->sock = sock;
  /* A striped connection is handed at most one unit (= one record) per call;
   * a lone one batches up to four records per write and read. */
  size_t rec = COLL_CRYPT_RECORD + COLL_CRYPT_OVERHEAD, k = nsocks > 1 ? 1 : 4;
  const char *fault = coll_param_str(COLL_PARAM_ENCRYPT_FAULT);
  if (dialer && sock == 0)
    c->fault = !strcmp(fault, "flip") ? FAULT_FLIP : !strcmp(fault, "replay") ? FAULT_REPLAY
             : !strcmp(fault, "length") ? FAULT_LENGTH : FAULT_NONE;
  c->rekey_every = !strcmp(fault, "rekey") ? REKEY_FAULT_EVERY : COLL_CRYPT_REKEY;
  c->scap = rec * (k + (c->fault == FAULT_REPLAY));
  c->rcap = rec * (k + 1);
  c->sbuf = malloc(c->scap);
  c->rbuf = malloc(c->rcap);
  uint8_t salt[32];
  memcpy(salt, nonce_c, 16);
  memcpy(salt + 16, nonce_a, 16);
  coll_result_t res = c->sbuf && c->rbuf ? COLL_SUCCESS
                      : coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
  if (res == COLL_SUCCESS) res = derive(comm, &c->tx, comm->rank, peer, sock, salt);
  if (res == COLL_SUCCESS) res = derive(comm, &c->rx, peer, comm->rank, sock, salt);
  if (res == COLL_SUCCESS && (dir_init(&c->tx, 1) || dir_init(&c->rx, 0)))
    res = coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: AES-256-GCM in libcrypto failed", comm->rank);
  if (res != COLL_SUCCESS) {
    coll_crypt_free(c);
    return res;
  }
  *out = c;
  return COLL_SUCCESS;
}

/* ---- sending ---- */

typedef struct {
  const struct iovec *iov;
  int n, i;
  size_t off;
} cursor_t;

static void skip(cursor_t *cu, size_t n) {
  while (cu->i < cu->n && n > 0) {
    size_t left = cu->iov[cu->i].iov_len - cu->off;
    size_t take = n < left ? n : left;
    cu->off += take;
    n -= take;
    if (cu->off == cu->iov[cu->i].iov_len) { cu->i++; cu->off = 0; }
  }
  while (cu->i < cu->n && cu->iov[cu->i].iov_len == cu->off) { cu->i++; cu->off = 0; }
}

/* Seals the next len bytes of the cursor as record number seq at out;
 * *last gets its last plaintext byte. */
static int seal(dir_t *d, uint64_t seq, cursor_t *cu, size_t len, uint8_t *out, uint8_t *last) {
  uint8_t iv[12];
  int outl;
  nonce(d, seq, iv);
  put32(out, (uint32_t)len);
  if (evp.enc_init(d->ctx, NULL, NULL, NULL, iv) <= 0 || evp.enc_update(d->ctx, NULL, &outl, out, 4) <= 0)
    return -1;
  uint8_t *ct = out + 4;
  size_t done = 0;
  while (done < len) {
    const struct iovec *v = &cu->iov[cu->i];
    size_t take = v->iov_len - cu->off;
    if (take > len - done) take = len - done;
    const uint8_t *src = (const uint8_t *)v->iov_base + cu->off;
    if (evp.enc_update(d->ctx, ct + done, &outl, src, (int)take) <= 0) return -1;
    *last = src[take - 1];
    done += take;
    skip(cu, take);
  }
  if (evp.enc_final(d->ctx, ct + len, &outl) <= 0 ||
      evp.ctx_ctrl(d->ctx, CTRL_GCM_GET_TAG, COLL_CRYPT_TAG, ct + len) <= 0)
    return -1;
  return 0;
}

static size_t iov_total(const struct iovec *iov, int n) {
  size_t t = 0;
  for (int i = 0; i < n; i++) t += iov[i].iov_len;
  return t;
}

static ssize_t put_bytes(int fd, const uint8_t *p, size_t n) {
  ssize_t k;
  do { k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT); } while (k < 0 && errno == EINTR);
  return k;
}

/* What a test fault does to the record it hits (tx.seq == FAULT_AT), sealed at rec. */
static size_t apply_fault(coll_crypt_t *c, uint8_t *rec, size_t len) {
  if (c->fault == FAULT_FLIP) rec[4 + len / 2] ^= 0x20;
  if (c->fault == FAULT_LENGTH) put32(rec, 0x7fffffffu);
  if (c->fault == FAULT_REPLAY && c->saved) { /* the record before, again, in its place */
    memmove(rec + c->saved_len, rec, len + COLL_CRYPT_OVERHEAD);
    memcpy(rec, c->saved, c->saved_len);
    return c->saved_len;
  }
  return 0;
}

coll_result_t coll_crypt_send(coll_comm_t *comm, coll_crypt_t *c, int fd, const struct iovec *iov,
                              int iovcnt, ssize_t *w) {
  cursor_t cu = {iov, iovcnt, 0, 0};
  size_t total = iov_total(iov, iovcnt), moved = 0;
  int err = EAGAIN;
  skip(&cu, 0);
  if (c->pending) {
    if (total == 0 || ((const uint8_t *)iov[cu.i].iov_base)[cu.off] != c->held)
      return coll_error(comm, COLL_INTERNAL_ERROR,
                        "rank %d: the link to rank %d was handed other bytes while a sealed "
                        "record was half sent", comm->rank, c->peer);
    ssize_t k = put_bytes(fd, c->sbuf + c->soff, c->slen - c->soff);
    if (k < 0) {
      *w = -1;
      return COLL_SUCCESS; /* errno as send left it */
    }
    c->soff += (size_t)k;
    if (c->soff < c->slen) {
      *w = -1;
      errno = EAGAIN;
      return COLL_SUCCESS;
    }
    c->pending = 0;
    moved = 1; /* the byte held back */
    skip(&cu, 1);
  }
  while (moved < total) {
    if (c->blocked) {
      struct pollfd p = {fd, POLLOUT, 0};
      if (poll(&p, 1, 0) <= 0 || !(p.revents & POLLOUT)) break;
    }
    /* Seal a batch, never across a rekey. */
    uint64_t seq0 = c->tx.seq, stop = (seq0 / c->rekey_every + 1) * c->rekey_every;
    size_t batch = 0, extra = 0, room = c->scap - (c->fault == FAULT_REPLAY ? COLL_CRYPT_RECORD + COLL_CRYPT_OVERHEAD : 0);
    int nrec = 0;
    uint8_t last = 0;
    cursor_t at = cu;
    c->slen = 0;
    while (moved + batch < total && c->slen + COLL_CRYPT_OVERHEAD < room && seq0 + nrec < stop) {
      size_t len = total - moved - batch;
      if (len > COLL_CRYPT_RECORD) len = COLL_CRYPT_RECORD;
      if (len > room - c->slen - COLL_CRYPT_OVERHEAD) len = room - c->slen - COLL_CRYPT_OVERHEAD;
      uint8_t *rec = c->sbuf + c->slen;
      if (seal(&c->tx, seq0 + nrec, &at, len, rec, &last))
        return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: AES-256-GCM sealing failed for rank %d",
                          comm->rank, c->peer);
      if (c->fault && !c->fault_done && seq0 + nrec == FAULT_AT - 1 && c->fault == FAULT_REPLAY) {
        free(c->saved);
        c->saved = malloc(len + COLL_CRYPT_OVERHEAD);
        if (c->saved) memcpy(c->saved, rec, len + COLL_CRYPT_OVERHEAD);
        c->saved_len = c->saved ? len + COLL_CRYPT_OVERHEAD : 0;
      }
      if (c->fault && !c->fault_done && seq0 + nrec == FAULT_AT) extra = apply_fault(c, rec, len);
      c->slen += len + COLL_CRYPT_OVERHEAD + extra;
      batch += len;
      nrec++;
      if (extra) break;
    }
    ssize_t k = put_bytes(fd, c->sbuf, c->slen);
    if (k <= 0) {
      /* Nothing left the process: the batch is dropped, its numbers used again. */
      c->blocked = 1;
      if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) err = errno;
      break;
    }
    if (extra || (c->fault && seq0 <= FAULT_AT && FAULT_AT < seq0 + nrec)) c->fault_done = 1;
    c->tx.seq = seq0 + (uint64_t)nrec;
    if (c->tx.seq % c->rekey_every == 0 && rekey(&c->tx, 1))
      return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: rekeying the link to rank %d failed",
                        comm->rank, c->peer);
    cu = at;
    if ((size_t)k < c->slen) {
      c->soff = (size_t)k;
      c->pending = 1;
      c->held = last;
      c->blocked = 1;
      moved += batch - 1;
      break;
    }
    c->blocked = 0;
    moved += batch;
  }
  if (moved) {
    *w = (ssize_t)moved;
  } else {
    *w = -1;
    errno = err;
  }
  return COLL_SUCCESS;
}

/* ---- receiving ---- */

static int whole_record(const coll_crypt_t *c) {
  size_t have = c->rfill - c->rpos;
  return have >= 4 && have >= (size_t)get32(c->rbuf + c->rpos) + COLL_CRYPT_OVERHEAD;
}

int coll_crypt_readable(const coll_crypt_t *c) {
  return c->pt_off < c->pt_end || whole_record(c);
}

/* Opens the whole record at rpos: in place (to == NULL), its plaintext then
 * handed out from rbuf, or straight into the reader's memory at `to`, which
 * has room for all of it. Bytes written there before the tag is checked are
 * only ever seen by a caller whose receive then fails. */
static coll_result_t open_record(coll_comm_t *comm, coll_crypt_t *c, cursor_t *to) {
  uint8_t *rec = c->rbuf + c->rpos, iv[12], tag[COLL_CRYPT_TAG];
  size_t len = get32(rec), done = 0;
  int outl, ok;
  nonce(&c->rx, c->rx.seq, iv);
  memcpy(tag, rec + 4 + len, COLL_CRYPT_TAG);
  ok = evp.dec_init(c->rx.ctx, NULL, NULL, NULL, iv) > 0 &&
       evp.dec_update(c->rx.ctx, NULL, &outl, rec, 4) > 0;
  while (ok && done < len) {
    size_t take = len - done;
    uint8_t *dst = rec + 4;
    if (to) {
      const struct iovec *v = &to->iov[to->i];
      if (take > v->iov_len - to->off) take = v->iov_len - to->off;
      dst = (uint8_t *)v->iov_base + to->off;
      skip(to, take);
    }
    ok = evp.dec_update(c->rx.ctx, dst, &outl, rec + 4 + done, (int)take) > 0;
    done += take;
  }
  ok = ok && evp.ctx_ctrl(c->rx.ctx, CTRL_GCM_SET_TAG, COLL_CRYPT_TAG, tag) > 0 &&
       evp.dec_final(c->rx.ctx, rec + 4 + len, &outl) > 0;
  if (!ok)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: encrypted record #%llu from rank %d (connection %d) failed "
                      "authentication: its bytes were altered, replayed or reordered on the way "
                      "(COLLECTIVES_ENCRYPT=1); the link is dropped",
                      comm->rank, (unsigned long long)c->rx.seq, c->peer, c->sock);
  c->pt_off = to ? 0 : c->rpos + 4;
  c->pt_end = to ? 0 : c->pt_off + len;
  c->rpos += len + COLL_CRYPT_OVERHEAD;
  c->rx.seq++;
  if (c->rx.seq % c->rekey_every == 0 && rekey(&c->rx, 0))
    return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: rekeying the link from rank %d failed",
                      comm->rank, c->peer);
  return COLL_SUCCESS;
}

/* The length of the record at rpos, checked before its bytes are waited for. */
static coll_result_t check_length(coll_comm_t *comm, coll_crypt_t *c) {
  if (c->rfill - c->rpos < 4) return COLL_SUCCESS;
  uint32_t len = get32(c->rbuf + c->rpos);
  if (len >= 1 && len <= COLL_CRYPT_RECORD) return COLL_SUCCESS;
  return coll_error(comm, COLL_REMOTE_ERROR,
                    "rank %d: encrypted record #%llu from rank %d (connection %d) claims %u "
                    "bytes (1 to %d allowed): the stream was altered on the way, or the peer "
                    "does not encrypt (COLLECTIVES_ENCRYPT)", comm->rank,
                    (unsigned long long)c->rx.seq, c->peer, c->sock, len, COLL_CRYPT_RECORD);
}

coll_result_t coll_crypt_recv(coll_comm_t *comm, coll_crypt_t *c, int fd, const struct iovec *iov,
                              int iovcnt, ssize_t *r) {
  cursor_t cu = {iov, iovcnt, 0, 0};
  size_t total = iov_total(iov, iovcnt), moved = 0;
  int eof = 0, err = EAGAIN;
  skip(&cu, 0);
  while (moved < total) {
    if (c->pt_off < c->pt_end) {
      const struct iovec *v = &cu.iov[cu.i];
      size_t take = v->iov_len - cu.off;
      if (take > c->pt_end - c->pt_off) take = c->pt_end - c->pt_off;
      memcpy((uint8_t *)v->iov_base + cu.off, c->rbuf + c->pt_off, take);
      c->pt_off += take;
      moved += take;
      skip(&cu, take);
      continue;
    }
    COLL_CHECK(check_length(comm, c));
    if (whole_record(c)) {
      /* A whole record the reader wants all of goes straight to its memory
       * (one copy less); otherwise it is opened in place and handed out. */
      size_t len = get32(c->rbuf + c->rpos);
      int direct = total - moved >= len;
      COLL_CHECK(open_record(comm, c, direct ? &cu : NULL));
      if (direct) moved += len;
      continue;
    }
    if (eof) break;
    /* Room for a whole record past rpos: move the partial one to the front. */
    if (c->rcap - c->rpos < COLL_CRYPT_RECORD + COLL_CRYPT_OVERHEAD) {
      memmove(c->rbuf, c->rbuf + c->rpos, c->rfill - c->rpos);
      c->rfill -= c->rpos;
      c->pt_off = c->pt_end = c->rpos = 0;
    }
    if (c->rfill == c->rcap) /* cannot be: past rpos there is room for a whole record */
      return coll_error(comm, COLL_INTERNAL_ERROR, "rank %d: the receive buffer of the link "
                        "from rank %d is full without a whole record", comm->rank, c->peer);
    ssize_t k;
    do { k = read(fd, c->rbuf + c->rfill, c->rcap - c->rfill); } while (k < 0 && errno == EINTR);
    if (k > 0) {
      c->rfill += (size_t)k;
      continue;
    }
    if (k == 0) eof = 1;
    else err = errno;
    if (k < 0) break;
  }
  if (moved) {
    *r = (ssize_t)moved;
  } else if (eof) {
    *r = 0;
  } else {
    *r = -1;
    errno = err;
  }
  return COLL_SUCCESS;
}

/* ---- test vectors ---- */

int coll_crypt_seal(const uint8_t key[32], const uint8_t iv[12], const uint8_t *aad, size_t naad,
                    const uint8_t *pt, size_t n, uint8_t *out) {
  if (coll_crypt_lib_error()) return -1;
  void *ctx = evp.ctx_new();
  int outl, ok = ctx && evp.enc_init(ctx, evp.aes_256_gcm(), NULL, key, iv) > 0 &&
                 (naad == 0 || evp.enc_update(ctx, NULL, &outl, aad, (int)naad) > 0) &&
                 (n == 0 || evp.enc_update(ctx, out, &outl, pt, (int)n) > 0) &&
                 evp.enc_final(ctx, out + n, &outl) > 0 &&
                 evp.ctx_ctrl(ctx, CTRL_GCM_GET_TAG, COLL_CRYPT_TAG, out + n) > 0;
  if (ctx) evp.ctx_free(ctx);
  return ok ? 0 : -1;
}
