/*
 * allgather_two_level.c -- host-aware allgatherv: inside the host, across
 * hosts on rails, inside the host again, in one step of each.
 *
 * Names (topology.h): rank q is local rank l_q on host h_q; host h runs L_h
 * ranks. Block b_q (counts[q] elements at displs[q]) reaches every rank so:
 *
 *   A  inside q's host    q sends b_q to each rank of its host
 *   B  rails              q sends b_q to its rail receiver on every other
 *                         host h: R_h(q) = the rank of h with local rank
 *                         l_q mod L_h
 *   C  inside host h      R_h(q) forwards b_q to the other ranks of h
 *
 * Example, 2 hosts x 2 ranks (0,1 on host 0; 2,3 on host 1): rank 0 sends b0
 * to 1 (A) and to 2 (B); 2 forwards it to 3 (C); and so on for every block.
 *
 * Each host link carries every block of its host out once per other host
 * and every other host's block in once: (H-1)/H S each way for even hosts,
 * what a ring over the host order carries too (the least possible), but in
 * one network step where the ring takes n-1: 1 alpha_net + 2 alpha_shm +
 * (H-1)/H S beta_net. Uneven hosts: a host with fewer ranks gives some
 * ranks several rails; the bytes per host link are unchanged.
 *
 * Blocks are cut into segments (COLLECTIVES_SEGMENT_BYTES) and C forwards
 * segment k as soon as B has brought it. Steps are added block by block,
 * segment by segment, A then B then C, the same order on every rank, so both
 * ends of every link add their steps for it in one order; each step depends
 * only on steps added before it.
 */
#include "algorithms/algorithms.h"
#include "algorithms/pattern.h"
#include "algorithms/topology.h"
#include "base/comm_state.h"

/* The rank of host h that receives rank q's block from the rail. */
static int rail_receiver(const coll_topo_t *t, int h, int q) {
  return coll_topo_rank(t, h, t->local[q] % coll_topo_lsize(t, h));
}

coll_result_t coll_allgatherv_two_level(coll_sched_t *s, const coll_args_t *a) {
  coll_comm_t *comm = s->comm;
  const coll_topo_t *t = coll_comm_topo(comm);
  if (!t) return COLL_SYSTEM_ERROR;
  int n = comm->size, r = comm->rank, H = t->nhosts, hm = t->host[r], L = coll_topo_lsize(t, hm);
  size_t elem = s->elem, total = 0;
  for (int i = 0; i < n; i++) total += a->counts[i];
  s->hdr.count = total; /* what every rank must agree on */
  char *out = a->recvbuf;
  const char *own = a->sendbuf;
  size_t own_off = a->displs[r] * elem, own_len = a->count * elem;
  if (own != out + own_off && own_len) coll_sched_copy(s, out + own_off, own, own_len);

  for (int q = 0; q < n; q++) {
    int hq = t->host[q];
    size_t pos = a->displs[q] * elem, len = a->counts[q] * elem;
    int nseg = coll_sched_nseg(s, len);
    /* rank q's rail receiver on our host (when q is elsewhere) */
    int R = hq != hm ? rail_receiver(t, hm, q) : -1;
    for (int k = 0; k < nseg; k++) {
      size_t o, l;
      coll_sched_seg(s, len, nseg, k, &o, &l);
      if (q == r) {
        /* step 0's source is sendbuf: the local copy above overlaps the sends */
        for (int i = 0; i < L; i++) {                                  /* A */
          int d = coll_topo_rank(t, hm, i);
          if (d != r) coll_sched_send(s, d, own + o, l, pos + o);
        }
        for (int h = 0; h < H; h++)                                    /* B */
          if (h != hm) coll_sched_send(s, rail_receiver(t, h, q), own + o, l, pos + o);
      } else if (hq == hm) {
        coll_sched_recv(s, q, out + pos + o, l, pos + o);              /* A */
      } else if (r == R) {
        int got = coll_sched_recv(s, q, out + pos + o, l, pos + o);    /* B */
        for (int i = 0; i < L; i++) {                                  /* C */
          int d = coll_topo_rank(t, hm, i);
          if (d != r) coll_sched_after(s, coll_sched_send(s, d, out + pos + o, l, pos + o), got);
        }
      } else {
        coll_sched_recv(s, R, out + pos + o, l, pos + o);              /* C */
      }
    }
  }
  return COLL_SUCCESS;
}
