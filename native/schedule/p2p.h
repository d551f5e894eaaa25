/*
 * p2p.h -- the point-to-point engine's state, shared by p2p.c (matching,
 * posting, moving bytes, the collectives' hooks) and p2p_wait.c (waiting,
 * requests, the API). Private to the core.
 */
#ifndef COLL_P2P_H
#define COLL_P2P_H

#include <poll.h>

#include "base/comm_state.h"
#include "transport/wire.h"

enum { OP_QUEUED = 0, OP_MOVING = 1, OP_DONE = 2 };

typedef struct coll_p2p_op {
  struct coll_p2p_op *next; /* posted receives, or the peer's send queue */
  coll_request_t *req;
  int is_send, state;
  int alloc;                /* receive of any size: buf is allocated at the match */
  int peer, tag;            /* a receive's may be COLL_ANY_*; peer is a root rank */
  uint32_t ctx;             /* the communicator's context id (comm/subcomm.c) */
  const int *local;         /* a subcommunicator's rank of each root rank; NULL on a root */
  coll_dtype_t dtype;
  void *buf;                /* receive */
  const void *sbuf;         /* send */
  size_t count;             /* send: elements; receive: capacity */
  double start, deadline;
  coll_status_t status;
  int sync;                 /* Ssend: done when the receiver's COLL_WIRE_P2P_ACK for
                               wseq comes back (a send to itself: when its message
                               is matched), not when the link took the bytes */
  int ack;                  /* an ack the engine sends: no request waits on it, it is
                               freed once sent (p2p_op_done) */
  int probe;                /* a probe's target: done when a message that fits has its
                               envelope here (coll_probe) */
  uint32_t wseq;            /* the sequence number the message left with */
} coll_p2p_op_t;

typedef struct p2p_msg {    /* arrived before its receive was posted */
  struct p2p_msg *next;
  int peer, tag;
  coll_dtype_t dtype;
  size_t count, nbytes, got;
  unsigned char *data;
  coll_p2p_op_t *claimed;   /* a receive posted while the payload was still arriving */
  uint32_t ctx;             /* the context id in its header */
  int sync;                 /* sent with Ssend: matching it acks sync_seq to peer */
  uint32_t sync_seq;
  coll_p2p_op_t *sync_op;   /* sent to itself with Ssend: matching it completes this */
} p2p_msg_t;

enum { HELD_NO = 0, HELD_COLLECTIVE = 1, HELD_FULL = 2 };

typedef struct {
  coll_p2p_op_t *sq, *sq_tail;
  uint8_t shdr[COLL_WIRE_HDR_BYTES];
  size_t shdr_done, sdone;
  int sending;              /* the head's header is encoded */
  uint32_t send_seq, recv_seq;
  uint8_t rhdr[COLL_WIRE_HDR_BYTES];
  size_t rhdr_got;
  int reading;              /* a payload is arriving into rdst */
  unsigned char *rdst;
  size_t rnbytes, rdone;
  coll_p2p_op_t *rop;
  p2p_msg_t *rmsg;
  int held;                 /* per pass: the next bytes are not for us now */
  int hvalid;               /* the envelope of the message held (HELD_FULL) in the
                               link, for a probe: valid until its header is taken */
  int htag;
  uint32_t hctx;
  coll_dtype_t hdtype;
  size_t hcount;
} p2p_peer_t;

struct coll_p2p {
  p2p_peer_t *peers;
  coll_p2p_op_t *posted, *posted_tail;
  p2p_msg_t *unexp, *unexp_tail;
  size_t unexp_bytes, unexp_limit;
  struct pollfd *pfs;
  int npfs_cap;
  int nhalf; /* during a collective: links with a message of ours half sent */
  coll_p2p_op_t *acked;  /* Ssends sent whole, waiting for their receiver's ack */
  int nacks;             /* acks queued to send (engine-owned ops) */
  coll_p2p_op_t *probe;  /* the probe the engine runs for, if any (its holder's) */
};

static inline int half_sent(const p2p_peer_t *pp) { return pp->sending && pp->shdr_done > 0; }

/* The state, made on first use (under comm->mu). */
coll_result_t p2p_state_get(coll_comm_t *comm);
/* Completes op with res and wakes waiters (under comm->mu). */
void p2p_op_done(coll_comm_t *comm, coll_p2p_op_t *op, coll_result_t res);
coll_result_t p2p_check_args(coll_comm_t *comm, const coll_args_t *a, int is_send);
/* Posts a send or receive; *out is its request. A receive that meets a kept
 * message of another size or dtype fails and names in *to_break the
 * communicator that the mismatch breaks (the caller breaks it). */
coll_result_t p2p_post(coll_comm_t *comm, const coll_args_t *a, int is_send, coll_request_t **out,
                       coll_comm_t **to_break);
/* is_send for p2p_post: a synchronous send (Ssend). */
#define P2P_SSEND 2
/* The first message that fits (ctx, root rank peer or COLL_ANY_SOURCE, tag or
 * COLL_ANY_TAG) whose header has arrived and no receive has claimed, in the
 * order a receive would take it: into *st (source in the numbering of local),
 * 1 if found (under comm->mu). */
int p2p_probe_find(coll_comm_t *comm, uint32_t ctx, int peer, int tag, const int *local,
                   coll_status_t *st);
/* Cancels an Ssend to this rank itself that no receive has taken: its message
 * is dropped; 1 if it was (under comm->mu). */
int p2p_cancel_self_ssend(coll_comm_t *comm, coll_p2p_op_t *op);
/* Moves this peer's queued sends (one: only the message under way) and
 * reads what it sent (one: only the rest of the message under way), as far
 * as the link goes without blocking. Holder of the communicator only. */
coll_result_t p2p_push_sends(coll_comm_t *comm, p2p_peer_t *pp, coll_link_t *link, int one,
                             int *moved);
coll_result_t p2p_pull(coll_comm_t *comm, p2p_peer_t *pp, coll_link_t *link, int one, int *moved);

#endif
