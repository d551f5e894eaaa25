/*
 * barrier_dissemination.c -- the dissemination barrier (Hensgen, Finkel,
 * Manber): in round k = 0, 1, ... while 2^k < n, rank r sends an empty
 * message to r + 2^k and waits for one from r - 2^k. After ceil(log2 n)
 * rounds every rank has heard, directly or through others, from every rank
 * that entered the barrier. Cost: ceil(log2 n) alpha, for any n.
 * The round number travels in the header's offset field and is checked.
 */
#include "algorithms/algorithms.h"
#include "base/comm_state.h"
#include "algorithms/pattern.h"

coll_result_t coll_barrier_dissemination(coll_sched_t *s, const coll_args_t *a) {
  (void)a;
  int n = s->comm->size, r = s->comm->rank, got = -1;
  for (int dist = 1, round = 0; dist < n; dist <<= 1, round++) {
    coll_sched_after(s, coll_sched_send(s, coll_mod(r + dist, n), NULL, 0, (uint64_t)round), got);
    got = coll_sched_after(s, coll_sched_recv(s, coll_mod(r - dist, n), NULL, 0, (uint64_t)round), got);
  }
  return COLL_SUCCESS;
}
