/*
 * broadcast_tree.c -- broadcast from root: a binomial tree for small
 * messages, a pipelined chain for large ones.
 *
 * Binomial (nbytes <= COLL_BCAST_CHAIN_MIN): relative rank v = r - root; v
 * receives once from its parent (v with its top bit cleared) and forwards to
 * v + 2^k for every 2^k above its top bit, largest subtree first. log2(n)
 * alpha + log2(n) S beta: latency-optimal.
 *
 *   v=0 -> 4, 2, 1;  v=4 -> 6, 5;  v=2 -> 3;  v=6 -> 7        (n = 8)
 *
 * Chain (larger): root -> root+1 -> ... -> root+n-1, cut into segments;
 * every rank forwards segment j as soon as it has it, so each link carries S
 * once and the time is about (n-1+k) segment times for k segments:
 * (n-1+k) alpha + S beta, which on a switched network runs at link speed.
 *
 * Both run over host-order positions (topology.h) rotated to start at the
 * root: the chain enters each host once, and the binomial tree's subtrees
 * stay on hosts as far as the numbering allows.
 */
#include "algorithms/algorithms.h"
#include "base/comm_state.h"
#include "algorithms/pattern.h"
#include "algorithms/topology.h"

#define COLL_BCAST_CHAIN_MIN (64 * 1024)

coll_result_t coll_broadcast_tree(coll_sched_t *s, const coll_args_t *a) {
  coll_comm_t *comm = s->comm;
  const coll_topo_t *t = coll_comm_topo(comm);
  if (!t) return COLL_SYSTEM_ERROR;
  int n = comm->size, r = coll_topo_pos(t, comm->rank), root = coll_topo_pos(t, a->root);
  char *buf = a->recvbuf;
  size_t nbytes = a->count * s->elem;

  if (nbytes <= COLL_BCAST_CHAIN_MIN) {
    int parent = coll_binomial_parent(r, n, root), children[32];
    int got = parent >= 0 ? coll_sched_recv(s, coll_topo_at(t, parent), buf, nbytes, 0) : -1;
    int k = coll_binomial_children(r, n, root, children);
    for (int i = 0; i < k; i++)
      coll_sched_after(s, coll_sched_send(s, coll_topo_at(t, children[i]), buf, nbytes, 0), got);
    return COLL_SUCCESS;
  }
  int v = coll_mod(r - root, n);
  int prev = v > 0 ? coll_topo_at(t, coll_mod(r - 1, n)) : -1;
  int next = v < n - 1 ? coll_topo_at(t, coll_mod(r + 1, n)) : -1;
  int nseg = coll_sched_nseg(s, nbytes);
  for (int j = 0; j < nseg; j++) {
    size_t o, l;
    coll_sched_seg(s, nbytes, nseg, j, &o, &l);
    int got = prev >= 0 ? coll_sched_recv(s, prev, buf + o, l, o) : -1;
    if (next >= 0) coll_sched_after(s, coll_sched_send(s, next, buf + o, l, o), got);
  }
  return COLL_SUCCESS;
}
