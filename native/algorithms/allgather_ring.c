/*
 * allgather_ring.c -- ring allgatherv, and the ring reduce-scatter used by
 * Reduce_scatter_block.
 *
 * Allgatherv: rank r's block b_r (counts[r] elements at displs[r]) travels
 * around the ring. At step s (0..n-2) rank r sends block (r - s) to r+1 and
 * receives block (r - s - 1) from r-1, straight into recvbuf:
 *
 *          step:   0     1     2
 *   rank 0 sends   b0    b3    b2        (n = 4)
 *   rank 0 recvs   b3    b2    b1
 *
 * Blocks may differ in size (zero too); each block is cut into its own
 * segments, and segment j of a block is forwarded as soon as it has arrived.
 * Step 0 sends from sendbuf, so the local copy into recvbuf overlaps the
 * network. Cost: (n-1) alpha + (n-1)/n S beta.
 *
 * Both run over host-order positions (topology.h): the ring's neighbours
 * share a host except at H hops, whatever the rank numbering; the blocks
 * stay those of the ranks (v is a position, order[v] its rank).
 *
 * Reduce-scatter (blocks of equal size): step s sends block (r - s - 1) and
 * reduces the incoming block (r - s - 2) into tmp (tmp = in op incoming), so
 * that after n-1 steps rank r holds the full reduction of its own block r.
 * Cost: (n-1) alpha + (n-1)/n S beta.
 */
#include <stdlib.h>

#include "algorithms/algorithms.h"
#include "base/comm_state.h"
#include "algorithms/pattern.h"
#include "algorithms/topology.h"
#include "base/status.h"

coll_result_t coll_allgatherv_ring(coll_sched_t *s, const coll_args_t *a) {
  coll_comm_t *comm = s->comm;
  const coll_topo_t *t = coll_comm_topo(comm);
  if (!t) return COLL_SYSTEM_ERROR;
  int n = comm->size, r = comm->rank, v = coll_topo_pos(t, r);
  int next = coll_topo_at(t, coll_ring_next(v, n)), prev = coll_topo_at(t, coll_ring_prev(v, n));
  size_t elem = s->elem, total = 0;
  for (int i = 0; i < n; i++) total += a->counts[i];
  s->hdr.count = total; /* what every rank must agree on */
  char *out = a->recvbuf;
  const char *own = a->sendbuf;
  size_t own_off = a->displs[r] * elem, own_len = a->count * elem;
  if (own != out + own_off && own_len) coll_sched_copy(s, out + own_off, own, own_len);
  if (n == 1) return COLL_SUCCESS;

  /* last[j]: receive of segment j of the block forwarded next */
  int maxseg = 1;
  for (int i = 0; i < n; i++) {
    int k = coll_sched_nseg(s, a->counts[i] * elem);
    if (k > maxseg) maxseg = k;
  }
  int *last = malloc((size_t)maxseg * sizeof(int));
  if (!last) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", r);
  for (int j = 0; j < maxseg; j++) last[j] = -1;
  for (int step = 0; step < n - 1; step++) {
    int sb = coll_topo_at(t, coll_mod(v - step, n)), rb = coll_topo_at(t, coll_mod(v - step - 1, n));
    size_t so = a->displs[sb] * elem, sl = a->counts[sb] * elem;
    size_t ro = a->displs[rb] * elem, rl = a->counts[rb] * elem;
    const char *src = step == 0 ? own - so : out; /* step 0: our block, from sendbuf */
    int sseg = coll_sched_nseg(s, sl), rseg = coll_sched_nseg(s, rl);
    for (int j = 0; j < sseg; j++) {
      size_t o, l;
      coll_sched_seg(s, sl, sseg, j, &o, &l);
      coll_sched_after(s, coll_sched_send(s, next, src + so + o, l, so + o), last[j]);
    }
    for (int j = 0; j < rseg; j++) {
      size_t o, l;
      coll_sched_seg(s, rl, rseg, j, &o, &l);
      last[j] = coll_sched_recv(s, prev, out + ro + o, l, ro + o);
    }
  }
  free(last);
  return COLL_SUCCESS;
}

coll_result_t coll_reduce_scatter_ring(coll_sched_t *s, const coll_args_t *a, void *tmp) {
  coll_comm_t *comm = s->comm;
  const coll_topo_t *t = coll_comm_topo(comm);
  if (!t) return COLL_SYSTEM_ERROR;
  int n = comm->size, r = comm->rank, v = coll_topo_pos(t, r);
  int next = coll_topo_at(t, coll_ring_next(v, n)), prev = coll_topo_at(t, coll_ring_prev(v, n));
  size_t block = a->count * s->elem;
  const char *in = a->sendbuf;
  char *work = tmp;
  int nseg = coll_sched_nseg(s, block);
  int *last = malloc((size_t)nseg * sizeof(int));
  if (!last) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", r);
  for (int j = 0; j < nseg; j++) last[j] = -1;
  for (int step = 0; step < n - 1; step++) {
    size_t so = (size_t)coll_topo_at(t, coll_mod(v - step - 1, n)) * block;
    size_t ro = (size_t)coll_topo_at(t, coll_mod(v - step - 2, n)) * block;
    const char *src = step == 0 ? in : work;
    for (int j = 0; j < nseg; j++) {
      size_t o, l;
      coll_sched_seg(s, block, nseg, j, &o, &l);
      coll_sched_after(s, coll_sched_send(s, next, src + so + o, l, so + o), last[j]);
      last[j] = coll_sched_recv_reduce(s, prev, work + ro + o, in + ro + o, l, ro + o);
    }
  }
  free(last);
  return COLL_SUCCESS;
}
