/*
 * comm/gpu_small.h -- small collectives on GPU buffers, staged whole through
 * pinned host memory and run on the host path (comm/gpu_small.c).
 */
#ifndef COLL_COMM_GPU_SMALL_H
#define COLL_COMM_GPU_SMALL_H

#include <stddef.h>

#include "coll.h"
#include "transport/wire.h"

typedef struct {
  int on;             /* the call runs on the host copy */
  void *dev_out;      /* where the result goes back on the device */
  const void *host_out;
  size_t out_bytes;   /* 0: nothing to copy back (a broadcast's root) */
} coll_gpu_small_t;

/* For a device call d (bound to its GPU, the caller's work waited for):
 * when its message is at most COLLECTIVES_CUDA_SMALL_BYTES, copies its
 * input to pinned memory and rewrites d into the same call on host memory
 * (segment_bytes: the caller's). The decision depends only on what every
 * rank agrees on (the message size, the parameter), so all ranks take the
 * same path. g->on = 0: run d as it is. */
coll_result_t coll_gpu_small_begin(coll_comm_t *comm, coll_kind_t kind, coll_args_t *d,
                                   size_t caller_segment, coll_gpu_small_t *g);
/* The same for reduce, gatherv, scatterv and alltoallv (COLL_KIND_REDUCE,
 * _GATHER, _SCATTER, _ALLTOALL), which have no device schedule: staged
 * whole at any size (the caller has bound the device). */
coll_result_t coll_gpu_whole_begin(coll_comm_t *comm, coll_kind_t kind, coll_args_t *d,
                                   coll_gpu_small_t *g);
/* After the host call: copies the result back and waits for the copy. */
coll_result_t coll_gpu_small_end(coll_comm_t *comm, const coll_gpu_small_t *g, coll_result_t res);

#endif
