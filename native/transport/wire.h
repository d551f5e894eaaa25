/*
 * wire.h -- the fixed header in front of every message, and the hello that
 * opens every link.
 *
 * Message header, 48 bytes, little-endian, checked field by field on receipt
 * against what the receiver expects (so ranks that disagree fail, naming both
 * values, instead of hanging or reducing garbage):
 *
 *   byte  0  u32 magic    "COLL" (0x4c4c4f43)
 *         4  u8  version  COLL_WIRE_VERSION
 *         5  u8  coll     collective kind (coll_kind_t)
 *         6  u8  redop    coll_op_t (0 where the collective has none)
 *         7  u8  dtype    coll_dtype_t
 *         8  u32 seq      the communicator's collective sequence number; it
 *                         counts every collective call, so ranks that call
 *                         collectives in different orders disagree here
 *        12  u32 nbytes   payload bytes that follow this header
 *        16  u32 aux      broadcast, reduce, gather, scatter: root; allreduce:
 *                         algorithm id; point-to-point: tag
 *        20  u32 flags    0: nbytes of payload follow; COLL_WIRE_IPC_DESC or
 *                         COLL_WIRE_IPC_ACK: a CUDA IPC record follows instead
 *                         (transport/cuda_ipc.c), and nbytes/offset name the
 *                         device bytes it is about; COLL_WIRE_SC_DESC: the
 *                         same for host bytes a same-host peer reads (shm);
 *                         point-to-point: COLL_WIRE_P2P_SYNC or COLL_WIRE_P2P_ACK
 *        24  u64 count    elements of the whole collective (as the sender sees it)
 *        32  u64 offset   byte offset of this payload in the collective's buffer
 *        40  u32 ctx      the communicator's context id: 0 for a communicator made by
 *                         coll_comm_create, derived at split for a subcommunicator
 *                         (comm/subcomm.c), which shares its parent's links; a
 *                         message is only ever matched by the communicator it names
 *        44  u32 gen      the generation of the root communicator (coll_comm_set_generation):
 *                         the world is generation 0, each shrink or grow makes the next
 *                         one (collectives/elastic/membership.py), so a message from a rank of an
 *                         earlier generation is refused, naming both, never taken for one
 *                         of the new world (its comm_id differs too, which already keeps
 *                         its link openings out: this catches a stale link or a peer
 *                         that kept the old id)
 *
 * Link opening, authenticated with the job's link key K (auth.h), in three
 * steps on the new connection (transport/select.c, transport/tcp.c):
 *   connecting side: hello, 32 bytes
 *       u32 magic "CLHI" | u16 COLL_OPENING_VERSION | u8 socket | u8 nsocks - 1 |
 *       u8 comm_tag[16] | u32 from | u32 to
 *     (comm_tag = the first 16 bytes of HMAC(K, "collectives hello" comm_id
 *     nonce_c): the acceptor recognizes its communicator, and a process at a
 *     poisoned address learns nothing of the comm_id)
 *     (socket: which of the link's nsocks TCP connections this is, 0 for the
 *     first, COLLECTIVES_NSOCKS, transport/stripe.c; a one-socket link's
 *     hello thus reads u32 version 2, as before sockets were counted; the
 *     accepting side refuses socket >= nsocks or an nsocks other than its
 *     own once the MAC is checked, transport/select.c)
 *     then its nonce_c[16]                        (COLL_HELLO_PART_BYTES in all)
 *   accepting side, once the hello is for it: a challenge, nonce_a[16] |
 *     HMAC(K, "collectives challenge" nonce_a hello nonce_c) (COLL_CHALLENGE_BYTES):
 *     the connecting side checks it before it sends anything more, so the
 *     offer (a shared-memory segment's name) never reaches a process that
 *     does not prove K, such as one at an address poisoned outside the store
 *   connecting side: transport offer[96] | mac = HMAC(K, "collectives open" nonce_a
 *     hello nonce_c offer)                       (COLL_OPENING_BYTES in all)
 *   accepting side: u32 answer | HMAC(K, "collectives answer" nonce_a hello nonce_c answer)
 *     (answer: 0 tcp, 1 shared memory taken, or a refusal naming why and the
 *     acceptor's COLLECTIVES_NSOCKS, transport/transport.h)
 * Each side proves K over the other's fresh nonce, so a recorded opening
 * cannot be replayed, and an outsider can neither pose as a rank nor answer
 * as one. Nothing read before the MAC is checked sizes anything: the opening
 * is fixed-size and read into a fixed buffer.
 *
 * Abort notice, COLL_ABORT_BYTES (= COLL_OPENING_BYTES), sent whole without
 * waiting for an answer: the hello's layout with magic "CLAB", a nonce, the
 * sender's error text NUL-padded to COLL_ABORT_REASON_BYTES, and HMAC(K,
 * "collectives abort" everything before). A rank whose communicator breaks
 * sends it to each peer it has no link with (transport/tcp.c), so that a peer
 * waiting for it to connect fails at once instead of at its deadline; the
 * peer need not be listening yet, which is why there is no challenge. It
 * cannot be replayed elsewhere: it names the communicator (comm_id, fresh
 * for every communicator) and both ranks, and a communicator takes only the
 * first notice, which breaks it for good.
 */
