/*
 * allreduce_ring.c -- ring allreduce (Baidu/Patarasuk-Yuan): reduce-scatter,
 * then allgather, over a ring r -> r+1.
 *
 * The buffer is cut into n chunks (balanced, chunk c = coll_split(count, n, c))
 * and each chunk into segments of about COLLECTIVES_SEGMENT_BYTES. With n = 4,
 * rank r at step s:
 *
 *   reduce-scatter, s = 0..n-2:  send chunk (r-s), receive chunk (r-s-1) and
 *                                reduce it into out (out = in op incoming)
 *   allgather,      s = 0..n-2:  send chunk (r+1-s), receive chunk (r-s)
 *                                straight into out
 *
 *          step:   rs0   rs1   rs2   ag0   ag1   ag2
 *   rank 0 sends   c0    c3    c2    c1    c0    c3
 *   rank 0 recvs   c3    c2    c1    c0    c3    c2
 *
 * After reduce-scatter rank r owns the full sum of chunk (r+1); every chunk
 * is reduced once, in ring order, at one rank, so all ranks end with the
 * same bits.
 *
 * Pipelining: segment j of the chunk sent at step s+1 only waits for segment
 * j of the receive at step s, so a rank forwards a segment while the next is
 * still arriving, and each link carries several segments at once (the socket
 * buffers hold them). Whole-chunk steps would alternate idle send and receive
 * phases; segments keep both directions busy.
 *
 * Cost: 2(n-1) alpha + 2 (n-1)/n S beta (bandwidth-optimal); with k segments
 * per chunk the alpha term grows to about 2(n-1)+k messages per link, the
 * pipeline's fill.
 *
 * Ranks are placed on the ring in host order (topology.h): r above is a
 * rank's position, so that only H of the n hops cross between hosts
 * whatever the rank numbering.
 *
 * Out-of-place needs no extra copy: the first reduction of a chunk reads the
 * caller's sendbuf as its local operand, and the first send of a rank's own
 * chunk reads sendbuf too.
 */
#include <stdlib.h>

#include "algorithms/algorithms.h"
#include "base/comm_state.h"
#include "algorithms/pattern.h"
#include "algorithms/topology.h"
#include "base/status.h"

coll_result_t coll_allreduce_ring(coll_sched_t *s, const coll_args_t *a) {
  coll_comm_t *comm = s->comm;
  const coll_topo_t *t = coll_comm_topo(comm);
  if (!t) return COLL_SYSTEM_ERROR;
  int n = comm->size, r = coll_topo_pos(t, comm->rank); /* position on the ring */
  int next = coll_topo_at(t, coll_ring_next(r, n)), prev = coll_topo_at(t, coll_ring_prev(r, n));
  size_t elem = s->elem;
  const char *in = a->sendbuf;
  char *out = a->recvbuf;

  /* Segments per chunk, the same for every chunk so that "segment j of the
   * previous step" is well defined; chunks differ by at most one element. */
  size_t chunk0 = (a->count / (size_t)n + (a->count % (size_t)n ? 1 : 0)) * elem;
  int nseg = coll_sched_nseg(s, chunk0);
  /* last[j]: the step that last wrote segment j of the chunk we forward next */
  int *last = malloc((size_t)nseg * sizeof(int));
  if (!last) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
  for (int j = 0; j < nseg; j++) last[j] = -1;

  for (int phase = 0; phase < 2; phase++) {
    for (int step = 0; step < n - 1; step++) {
      int sc = phase == 0 ? coll_ring_rs_send_chunk(r, n, step) : coll_ring_ag_send_chunk(r, n, step);
      int rc = phase == 0 ? coll_ring_rs_recv_chunk(r, n, step) : coll_ring_ag_recv_chunk(r, n, step);
      size_t so, sl, ro, rl;
      coll_split(a->count, n, sc, &so, &sl);
      coll_split(a->count, n, rc, &ro, &rl);
      so *= elem; sl *= elem; ro *= elem; rl *= elem;
      /* The chunk sent in the first reduce-scatter step is still unreduced
       * input; everything sent later has been written into out. */
      const char *src = (phase == 0 && step == 0) ? in : out;
      for (int j = 0; j < nseg; j++) {
        size_t o, l;
        coll_sched_seg(s, sl, nseg, j, &o, &l);
        coll_sched_after(s, coll_sched_send(s, next, src + so + o, l, so + o), last[j]);
        coll_sched_seg(s, rl, nseg, j, &o, &l);
        if (phase == 0)
          last[j] = coll_sched_recv_reduce(s, prev, out + ro + o, in + ro + o, l, ro + o);
        else
          last[j] = coll_sched_recv(s, prev, out + ro + o, l, ro + o);
      }
    }
  }
  free(last);
  return COLL_SUCCESS;
}
