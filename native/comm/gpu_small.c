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
 * Pinned layout (pool COLL_CUDA_PINNED_SMALL): the output region, then the
 * input region unless the input lies inside the output (in place), where it
 * keeps its offset.
 */
#include "comm/gpu_small.h"

#include <string.h>

#include "base/comm_state.h"
#include "base/param.h"
#include "base/status.h"
#include "cuda/cuda.h"
#include "transport/wire.h"

/* Output bytes of an allgatherv: the end of the furthest block (counts and
 * displs are the caller's, equal on every rank); SIZE_MAX when it overflows. */
static size_t gathered_bytes(const coll_comm_t *comm, const coll_args_t *d, size_t elem) {
  size_t end = 0;
  for (int i = 0; i < comm->size; i++) {
    size_t c = d->counts[i], o = d->displs[i];
    if (c > ((size_t)1 << 48) || o > ((size_t)1 << 48)) return SIZE_MAX;
    if (c && (c + o) * elem > end) end = (c + o) * elem;
  }
  return end;
}

coll_result_t coll_gpu_small_begin(coll_comm_t *comm, coll_kind_t kind, coll_args_t *d,
                                   size_t caller_segment, coll_gpu_small_t *g) {
  memset(g, 0, sizeof *g);
  long long limit = coll_param_int(COLL_PARAM_CUDA_SMALL_BYTES);
  if (d->memory != COLL_MEMORY_CUDA || comm->size < 2 || limit <= 0) return COLL_SUCCESS;
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
      agreed = out = gathered_bytes(comm, d, elem);
      break;
    case COLL_KIND_REDUCE_SCATTER:
      agreed = in = out * (size_t)comm->size;
      break;
    default:
      return COLL_SUCCESS;
  }
  if (agreed == 0 || agreed > (size_t)limit) return COLL_SUCCESS;
  size_t out_room = (out + 255) & ~(size_t)255;
  unsigned char *pinned = NULL;
  COLL_CHECK(coll_cuda_pinned(comm, COLL_CUDA_PINNED_SMALL, out_room + in + 1, &pinned));
  const char *dsend = d->sendbuf, *drecv = d->recvbuf;
  unsigned char *hsend = pinned + out_room;
  if (dsend >= drecv && dsend < drecv + out) hsend = pinned + (dsend - drecv); /* in place */
  if (send_in && in) COLL_CHECK(coll_cuda_copy(comm, hsend, dsend, in));
  uint64_t t = 0;
  COLL_CHECK(coll_cuda_fence(comm, &t));
  COLL_CHECK(coll_cuda_wait(comm, t));
  g->on = 1;
  g->dev_out = d->recvbuf;
  g->host_out = pinned;
  g->out_bytes = back ? out : 0;
  d->sendbuf = hsend;
  d->recvbuf = pinned;
  d->memory = COLL_MEMORY_HOST;
  d->segment_bytes = caller_segment;
  coll_cuda_stats_t *st = coll_cuda_stats(comm);
  if (st) st->small_calls++;
  COLL_INFO(COLL_LOG_CUDA, "rank %d: %s of %zu bytes on GPU buffers staged whole through pinned memory",
            comm->rank, coll_kind_name(kind), agreed);
  return COLL_SUCCESS;
}

coll_result_t coll_gpu_small_end(coll_comm_t *comm, const coll_gpu_small_t *g, coll_result_t res) {
  if (res != COLL_SUCCESS) return res; /* the pinned copy is dropped, the device left as it was */
  if (g->out_bytes) COLL_CHECK(coll_cuda_copy(comm, g->dev_out, g->host_out, g->out_bytes));
  return coll_cuda_finish(comm);
}
