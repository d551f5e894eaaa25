/*
 * broadcast_agree.c -- a broadcast (or reduce, gatherv, scatterv) whose ranks
 * name different roots fails on every rank, in the same call, with the same
 * list of roots.
 *
 * Checking the root in each message's header is not enough: a rank that
 * believes it is the root receives nothing, and a rank whose tree differs
 * from its neighbours' may wait on a peer that never sends (or get nothing
 * at all and return its own buffer). So before any data moves, every rank
 * learns every rank's root, by a step whose schedule does not depend on the
 * root: a dissemination allreduce (as the barrier's), MAX over uint8, of a
 * table of n u32 slots, rank k's slot holding root + 1 at rank k and 0
 * elsewhere (so MAX, byte by byte, of one nonzero value and zeros is that
 * value: the reduction is an allgather):
 *
 *   round k = 0, 1, ... while 2^k < n: send state_k to r + 2^k, and
 *   state_{k+1} = state_k MAX (state from r - 2^k)
 *
 * After ceil(log2 n) rounds state covers every rank (ranges overlap for n
 * not a power of two; MAX does not mind), so all ranks hold the same table
 * and decide alike: one root, go on; several, every rank fails with
 * COLL_INVALID_USAGE naming each root and the ranks that named it, and
 * nothing is left on any link, so the communicator stays usable.
 * Cost: ceil(log2 n) (alpha + 4 n beta).
 *
 * For a small host broadcast the data rides along: the state is
 * [table | S data bytes], the data zero except at the root, and MAX over
 * uint8 of (data, 0, ..., 0) is the data, so after the same rounds every rank
 * has the root's bytes: ceil(log2 n) (alpha + (4 n + S) beta), the binomial tree's
 * latency, with the agreement for free. Above COLL_BCAST_FUSED_MAX the tree
 * or chain follows the agreement (broadcast_tree.c), under the same sequence
 * number; its messages carry the root in aux, the agreement's
 * COLL_BCAST_AGREE_AUX, which no root can equal.
 *
 * The header's kind, count and dtype are the collective's own (count 0 for
 * gatherv and scatterv, whose ranks' counts differ), so ranks that disagree
 * on those fail here too, naming both values (wire.c). The rooted
 * collectives (rooted.c) run the same step, without data.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "algorithms/pattern.h"
#include "base/comm_state.h"
#include "base/status.h"

#define COLL_BCAST_FUSED_MAX (8 * 1024)
#define COLL_BCAST_AGREE_AUX 0xffffffffu /* no root is this large */

static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* "root 0: ranks 0, 1; root 3: rank 2" from the table (cut with "..." to fit). */
static void roots_text(const uint8_t *table, int n, char *out, size_t cap) {
  size_t len = 0;
  out[0] = 0;
  uint32_t done_below = 0; /* roots + 1 are listed in increasing order */
  for (;;) {
    uint32_t next = UINT32_MAX;
    int count = 0;
    for (int k = 0; k < n; k++) {
      uint32_t v = get32(table + 4 * (size_t)k);
      if (v > done_below && v < next) next = v;
    }
    if (next == UINT32_MAX) return;
    for (int k = 0; k < n; k++) count += get32(table + 4 * (size_t)k) == next;
    if (next == (uint32_t)COLL_ROOT_REFUSED + 1)
      len += (size_t)snprintf(out + len, cap - len, "%srefused its arguments: rank%s",
                              len ? "; " : "", count > 1 ? "s" : "");
    else
      len += (size_t)snprintf(out + len, cap - len, "%sroot %u: rank%s", len ? "; " : "",
                              (unsigned)(next - 1), count > 1 ? "s" : "");
    int first = 1;
    for (int k = 0; k < n && len < cap; k++) {
      if (get32(table + 4 * (size_t)k) != next) continue;
      if (len + 24 >= cap) {
        snprintf(out + len, cap - len, ", ...");
        return;
      }
      len += (size_t)snprintf(out + len, cap - len, first ? " %d" : ", %d", k);
      first = 0;
    }
    if (len + 24 >= cap) return;
    done_below = next;
  }
}

