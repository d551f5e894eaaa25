/*
 * comm/gpu_small.c -- small collectives on GPU buffers, staged whole.
 *
 * A device collective pays per segment and link a protocol round trip
 * (CUDA IPC records, or staged pieces with their tickets), several hundred
 * microseconds on an H100 even for 8 bytes. Up to COLLECTIVES_CUDA_SMALL_BYTES
 * (a few KiB) that is all overhead: here the call's input goes to pinned host
 * memory in one device-to-host copy, the very same collective runs on host
 * memory (with the host's shared-memory fast path and single-message
 * schedules), and the result comes back in one host-to-device copy. So a
 * small GPU allreduce costs the host allreduce plus two copies.
 *
 * On the wire such a call is exactly a host call (same headers, schedules
 * and algorithm), and every rank decides alike: the size tested is one every
 * rank agrees on (the whole vector of allreduce and broadcast, the gathered
 * or scattered total of allgatherv and reduce_scatter), against the same
 * parameter. Ranks configured with different thresholds fail with the
 * header mismatch the device path's records cause, never hang.
 *
 * The rooted collectives (reduce, gatherv, scatterv) and alltoallv have no
 * device schedule: on GPU buffers they are staged whole the same way at any
 * size (coll_gpu_whole_begin), one copy in and one copy out around the host
 * call; correct, not pipelined.
 *
 * Pinned layout (pool COLL_CUDA_PINNED_SMALL, or _WHOLE): the output region,
 * then the input region, except that an input inside the output (in place)
 * keeps its offset there, and an output inside the input (scatterv's root in
 * place) keeps its offset in the input.
 */
#include "comm/gpu_small.h"

#include <string.h>

#include "base/comm_state.h"
#include "base/param.h"
#include "base/status.h"
#include "cuda/cuda.h"
#include "transport/wire.h"

/* Bytes of a buffer laid out in blocks (counts[i] elements at displs[i]):
 * the end of the furthest block; SIZE_MAX when it overflows. */
static size_t blocks_bytes(const coll_comm_t *comm, const size_t *counts, const size_t *displs,
                           size_t elem) {
  size_t end = 0;
  for (int i = 0; i < comm->size; i++) {
    size_t c = counts[i], o = displs[i];
    if (c > ((size_t)1 << 48) || o > ((size_t)1 << 48)) return SIZE_MAX;
    if (c && (c + o) * elem > end) end = (c + o) * elem;
  }
  return end;
}

