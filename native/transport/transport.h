/*
 * transport.h -- a link to one peer, and the small vtable behind it.
 *
 * Every link starts as a TCP connection (the lower rank connects, opening
 * with a hello). Then the two ends negotiate over it (transport/select.c):
 * the connecting side offers the first transport in priority order whose
 * can_connect says yes (shm between ranks on one host, else tcp), the other
 * side accepts it or answers tcp, and the choice is logged at INFO/NET. So
 * ranks with different settings still agree, and the TCP socket stays as the
 * link's doorbell and death detector.
 *
 * A link is a reliable, ordered byte stream: the schedule executor
 * (schedule.c) frames messages with the wire header and drives the link with
 * non-blocking partial send/recv, and sleeps in poll() on the fd and events
 * the link asks for. A transport that holds received bytes in memory the
 * executor can read (shm) also offers peek/consume, so receive+reduce reads
 * the peer's bytes where they are instead of copying them first. A
 * memory-semantics transport (CUDA IPC) will add its own entry points beside
 * these; an algorithm never sees any of it.
 */
#ifndef COLL_TRANSPORT_H
#define COLL_TRANSPORT_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "coll.h"
#include "base/comm_state.h"
#include "transport/wire.h"

typedef struct coll_transport coll_transport_t;

struct coll_link { /* typedef coll_link_t: base/comm_state.h */
  const coll_transport_t *tp;
  coll_comm_t *comm;
  int peer;
  int fd;           /* pollable descriptor; -1 once closed */
  int wake_fd;      /* a second descriptor the link is woken on (shm's doorbell), or -1 */
  unsigned char *stage; /* receive staging for fused recv+reduce (COLL_STAGE_BYTES) */
  void *priv;       /* the transport's own state */
  /* Bytes handed back after being read (transport/unread.c): a point-to-point
   * message's neighbour read with it, or a header read by a reader it was
   * not for. Every reader goes through coll_link_recv/peek, which return
   * these before the transport's. */
  unsigned char *unread;
  size_t unread_len, unread_off;
  void *dial;       /* a dial in progress (select.c), NULL otherwise */
  /* COLLECTIVES_ENCRYPT: the record state of each of the link's TCP
   * connections, indexed like its sockets (transport/crypt.c); NULL on an
   * unencrypted link (shared memory, or encryption off). */
  struct coll_crypt **crypt;
  int ncrypt;
};

struct coll_transport {
  const char *name;
  /* Nonzero if this transport can reach `peer` from this rank. */
  int (*can_connect)(coll_comm_t *comm, int peer);
  /* Non-blocking: moves as many bytes as possible, *n = bytes moved (0 when
   * the call would block). A closed or reset connection is COLL_REMOTE_ERROR
   * naming the peer. */
  coll_result_t (*send)(coll_link_t *link, const struct iovec *iov, int iovcnt, size_t *n);
  coll_result_t (*recv)(coll_link_t *link, const struct iovec *iov, int iovcnt, size_t *n);
  void (*close)(coll_link_t *link);
  /* The poll events to sleep on when the executor wants to send and/or
   * receive and the last calls moved nothing -- on link->wake_fd where the
   * link has one (link->fd is then only watched for a hang-up), else on
   * link->fd; -1 means "progress is possible now, do not sleep". */
  int (*wait_events)(coll_link_t *link, int sending, int receiving);
  /* Called with the revents poll reported for `fd` (link->fd or
   * link->wake_fd); may be NULL. */
  coll_result_t (*after_poll)(coll_link_t *link, int fd, short revents);
  /* Optional zero-copy receive: the next contiguous received bytes, and
   * releasing them. NULL where the transport has no such memory. */
  coll_result_t (*recv_peek)(coll_link_t *link, const void **p, size_t *n);
  void (*recv_consume)(coll_link_t *link, size_t n);
  /* Optional single copy (shm over CMA, transport/shm_cma.c); NULL where
   * the transport has none. A message of n bytes for which sc_wanted says
   * yes goes as a header flagged COLL_WIRE_SC_DESC and a descriptor
   * (sc_post fills COLL_SC_DESC_BYTES) instead of its bytes; the sender
   * leaves its buffer alone until sc_acked says the peer read it. The
   * receiver (if sc_can_read: it told the peer it could) reads the bytes
   * with sc_read, bounded by the receive it posted, then sc_done. */
  int (*sc_wanted)(coll_link_t *link, size_t n);
  void (*sc_post)(coll_link_t *link, const void *src, size_t n, uint8_t *desc);
  coll_result_t (*sc_acked)(coll_link_t *link, int *acked);
  int (*sc_can_read)(coll_link_t *link);
  coll_result_t (*sc_read)(coll_link_t *link, const uint8_t *desc, size_t expect, size_t off,
                           void *dst, size_t len);
  void (*sc_done)(coll_link_t *link);
};

