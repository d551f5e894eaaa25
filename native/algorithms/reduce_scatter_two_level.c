/*
 * reduce_scatter_two_level.c -- host-aware reduce-scatter (equal blocks):
 * reduce inside each host, one partial per destination across hosts.
 *
 * Names (topology.h): rank d is local rank l_d on host h_d; host h runs L_h
 * ranks. Block d of every rank's input is reduced into tmp + d * block on
 * rank d:
 *
 *   A  inside host h != h_d   every rank of h sends its block d to the
 *                             aggregator a_h(d) = the rank of h with local
 *                             rank l_d mod L_h, which reduces them in local
 *                             order: tmp_d = in_d op x_1 op ...
 *   B  rails                  a_h(d) sends its partial tmp_d to d
 *   A' inside host h_d        every other rank of h_d sends its block d to d
 *   final, at d               tmp_d = in_d op (A' in local order) op (B in
 *                             host order)
 *
 * Each host link carries one partial per destination on another host,
 * (n - L_h) blocks out and L_h (H-1) in: (H-1)/H S each way for even hosts,
 * the least possible, in one network step (a ring over n ranks takes n-1):
 * 1 alpha_net + 1 alpha_shm + (H-1)/H S beta_net.
 *
 * Blocks are cut into segments; steps are added destination by destination,
 * segment by segment, in the same order on every rank (both ends of every
 * link agree on its order; every step depends only on earlier ones). A
 * block is reduced at one rank only, so its bits are the same whatever the
 * timing.
 */
#include "algorithms/algorithms.h"
#include "algorithms/pattern.h"
#include "algorithms/topology.h"
#include "base/comm_state.h"

coll_result_t coll_reduce_scatter_two_level(coll_sched_t *s, const coll_args_t *a, void *tmp) {
  coll_comm_t *comm = s->comm;
  const coll_topo_t *t = coll_comm_topo(comm);
  if (!t) return COLL_SYSTEM_ERROR;
  int n = comm->size, r = comm->rank, H = t->nhosts, hm = t->host[r], L = coll_topo_lsize(t, hm);
  size_t block = a->count * s->elem;
  const char *in = a->sendbuf;
  char *work = tmp;
  int nseg = coll_sched_nseg(s, block);

  for (int d = 0; d < n; d++) {
    int hd = t->host[d], ld = t->local[d];
    int agg = hd == hm ? d : coll_topo_rank(t, hm, ld % L); /* who reduces block d here */
    size_t base = (size_t)d * block;
    for (int k = 0; k < nseg; k++) {
      size_t o, l;
      coll_sched_seg(s, block, nseg, k, &o, &l);
      size_t off = base + o;
      if (r != agg) { /* A, A': our block d to whoever reduces it on our host */
        coll_sched_send(s, agg, in + off, l, off);
        continue;
      }
      const char *acc = in;
      int dep = -1;
      for (int i = 0; i < L; i++) {
        int q = coll_topo_rank(t, hm, i);
        if (q == r) continue;
        int st = coll_sched_recv_reduce(s, q, work + off, acc + off, l, off);
        dep = coll_sched_after(s, st, dep);
        acc = work;
      }
      if (r != d) { /* B: our host's partial (our input alone if we are the host) to d */
        coll_sched_after(s, coll_sched_send(s, d, acc + off, l, off), dep);
        continue;
      }
      for (int h = 0; h < H; h++) { /* final: the other hosts' partials, in host order */
        if (h == hm) continue;
        int from = coll_topo_rank(t, h, ld % coll_topo_lsize(t, h));
        int st = coll_sched_recv_reduce(s, from, work + off, acc + off, l, off);
        dep = coll_sched_after(s, st, dep);
        acc = work;
      }
      if (acc == in) coll_sched_copy(s, work + off, in + off, l); /* one rank in all */
    }
  }
  return COLL_SUCCESS;
}
