/*
 * crypt.h -- encrypted TCP connections (COLLECTIVES_ENCRYPT=1).
 *
 * Each TCP connection of a link between ranks (one, or COLLECTIVES_NSOCKS of
 * a striped link) carries its bytes in records sealed with AES-256-GCM, with
 * keys of its own for each direction. Links over shared memory are never
 * encrypted: their bytes do not leave the host's memory.
 *
 * Keys: HKDF-SHA256 (RFC 5869) with the link key (from the job secret, auth.h)
 * as input keying material, salt = nonce_c || nonce_a, the two fresh nonces
 * the connection's authenticated opening exchanged (wire.h), and info =
 * "collectives aead v1" | comm_id | u32 sender | u32 receiver | u8 socket,
 * giving a 32-byte key and a 12-byte IV per direction. A record's nonce is the
 * IV XOR its number in that direction (0, 1, 2, ...), so a nonce never
 * repeats under one key: records are neither reordered, dropped nor replayed
 * without the receiver's check failing. After every COLL_CRYPT_REKEY records a
 * direction's key is replaced by HKDF(old key, "collectives rekey"), on both
 * ends at the same record, so no key seals more than 64 GiB (TLS 1.3's margin
 * for AES-GCM is about 2^24.5 full records of 16 KiB, ~380 GiB).
 *
 * Record on the wire, per connection and direction:
 *   u32 len (plaintext bytes, 1..COLL_CRYPT_RECORD, little-endian) |
 *   ciphertext[len] | tag[16]        (AAD: the 4 length bytes)
 * A length over COLL_CRYPT_RECORD is refused before anything is read into
 * memory; the receive buffer is fixed when the connection is made.
 *
 * The cipher is OpenSSL's libcrypto (EVP), loaded at run time with dlopen
 * (COLLECTIVES_CRYPTO_LIB, default libcrypto.so.3), so that building the core
 * needs no OpenSSL headers and a job that does not encrypt never loads it.
 *
 * coll_crypt_send/coll_crypt_recv behave like sendmsg/readv on a non-blocking
 * socket (*w and *r: bytes, or -1 with errno, EAGAIN when nothing moved; 0 from
 * recv: the peer closed), so tcp.c and stripe.c call them in place of those.
 * A send seals the caller's bytes into records and reports as sent only
 * bytes whose records the kernel took whole, except when the kernel took part
 * of the last record: then all but the last byte of it are reported, the
 * rest of the record is written on the next call (a message left with bytes
 * to send is always continued before any other on the same link, which is
 * what the held-back byte relies on; the next call must start with that byte,
 * or the link fails as an internal error instead of sending garbage). When
 * the kernel took nothing, the sealed bytes are dropped unsent and their record
 * number is used again: nothing sealed under it ever left the process.
 */
#ifndef COLL_CRYPT_H
#define COLL_CRYPT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "base/comm_state.h"
#include "coll.h"

/* Plaintext bytes per record at most: the stripe unit (transport.h), so a
 * striped link's unit is one record. */
#define COLL_CRYPT_RECORD (64 * 1024)
#define COLL_CRYPT_TAG 16
#define COLL_CRYPT_OVERHEAD (4 + COLL_CRYPT_TAG)
#define COLL_CRYPT_REKEY (1u << 20)

typedef struct coll_crypt coll_crypt_t;

/* Nonzero when COLLECTIVES_ENCRYPT=1 on this rank. */
int coll_crypt_wanted(void);
/* Loads libcrypto (once per process); an error naming the library and
 * COLLECTIVES_ENCRYPT when it cannot be loaded. */
coll_result_t coll_crypt_load(coll_comm_t *comm);
/* The state of connection `sock` of the link to `peer`, keyed from the link
 * key and the opening's nonces; dialer: this rank connected. `nsocks` sizes
 * its buffers (a striped connection never carries more than a unit at once). */
coll_result_t coll_crypt_new(coll_comm_t *comm, int peer, int sock, int nsocks, int dialer,
                             const uint8_t nonce_c[16], const uint8_t nonce_a[16],
                             coll_crypt_t **out);
void coll_crypt_free(coll_crypt_t *c);
/* Gives link its k connections' states (all NULL until set); and frees them
 * (tcp and stripe links' close). */
coll_result_t coll_crypt_attach(coll_link_t *link, int k);
void coll_crypt_drop(coll_link_t *link);
coll_result_t coll_crypt_send(coll_comm_t *comm, coll_crypt_t *c, int fd, const struct iovec *iov,
                              int iovcnt, ssize_t *w);
coll_result_t coll_crypt_recv(coll_comm_t *comm, coll_crypt_t *c, int fd, const struct iovec *iov,
                              int iovcnt, ssize_t *r);
/* Nonzero when received bytes are already decrypted (or a whole record is
 * buffered), so a reader must not sleep in poll() for the socket. */
int coll_crypt_readable(const coll_crypt_t *c);

/* Why libcrypto cannot be used (loading it first), or NULL when it can. */
const char *coll_crypt_lib_error(void);
/* For tests: HKDF-SHA256 and AES-256-GCM sealing (out: ciphertext then the
 * 16-byte tag) through the loaded library, checked against RFC 5869's and
 * the GCM specification's vectors; 0, or -1 when the library failed. */
int coll_crypt_hkdf(const uint8_t *ikm, size_t nikm, const uint8_t *salt, size_t nsalt,
                    const uint8_t *info, size_t ninfo, uint8_t *out, size_t nout);
int coll_crypt_seal(const uint8_t key[32], const uint8_t iv[12], const uint8_t *aad, size_t naad,
                    const uint8_t *pt, size_t n, uint8_t *out);

#endif
