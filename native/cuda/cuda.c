/*
 * cuda.c -- cuda.h's entry points: each goes to the CUDA runtime
 * (cuda/runtime.c), or, when COLLECTIVES_CUDA_FAKE=1, to the host-memory
 * test double (cuda/fake.c) that lets the device executor and CUDA IPC
 * protocol run in CI, which has no GPU.
 */
#include "cuda/backend.h"

#include <stdlib.h>

#include "base/param.h"

static int fake(void) {
  static int on = -1; /* the parameter cache is read once anyway */
  if (on < 0) on = coll_param_int(COLL_PARAM_CUDA_FAKE) != 0;
  return on;
}

const char *coll_cuda_error_text(void) {
  return fake() ? coll_cudafake_error_text() : coll_cudart_error_text();
}

int coll_cuda_built(void) {
  return fake() ? coll_cudafake_built() : coll_cudart_built();
}

int coll_cuda_device_count(void) {
  return fake() ? coll_cudafake_device_count() : coll_cudart_device_count();
}

int coll_cuda_pointer_device(const void *p) {
  return fake() ? coll_cudafake_pointer_device(p) : coll_cudart_pointer_device(p);
}

coll_result_t coll_cuda_alloc(int device, size_t n, void **p) {
  return fake() ? coll_cudafake_alloc(device, n, p) : coll_cudart_alloc(device, n, p);
}

void coll_cuda_free(void *p) {
  if (fake()) coll_cudafake_free(p); else coll_cudart_free(p);
}

coll_result_t coll_cuda_memcpy(void *dst, const void *src, size_t n) {
  return fake() ? coll_cudafake_memcpy(dst, src, n) : coll_cudart_memcpy(dst, src, n);
}

coll_result_t coll_cuda_copy_bandwidth(int device, size_t n, int iters, double *gbps) {
  return fake() ? coll_cudafake_copy_bandwidth(device, n, iters, gbps) : coll_cudart_copy_bandwidth(device, n, iters, gbps);
}

coll_result_t coll_cuda_record_ready(int device, void *stream, void **event) {
  return fake() ? coll_cudafake_record_ready(device, stream, event) : coll_cudart_record_ready(device, stream, event);
}

void coll_cuda_event_destroy(void *event) {
  if (fake()) coll_cudafake_event_destroy(event); else coll_cudart_event_destroy(event);
}

coll_result_t coll_cuda_begin(coll_comm_t *comm, int device, void *stream, void *ready) {
  return fake() ? coll_cudafake_begin(comm, device, stream, ready) : coll_cudart_begin(comm, device, stream, ready);
}

coll_result_t coll_cuda_copy(coll_comm_t *comm, void *dst, const void *src, size_t n) {
  return fake() ? coll_cudafake_copy(comm, dst, src, n) : coll_cudart_copy(comm, dst, src, n);
}

coll_result_t coll_cuda_reduce(coll_comm_t *comm, void *out, const void *in1, const void *in2, size_t count, coll_dtype_t dtype, coll_op_t op) {
  return fake() ? coll_cudafake_reduce(comm, out, in1, in2, count, dtype, op) : coll_cudart_reduce(comm, out, in1, in2, count, dtype, op);
}

coll_result_t coll_cuda_scale(coll_comm_t *comm, void *out, const void *in, size_t count, coll_dtype_t dtype, double divisor) {
  return fake() ? coll_cudafake_scale(comm, out, in, count, dtype, divisor) : coll_cudart_scale(comm, out, in, count, dtype, divisor);
}

coll_result_t coll_cuda_fence(coll_comm_t *comm, uint64_t *ticket) {
  return fake() ? coll_cudafake_fence(comm, ticket) : coll_cudart_fence(comm, ticket);
}

coll_result_t coll_cuda_poll(coll_comm_t *comm, uint64_t ticket, int *done) {
  return fake() ? coll_cudafake_poll(comm, ticket, done) : coll_cudart_poll(comm, ticket, done);
}

coll_result_t coll_cuda_wait(coll_comm_t *comm, uint64_t ticket) {
  return fake() ? coll_cudafake_wait(comm, ticket) : coll_cudart_wait(comm, ticket);
}

coll_result_t coll_cuda_finish(coll_comm_t *comm) {
  return fake() ? coll_cudafake_finish(comm) : coll_cudart_finish(comm);
}

coll_result_t coll_cuda_pinned(coll_comm_t *comm, int which, size_t n, unsigned char **p) {
  return fake() ? coll_cudafake_pinned(comm, which, n, p) : coll_cudart_pinned(comm, which, n, p);
}

coll_result_t coll_cuda_scratch(coll_comm_t *comm, int which, size_t n, void **p) {
  return fake() ? coll_cudafake_scratch(comm, which, n, p) : coll_cudart_scratch(comm, which, n, p);
}

coll_result_t coll_cuda_ipc_export(coll_comm_t *comm, const void *p, unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES], uint64_t *offset) {
  return fake() ? coll_cudafake_ipc_export(comm, p, handle, offset) : coll_cudart_ipc_export(comm, p, handle, offset);
}

coll_result_t coll_cuda_ipc_import(coll_comm_t *comm, int peer, const unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES], void **base) {
  return fake() ? coll_cudafake_ipc_import(comm, peer, handle, base) : coll_cudart_ipc_import(comm, peer, handle, base);
}

void coll_cuda_destroy(coll_comm_t *comm) {
  if (fake()) coll_cudafake_destroy(comm); else coll_cudart_destroy(comm);
}
