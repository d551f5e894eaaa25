/*
 * auth.h -- SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), and the
 * authentication of a link's opening and of abort notices with the job's
 * link key (collectives/rendezvous/auth.py derives it from the job secret; the core
 * never sees the secret itself).
 *
 * Kept small and dependency-free: the core links no crypto library. Checked
 * against hashlib's test vectors in tests/test_security.py.
 */
#ifndef COLL_AUTH_H
#define COLL_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define COLL_SHA256_BYTES 32
#define COLL_KEY_BYTES 32

typedef struct {
  uint32_t h[8];
  uint64_t len;         /* bytes hashed so far */
  uint8_t block[64];
  size_t fill;
} coll_sha256_t;

void coll_sha256_init(coll_sha256_t *s);
void coll_sha256_update(coll_sha256_t *s, const void *data, size_t n);
void coll_sha256_final(coll_sha256_t *s, uint8_t out[COLL_SHA256_BYTES]);

typedef struct {
  coll_sha256_t inner, outer;
} coll_hmac_t;

void coll_hmac_init(coll_hmac_t *m, const uint8_t *key, size_t keylen);
void coll_hmac_update(coll_hmac_t *m, const void *data, size_t n);
void coll_hmac_final(coll_hmac_t *m, uint8_t out[COLL_SHA256_BYTES]);
/* One-shot HMAC-SHA256 of label || a || b (any of them may be empty). */
void coll_hmac3(const uint8_t *key, size_t keylen, const char *label, const void *a, size_t na,
                const void *b, size_t nb, uint8_t out[COLL_SHA256_BYTES]);
/* Nonzero when the n bytes are equal; time independent of where they differ. */
int coll_ct_equal(const void *a, const void *b, size_t n);
/* n unpredictable bytes (getrandom, else /dev/urandom); nonzero on failure. */
int coll_random_bytes(void *out, size_t n);

#endif