/* A single-copy descriptor: u64 address, u64 length, in the sender's memory. */
#define COLL_SC_DESC_BYTES 16

extern const coll_transport_t coll_transport_tcp;
extern const coll_transport_t coll_transport_shm;
/* TCP over several connections (COLLECTIVES_NSOCKS > 1, transport/stripe.c). */
extern const coll_transport_t coll_transport_stripe;

/* Bytes of a striped link's stream each socket takes in turn: large enough
 * that one sendmsg/readv moves a useful amount, small enough that a
 * pipelining segment (512K or 1M) spreads over 8+ sockets. Part of the
 * opening's version: both ends must cut the stream alike. */
#define COLL_STRIPE_UNIT (64 * 1024)
/* COLLECTIVES_NSOCKS, bounded to 1..COLL_MAX_NSOCKS. */
int coll_tcp_nsocks(void);
/* Makes link a striped TCP link of k sockets, none filled yet (fds -1). */
coll_result_t coll_stripe_new(coll_link_t *link, int k);
/* Puts fd in slot i: 0 if i is out of range or taken (fd not kept), 1 if
 * slots remain empty, 2 when this filled the last one (the link is ready). */
int coll_stripe_fill(coll_link_t *link, int i, int fd);
/* TCP connections behind a link (1 unless striped). */
int coll_stripe_sockets(const coll_link_t *link);

/* shm negotiation (transport/shm.c), run over the link's TCP socket right
 * after the hello. The offer is COLL_SHM_OFFER_BYTES; the connecting side
 * builds it (shm or tcp), the accepting side answers with one u32. */
#define COLL_SHM_OFFER_BYTES 96
/* Bytes 4..7 of every connection's offer: u32 flags the dialer sends whatever
 * the transport (checked by the acceptor once the MAC proved them). */
#define COLL_OFFER_FLAGS_AT 4
#define COLL_OFFER_ENCRYPT 1u /* the dialer runs with COLLECTIVES_ENCRYPT=1 */
coll_result_t coll_shm_make_offer(coll_link_t *link, int want_shm, unsigned char *offer);
/* Accepting side: maps the offered segment if it can; *ok = 1 then. */
coll_result_t coll_shm_take_offer(coll_link_t *link, const unsigned char *offer, int allowed, int *ok);
/* Nonzero when an offered segment path is exactly what rank `from` makes for
 * a link to `to` with this token (no other directory, no ".."). */
int coll_shm_path_ok(const char *path, int from, int to, uint64_t token);
/* Connecting side, after the answer: keep the segment (ok) or drop it. */
void coll_shm_settle(coll_link_t *link, int ok);

/* Bytes of the staging buffer each link keeps for fused receive+reduce: small
 * enough to stay in L2 while it is reduced, large enough that one recv call
 * moves a useful amount. */
#define COLL_STAGE_BYTES (256 * 1024)

/* The link to `peer`, connecting it first if needed (transport/select.c). */
coll_result_t coll_link_get(coll_comm_t *comm, int peer, double deadline, coll_link_t **out);
/* The reads every executor uses (transport/unread.c): the transport's recv,
 * recv_peek/recv_consume (when it has them) and wait_events, after the
 * link's handed-back bytes. */
coll_result_t coll_link_recv(coll_link_t *link, const struct iovec *iov, int iovcnt, size_t *n);
coll_result_t coll_link_peek(coll_link_t *link, const void **p, size_t *n);
void coll_link_consume(coll_link_t *link, size_t n);
int coll_link_wait_events(coll_link_t *link, int sending, int receiving);
/* Hands n bytes back to the link, in front of any it holds already. */
coll_result_t coll_link_unread(coll_link_t *link, const void *p, size_t n);
/* Non-blocking link set-up for point-to-point waits (transport/select.c):
 * dial a higher peer and send the opening (which needs nothing from the
 * peer beyond its kernel's backlog), then take its answer once readable.
 * *done = 1 when the link exists. */
