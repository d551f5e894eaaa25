/*
 * schedule.h -- the step vocabulary algorithms are written in, and its executor.
 *
 * An algorithm builds a schedule: a list of steps, each a message to or from
 * one peer (or a local copy), with "runs after" edges between them. The
 * executor (schedule.c) runs every step whose predecessors are done, keeping
 * sends and receives on many links in flight at once, and blocks in poll()
 * when nothing can move. Steps on one link leave and arrive in the order they
 * were added, so both ends of a link must add their steps for it in the same
 * order (they do, since both derive them from the same arithmetic).
 *
 *   send(peer, src, n, off)                 header + n bytes from src
 *   recv(peer, dst, n, off)                 n bytes straight into dst
 *   recv_reduce(peer, dst, local, n, off)   dst = local op incoming, reduced
 *                                           as it arrives (staged in L2-sized
 *                                           pieces); dst may be local
 *   copy(dst, src, n)                       local memcpy
 *   recv_reduce_send / recv_copy_send       a receive followed by forwarding
 *                                           the same bytes (pipelining idiom)
 *
 * `off` is the byte offset of the payload in the collective's buffer; it goes
 * in the header and is checked on receipt. No algorithm touches a socket.
 */
#ifndef COLL_SCHEDULE_H
#define COLL_SCHEDULE_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "reduce/reduce.h"
#include "transport/transport.h"
#include "transport/wire.h"
#include "base/stall.h"

typedef enum { COLL_STEP_SEND, COLL_STEP_RECV, COLL_STEP_RECV_REDUCE, COLL_STEP_COPY } coll_step_kind_t;

typedef struct {
  uint8_t kind;
  /* SEND: a receive from the same peer waits for this send to complete (an
   * exchange, as butterfly's), so it never goes by single copy: the peer's
   * matching receive may wait the same way for its own send, and only the
   * ring's buffering breaks that cycle. Set by the executor. */
  uint8_t no_sc;
  int peer;
  void *dst;
  const void *src;  /* SEND: payload; RECV_REDUCE: local operand; COPY: source */
  size_t nbytes;
  uint64_t offset;
  int npred;        /* unfinished predecessors */
  int succ_begin, succ_end; /* successors in the executor's edge table */
} coll_step_t;

typedef struct {
  coll_comm_t *comm;
  coll_wire_hdr_t hdr;     /* coll, redop, dtype, seq, aux, count; nbytes/offset per step */
  coll_reduce_fn reduce;
  size_t elem;             /* element size in bytes */
  size_t segment_bytes;    /* pipelining segment, a multiple of elem */
  coll_step_t *steps;
  int nsteps, cap;
  int (*edges)[2];         /* (pred, succ) */
  int nedges, ecap;
  int oom;
} coll_sched_t;

/* Starts a schedule for one collective call; takes the next sequence number. */
void coll_sched_init(coll_sched_t *s, coll_comm_t *comm, coll_kind_t kind, const coll_args_t *args,
                     uint32_t aux);
void coll_sched_free(coll_sched_t *s);

int coll_sched_send(coll_sched_t *s, int peer, const void *src, size_t n, uint64_t off);
int coll_sched_recv(coll_sched_t *s, int peer, void *dst, size_t n, uint64_t off);
int coll_sched_recv_reduce(coll_sched_t *s, int peer, void *dst, const void *local, size_t n,
                           uint64_t off);
int coll_sched_copy(coll_sched_t *s, void *dst, const void *src, size_t n);
/* `step` runs after `pred` completes; pred < 0 is no dependency. Returns step. */
int coll_sched_after(coll_sched_t *s, int step, int pred);

/* Receive (reduced into dst) from `from`, then forward dst to `to`. Returns the send. */
int coll_sched_recv_reduce_send(coll_sched_t *s, int from, int to, void *dst, const void *local,
                                size_t n, uint64_t off);
/* Receive into dst from `from`, then forward it to `to`. Returns the send. */
int coll_sched_recv_copy_send(coll_sched_t *s, int from, int to, void *dst, size_t n, uint64_t off);

/* Number of pipelining segments for a region of n bytes (at least 1). */
int coll_sched_nseg(const coll_sched_t *s, size_t n);
/* Byte range of segment i of nseg over a region of n bytes, cut on element
 * boundaries. */
void coll_sched_seg(const coll_sched_t *s, size_t n, int nseg, int i, size_t *off, size_t *len);

/* Runs the schedule to completion or to the first error (by `deadline`). */
coll_result_t coll_sched_run(coll_sched_t *s, double deadline);
/* The same for a schedule over GPU buffers (schedule/device.c): CUDA IPC to
 * same-host peers, pinned host staging to the others. */
coll_result_t coll_sched_run_device(coll_sched_t *s, double deadline);

/* The wire header of one step's message (the schedule's, with its size and
 * offset). */
coll_wire_hdr_t coll_sched_step_hdr(const coll_sched_t *s, const coll_step_t *st);
/* Sends what is left of a message's header (hdr, *hdr_done bytes gone) and
 * then `len` payload bytes from `payload`, as far as the link takes them;
 * adds the payload bytes moved to *sent; *full when the link took less than
 * offered. */
coll_result_t coll_link_send_framed(coll_link_t *link, const uint8_t *hdr, size_t *hdr_done,
                                    const void *payload, size_t len, size_t *sent, int *full);

/* For the executors' sleep in poll(): adds the descriptors of `link` for
 * events `ev` (wait_events' answer, or POLLRDHUP alone to watch for a
 * hang-up) to pfs and returns how many (at most 2: the socket, and the
 * transport's own wake-up descriptor where it has one). */
int coll_link_pollfds(const coll_link_t *link, int ev, struct pollfd *pfs);
/* Hands the results in pfs[0, npf) that concern `link` to its transport;
 * sets *hup when its socket hung up. */
coll_result_t coll_link_polled(coll_link_t *link, const struct pollfd *pfs, int npf, int *hup);

/* The receive of a single-copy message whose header (flagged
 * COLL_WIRE_SC_DESC) has been checked: reads the rest of the descriptor
 * (desc, *desc_got bytes so far), then the payload from the peer's memory,
 * and acknowledges it; *done when the step is complete (schedule/single_copy.c). */
coll_result_t coll_sched_sc_recv(coll_sched_t *s, coll_link_t *link, coll_step_t *st, uint8_t *desc,
                                 size_t *desc_got, int *moved, int *done);

/* A small allreduce run without a schedule where it can (schedule/fast.c):
 * butterfly's full exchange over shared-memory links that exist already,
 * wire-identical to the schedule. *handled = 0: take the general path. */
coll_result_t coll_fast_allreduce(coll_comm_t *comm, const coll_args_t *a, coll_algo_t algo,
                                  int *handled);

/* For the executors: each step's successor range in succ (nedges entries)
 * and its predecessor count; cnt is n ints of scratch. */
void coll_sched_link_edges(coll_sched_t *s, int *succ, int *cnt);

#endif
