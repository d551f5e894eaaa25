/* wire.c -- header and hello encoding and checks (layout in wire.h). */
#include "transport/wire.h"

#include <string.h>

#include "base/auth.h"
#include "base/comm_state.h"
#include "base/status.h"
#include "transport/transport.h"

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

const char *coll_kind_name(int kind) {
  switch (kind) {
    case COLL_KIND_ALLREDUCE: return "allreduce";
    case COLL_KIND_ALLGATHERV: return "allgatherv";
    case COLL_KIND_BROADCAST: return "broadcast";
    case COLL_KIND_REDUCE_SCATTER: return "reduce_scatter";
    case COLL_KIND_BARRIER: return "barrier";
    case COLL_KIND_P2P: return "send/recv";
    case COLL_KIND_REDUCE: return "reduce";
    case COLL_KIND_GATHER: return "gatherv";
    case COLL_KIND_SCATTER: return "scatterv";
    case COLL_KIND_ALLTOALL: return "alltoallv";
    default: return "unknown";
  }
}

void coll_wire_encode(uint8_t out[COLL_WIRE_HDR_BYTES], const coll_wire_hdr_t *h) {
  put32(out, COLL_WIRE_MAGIC);
  out[4] = COLL_WIRE_VERSION;
  out[5] = h->coll;
  out[6] = h->redop;
  out[7] = h->dtype;
  put32(out + 8, h->seq);
  put32(out + 12, h->nbytes);
  put32(out + 16, h->aux);
  put32(out + 20, h->flags);
  put64(out + 24, h->count);
  put64(out + 32, h->offset);
  put32(out + 40, h->ctx);
  put32(out + 44, h->gen);
}

const char *coll_wire_flags_text(uint32_t flags) {
  switch (flags) {
    case 0: return "bytes on the link";
    case COLL_WIRE_IPC_DESC: return "a CUDA IPC descriptor";
    case COLL_WIRE_IPC_ACK: return "a CUDA IPC acknowledgement";
    case COLL_WIRE_SC_DESC: return "a single-copy descriptor (shared memory)";
    case COLL_WIRE_P2P_SYNC: return "a synchronous-mode message";
    case COLL_WIRE_P2P_ACK: return "a synchronous-mode acknowledgement";
    default: return "unknown flags";
  }
}

static const char *dtype_text(unsigned d) {
  return d < COLL_NUM_DTYPES ? coll_dtype_name((coll_dtype_t)d) : "?";
}
static const char *op_text(unsigned o) { return o < COLL_NUM_OPS ? coll_op_name((coll_op_t)o) : "?"; }

