/*
 * cuda.c -- cuda.h's entry points: each goes to the CUDA runtime
 * (cuda/runtime.c), or, when COLLECTIVES_CUDA_FAKE=1, to the host-memory
 * test double (cuda/fake.c) that lets the device executor and CUDA IPC
 * protocol run in CI, which has no GPU.
 */
#include "cuda/backend.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/comm_state.h"
#include "base/status.h"

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

coll_result_t coll_cuda_copy_on(coll_comm_t *comm, int lane, void *dst, const void *src, size_t n) {
  if (lane < 0 || lane >= COLL_CUDA_LANES)
    return coll_error(comm, COLL_INTERNAL_ERROR, "rank %d: CUDA lane %d", comm->rank, lane);
  return fake() ? coll_cudafake_copy_on(comm, lane, dst, src, n) : coll_cudart_copy_on(comm, lane, dst, src, n);
}

coll_result_t coll_cuda_copy(coll_comm_t *comm, void *dst, const void *src, size_t n) {
  return coll_cuda_copy_on(comm, 0, dst, src, n);
}

coll_result_t coll_cuda_reduce(coll_comm_t *comm, void *out, const void *in1, const void *in2, size_t count, coll_dtype_t dtype, coll_op_t op) {
  return fake() ? coll_cudafake_reduce(comm, out, in1, in2, count, dtype, op) : coll_cudart_reduce(comm, out, in1, in2, count, dtype, op);
}

coll_result_t coll_cuda_scale(coll_comm_t *comm, void *out, const void *in, size_t count, coll_dtype_t dtype, double divisor) {
  return fake() ? coll_cudafake_scale(comm, out, in, count, dtype, divisor) : coll_cudart_scale(comm, out, in, count, dtype, divisor);
}

coll_result_t coll_cuda_fence_on(coll_comm_t *comm, int lane, uint64_t *ticket) {
  if (lane < 0 || lane >= COLL_CUDA_LANES)
    return coll_error(comm, COLL_INTERNAL_ERROR, "rank %d: CUDA lane %d", comm->rank, lane);
  return fake() ? coll_cudafake_fence_on(comm, lane, ticket) : coll_cudart_fence_on(comm, lane, ticket);
}

coll_result_t coll_cuda_fence(coll_comm_t *comm, uint64_t *ticket) {
  return coll_cuda_fence_on(comm, 0, ticket);
}

coll_cuda_stats_t *coll_cuda_stats(coll_comm_t *comm) {
  return (coll_cuda_stats_t *)comm->cuda; /* both backends' state starts with it */
}

coll_result_t coll_cuda_xevent_create(coll_comm_t *comm, void **ev, unsigned char handle[COLL_CUDA_IPC_EVENT_BYTES]) {
  return fake() ? coll_cudafake_xevent_create(comm, ev, handle) : coll_cudart_xevent_create(comm, ev, handle);
}

coll_result_t coll_cuda_xevent_open(coll_comm_t *comm, int peer, const unsigned char handle[COLL_CUDA_IPC_EVENT_BYTES], void **ev) {
  return fake() ? coll_cudafake_xevent_open(comm, peer, handle, ev) : coll_cudart_xevent_open(comm, peer, handle, ev);
}

void coll_cuda_xevent_destroy(void *ev, int own) {
  if (!ev) return;
  if (fake()) coll_cudafake_xevent_destroy(ev, own); else coll_cudart_xevent_destroy(ev, own);
}

coll_result_t coll_cuda_xevent_record(coll_comm_t *comm, void *ev) {
  return fake() ? coll_cudafake_xevent_record(comm, ev) : coll_cudart_xevent_record(comm, ev);
}

coll_result_t coll_cuda_xevent_wait(coll_comm_t *comm, void *ev) {
  return fake() ? coll_cudafake_xevent_wait(comm, ev) : coll_cudart_xevent_wait(comm, ev);
}

coll_result_t coll_cuda_lane_after(coll_comm_t *comm, int lane, int after) {
  if (lane < 0 || lane >= COLL_CUDA_LANES || after < 0 || after >= COLL_CUDA_LANES || lane == after)
    return coll_error(comm, COLL_INTERNAL_ERROR, "rank %d: CUDA lanes %d after %d", comm->rank, lane, after);
  return fake() ? coll_cudafake_lane_after(comm, lane, after) : coll_cudart_lane_after(comm, lane, after);
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

coll_result_t coll_cuda_ipc_export(coll_comm_t *comm, const void *p, unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES], uint64_t *offset, uint64_t *alloc_base) {
  return fake() ? coll_cudafake_ipc_export(comm, p, handle, offset, alloc_base) : coll_cudart_ipc_export(comm, p, handle, offset, alloc_base);
}

/* ---- the process's CUDA IPC mappings ----
 *
 * CUDA maps a peer's allocation into a process once: opening the same handle
 * again, or a handle of other memory in a region already mapped (the driver
 * packs small cudaMallocs into shared regions), fails with "already mapped".
 * So the mappings are one cache per process, shared by every communicator,
 * keyed by the handle's bytes. An entry is closed when
 *  - its owner (process, allocation address) shows up with another handle:
 *    that allocation was freed, and keeping the mapping would keep its
 *    memory alive;
 *  - the cache is full (least recently used first);
 *  - opening a new handle fails with "already mapped": first the owner's
 *    other mappings, then every idle one, and the open is tried again.
 * An entry pinned by a DESC being applied is never closed; closing first
 * waits for the device (ipc_close), so no queued read of it remains. */