#ifndef COLL_WIRE_H
#define COLL_WIRE_H

#include <stdint.h>

#include "base/auth.h"
#include "coll.h"
#include "base/comm_state.h"

#define COLL_WIRE_MAGIC 0x4c4c4f43u  /* "COLL" */
#define COLL_HELLO_MAGIC 0x49484c43u /* "CLHI" */
#define COLL_WIRE_VERSION 2
#define COLL_WIRE_HDR_BYTES 48
#define COLL_OPENING_VERSION 3
#define COLL_HELLO_BYTES 32
#define COLL_NONCE_BYTES 16
#define COLL_MAC_BYTES 32
#define COLL_HELLO_PART_BYTES (COLL_HELLO_BYTES + COLL_NONCE_BYTES)
#define COLL_CHALLENGE_BYTES (COLL_NONCE_BYTES + COLL_MAC_BYTES)
/* The most TCP connections one link may have (COLLECTIVES_NSOCKS). */
#define COLL_MAX_NSOCKS 16
#define COLL_ABORT_MAGIC 0x42414c43u /* "CLAB" */
#define COLL_ABORT_BYTES (COLL_HELLO_PART_BYTES + COLL_ABORT_REASON_BYTES + COLL_MAC_BYTES)

typedef enum {
  COLL_KIND_ALLREDUCE = 1,
  COLL_KIND_ALLGATHERV = 2,
  COLL_KIND_BROADCAST = 3,
  COLL_KIND_REDUCE_SCATTER = 4,
  COLL_KIND_BARRIER = 5,
  COLL_KIND_REDUCE = 7,  /* rooted.c: aux is the root, as for the two below */
  COLL_KIND_GATHER = 8,  /* count 0: each block's size is checked per message */
  COLL_KIND_SCATTER = 9,
  COLL_KIND_ALLTOALL = 10, /* alltoall.c: count 0, as for gather */
  COLL_KIND_P2P = 6 /* a point-to-point message (p2p.c): seq counts the messages
                       from this sender to this receiver, aux is the tag, count
                       the elements, offset 0; the payload is count x dtype
                       bytes (nbytes holds its low 32 bits) */
} coll_kind_t;

#define COLL_WIRE_IPC_DESC 1u /* "read my bytes here" */
#define COLL_WIRE_IPC_ACK 2u  /* "done reading them" */
#define COLL_WIRE_SC_DESC 3u  /* "read my bytes from my memory" (shm single copy,
                                 transport/shm_cma.c): a COLL_SC_DESC_BYTES
                                 descriptor follows, nbytes names the bytes */
