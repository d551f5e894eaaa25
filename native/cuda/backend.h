/*
 * cuda/backend.h -- the two implementations behind cuda.h, private to the
 * CUDA layer: coll_cudart_* (cuda/runtime.c: the CUDA runtime, or "built
 * without CUDA" errors) and coll_cudafake_* (cuda/fake.c: one GPU emulated in
 * host memory for tests, COLLECTIVES_CUDA_FAKE=1). cuda.c picks one per call.
 * Each has exactly cuda.h's signatures (copies and fences only in their
 * lane form; each backend's state starts with coll_cuda_stats_t), except for CUDA IPC, where the
 * backends only open and close mappings (ipc_open, ipc_close) and cuda.c
 * keeps the process's one cache of them.
 */
#ifndef COLL_CUDA_BACKEND_H
#define COLL_CUDA_BACKEND_H

#include "cuda/cuda.h"

#define COLL_CUDA_DECLARE(prefix) \
  const char *prefix##error_text(void); \
  int prefix##built(void); \
  int prefix##device_count(void); \
  int prefix##pointer_device(const void *p); \
  coll_result_t prefix##alloc(int device, size_t n, void **p); \
  void prefix##free(void *p); \
  coll_result_t prefix##memcpy(void *dst, const void *src, size_t n); \
  coll_result_t prefix##copy_bandwidth(int device, size_t n, int iters, double *gbps); \
  coll_result_t prefix##record_ready(int device, void *stream, void **event); \
  void prefix##event_destroy(void *event); \
  coll_result_t prefix##begin(coll_comm_t *comm, int device, void *stream, void *ready); \
  coll_result_t prefix##copy_on(coll_comm_t *comm, int lane, void *dst, const void *src, size_t n); \
  coll_result_t prefix##reduce(coll_comm_t *comm, void *out, const void *in1, const void *in2, size_t count, coll_dtype_t dtype, coll_op_t op); \
  coll_result_t prefix##scale(coll_comm_t *comm, void *out, const void *in, size_t count, coll_dtype_t dtype, double divisor); \
  coll_result_t prefix##fence_on(coll_comm_t *comm, int lane, uint64_t *ticket); \
  coll_result_t prefix##poll(coll_comm_t *comm, uint64_t ticket, int *done); \
  coll_result_t prefix##wait(coll_comm_t *comm, uint64_t ticket); \
  coll_result_t prefix##finish(coll_comm_t *comm); \
  coll_result_t prefix##pinned(coll_comm_t *comm, int which, size_t n, unsigned char **p); \
  coll_result_t prefix##scratch(coll_comm_t *comm, int which, size_t n, void **p); \
  coll_result_t prefix##ipc_export(coll_comm_t *comm, const void *p, unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES], uint64_t *offset, uint64_t *alloc_base); \
  coll_result_t prefix##ipc_open(coll_comm_t *comm, int peer, const unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES], void **base, size_t *size, int *already_mapped); \
  void prefix##ipc_close(int device, void *base, size_t size); \
  coll_result_t prefix##xevent_create(coll_comm_t *comm, void **ev, unsigned char handle[COLL_CUDA_IPC_EVENT_BYTES]); \
  coll_result_t prefix##xevent_open(coll_comm_t *comm, int peer, const unsigned char handle[COLL_CUDA_IPC_EVENT_BYTES], void **ev); \
  void prefix##xevent_destroy(void *ev, int own); \
  coll_result_t prefix##xevent_record(coll_comm_t *comm, void *ev); \
  coll_result_t prefix##xevent_wait(coll_comm_t *comm, void *ev); \
  coll_result_t prefix##lane_after(coll_comm_t *comm, int lane, int after); \
  void prefix##destroy(coll_comm_t *comm);

COLL_CUDA_DECLARE(coll_cudart_)
COLL_CUDA_DECLARE(coll_cudafake_)

#endif
