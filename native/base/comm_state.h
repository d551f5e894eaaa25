/*
 * comm_state.h -- the native communicator's state: peers, links, sequence numbers,
 * deadlines, the broken state, and the progress thread for requests.
 * All state of the core hangs off this struct (no process globals beyond the
 * log and parameter caches), so every layer sees it; each part is read and
 * written by the layer that owns it (links and the listener by transport/,
 * the kept schedule arrays by schedule/, the queue by comm/). Types of the
 * layers above appear here only as incomplete structs.
 */
#ifndef COLL_COMM_STATE_H
#define COLL_COMM_STATE_H

#include <pthread.h>
#include <stdint.h>

#include "coll.h"
#include "base/auth.h"

/* Half-open connections a listener keeps beyond what the job's own openings
 * can need at once (every lower rank dialing all its COLLECTIVES_NSOCKS
 * connections): room for abort notices, liveness probes and strangers. A
 * listener's table holds rank x nsocks + COLL_MAX_PENDING (coll_tcp_listen);
 * when full, a stranger's connection goes first (transport/tcp.c). */
#define COLL_MAX_PENDING 256
/* The longest abort notice text a peer may send (transport/wire.h). */
#define COLL_ABORT_REASON_BYTES 96

typedef struct coll_link coll_link_t;       /* transport/transport.h */
struct coll_pending;                        /* an accepted connection's opening, transport/tcp.c */
struct pollfd;                              /* <poll.h> */

typedef struct {
  char host[256];
  int port;
  coll_link_t *link;  /* NULL until an algorithm first needs this peer (or it connected) */
  coll_link_t *dialing; /* a link this rank dialed whose answer has not come (transport/select.c) */
  coll_link_t *joining; /* a link from a lower rank whose sockets have not all arrived
                           (COLLECTIVES_NSOCKS > 1, transport/select.c) */
  char host_id[160];  /* equal for ranks that share a host (and its /dev/shm) */
} coll_peer_t;

struct coll_request {
  coll_request_t *next;
  coll_comm_t *comm;
  coll_result_t (*run)(coll_comm_t *, const coll_args_t *);
  coll_args_t args;
  coll_result_t result;
  int done;
  struct coll_p2p_op *p2p; /* point-to-point requests (p2p.c): the op, allocated with it */
};

struct coll_comm {
  int rank, size;
  uint8_t id[16];
  uint8_t link_key[COLL_KEY_BYTES]; /* from the job secret (coll_comm_set_link_key); zeros: none */
  int listen_fd, port;
  coll_peer_t *peers;
  /* Accepted connections whose hello has not fully arrived: max_pending
   * slots, allocated with the listener (transport/tcp.c), and room for a
   * poll() over them and the listener (pending_pfs, max_pending + 2). */
  struct coll_pending *pending;
  int npending, max_pending;
  struct pollfd *pending_pfs;
  uint32_t seq;          /* collective calls so far; carried in every header */
  int broken;
  coll_result_t broken_code;
  int err_set;           /* the first error of the current call is kept */
  char err[1536];
  /* The first abort notice received (a peer whose communicator broke,
   * transport/tcp.c): its rank, or -1, and its text. */
  int abort_from;
  char abort_reason[COLL_ABORT_REASON_BYTES];
  /* Why this rank refused a link opening that proved the job's key (a peer
   * with another COLLECTIVES_NSOCKS, or one that broke the opening's rules,
   * transport/select.c), or "": a wait for links fails with it at once. */
  char link_refused[256];
  double timeout;        /* default deadline, seconds */
  size_t segment_bytes;  /* COLLECTIVES_SEGMENT_BYTES; 0: auto (coll_comm_segment_bytes) */
  int sockbuf;           /* COLLECTIVES_SOCKET_BUFFER; -1: auto (coll_tcp_link_buffer) */
  double spin;           /* seconds to keep retrying before poll() */
  int oversubscribed;    /* the host runs more ranks than cores (coll_comm_set_oversubscribed) */
  int job_oversubscribed;/* some host of the job does (coll_comm_set_job_oversubscribed) */
  int all_shm;           /* coll_links_all_shm's answer: 0 not yet known, 1 yes, 2 no */
  struct coll_topo *topo;/* host groups and host order (algorithms/topology.c); NULL until
                            first needed, dropped when a host id changes */

  /* Progress thread: runs queued requests in order; blocking calls made
   * meanwhile wait for the queue to drain (coll_comm_enter). */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  int thread_started, stopping, busy;
  coll_request_t *qhead, *qtail;

  struct coll_cuda *cuda; /* stream, events, pools, IPC maps (cuda.c); NULL until a GPU call */
  struct coll_ipc_sig *ipc_sig; /* CUDA IPC links' interprocess events (transport/cuda_ipc.c);
                                 NULL until the first stream-ordered record */
  struct coll_p2p *p2p;   /* point-to-point state (p2p.c); NULL until the first one */

