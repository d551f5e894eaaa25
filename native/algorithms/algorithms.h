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
coll_result_t coll_allgatherv_ring(coll_sched_t *s, const coll_args_t *a);
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

typedef struct {
  coll_algo_t id;          /* its name: coll_algo_name(id) (base/status.c) */
  const char *description;
  coll_result_t (*build)(coll_sched_t *s, const coll_args_t *a);
} coll_algo_entry_t;

/* The registry, indexed by coll_algo_t (entry 0, AUTO, has no builder). */
const coll_algo_entry_t *coll_algo_entry(coll_algo_t id);
/* What AUTO picks for an allreduce of nbytes on comm: by rank count, size
 * and whether every link is shared memory (tune.c). */
coll_algo_t coll_tune_choose_comm(coll_comm_t *comm, size_t nbytes);

#endif
