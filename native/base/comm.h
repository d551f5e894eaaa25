/*
 * comm.h -- the native communicator's state: peers, links, sequence numbers,
 * deadlines, the broken state, and the progress thread for requests.
 * All state of the core hangs off this struct (no process globals beyond the
 * log and parameter caches), so every layer sees it; each part is read and
 * written by the layer that owns it (links and the listener by transport/,
 * the kept schedule arrays by schedule/, the queue by comm/). Types of the
 * layers above appear here only as incomplete structs.
 */
#ifndef COLL_COMM_H
#define COLL_COMM_H

#include <pthread.h>
#include <stdint.h>

#include "coll.h"

#define COLL_MAX_PENDING 64
/* The longest abort notice text a peer may send (transport/wire.h). */
#define COLL_ABORT_REASON_BYTES 96

typedef struct coll_link coll_link_t;       /* transport/transport.h */
struct coll_pending;                        /* an accepted connection's opening, transport/tcp.c */

typedef struct {
  char host[256];
  int port;
  coll_link_t *link;  /* NULL until an algorithm first needs this peer (or it connected) */
  char host_id[160];  /* equal for ranks that share a host (and its /dev/shm) */
} coll_peer_t;

struct coll_request {
  coll_request_t *next;
  coll_comm_t *comm;
  coll_result_t (*run)(coll_comm_t *, const coll_args_t *);
  coll_args_t args;
  coll_result_t result;
  int done;
};

struct coll_comm {
  int rank, size;
  uint8_t id[16];
  int listen_fd, port;
  coll_peer_t *peers;
  /* Accepted connections whose hello has not fully arrived: COLL_MAX_PENDING
   * slots, allocated with the listener (transport/tcp.c). */
  struct coll_pending *pending;
  int npending;
  uint32_t seq;          /* collective calls so far; carried in every header */
  int broken;
  coll_result_t broken_code;
  int err_set;           /* the first error of the current call is kept */
  char err[1536];
  /* The first abort notice received (a peer whose communicator broke,
   * transport_tcp.c): its rank, or -1, and its text. */
  int abort_from;
  char abort_reason[COLL_ABORT_REASON_BYTES];
  double timeout;        /* default deadline, seconds */
  size_t segment_bytes;  /* COLLECTIVES_SEGMENT_BYTES; 0: auto (coll_comm_segment_bytes) */
  int sockbuf;           /* COLLECTIVES_SOCKET_BUFFER; -1: auto (coll_tcp_link_buffer) */
  double spin;           /* seconds to keep retrying before poll() */
  int oversubscribed;    /* the host runs more ranks than cores (coll_comm_set_oversubscribed) */
  int job_oversubscribed;/* some host of the job does (coll_comm_set_job_oversubscribed) */
  int all_shm;           /* coll_links_all_shm's answer: 0 not yet known, 1 yes, 2 no */

  /* Progress thread: runs queued requests in order; blocking calls made
   * meanwhile wait for the queue to drain (coll_comm_enter). */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  int thread_started, stopping, busy;
  coll_request_t *qhead, *qtail;

  struct coll_cuda *cuda; /* stream, events, pools, IPC maps (cuda.c); NULL until a GPU call */

  /* Arrays kept from one call to the next (calls are serialized): a
   * schedule's steps and edges and the host executor's scratch, so that a
   * small collective does not pay for six malloc/free pairs (schedule.c). */
  struct { void *steps, *edges, *scratch; int cap, ecap; size_t scratch_bytes; } keep;
};

/* CLOCK_MONOTONIC seconds (base/status.c). */
double coll_now(void);

#endif
