/*
 * allreduce_butterfly.c -- recursive halving reduce-scatter, then recursive
 * doubling allgather (Rabenseifner), for any rank count.
 *
 * Non-power-of-two: with p = largest power of two <= n and rem = n - p, the
 * first 2*rem ranks pair up; even rank 2i sends its whole vector to 2i+1,
 * which reduces it and joins the butterfly as virtual rank i, while 2i waits
 * for the result at the end. Ranks >= 2*rem join as virtual rank r - rem.
 *
 * Halving, mask = p/2 .. 1, partner = v ^ mask: split the region I own in
 * two; the half on my side of the mask is kept (K), the other half (G) goes
 * to the partner, and the partner's copy of K is reduced into mine:
 *
 *   v=0 [0,8) -> keeps [0,4) gives [4,8) -> keeps [0,2) -> keeps [0,1)
 *
 * Doubling runs the masks back, 1 .. p/2: send what I own (K at that level),
 * receive the partner's (G at that level) into out.
 *
 * Small messages (<= COLL_BFLY_FULL_BYTES) skip the halving and exchange the
 * whole vector at each of the log2(p) levels (recursive doubling): half the
 * messages, which is what matters when latency dominates.
 *
 * r and v above are host-order positions (topology.h): partners closer than
 * a host's rank count share a host whatever the numbering, so only the
 * log2(H) levels with the widest masks cross between hosts.
 *
 * Operand order: each level computes local op incoming; the ops are
 * commutative bit for bit (IEEE +, *, min, max), so both partners hold the
 * same bits, and every element is reduced by the same tree on all ranks.
 *
 * Cost: 2 log2(p) alpha + 2 (p-1)/p S beta (+ 2 S beta for the fold when n
 * is not a power of two); full exchange: log2(p) alpha + log2(p) S beta.
 */
#include <stdlib.h>

#include "algorithms/algorithms.h"
#include "base/comm_state.h"
#include "algorithms/pattern.h"
#include "algorithms/topology.h"
#include "base/status.h"

/* Full-vector exchange needs both directions' bytes to fit in the socket
 * buffers at once (each side finishes its send before it reduces into the
 * vector it is sending), so it stays well below the smallest default. */
#define COLL_BFLY_FULL_BYTES (32 * 1024)

/* Adds a segmented transfer of [off, off+len) and returns its last step;
 * every segment runs after `dep`. */
static int segmented(coll_sched_t *s, int send, int peer, char *dst, const char *src, size_t off,
                     size_t len, int dep) {
  int nseg = coll_sched_nseg(s, len), last = -1;
  for (int j = 0; j < nseg; j++) {
    size_t o, l;
    coll_sched_seg(s, len, nseg, j, &o, &l);
    int st;
    if (send) st = coll_sched_send(s, peer, src + off + o, l, off + o);
    else if (src) st = coll_sched_recv_reduce(s, peer, dst + off + o, src + off + o, l, off + o);
    else st = coll_sched_recv(s, peer, dst + off + o, l, off + o);
    last = coll_sched_after(s, st, dep);
  }
  return last;
}

coll_result_t coll_allreduce_butterfly(coll_sched_t *s, const coll_args_t *a) {
  coll_comm_t *comm = s->comm;
  const coll_topo_t *t = coll_comm_topo(comm);
  if (!t) return COLL_SYSTEM_ERROR;
  int n = comm->size, r = coll_topo_pos(t, comm->rank);
  int p = coll_pow2_floor(n), rem = n - p;
  int v = coll_bfly_vrank(r, n);
  size_t elem = s->elem, nbytes = a->count * elem;
  const char *in = a->sendbuf;
  char *out = a->recvbuf;

  if (v < 0) { /* extra rank: fold into r+1, get the result back */
    int sent = segmented(s, 1, coll_topo_at(t, r + 1), NULL, in, 0, nbytes, -1);
    segmented(s, 0, coll_topo_at(t, r + 1), out, NULL, 0, nbytes, sent);
    return COLL_SUCCESS;
  }
  const char *cur = in; /* where my partial vector lives */
  int dep = -1;         /* last receive so far: later steps run after it */
  if (r < 2 * rem) {
    dep = segmented(s, 0, coll_topo_at(t, r - 1), out, in, 0, nbytes, -1);
    cur = out;
  }

  if (nbytes <= COLL_BFLY_FULL_BYTES) {
    for (int mask = 1; mask < p; mask <<= 1) {
      int partner = coll_topo_at(t, coll_bfly_real(v ^ mask, n));
      int sent = coll_sched_after(s, coll_sched_send(s, partner, cur, nbytes, 0), dep);
      /* Reduce only once my copy has left: out is what I am sending. */
      int got = coll_sched_recv_reduce(s, partner, out, cur, nbytes, 0);
      coll_sched_after(s, got, sent);
      dep = coll_sched_after(s, got, dep);
      cur = out;
    }
  } else {
    int levels = 0;
    while ((1 << levels) < p) levels++;
    size_t *keep_off = malloc(sizeof(size_t) * 4 * (size_t)(levels + 1));
    if (!keep_off) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
    size_t *keep_len = keep_off + levels + 1, *give_off = keep_len + levels + 1,
           *give_len = give_off + levels + 1;
    size_t lo = 0, cnt = a->count; /* region I own, in elements */
    int k = 0;
    for (int mask = p >> 1; mask >= 1; mask >>= 1, k++) {
      int partner = coll_topo_at(t, coll_bfly_real(v ^ mask, n));
      size_t lower = cnt / 2, upper = cnt - lower;
      int mine_low = (v & mask) == 0;
      keep_off[k] = mine_low ? lo : lo + lower;
      keep_len[k] = mine_low ? lower : upper;
      give_off[k] = mine_low ? lo + lower : lo;
      give_len[k] = mine_low ? upper : lower;
      int sent = segmented(s, 1, partner, NULL, cur, give_off[k] * elem, give_len[k] * elem, dep);
      int got = segmented(s, 0, partner, out, cur, keep_off[k] * elem, keep_len[k] * elem, dep);
      (void)sent;
      dep = got >= 0 ? got : dep;
      cur = out;
      lo = keep_off[k];
      cnt = keep_len[k];
    }
    for (int mask = 1; mask < p; mask <<= 1) {
      k--;
      int partner = coll_topo_at(t, coll_bfly_real(v ^ mask, n));
      segmented(s, 1, partner, NULL, out, keep_off[k] * elem, keep_len[k] * elem, dep);
      int got = segmented(s, 0, partner, out, NULL, give_off[k] * elem, give_len[k] * elem, dep);
      dep = got >= 0 ? got : dep;
    }
    free(keep_off);
  }
  if (r < 2 * rem) segmented(s, 1, coll_topo_at(t, r - 1), NULL, out, 0, nbytes, dep);
  else if (p == 1 && out != in && nbytes) coll_sched_copy(s, out, in, nbytes);
  return COLL_SUCCESS;
}