coll_result_t coll_wire_check(coll_comm_t *comm, int peer, const uint8_t got[COLL_WIRE_HDR_BYTES],
                              const coll_wire_hdr_t *e) {
  uint32_t magic = get32(got);
  if (magic != COLL_WIRE_MAGIC || got[4] != COLL_WIRE_VERSION)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: malformed message from rank %d (magic 0x%08x version %u, expected "
                      "0x%08x version %u) during %s seq %u",
                      comm->rank, peer, magic, got[4], COLL_WIRE_MAGIC, COLL_WIRE_VERSION,
                      coll_kind_name(e->coll), e->seq);
  coll_wire_hdr_t g = {got[5],          got[6],           got[7],
                       get32(got + 8),  get32(got + 12),  get32(got + 16),
                       get32(got + 20), get64(got + 24),  get64(got + 32), get32(got + 40),
                       get32(got + 44)};
  if (g.gen != e->gen)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: rank %d sent a message of communicator generation %u during %s "
                      "#%u on generation %u (a stale peer from before a shrink or grow)",
                      comm->rank, peer, g.gen, coll_kind_name(e->coll), e->seq, e->gen);
  if (g.ctx != e->ctx)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: rank %d sent a message for communicator context 0x%08x during "
                      "%s #%u on communicator context 0x%08x (ranks called collectives on "
                      "different communicators in a different order?)",
                      comm->rank, peer, g.ctx, coll_kind_name(e->coll), e->seq, e->ctx);
  if (g.coll == COLL_KIND_P2P && e->coll != COLL_KIND_P2P)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: rank %d sent a point-to-point message (tag %u, %llu elements) "
                      "that this rank cannot set aside during %s #%u",
                      comm->rank, peer, g.aux, (unsigned long long)g.count, coll_kind_name(e->coll),
                      e->seq);
  if (g.seq != e->seq || g.coll != e->coll)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: collectives called in a different order: this rank is in %s "
                      "(call #%u), rank %d sent %s (call #%u)",
                      comm->rank, coll_kind_name(e->coll), e->seq, peer, coll_kind_name(g.coll), g.seq);
  if (g.dtype != e->dtype)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: dtype mismatch in %s #%u: this rank has %s, rank %d has %s",
                      comm->rank, coll_kind_name(e->coll), e->seq, dtype_text(e->dtype), peer,
                      dtype_text(g.dtype));
  if (g.count != e->count)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: count mismatch in %s #%u: this rank has %llu elements, rank %d has %llu",
                      comm->rank, coll_kind_name(e->coll), e->seq, (unsigned long long)e->count, peer,
                      (unsigned long long)g.count);
  if (g.redop != e->redop)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: op mismatch in %s #%u: this rank has %s, rank %d has %s", comm->rank,
                      coll_kind_name(e->coll), e->seq, op_text(e->redop), peer, op_text(g.redop));
  if (g.aux != e->aux) {
    if (e->coll == COLL_KIND_BROADCAST || e->coll == COLL_KIND_REDUCE ||
        e->coll == COLL_KIND_GATHER || e->coll == COLL_KIND_SCATTER)
      return coll_error(comm, COLL_REMOTE_ERROR,
                        "rank %d: root mismatch in %s #%u: this rank has root %u, rank %d has %u",
                        comm->rank, coll_kind_name(e->coll), e->seq, e->aux, peer, g.aux);
    if (e->coll == COLL_KIND_ALLREDUCE)
      return coll_error(comm, COLL_REMOTE_ERROR,
                        "rank %d: algorithm mismatch in allreduce #%u: this rank runs %s, rank %d runs %s",
                        comm->rank, e->seq, coll_algo_name((coll_algo_t)e->aux), peer,
                        g.aux < COLL_NUM_ALGOS ? coll_algo_name((coll_algo_t)g.aux) : "?");
    return coll_error(comm, COLL_REMOTE_ERROR, "rank %d: parameter mismatch in %s #%u with rank %d",
                      comm->rank, coll_kind_name(e->coll), e->seq, peer);
  }
  if (g.flags != e->flags)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: rank %d moves %s #%u as %s, this rank expects %s (do both ranks "
                      "pass GPU buffers, with the same COLLECTIVES_TRANSPORT and "
                      "COLLECTIVES_CUDA_IPC?)",
                      comm->rank, peer, coll_kind_name(e->coll), e->seq, coll_wire_flags_text(g.flags),
                      coll_wire_flags_text(e->flags));
  if (g.nbytes != e->nbytes || g.offset != e->offset)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: message from rank %d out of step in %s #%u: expected %u bytes at "
                      "offset %llu, got %u bytes at offset %llu (counts per rank differ?)",
                      comm->rank, peer, coll_kind_name(e->coll), e->seq, e->nbytes,
                      (unsigned long long)e->offset, g.nbytes, (unsigned long long)g.offset);
  return COLL_SUCCESS;
}

/* The first 16 bytes of HMAC(K, "collectives hello" comm_id nonce). */
static void comm_tag(const uint8_t key[COLL_KEY_BYTES], const uint8_t comm_id[16],
                     const uint8_t nonce[COLL_NONCE_BYTES], uint8_t out[16]) {
  uint8_t mac[COLL_MAC_BYTES];
  coll_hmac3(key, COLL_KEY_BYTES, "collectives hello", comm_id, 16, nonce, COLL_NONCE_BYTES, mac);
  memcpy(out, mac, 16);
}

static void opening_encode(uint8_t *out, const uint8_t key[COLL_KEY_BYTES], uint32_t magic,
                           const uint8_t comm_id[16], int from, int to, int sock, int nsocks) {
  put32(out, magic);
  put32(out + 4, COLL_OPENING_VERSION);
  out[6] = (uint8_t)sock;
  out[7] = (uint8_t)(nsocks - 1);
  put32(out + 24, (uint32_t)from);
  put32(out + 28, (uint32_t)to);
  /* A nonce that cannot be had is a zero one: the MACs still need the key. */
  if (coll_random_bytes(out + COLL_HELLO_BYTES, COLL_NONCE_BYTES) != 0)
    memset(out + COLL_HELLO_BYTES, 0, COLL_NONCE_BYTES);
  comm_tag(key, comm_id, out + COLL_HELLO_BYTES, out + 8);
}

static int opening_decode(const uint8_t *in, const uint8_t key[COLL_KEY_BYTES], uint32_t magic,
                          const uint8_t comm_id[16], int to, int *sock, int *nsocks) {
  /* The version is the low 16 bits. The socket bytes are only passed on
   * (0..255 and 1..256): the accepting side checks them against its own
   * COLLECTIVES_NSOCKS once the MAC has proved who sent them, so that a rank
   * that disagrees is named in an error rather than dropped as noise. */
  if (get32(in) != magic || (get32(in + 4) & 0xffffu) != COLL_OPENING_VERSION) return -1;
  if (sock) *sock = in[6];
  if (nsocks) *nsocks = in[7] + 1;
  uint8_t tag[16];
  comm_tag(key, comm_id, in + COLL_HELLO_BYTES, tag);
  if (!coll_ct_equal(tag, in + 8, 16)) return -1;
  if ((int)get32(in + 28) != to) return -1;
  uint32_t from = get32(in + 24);
  return from > 0x7fffffffu ? -1 : (int)from;
}

