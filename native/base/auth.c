/* auth.c -- SHA-256, HMAC-SHA256, constant-time compare, random bytes (auth.h). */
#define _GNU_SOURCE
#include "base/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void compress(uint32_t h[8], const uint8_t b[64]) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)b[4 * i] << 24 | (uint32_t)b[4 * i + 1] << 16 | (uint32_t)b[4 * i + 2] << 8 |
           (uint32_t)b[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], bb = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = hh + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
    uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
    hh = g; g = f; f = e; e = d + t1; d = c; c = bb; bb = a; a = t1 + t2;
  }
  h[0] += a; h[1] += bb; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

void coll_sha256_init(coll_sha256_t *s) {
  static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, iv, sizeof iv);
  s->len = 0;
  s->fill = 0;
}

void coll_sha256_update(coll_sha256_t *s, const void *data, size_t n) {
  const uint8_t *p = data;
  s->len += n;
  while (n > 0) {
    size_t take = 64 - s->fill < n ? 64 - s->fill : n;
    memcpy(s->block + s->fill, p, take);
    s->fill += take;
    p += take;
    n -= take;
    if (s->fill == 64) {
      compress(s->h, s->block);
      s->fill = 0;
    }
  }
}

void coll_sha256_final(coll_sha256_t *s, uint8_t out[COLL_SHA256_BYTES]) {
  uint64_t bits = s->len * 8;
  uint8_t pad = 0x80;
  coll_sha256_update(s, &pad, 1);
  pad = 0;
  while (s->fill != 56) coll_sha256_update(s, &pad, 1);
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
  coll_sha256_update(s, len, 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(s->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)s->h[i];
  }
}

void coll_hmac_init(coll_hmac_t *m, const uint8_t *key, size_t keylen) {
  uint8_t k[64], pad[64];
  memset(k, 0, sizeof k);
  if (keylen > 64) {
    coll_sha256_t s;
    coll_sha256_init(&s);
    coll_sha256_update(&s, key, keylen);
    coll_sha256_final(&s, k);
  } else if (keylen > 0) {
    memcpy(k, key, keylen);
  }
  for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
  coll_sha256_init(&m->inner);
  coll_sha256_update(&m->inner, pad, 64);
  for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
  coll_sha256_init(&m->outer);
  coll_sha256_update(&m->outer, pad, 64);
}

void coll_hmac_update(coll_hmac_t *m, const void *data, size_t n) {
  coll_sha256_update(&m->inner, data, n);
}

void coll_hmac_final(coll_hmac_t *m, uint8_t out[COLL_SHA256_BYTES]) {
  uint8_t inner[COLL_SHA256_BYTES];
  coll_sha256_final(&m->inner, inner);
  coll_sha256_update(&m->outer, inner, sizeof inner);
  coll_sha256_final(&m->outer, out);
}

void coll_hmac3(const uint8_t *key, size_t keylen, const char *label, const void *a, size_t na,
                const void *b, size_t nb, uint8_t out[COLL_SHA256_BYTES]) {
  coll_hmac_t m;
  coll_hmac_init(&m, key, keylen);
  if (label) coll_hmac_update(&m, label, strlen(label));
  if (na) coll_hmac_update(&m, a, na);
  if (nb) coll_hmac_update(&m, b, nb);
  coll_hmac_final(&m, out);
}

int coll_ct_equal(const void *a, const void *b, size_t n) {
  const volatile uint8_t *x = a, *y = b;
  uint8_t diff = 0;
  for (size_t i = 0; i < n; i++) diff |= x[i] ^ y[i];
  return diff == 0;
}

int coll_random_bytes(void *out, size_t n) {
  uint8_t *p = out;
  while (n > 0) {
    ssize_t r = getrandom(p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    p += r;
    n -= (size_t)r;
  }
  if (n == 0) return 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) { close(fd); return -1; }
    p += r;
    n -= (size_t)r;
  }
  close(fd);
  return 0;
}

/* ---- the communicator's side (coll.h) ---- */

#include "base/comm_state.h"
#include "base/status.h"

coll_result_t coll_comm_set_link_key(coll_comm_t *comm, const uint8_t *key, size_t n) {
  if (!key || n != COLL_KEY_BYTES)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "a link key is %d bytes, not %zu",
                      COLL_KEY_BYTES, n);
  memcpy(comm->link_key, key, COLL_KEY_BYTES);
  return COLL_SUCCESS;
}

void coll_hmac_sha256(const uint8_t *key, size_t keylen, const uint8_t *msg, size_t n,
                      uint8_t out[32]) {
  coll_hmac_t m;
  coll_hmac_init(&m, key, keylen);
  coll_hmac_update(&m, msg, n);
  coll_hmac_final(&m, out);
}