#define IPC_MAX_MAPS 128

typedef struct {
  unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES];
  uint64_t owner, owner_base; /* the exporting process, its allocation's address there */
  int device;
  void *base;
  size_t size;
  int pins;
  uint64_t used;
} ipc_entry_t;

static pthread_mutex_t ipc_mu = PTHREAD_MUTEX_INITIALIZER;
static ipc_entry_t ipc_maps[IPC_MAX_MAPS];
static int ipc_n;
static uint64_t ipc_clock;

static void ipc_drop(int i) {
  if (fake()) coll_cudafake_ipc_close(ipc_maps[i].device, ipc_maps[i].base, ipc_maps[i].size);
  else coll_cudart_ipc_close(ipc_maps[i].device, ipc_maps[i].base, ipc_maps[i].size);
  ipc_maps[i] = ipc_maps[--ipc_n];
}

/* Closes every idle entry (of `owner` only, unless owner is 0); the count closed. */
static int ipc_drop_idle(uint64_t owner) {
  int closed = 0;
  for (int i = ipc_n - 1; i >= 0; i--)
    if (ipc_maps[i].pins == 0 && (owner == 0 || ipc_maps[i].owner == owner)) {
      ipc_drop(i);
      closed++;
    }
  return closed;
}

coll_result_t coll_cuda_ipc_import(coll_comm_t *comm, int peer, const unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES], uint64_t owner, uint64_t owner_base, void **base, size_t *size) {
  coll_result_t res = COLL_SUCCESS;
  *base = NULL;
  *size = 0;
  pthread_mutex_lock(&ipc_mu);
  ipc_clock++;
  for (int i = 0; i < ipc_n; i++) {
    if (!memcmp(ipc_maps[i].handle, handle, COLL_CUDA_IPC_HANDLE_BYTES)) {
      ipc_maps[i].pins++;
      ipc_maps[i].used = ipc_clock;
      *base = ipc_maps[i].base;
      *size = ipc_maps[i].size;
      goto out;
    }
  }
  for (int i = ipc_n - 1; i >= 0; i--) /* the owner freed what it had at that address */
    if (ipc_maps[i].owner == owner && ipc_maps[i].owner_base == owner_base && ipc_maps[i].pins == 0)
      ipc_drop(i);
  if (ipc_n == IPC_MAX_MAPS) {
    int lru = -1;
    for (int i = 0; i < ipc_n; i++)
      if (ipc_maps[i].pins == 0 && (lru < 0 || ipc_maps[i].used < ipc_maps[lru].used)) lru = i;
    if (lru < 0) {
      res = coll_error(comm, COLL_CUDA_ERROR,
                       "rank %d: %d CUDA IPC mappings are all in use; cannot map rank %d's buffer",
                       comm->rank, IPC_MAX_MAPS, peer);
      goto out;
    }
    ipc_drop(lru);
  }
  void *p = NULL;
  size_t n = 0;
  int already = 0;
  for (int attempt = 0; attempt < 3; attempt++) {
    already = 0;
    res = fake() ? coll_cudafake_ipc_open(comm, peer, handle, &p, &n, &already)
                 : coll_cudart_ipc_open(comm, peer, handle, &p, &n, &already);
    if (res != COLL_SUCCESS || !already) break;
    /* Its memory is in a region one of our mappings holds: close the owner's
     * other mappings, then every idle one, and try again. */
    if (attempt == 0) ipc_drop_idle(owner);
    else if (attempt == 1) ipc_drop_idle(0);
  }
  if (res == COLL_SUCCESS && already)
    res = coll_error(comm, COLL_CUDA_ERROR,
                     "rank %d: cannot map rank %d's buffer with CUDA IPC: its memory is already "
                     "mapped in this process by a mapping still in use (cudaErrorAlreadyMapped); "
                     "COLLECTIVES_CUDA_IPC=0 stages through host memory instead",
                     comm->rank, peer);
  if (res != COLL_SUCCESS) goto out;
  ipc_entry_t *e = &ipc_maps[ipc_n++];
  memcpy(e->handle, handle, COLL_CUDA_IPC_HANDLE_BYTES);
  e->owner = owner;
  e->owner_base = owner_base;
  e->device = coll_cuda_pointer_device(p);
  e->base = p;
  e->size = n;
  e->pins = 1;
  e->used = ipc_clock;
  *base = p;
  *size = n;
out:
  pthread_mutex_unlock(&ipc_mu);
  return res;
}

void coll_cuda_ipc_release(const void *base) {
  pthread_mutex_lock(&ipc_mu);
  for (int i = 0; i < ipc_n; i++)
    if (ipc_maps[i].base == base && ipc_maps[i].pins > 0) {
      ipc_maps[i].pins--;
      break;
    }
  pthread_mutex_unlock(&ipc_mu);
}

int coll_cuda_ipc_open_count(void) {
  pthread_mutex_lock(&ipc_mu);
  int n = ipc_n;
  pthread_mutex_unlock(&ipc_mu);
  return n;
}

void coll_cuda_destroy(coll_comm_t *comm) {
  /* The mappings outlive communicators (any may reuse them); those idle when
   * one goes away are closed, so a finished job holds no peer's memory. */
  if (comm->cuda) {
    pthread_mutex_lock(&ipc_mu);
    ipc_drop_idle(0);
    pthread_mutex_unlock(&ipc_mu);
  }
  if (fake()) coll_cudafake_destroy(comm); else coll_cudart_destroy(comm);
}