int coll_opening_kind(const uint8_t in[COLL_HELLO_PART_BYTES]) {
  uint32_t magic = get32(in);
  return magic == COLL_HELLO_MAGIC ? 1 : magic == COLL_ABORT_MAGIC ? 2 : 0;
}

void coll_hello_encode(uint8_t out[COLL_HELLO_PART_BYTES], const uint8_t key[COLL_KEY_BYTES],
                       const uint8_t comm_id[16], int from, int to, int sock, int nsocks) {
  opening_encode(out, key, COLL_HELLO_MAGIC, comm_id, from, to, sock, nsocks);
}

int coll_hello_decode(const uint8_t in[COLL_HELLO_PART_BYTES], const uint8_t key[COLL_KEY_BYTES],
                      const uint8_t comm_id[16], int to, int *sock, int *nsocks) {
  return opening_decode(in, key, COLL_HELLO_MAGIC, comm_id, to, sock, nsocks);
}

void coll_challenge_mac(const uint8_t key[COLL_KEY_BYTES], const uint8_t nonce[COLL_NONCE_BYTES],
                        const uint8_t hello[COLL_HELLO_PART_BYTES], uint8_t out[COLL_MAC_BYTES]) {
  coll_hmac3(key, COLL_KEY_BYTES, "collectives challenge", nonce, COLL_NONCE_BYTES, hello,
             COLL_HELLO_PART_BYTES, out);
}

void coll_opening_mac(const uint8_t key[COLL_KEY_BYTES], const uint8_t challenge[COLL_NONCE_BYTES],
                      const uint8_t *opening, uint8_t out[COLL_MAC_BYTES]) {
  coll_hmac3(key, COLL_KEY_BYTES, "collectives open", challenge, COLL_NONCE_BYTES, opening,
             COLL_OPENING_BYTES - COLL_MAC_BYTES, out);
}

void coll_answer_mac(const uint8_t key[COLL_KEY_BYTES], const uint8_t challenge[COLL_NONCE_BYTES],
                     const uint8_t opening[COLL_HELLO_PART_BYTES], uint32_t answer,
                     uint8_t out[COLL_MAC_BYTES]) {
  uint8_t tail[COLL_HELLO_PART_BYTES + 4];
  memcpy(tail, opening, COLL_HELLO_PART_BYTES);
  put32(tail + COLL_HELLO_PART_BYTES, answer);
  coll_hmac3(key, COLL_KEY_BYTES, "collectives answer", challenge, COLL_NONCE_BYTES, tail,
             sizeof tail, out);
}

static void abort_mac(const uint8_t key[COLL_KEY_BYTES], const uint8_t *in,
                      uint8_t out[COLL_MAC_BYTES]) {
  coll_hmac3(key, COLL_KEY_BYTES, "collectives abort", in, COLL_ABORT_BYTES - COLL_MAC_BYTES, NULL,
             0, out);
}

void coll_abort_encode(uint8_t out[COLL_ABORT_BYTES], const uint8_t key[COLL_KEY_BYTES],
                       const uint8_t comm_id[16], int from, int to, const char *reason) {
  char *text = (char *)out + COLL_HELLO_PART_BYTES;
  opening_encode(out, key, COLL_ABORT_MAGIC, comm_id, from, to, 0, 1);
  memset(text, 0, COLL_ABORT_REASON_BYTES);
  size_t n = strlen(reason);
  if (n < COLL_ABORT_REASON_BYTES) {
    memcpy(text, reason, n);
  } else {
    memcpy(text, reason, COLL_ABORT_REASON_BYTES - 4);
    memcpy(text + COLL_ABORT_REASON_BYTES - 4, "...", 3);
  }
  abort_mac(key, out, out + COLL_ABORT_BYTES - COLL_MAC_BYTES);
}

int coll_abort_decode(const uint8_t in[COLL_ABORT_BYTES], const uint8_t key[COLL_KEY_BYTES],
                      const uint8_t comm_id[16], int to, char reason[COLL_ABORT_REASON_BYTES]) {
  int sock = 0, nsocks = 1;
  int from = opening_decode(in, key, COLL_ABORT_MAGIC, comm_id, to, &sock, &nsocks);
  if (from < 0 || from == to || sock != 0 || nsocks != 1) return -1;
  uint8_t mac[COLL_MAC_BYTES];
  abort_mac(key, in, mac);
  if (!coll_ct_equal(mac, in + COLL_ABORT_BYTES - COLL_MAC_BYTES, COLL_MAC_BYTES)) return -2;
  memcpy(reason, in + COLL_HELLO_PART_BYTES, COLL_ABORT_REASON_BYTES);
  reason[COLL_ABORT_REASON_BYTES - 1] = 0;
  for (char *c = reason; *c; c++)  /* text from the network: printable only */
    if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e) *c = '?';
  return from;
}