/* Point-to-point (COLL_KIND_P2P) only: */
#define COLL_WIRE_P2P_SYNC 4u /* an Ssend: ack when a receive matches it */
#define COLL_WIRE_P2P_ACK 5u  /* "a receive matched your message": aux is that message's
                                 seq (not a tag), count 0, no payload; not matched
                                 against receives (schedule/p2p.c) */

typedef struct {
  uint8_t coll, redop, dtype;
  uint32_t seq, nbytes, aux, flags;
  uint64_t count, offset;
  uint32_t ctx;
  uint32_t gen;
} coll_wire_hdr_t;

const char *coll_kind_name(int kind);
const char *coll_wire_flags_text(uint32_t flags);
void coll_wire_encode(uint8_t out[COLL_WIRE_HDR_BYTES], const coll_wire_hdr_t *h);
/* Checks a received header against the expected one; on mismatch records an
 * error naming this rank, the peer, and both sides' values. */
coll_result_t coll_wire_check(coll_comm_t *comm, int peer, const uint8_t got[COLL_WIRE_HDR_BYTES],
                              const coll_wire_hdr_t *expect);

/* 1: the bytes open with a hello's magic; 2: an abort notice's; 0: neither. */
int coll_opening_kind(const uint8_t in[COLL_HELLO_PART_BYTES]);
/* The hello of socket `sock` of a link of `nsocks` sockets, and a fresh
 * nonce (COLL_HELLO_PART_BYTES). */
void coll_hello_encode(uint8_t out[COLL_HELLO_PART_BYTES], const uint8_t key[COLL_KEY_BYTES],
                       const uint8_t comm_id[16], int from, int to, int sock, int nsocks);
/* Returns the sender's rank, or -1 if the bytes are not a hello for this
 * communicator and this rank; *sock (0..255) and *nsocks (1..256), where not
 * NULL, get the hello's, unchecked (the caller bounds them). */
int coll_hello_decode(const uint8_t in[COLL_HELLO_PART_BYTES], const uint8_t key[COLL_KEY_BYTES],
                      const uint8_t comm_id[16], int to, int *sock, int *nsocks);
/* The MAC after the accepting side's challenge nonce (it proves K before the
 * connecting side sends its offer). */
void coll_challenge_mac(const uint8_t key[COLL_KEY_BYTES], const uint8_t nonce[COLL_NONCE_BYTES],
                        const uint8_t hello[COLL_HELLO_PART_BYTES], uint8_t out[COLL_MAC_BYTES]);
/* The MAC that ends an opening (over its first COLL_OPENING_BYTES - COLL_MAC_BYTES). */
void coll_opening_mac(const uint8_t key[COLL_KEY_BYTES], const uint8_t challenge[COLL_NONCE_BYTES],
                      const uint8_t *opening, uint8_t out[COLL_MAC_BYTES]);
/* The MAC after the accepting side's u32 answer. */
void coll_answer_mac(const uint8_t key[COLL_KEY_BYTES], const uint8_t challenge[COLL_NONCE_BYTES],
                     const uint8_t opening[COLL_HELLO_PART_BYTES], uint32_t answer,
                     uint8_t out[COLL_MAC_BYTES]);

/* reason is cut to fit (ending "..."). */
void coll_abort_encode(uint8_t out[COLL_ABORT_BYTES], const uint8_t key[COLL_KEY_BYTES],
                       const uint8_t comm_id[16], int from, int to, const char *reason);
/* Returns the sender's rank and copies its text (NUL-terminated) to reason;
 * -1 if the bytes are not an abort notice for this communicator and rank,
 * -2 if they are but their MAC is wrong (not from this job). */
int coll_abort_decode(const uint8_t in[COLL_ABORT_BYTES], const uint8_t key[COLL_KEY_BYTES],
                      const uint8_t comm_id[16], int to, char reason[COLL_ABORT_REASON_BYTES]);

#endif
