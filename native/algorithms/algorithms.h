/*
 * algorithms.h -- each algorithm builds its schedule into s from args; it
 * never opens a socket or calls CUDA. A builder may decline (returns
 * COLL_INVALID_USAGE without adding steps) and selection falls back.
 * The registry of allreduce algorithms and the choice for AUTO are in tune.c.
 */
#ifndef COLL_ALGORITHMS_H
#define COLL_ALGORITHMS_H

#include "schedule/schedule.h"

coll_result_t coll_allreduce_ring(coll_sched_t *s, const coll_args_t *a);
coll_result_t coll_allreduce_tree(coll_sched_t *s, const coll_args_t *a);
coll_result_t coll_allreduce_butterfly(coll_sched_t *s, const coll_args_t *a);
/* Reduce inside each host, allreduce across hosts on rails, broadcast inside
 * each host (allreduce_two_level.c); any topology, uneven hosts included. */
coll_result_t coll_allreduce_two_level(coll_sched_t *s, const coll_args_t *a);
coll_result_t coll_allgatherv_ring(coll_sched_t *s, const coll_args_t *a);
/* Inside each host, across hosts on rails, inside again (allgather_two_level.c). */
coll_result_t coll_allgatherv_two_level(coll_sched_t *s, const coll_args_t *a);
coll_result_t coll_broadcast_tree(coll_sched_t *s, const coll_args_t *a);
/* Runs before every broadcast, reduce, gatherv and scatterv on more than one
 * rank (broadcast_agree.c; kind names the collective): all ranks learn every
 * rank's root and, if they differ, all fail with COLL_INVALID_USAGE naming
 * them (the communicator stays usable). A small host broadcast is done by
 * the same step (*done set); otherwise the collective proper follows under
 * the same sequence number. */
coll_result_t coll_root_agree(coll_comm_t *comm, const coll_args_t *a, coll_kind_t kind, int *done);
/* Ring reduce-scatter of sendbuf (size * count elements) into tmp (same
 * size); rank r's fully reduced block r ends in tmp + r * count. */
coll_result_t coll_reduce_scatter_ring(coll_sched_t *s, const coll_args_t *a, void *tmp);
/* The same result (block r in tmp + r * count) reduced inside each host
 * first, one partial per destination across hosts (reduce_scatter_two_level.c). */
coll_result_t coll_reduce_scatter_two_level(coll_sched_t *s, const coll_args_t *a, void *tmp);
coll_result_t coll_barrier_dissemination(coll_sched_t *s, const coll_args_t *a);

/* The rooted and all-to-all collectives as a check (arguments only, nothing
 * sent) and a run (the schedule, under the communicator's serialization); the
 * communicator's entry points (comm/comm.c) put them together. */
coll_result_t coll_check_reduce(coll_comm_t *comm, const coll_args_t *a);
coll_result_t coll_run_reduce(coll_comm_t *comm, const coll_args_t *a);
coll_result_t coll_check_gatherv(coll_comm_t *comm, const coll_args_t *a);
coll_result_t coll_run_gatherv(coll_comm_t *comm, const coll_args_t *a);
coll_result_t coll_check_scatterv(coll_comm_t *comm, const coll_args_t *a);
coll_result_t coll_run_scatterv(coll_comm_t *comm, const coll_args_t *a);
coll_result_t coll_check_alltoallv(coll_comm_t *comm, const coll_args_t *a);
coll_result_t coll_run_alltoallv(coll_comm_t *comm, const coll_args_t *a);

/* One rank's allreduce (sum), allgatherv (equal blocks) or reduce-scatter
 * (sum; both algo ring or two_level) schedule for a world given by host labels, built without a
 * socket (dryrun.c, for tests): 8 numbers per step (kind, peer, nbytes,
 * offset, src buffer, src offset, dst buffer, dst offset; buffer 0 in, 1
 * out, -1 none) and the (pred, succ) edges; free both. */
coll_result_t coll_dryrun(int n, const int *labels, int rank, coll_kind_t kind, coll_algo_t algo,
                          size_t count, coll_dtype_t dtype, size_t segment_bytes, const void *in,
                          void *out, long long **steps, int *nsteps, int **edges, int *nedges);

typedef struct {
  coll_algo_t id;          /* its name: coll_algo_name(id) (base/status.c) */
  const char *description;
  coll_result_t (*build)(coll_sched_t *s, const coll_args_t *a);
} coll_algo_entry_t;

/* The registry, indexed by coll_algo_t (entry 0, AUTO, has no builder). */
const coll_algo_entry_t *coll_algo_entry(coll_algo_t id);
/* What AUTO picks for an allreduce of nbytes on comm: when two or more hosts
 * run and one of them runs two or more ranks, the tuned rows of that shape,
 * else two_level; otherwise by rank count, size and whether every link is
 * shared memory (tune.c). */
coll_algo_t coll_tune_choose_comm(coll_comm_t *comm, size_t nbytes);
/* The same choice for a world given by its topology t (NULL: one host) and
 * size ranks, all_shm when every link is shared memory: the tuned rows of
 * t's shape (HxL) when t is two-level, else two_level (tune.c). */
struct coll_topo;
coll_algo_t coll_tune_choose_topo(const struct coll_topo *t, int size, size_t nbytes, int all_shm);
/* Whether collectives other than allreduce go in two levels on comm: the same
 * topology rule, unless COLLECTIVES_ALGO forces a flat allreduce (tune.c). */
int coll_tune_two_level(coll_comm_t *comm);

#endif
