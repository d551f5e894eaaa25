/*
 * allreduce_two_level.c -- host-aware allreduce for hosts that run several
 * ranks each: reduce inside the host, allreduce across hosts on "rails",
 * broadcast inside the host; pipelined in segments so the three phases
 * overlap.
 *
 * Names (topology.h): H hosts, host h runs L_h ranks, P slices. The buffer is
 * cut into P balanced slices (coll_split); on host h slice j belongs to the
 * owner o_h(j) = local rank j mod L_h. P = the largest L_h for large
 * messages (every rank owns a slice where hosts are even), P = 1 for small
 * ones (one owner per host: fewest messages).
 *
 *   A  intra-host reduce   every rank sends its copy of slice j to o_h(j),
 *                          which reduces them in local-rank order:
 *                          out_j = in_j op x_1 op x_2 ...
 *   B  rail allreduce      the owners of slice j, one per host, in host
 *                          order, allreduce out_j: a ring (reduce-scatter +
 *                          allgather over the H owners) or, when slices are
 *                          at most COLL_RAIL_FULL_BYTES and H is a power of
 *                          two, recursive doubling (log2 H full exchanges:
 *                          fewer steps, more bytes, so only for small ones)
 *   C  intra-host bcast    o_h(j) sends the final out_j to the host's others
 *
 * Example, 2 hosts x 2 ranks (ranks 0,1 on host 0; 2,3 on host 1), P = 2:
 *
 *            A                B                  C
 *   rank 0   recv+reduce s0   s0 with rank 2     send s0 to 1
 *            from 1, send s1 to 1
 *   rank 1   send s0 to 0,    s1 with rank 3     send s1 to 0
 *            recv+reduce s1
 *
 * Each slice is cut into K segments of about COLLECTIVES_SEGMENT_BYTES and
 * the phases are added tick by tick: at tick t, A of segment t, B of segment
 * t - 1, C of segment t - 2. Both ends of every link add their steps in this
 * one global order, so every link's messages match, and since a step depends
 * only on steps added before it the schedule cannot wait on itself; the lags
 * let a host reduce segment t while segment t - 1 crosses the network and
 * segment t - 2 is broadcast, so the time approaches the slowest phase, not
 * the sum of the three.
 *
 * Bytes per host link (S = message size): 2 (H-1)/H S for the ring rails
 * (the least any allreduce can send without servers), against 2 (n-1)/n S
 * for a flat ring over n ranks; 2 (H-1) network steps instead of 2 (n-1).
 * Cost: 2 (H-1) alpha_net + 2 (H-1)/H S beta_net, plus two shared-memory
 * passes of S (L-1)/L inside the host, overlapped with it.
 *
 * Uneven hosts: a host with fewer ranks than P gives some local ranks
 * several slices, so its ranks carry more of the rails, but no host is
 * refused and the bytes through each host link are unchanged.
 *
 * Every element is reduced in one fixed order (A in local-rank order at one
 * rank, B by the ring at one rank or symmetrically by recursive doubling,
 * whose operands commute bit for bit) and then copied, so all ranks end with
 * the same bits.
 */
#include <stdlib.h>

#include "algorithms/algorithms.h"
#include "algorithms/pattern.h"
#include "algorithms/topology.h"
#include "base/comm_state.h"
#include "base/status.h"

/* Up to this size a message has one slice per host (P = 1). */
#define COLL_TWO_LEVEL_ONE_SLICE (32 * 1024)
/* A rail's recursive doubling exchanges whole slices both ways at once: each
 * side's send must fit in the socket buffers (as butterfly's full exchange). */
#define COLL_RAIL_FULL_BYTES (32 * 1024)
#define RAIL_LAG 1
#define BCAST_LAG 2

/* Allreduce of [off, off + len) among the m ranks part[0..m-1] (this rank is
 * part[me]) by recursive doubling (full) or a ring: the result lands in out,
 * the operand is acc (in or out), every step runs after `ready`. Returns a
 * step after which out's region is final. */