/* Stages d when its agreed size is at most limit (whole: always). */
static coll_result_t stage(coll_comm_t *comm, coll_kind_t kind, coll_args_t *d,
                           size_t caller_segment, coll_gpu_small_t *g, size_t limit, int whole) {
  memset(g, 0, sizeof *g);
  if (d->memory != COLL_MEMORY_CUDA) return COLL_SUCCESS;
  int root = comm->rank == d->root;
  size_t elem = coll_dtype_size(d->dtype), in = d->count * elem, out = in, agreed = in;
  int send_in = 1, back = 1; /* copy the input in; copy the result back */
  switch (kind) {
    case COLL_KIND_ALLREDUCE:
      break;
    case COLL_KIND_BROADCAST: /* in place: only the root's bytes matter, only others change */
      send_in = comm->rank == d->root;
      back = !send_in;
      break;
    case COLL_KIND_ALLGATHERV:
      if (!d->counts || !d->displs) return COLL_SUCCESS;
      agreed = out = blocks_bytes(comm, d->counts, d->displs, elem);
      break;
    case COLL_KIND_REDUCE_SCATTER:
      agreed = in = out * (size_t)comm->size;
      break;
    case COLL_KIND_REDUCE: /* the result at the root only */
      out = root ? in : 0;
      back = root;
      break;
    case COLL_KIND_GATHER:
      out = root && d->counts && d->displs ? blocks_bytes(comm, d->counts, d->displs, elem) : 0;
      back = root;
      break;
    case COLL_KIND_SCATTER:
      in = root && d->counts && d->displs ? blocks_bytes(comm, d->counts, d->displs, elem) : 0;
      send_in = root;
      break;
    case COLL_KIND_ALLTOALL: /* send side: counts/displs [0, n); receive side: [n, 2n) */
      if (!d->counts || !d->displs) return COLL_SUCCESS;
      in = blocks_bytes(comm, d->counts, d->displs, elem);
      out = blocks_bytes(comm, d->counts + comm->size, d->displs + comm->size, elem);
      break;
    default:
      return COLL_SUCCESS;
  }
  if (in == SIZE_MAX || out == SIZE_MAX)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "rank %d: %s: block counts overflow",
                      comm->rank, coll_kind_name(kind));
  if (!whole && (agreed == 0 || agreed > limit)) return COLL_SUCCESS;
  size_t out_room = (out + 255) & ~(size_t)255;
  unsigned char *pinned = NULL;
  COLL_CHECK(coll_cuda_pinned(comm, whole ? COLL_CUDA_PINNED_WHOLE : COLL_CUDA_PINNED_SMALL,
                              out_room + in + 1, &pinned));
  const char *dsend = d->sendbuf, *drecv = d->recvbuf;
  unsigned char *hsend = pinned + out_room, *hrecv = pinned;
  if (dsend && drecv && dsend >= drecv && dsend < drecv + out)
    hsend = pinned + (dsend - drecv); /* in place: the input inside the output */
  else if (dsend && drecv && drecv >= dsend && drecv < dsend + in)
    hrecv = hsend + (drecv - dsend); /* in place: the output inside the input */
  if (send_in && in) COLL_CHECK(coll_cuda_copy(comm, hsend, dsend, in));
  uint64_t t = 0;
  COLL_CHECK(coll_cuda_fence(comm, &t));
  COLL_CHECK(coll_cuda_wait(comm, t));
  g->on = 1;
  g->dev_out = d->recvbuf;
  g->host_out = hrecv;
  g->out_bytes = back && drecv ? out : 0;
  if (kind == COLL_KIND_SCATTER && drecv) g->out_bytes = d->count * elem; /* every rank's block */
  d->sendbuf = dsend ? hsend : NULL;
  d->recvbuf = drecv ? hrecv : NULL;
  d->memory = COLL_MEMORY_HOST;
  d->segment_bytes = caller_segment;
  coll_cuda_stats_t *st = coll_cuda_stats(comm);
  if (st && whole) st->whole_calls++;
  else if (st) st->small_calls++;
  COLL_INFO(COLL_LOG_CUDA, "rank %d: %s on GPU buffers (%zu bytes in, %zu out) staged whole "
            "through pinned memory", comm->rank, coll_kind_name(kind), in, out);
  return COLL_SUCCESS;
}

coll_result_t coll_gpu_small_begin(coll_comm_t *comm, coll_kind_t kind, coll_args_t *d,
                                   size_t caller_segment, coll_gpu_small_t *g) {
  long long limit = coll_param_int(COLL_PARAM_CUDA_SMALL_BYTES);
  if (comm->size < 2 || limit <= 0) {
    memset(g, 0, sizeof *g);
    return COLL_SUCCESS;
  }
  return stage(comm, kind, d, caller_segment, g, (size_t)limit, 0);
}

coll_result_t coll_gpu_whole_begin(coll_comm_t *comm, coll_kind_t kind, coll_args_t *d,
                                   coll_gpu_small_t *g) {
  return stage(comm, kind, d, d->segment_bytes, g, SIZE_MAX, 1);
}

coll_result_t coll_gpu_small_end(coll_comm_t *comm, const coll_gpu_small_t *g, coll_result_t res) {
  if (res != COLL_SUCCESS) return res; /* the pinned copy is dropped, the device left as it was */
  if (g->out_bytes) COLL_CHECK(coll_cuda_copy(comm, g->dev_out, g->host_out, g->out_bytes));
  return coll_cuda_finish(comm);
}
