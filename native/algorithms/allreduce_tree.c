/*
 * allreduce_tree.c -- pipelined binary-tree allreduce: reduce up the tree to
 * rank 0, then broadcast down it.
 *
 * Tree: parent of r is (r-1)/2, children 2r+1 and 2r+2. Per segment j:
 *
 *   out[j] = in[j] op child0[j] op child1[j]     (recv_reduce, child0 first)
 *   send out[j] to the parent                    (leaf: in[j], nothing to reduce)
 *   receive the final out[j] from the parent     (after our send of j left,
 *                                                 since it overwrites out[j])
 *   send out[j] to both children
 *
 * Segments flow up and down at once: while segment j is reduced at the root,
 * segment j+1 climbs and segment j-1 descends. Reduction order is fixed by
 * the tree (child0 before child1 at every node) and the root broadcasts its
 * bits, so every rank ends with the same result.
 *
 * Cost: about 2 log2(n) alpha for the pipeline's fill plus 2 S beta (each
 * inner node sends S up and 2S down), so for large S the ring wins; the tree
 * wins on latency over many ranks at mid sizes.
 */
#include "algorithms/algorithms.h"
#include "base/comm_state.h"
#include "algorithms/pattern.h"
#include "algorithms/topology.h"

coll_result_t coll_allreduce_tree(coll_sched_t *s, const coll_args_t *a) {
  coll_comm_t *comm = s->comm;
  const coll_topo_t *t = coll_comm_topo(comm);
  if (!t) return COLL_SYSTEM_ERROR;
  /* The tree is over host-order positions (topology.h): subtrees stay on a host. */
  int n = comm->size, r = coll_topo_pos(t, comm->rank);
  int parent = coll_tree_parent(r, n, 0);
  int child[2] = {coll_tree_child(r, n, 0, 0), coll_tree_child(r, n, 0, 1)};
  if (parent >= 0) parent = coll_topo_at(t, parent);
  for (int c = 0; c < 2; c++)
    if (child[c] >= 0) child[c] = coll_topo_at(t, child[c]);
  const char *in = a->sendbuf;
  char *out = a->recvbuf;
  size_t nbytes = a->count * s->elem;
  int nseg = coll_sched_nseg(s, nbytes);

  for (int j = 0; j < nseg; j++) {
    size_t off, len;
    coll_sched_seg(s, nbytes, nseg, j, &off, &len);
    const char *acc = in + off; /* where segment j's partial result lives */
    int reduced = -1;
    for (int c = 0; c < 2; c++) {
      if (child[c] < 0) continue;
      int st = coll_sched_recv_reduce(s, child[c], out + off, acc, len, off);
      reduced = coll_sched_after(s, st, reduced);
      acc = out + off;
    }
    int final = reduced;
    if (parent >= 0) {
      int up = coll_sched_after(s, coll_sched_send(s, parent, acc, len, off), reduced);
      final = coll_sched_after(s, coll_sched_recv(s, parent, out + off, len, off), up);
    } else if (reduced < 0 && out != in) {
      final = coll_sched_copy(s, out + off, in + off, len); /* a root without children: n == 1 */
    }
    for (int c = 0; c < 2; c++)
      if (child[c] >= 0) coll_sched_after(s, coll_sched_send(s, child[c], out + off, len, off), final);
  }
  return COLL_SUCCESS;
}