  /* Subcommunicators (comm/subcomm.c). A communicator made by
   * coll_comm_create is a root (root NULL, world/local NULL, ctx 0).
   * A subcommunicator (coll_comm_split) owns no socket, listener or
   * point-to-point state: it uses its root's links (peers[i].link is the
   * root's link to world[i], fetched through the root), the root's lock,
   * request queue and progress thread (so calls on the root and on all its
   * subcommunicators are serialized), and the root's point-to-point engine
   * with its own ctx on every message. A failure on either breaks the root
   * (its links are shared), and so every communicator over it. */
  coll_comm_t *root;
  coll_comm_t *parent;   /* NULL for a root */
  int *world;            /* sub: the root rank of each of its ranks */
  int *local;            /* sub: its rank for each root rank, or -1 */
  uint32_t ctx;          /* in every header (transport/wire.h) */
  uint32_t gen;          /* a root's generation (coll_comm_set_generation), in every header;
                            a subcommunicator's messages carry its root's */
  uint32_t nsplits;      /* splits and dups made from this communicator */
  int nchildren;         /* live subcommunicators made from it */
  int zombie;            /* destroyed while subcommunicators lived: everything but the
                            struct and its lock is gone; freed with the last of them */

  /* Arrays kept from one call to the next (calls are serialized): a
   * schedule's steps and edges and the host executor's scratch, so that a
   * small collective does not pay for six malloc/free pairs (schedule.c). */
  struct { void *steps, *edges, *scratch; int cap, ecap; size_t scratch_bytes; } keep;
};

/* CLOCK_MONOTONIC seconds (base/status.c). */
double coll_now(void);
/* now + timeout (the communicator default when timeout <= 0). */
static inline double coll_comm_deadline(const coll_comm_t *comm, double timeout) {
  return coll_now() + (timeout > 0 ? timeout : comm->timeout);
}
/* Marks the communicator broken after a failed collective: closes every link
 * so that the peers fail fast instead of waiting for their deadline. */
void coll_comm_break(coll_comm_t *comm, coll_result_t code);
/* Serialization with the progress thread and the other callers (comm.c):
 * coll_comm_enter waits for queued requests and takes the communicator
 * (COLL_INVALID_USAGE if broken); coll_comm_leave gives it back, breaking it
 * first if res is a failure other than an argument or usage error. */
coll_result_t coll_comm_enter(coll_comm_t *comm);
coll_result_t coll_comm_leave(coll_comm_t *comm, coll_result_t res);
/* A blocking collective: check (nothing sent on failure), enter, run, leave. */
coll_result_t coll_comm_blocking(coll_comm_t *comm, const coll_args_t *a,
                                 coll_result_t (*check)(coll_comm_t *, const coll_args_t *),
                                 coll_result_t (*run)(coll_comm_t *, const coll_args_t *));

/* Point-to-point hooks for the collectives (p2p.c). A message may be half
 * sent or half received on a link when a collective starts (a large Isend):
 * the collective's messages must not land inside it. coll_p2p_quiesce, at
 * the start, hands back half-read headers. Then the host executor calls
 * coll_p2p_drain before each send to / receive from a link: it moves the
 * half-done message on, and *clear says whether the collective's own bytes
 * may go. Waiting for that inside the collective, not before it, means a
 * rank never waits for a peer to read before joining the collective that
 * peer may be waiting in (coll_p2p_finish does wait: for GPU collectives,
 * whose executor has no such hook). */
coll_result_t coll_p2p_quiesce(coll_comm_t *comm, double deadline);
coll_result_t coll_p2p_drain(coll_comm_t *comm, coll_link_t *link, int sending, int *moved,
                             int *clear);
coll_result_t coll_p2p_finish(coll_comm_t *comm, double deadline);
/* For the executor's poll: 1 if a message to `peer` is half sent, | 2 if one
 * from it is half received (such links are watched even when no step of
 * the collective is ready on them). */
int coll_p2p_pending(coll_comm_t *comm, int peer);
/* A collective's executor read the header `hdr` of a point-to-point message
 * from `link`, followed by `nextra` bytes at `extra` (read with it): deliver
 * it (to a posted receive, else set aside) and hand bytes past its end back
 * to the link; the rest of its payload is read by coll_p2p_drain. */
coll_result_t coll_p2p_divert(coll_comm_t *comm, coll_link_t *link, const uint8_t *hdr,
                              const void *extra, size_t nextra, double deadline);
/* Fails every pending point-to-point request (at break and destroy) and frees
 * the state (destroy). */
void coll_p2p_fail_all(coll_comm_t *comm, coll_result_t code);
/* Receives posted on a subcommunicator (the one whose rank map is `local`)
 * that no message has matched yet, in its root's engine; forget: from now on
 * their status names root ranks (the subcommunicator is being freed). */
int coll_p2p_unmatched(coll_comm_t *root, const int *local, int forget);
void coll_p2p_destroy(coll_comm_t *comm);
coll_result_t coll_p2p_wait(coll_request_t *req);
coll_result_t coll_p2p_test(coll_request_t *req, int *done);
void coll_p2p_free(coll_request_t *req);

/* The communicator holding the links, lock and queue: comm itself, or a
 * subcommunicator's root. */
static inline coll_comm_t *coll_comm_root(coll_comm_t *comm) { return comm->root ? comm->root : comm; }
/* Appends to a failed subcommunicator's error text which numbering it uses
 * (its ranks and the root ranks they are), comm/subcomm.c; no-op on a root. */
void coll_subcomm_explain(coll_comm_t *comm);
/* coll_comm_destroy's part for a subcommunicator. */
void coll_subcomm_destroy(coll_comm_t *comm);
/* At the end of destroying comm, with its links, thread and state gone:
 * nonzero if subcommunicators made from it live, which then keep the struct
 * (marked zombie, broken) until the last of them is destroyed. */
int coll_subcomm_keep(coll_comm_t *comm);

#endif
