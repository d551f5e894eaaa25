/*
 * dryrun.c -- one rank's schedule for a world described only by host labels,
 * built without a socket, for tests (tests/test_topology.py runs every
 * rank's schedule in a simulator: messages match link by link, nothing waits
 * forever, and the result is exact).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "algorithms/topology.h"
#include "base/comm_state.h"
#include "base/status.h"

/* For allreduce (count elements), allgatherv (count elements per rank,
 * blocks in rank order; out holds n * count) and reduce-scatter (in and the
 * scratch out hold n * count; rank r's block ends at out + r * count). in/out are caller buffers
 * (equal for in place); each step comes back as
 * kind, peer, nbytes, offset, src buffer/offset, dst buffer/offset (buffer 0:
 * in, 1: out, -1: none; in place reports out) and its edges as pairs. */
static void where(const void *p, const char *in, const char *out, size_t span, long long *buf,
                  long long *off) {
  const char *c = p;
  if (!p) { *buf = -1; *off = 0; return; }
  if (c >= out && c <= out + span) { *buf = 1; *off = c - out; return; }
  if (c >= in && c <= in + span) { *buf = 0; *off = c - in; return; }
  *buf = -2; *off = 0; /* elsewhere: a test fails on it */
}

coll_result_t coll_dryrun(int n, const int *labels, int rank, coll_kind_t kind, coll_algo_t algo,
                          size_t count, coll_dtype_t dtype, size_t segment_bytes, const void *in,
                          void *out, long long **steps, int *nsteps, int **edges, int *nedges) {
  *steps = NULL;
  *edges = NULL;
  *nsteps = *nedges = 0;
  if (n < 1 || rank < 0 || rank >= n || algo <= COLL_ALGO_AUTO || algo >= COLL_NUM_ALGOS ||
      (kind != COLL_KIND_ALLREDUCE && kind != COLL_KIND_ALLGATHERV &&
       kind != COLL_KIND_REDUCE_SCATTER) ||
      (kind != COLL_KIND_ALLREDUCE && algo != COLL_ALGO_RING && algo != COLL_ALGO_TWO_LEVEL))
    return COLL_INVALID_ARGUMENT;
  size_t *cv = calloc(2 * (size_t)n, sizeof(size_t)); /* allgatherv: equal blocks */
  if (!cv) return COLL_SYSTEM_ERROR;
  for (int i = 0; i < n; i++) {
    cv[i] = count;
    cv[n + i] = (size_t)i * count;
  }
  coll_comm_t *c = calloc(1, sizeof *c);
  if (!c || !(c->peers = calloc((size_t)n, sizeof *c->peers))) {
    free(c);
    free(cv);
    return COLL_SYSTEM_ERROR;
  }
  c->rank = rank;
  c->size = n;
  c->segment_bytes = segment_bytes;
  c->all_shm = 2; /* as if over TCP: nothing here asks a transport */
  for (int i = 0; i < n; i++) snprintf(c->peers[i].host_id, sizeof c->peers[i].host_id, "h%d", labels[i]);
  coll_args_t a;
  memset(&a, 0, sizeof a);
  a.sendbuf = in;
  a.recvbuf = out;
  a.count = count;
  a.dtype = dtype;
  a.op = COLL_SUM;
  a.algo = algo;
  a.counts = cv;
  a.displs = cv + n;
  coll_sched_t s;
  coll_sched_init(&s, c, kind, &a, (uint32_t)algo);
  coll_result_t res;
  if (kind == COLL_KIND_ALLREDUCE) res = coll_algo_entry(algo)->build(&s, &a);
  else if (kind == COLL_KIND_ALLGATHERV)
    res = algo == COLL_ALGO_RING ? coll_allgatherv_ring(&s, &a) : coll_allgatherv_two_level(&s, &a);
  else /* reduce-scatter: out is the scratch (n blocks), block rank ends at rank * count */
    res = algo == COLL_ALGO_RING ? coll_reduce_scatter_ring(&s, &a, out)
                                 : coll_reduce_scatter_two_level(&s, &a, out);
  if (res == COLL_SUCCESS && s.oom) res = COLL_SYSTEM_ERROR;
  size_t span = count * coll_dtype_size(dtype) * (kind == COLL_KIND_ALLREDUCE ? 1 : (size_t)n);
  if (res == COLL_SUCCESS) {
    *steps = malloc(sizeof(long long) * 8 * (size_t)(s.nsteps + 1));
    *edges = malloc(sizeof(int) * 2 * (size_t)(s.nedges + 1));
    if (!*steps || !*edges) res = COLL_SYSTEM_ERROR;
  }
  if (res == COLL_SUCCESS) {
    for (int i = 0; i < s.nsteps; i++) {
      coll_step_t *st = &s.steps[i];
      long long *o = *steps + 8 * i;
      o[0] = st->kind;
      o[1] = st->peer;
      o[2] = (long long)st->nbytes;
      o[3] = (long long)st->offset;
      where(st->src, in, out, span, &o[4], &o[5]);
      where(st->dst, in, out, span, &o[6], &o[7]);
    }
    memcpy(*edges, s.edges, sizeof(int) * 2 * (size_t)s.nedges);
    *nsteps = s.nsteps;
    *nedges = s.nedges;
  } else {
    free(*steps);
    free(*edges);
    *steps = NULL;
    *edges = NULL;
  }
  coll_sched_free(&s);
  free(c->keep.steps);
  free(c->keep.edges);
  free(c->keep.scratch);
  coll_comm_topo_forget(c);
  free(c->peers);
  free(c);
  free(cv);
  return res;
}