coll_result_t coll_link_dial_start(coll_comm_t *comm, int peer, double deadline);
coll_result_t coll_link_dial_poll(coll_comm_t *comm, int peer, int *done);
/* Accepts and answers whatever openings have arrived, without waiting
 * (transport/tcp.c); listener and half-open descriptors go in pfs (at most
 * comm->max_pending + 1) for a caller's poll(). */
void coll_tcp_serve(coll_comm_t *comm);
/* COLL_SUCCESS, or the error naming the rank whose abort notice reached us. */
coll_result_t coll_tcp_aborted(coll_comm_t *comm);
int coll_tcp_listen_pollfds(const coll_comm_t *comm, struct pollfd *pfs);

/* Closes every link (after an error, so peers fail fast, and at destroy). */
void coll_links_close_all(coll_comm_t *comm);
/* Nonzero when every link of comm will be shared memory (all peers on our
 * host and COLLECTIVES_TRANSPORT not tcp), judged without opening any. */
int coll_links_all_shm(coll_comm_t *comm);

/* Every link opens with a hello, a nonce, a transport offer and a MAC
 * (wire.h), read into one fixed block. */
#define COLL_OPENING_BYTES (COLL_HELLO_PART_BYTES + COLL_SHM_OFFER_BYTES + COLL_MAC_BYTES)
/* The accepting side's answer: u32 + MAC. The u32 is 0 (tcp), 1 (shared
 * memory taken) or a refusal, COLL_ANSWER_REFUSED | reason << 8 | the
 * acceptor's COLLECTIVES_NSOCKS << 16 | its COLLECTIVES_ENCRYPT << 24
 * (transport/select.c). */
#define COLL_ANSWER_BYTES (4 + COLL_MAC_BYTES)
#define COLL_ANSWER_REFUSED 2u
#define COLL_REFUSED_NSOCKS 1u /* the two ranks' COLLECTIVES_NSOCKS differ */
#define COLL_REFUSED_SOCKET 2u /* a connection index taken twice, or shm offered on a later one */
#define COLL_REFUSED_ENCRYPT 3u /* the two ranks' COLLECTIVES_ENCRYPT differ (the acceptor's
                                   is bit 24 of the answer), or the acceptor cannot encrypt */
/* An accepted connection whose opening has not fully arrived (comm->pending). */
struct coll_pending {
  int fd, got, challenged;
  unsigned char buf[COLL_OPENING_BYTES];
  unsigned char challenge[COLL_NONCE_BYTES]; /* sent once the hello was for us */
};

/* Connecting side: connect to peer's listener and send the opening. */
coll_result_t coll_tcp_dial(coll_comm_t *comm, int peer, double deadline, const void *opening,
                            size_t n, int *fd);
/* Accepting side: serve the listener (answering every complete opening, from
 * any peer, through coll_link_adopt) until peer's link exists. */
coll_result_t coll_tcp_accept_until(coll_comm_t *comm, int peer, double deadline);
/* Builds the link for an accepted connection from `peer` whose opening
 * (COLL_OPENING_BYTES) proved the link key over `challenge`, and answers its
 * offer (transport/select.c). */
void coll_link_adopt(coll_comm_t *comm, int peer, int fd, const unsigned char *opening,
                     const unsigned char *challenge);

/* SO_SNDBUF/SO_RCVBUF each TCP link gets, in bytes; 0: the kernel's
 * autotuning (COLLECTIVES_SOCKET_BUFFER, "auto" resolved). */
int coll_tcp_link_buffer(const coll_comm_t *comm);
/* The TCP listener every rank opens at creation (transport/tcp.c). */
coll_result_t coll_tcp_listen(coll_comm_t *comm, const char *bind_host);
/* Closes half-open handshakes and the listener. */
void coll_tcp_shutdown(coll_comm_t *comm);
/* Sends an abort notice (wire.h) with this rank's error to each peer marked
 * in `unlinked`; best effort, about a second at most. */
void coll_tcp_send_aborts(coll_comm_t *comm, const unsigned char *unlinked);

#endif