static int rail(coll_sched_t *s, const int *part, int m, int me, int full, char *out,
                const char *acc, size_t off, size_t len, int ready) {
  if (m == 1) {
    if (acc == out) return ready;
    return coll_sched_after(s, coll_sched_copy(s, out + off, acc + off, len), ready);
  }
  if (full) {
    const char *cur = acc;
    int dep = ready;
    for (int mask = 1; mask < m; mask <<= 1) {
      int partner = part[me ^ mask];
      int sent = coll_sched_after(s, coll_sched_send(s, partner, cur + off, len, off), dep);
      int got = coll_sched_recv_reduce(s, partner, out + off, cur + off, len, off);
      coll_sched_after(s, got, sent); /* out may be what we are sending */
      dep = coll_sched_after(s, got, dep);
      cur = out;
    }
    return dep;
  }
  /* Ring over the rail: chunk c of the region is coll_split(len / elem, m, c);
   * the step tables of allreduce_ring.c, with part[] as the ring. */
  int next = part[(me + 1) % m], prev = part[(me + m - 1) % m];
  size_t elem = s->elem, count = len / elem;
  int begin = s->nsteps, last = ready;
  for (int phase = 0; phase < 2; phase++) {
    for (int st = 0; st < m - 1; st++) {
      int sc = phase == 0 ? coll_ring_rs_send_chunk(me, m, st) : coll_ring_ag_send_chunk(me, m, st);
      int rc = phase == 0 ? coll_ring_rs_recv_chunk(me, m, st) : coll_ring_ag_recv_chunk(me, m, st);
      size_t so, sl, ro, rl;
      coll_split(count, m, sc, &so, &sl);
      coll_split(count, m, rc, &ro, &rl);
      so = off + so * elem; sl *= elem; ro = off + ro * elem; rl *= elem;
      const char *src = (phase == 0 && st == 0) ? acc : out;
      coll_sched_after(s, coll_sched_send(s, next, src + so, sl, so), last);
      int got = phase == 0 ? coll_sched_recv_reduce(s, prev, out + ro, acc + ro, rl, ro)
                           : coll_sched_recv(s, prev, out + ro, rl, ro);
      coll_sched_after(s, got, ready);
      last = got;
    }
  }
  /* A step (copying nothing) that completes when every receive above has:
   * then the whole region is final. */
  int end = s->nsteps, join = coll_sched_copy(s, out + off, out + off, 0);
  for (int i = begin; i < end; i++)
    if (s->steps[i].kind != COLL_STEP_SEND) coll_sched_after(s, join, i);
  return join;
}

coll_result_t coll_allreduce_two_level(coll_sched_t *s, const coll_args_t *a) {
  coll_comm_t *comm = s->comm;
  const coll_topo_t *t = coll_comm_topo(comm);
  if (!t) return COLL_SYSTEM_ERROR;
  int r = comm->rank, H = t->nhosts, hm = t->host[r], L = coll_topo_lsize(t, hm);
  size_t elem = s->elem, nbytes = a->count * elem;
  const char *in = a->sendbuf;
  char *out = a->recvbuf;
  int P = nbytes <= COLL_TWO_LEVEL_ONE_SLICE ? 1 : t->max_local;

  /* Segments per slice, the same for every slice (they differ by at most one
   * element) so that "segment k" names one tick everywhere. */
  size_t slice0 = (a->count / (size_t)P + (a->count % (size_t)P ? 1 : 0)) * elem;
  int K = coll_sched_nseg(s, slice0);
  /* Recursive doubling sends log2(H) whole slices per rail, the ring
   * 2 (H-1)/H of one: doubling only where latency rules. Decided per call,
   * not per segment, so that every segment of a rail takes the same route. */
  int full = slice0 <= COLL_RAIL_FULL_BYTES && (H & (H - 1)) == 0;
  size_t cells = (size_t)P * (size_t)K;
  int *mem = malloc(sizeof(int) * (3 * cells + (size_t)H));
  if (!mem) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", r);
  int *ready = mem, *fin = mem + cells, *sent = mem + 2 * cells, *part = mem + 3 * cells;
  const char **accs = malloc(sizeof(char *) * cells);
  if (!accs) {
    free(mem);
    return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", r);
  }

  for (int tick = 0; tick < K + BCAST_LAG; tick++) {
    for (int j = 0; j < P; j++) {
      size_t so, sl;
      coll_split(a->count, P, j, &so, &sl);
      int o = coll_topo_owner(t, hm, j);
      for (int phase = 0; phase < 3; phase++) {
        int k = tick - (phase == 0 ? 0 : phase == 1 ? RAIL_LAG : BCAST_LAG);
        if (k < 0 || k >= K) continue;
        size_t c = (size_t)j * (size_t)K + (size_t)k, o_, l_;
        coll_sched_seg(s, sl * elem, K, k, &o_, &l_);
        size_t off = so * elem + o_;
        if (l_ == 0) continue; /* the same on every rank: no message */
        if (phase == 0 && r != o) {
          sent[c] = coll_sched_send(s, o, in + off, l_, off);
        } else if (phase == 0) {
          const char *acc = in;
          int dep = -1;
          for (int l = 0; l < L; l++) {
            int q = coll_topo_rank(t, hm, l);
            if (q == r) continue;
            int st = coll_sched_recv_reduce(s, q, out + off, acc + off, l_, off);
            dep = coll_sched_after(s, st, dep);
            acc = out;
          }
          ready[c] = dep;
          accs[c] = acc;
        } else if (phase == 1 && r == o) {
          for (int h = 0; h < H; h++) part[h] = coll_topo_owner(t, h, j);
          fin[c] = rail(s, part, H, hm, full, out, accs[c], off, l_, ready[c]);
        } else if (phase == 2 && r == o) {
          for (int l = 0; l < L; l++) {
            int q = coll_topo_rank(t, hm, l);
            if (q != r) coll_sched_after(s, coll_sched_send(s, q, out + off, l_, off), fin[c]);
          }
        } else if (phase == 2) {
          /* out may be in (in place): overwrite it only once our copy left */
          coll_sched_after(s, coll_sched_recv(s, o, out + off, l_, off), sent[c]);
        }
      }
    }
  }
  free(accs);
  free(mem);
  return COLL_SUCCESS;
}
