/*
 * comm.h -- the native communicator: peers, links, sequence numbers,
 * deadlines, the broken state, and the progress thread for requests.
 * All state of the core hangs off this struct (no process globals beyond the
 * log and parameter caches).
 */
#ifndef COLL_COMM_H
#define COLL_COMM_H

#include <pthread.h>
#include <stdint.h>

#include "coll.h"
#include "transport.h"

#define COLL_MAX_PENDING 64

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
  uint8_t link_key[COLL_KEY_BYTES]; /* from the job secret (coll_comm_set_link_key); zeros: none */
  int listen_fd, port;
  coll_peer_t *peers;
  /* Accepted connections whose hello has not fully arrived (transport_tcp.c). */
  struct {
    int fd, got, challenged;
    unsigned char buf[COLL_OPENING_BYTES];
    unsigned char challenge[COLL_NONCE_BYTES]; /* sent once the hello was for us */
  } pending[COLL_MAX_PENDING];
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
  int job_oversubscribed; /* some host of the job does: 0 not said (then: this host), 1 no, 2 yes */
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

/* CLOCK_MONOTONIC seconds. */
double coll_now(void);
/* now + timeout (the communicator default when timeout <= 0). */
double coll_comm_deadline(const coll_comm_t *comm, double timeout);
/* Marks the communicator broken after a failed collective: closes every link
 * so that the peers fail fast instead of waiting for their deadline. */
void coll_comm_break(coll_comm_t *comm, coll_result_t code);

#endif