coll_result_t coll_root_agree(coll_comm_t *comm, const coll_args_t *args, coll_kind_t kind,
                              int *done) {
  int n = comm->size, r = comm->rank, root = args->root, rounds = 0;
  *done = 0;
  for (int dist = 1; dist < n; dist <<= 1) rounds++;
  coll_args_t h = *args; /* what the header carries */
  if (kind != COLL_KIND_BROADCAST) {
    /* Rooted collectives agree on the root alone here; their data messages carry and
     * check count and dtype. So a rank that refused its own arguments
     * (COLL_ROOT_REFUSED: its count and dtype mean nothing) takes part like any. */
    h.count = 0;
    h.dtype = COLL_UINT8;
  }
  const coll_args_t *a = &h;
  size_t nbytes = a->count * coll_dtype_size(a->dtype);
  int fused = kind == COLL_KIND_BROADCAST && a->memory == COLL_MEMORY_HOST &&
              nbytes <= COLL_BCAST_FUSED_MAX;
  size_t table = 4 * (size_t)n, width = table + (fused ? nbytes : 0);
  uint8_t *st = calloc((size_t)rounds + 1, width);
  if (!st) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", r);
  for (int i = 0; i < 4; i++) st[4 * (size_t)r + i] = (uint8_t)(((uint32_t)root + 1) >> (8 * i));
  if (fused && r == root && nbytes) memcpy(st + table, a->recvbuf, nbytes);

  coll_sched_t s;
  coll_sched_init(&s, comm, kind, a, COLL_BCAST_AGREE_AUX);
  s.hdr.redop = 0; /* a reduce's op is checked by the reduce itself */
  uint32_t seq = s.hdr.seq;
  s.reduce = coll_reduce_kernel(COLL_UINT8, COLL_MAX);
  s.elem = 1;
  int got = -1;
  for (int k = 0, dist = 1; dist < n; k++, dist <<= 1) {
    uint8_t *cur = st + (size_t)k * width;
    coll_sched_after(&s, coll_sched_send(&s, coll_mod(r + dist, n), cur, width, (uint64_t)k), got);
    got = coll_sched_after(
        &s, coll_sched_recv_reduce(&s, coll_mod(r - dist, n), cur + width, cur, width, (uint64_t)k), got);
  }
  coll_result_t res = s.oom ? coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", r)
                            : coll_sched_run(&s, coll_comm_deadline(comm, a->timeout));
  coll_sched_free(&s);
  const uint8_t *final = st + (size_t)rounds * width;
  /* Ranks that all refused agree on nothing: a refusing rank has no buffer
   * (run_broadcast_refused passes NULL), so the fused data must not be taken. Every
   * rank refusing a broadcast (a bad root everywhere) crashed here before. */
  int agreed = root != COLL_ROOT_REFUSED;
  for (int k = 0; res == COLL_SUCCESS && k < n; k++)
    agreed &= get32(final + 4 * (size_t)k) == (uint32_t)root + 1;
  if (res == COLL_SUCCESS && !agreed) {
    char roots[1024];
    roots_text(final, n, roots, sizeof roots);
    res = coll_error(comm, COLL_INVALID_USAGE,
                     "rank %d: %s #%u: the ranks disagree on the root (%s); nothing was sent",
                     r, coll_kind_name(kind), seq, roots);
  } else if (res == COLL_SUCCESS && fused) {
    /* every rank refused (COLL_ROOT_REFUSED agreed by all): no buffer, nothing to copy */
    if (r != root && nbytes && root != COLL_ROOT_REFUSED) memcpy(a->recvbuf, final + table, nbytes);
    *done = 1;
  } else if (res == COLL_SUCCESS) {
    comm->seq = seq; /* the collective that follows goes under the same number */
  }
  free(st);
  return res;
}
