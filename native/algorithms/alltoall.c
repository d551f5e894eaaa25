/*
 * alltoall.c -- alltoallv (contracts in coll.h), host memory: a pairwise
 * exchange.
 *
 * Rank r sends block j of its sendbuf to rank j and receives rank j's block
 * for it into block j of its recvbuf. In step k = 1 .. n-1 it sends to
 * (r + k) mod n and receives from (r - k) mod n, so every step is a perfect
 * matching of senders and receivers and no link carries two steps' bytes at
 * once; step k's send waits for step k-1's receive, which keeps at most two
 * steps in flight per rank. Its own block is a local copy.
 *
 *   step k:   r -> r+k,   r-k -> r          n = 4, rank 0: k=1: 0->1, 3->0
 *                                                          k=2: 0->2, 2->0
 *                                                          k=3: 0->3, 1->0
 *   cost: (n - 1)·alpha + (n - 1)/n·S·beta for S bytes per rank (evenly split),
 *   the bound for a rank's link. (A Bruck-style schedule would cut the alpha
 *   term to log2(n) for tiny blocks at the price of forwarding; not measured
 *   here, so not built.)
 *
 * Block sizes differ per pair (alltoallv), so the header's count is 0 and
 * each message's size is checked against what its receiver expects: a pair
 * that disagrees fails with both sizes.
 */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "base/comm_state.h"
#include "algorithms/pattern.h"
#include "schedule/schedule.h"
#include "base/status.h"

coll_result_t coll_check_alltoallv(coll_comm_t *comm, const coll_args_t *a) {
  comm->err_set = 0;
  int n = comm->size;
  if ((unsigned)a->dtype >= COLL_NUM_DTYPES)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "alltoallv: invalid dtype %d", (int)a->dtype);
  if (a->memory != COLL_MEMORY_HOST)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "alltoallv takes host buffers");
  if (!a->counts || !a->displs)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "alltoallv needs counts and displacements");
  size_t limit = ((size_t)1 << 48) / coll_dtype_size(a->dtype);
  for (int i = 0; i < 2 * n; i++) {
    if (a->counts[i] > limit || a->displs[i] > limit)
      return coll_error(comm, COLL_INVALID_ARGUMENT, "alltoallv: count or displacement too large");
    if (a->counts[i] && !(i < n ? a->sendbuf : a->recvbuf))
      return coll_error(comm, COLL_INVALID_ARGUMENT, "alltoallv: NULL buffer with a nonzero count");
  }
  if (a->counts[comm->rank] != a->counts[n + comm->rank])
    return coll_error(comm, COLL_INVALID_ARGUMENT,
                      "alltoallv: rank %d sends itself %zu elements but expects %zu", comm->rank,
                      a->counts[comm->rank], a->counts[n + comm->rank]);
  return COLL_SUCCESS;
}

coll_result_t coll_run_alltoallv(coll_comm_t *comm, const coll_args_t *a) {
  int n = comm->size, r = comm->rank;
  size_t elem = coll_dtype_size(a->dtype);
  const size_t *scount = a->counts, *rcount = a->counts + n;
  const size_t *sdispl = a->displs, *rdispl = a->displs + n;
  const char *in = a->sendbuf;
  char *out = a->recvbuf, *copy = NULL;
  if (a->sendbuf == a->recvbuf) {
    /* In place: the blocks to send are read from a copy, since received
     * blocks overwrite recvbuf while others are still to go. */
    size_t end = 0;
    for (int i = 0; i < n; i++)
      if ((sdispl[i] + scount[i]) * elem > end) end = (sdispl[i] + scount[i]) * elem;
    copy = malloc(end + 1);
    if (!copy) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", r);
    memcpy(copy, in, end);
    in = copy;
  }
  coll_sched_t s;
  coll_sched_init(&s, comm, COLL_KIND_ALLTOALL, a, 0);
  s.hdr.count = 0;
  if (scount[r] && out + rdispl[r] * elem != in + sdispl[r] * elem)
    coll_sched_copy(&s, out + rdispl[r] * elem, in + sdispl[r] * elem, scount[r] * elem);
  int prev_recv = -1;
  for (int k = 1; k < n; k++) {
    int to = coll_mod(r + k, n), from = coll_mod(r - k, n);
    size_t sl = scount[to] * elem, rl = rcount[from] * elem;
    int nsend = coll_sched_nseg(&s, sl), nrecv = coll_sched_nseg(&s, rl), last = -1;
    for (int j = 0; j < nsend; j++) {
      size_t o, l;
      coll_sched_seg(&s, sl, nsend, j, &o, &l);
      coll_sched_after(&s, coll_sched_send(&s, to, in + sdispl[to] * elem + o, l, o), prev_recv);
    }
    for (int j = 0; j < nrecv; j++) {
      size_t o, l;
      coll_sched_seg(&s, rl, nrecv, j, &o, &l);
      last = coll_sched_recv(&s, from, out + rdispl[from] * elem + o, l, o);
    }
    prev_recv = last;
  }
  coll_result_t res = s.oom ? coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", r)
                            : coll_sched_run(&s, coll_comm_deadline(comm, a->timeout));
  coll_sched_free(&s);
  free(copy);
  return res;
}

