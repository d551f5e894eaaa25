/*
 * cuda/runtime.c -- the CUDA runtime behind cuda.h (ordering model there), or,
 * in a build without nvcc, the same functions failing with a clear message.
 * cuda.c dispatches to these (or to the test double, cuda/fake.c).
 */
#include "cuda/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/comm_state.h"
#include "base/status.h"

#ifdef COLL_HAVE_CUDA
#include <cuda_runtime_api.h>

/* The kernels' launchers (cuda/kernels.cu). */
cudaError_t coll_cuda_launch_reduce(void *out, const void *in1, const void *in2, size_t count,
                                    coll_dtype_t dtype, coll_op_t op, int sm_count,
                                    cudaStream_t stream);
cudaError_t coll_cuda_launch_scale(void *out, const void *in, size_t count, coll_dtype_t dtype,
                                   double divisor, int sm_count, cudaStream_t stream);

/* Completion events in flight at once; a fence beyond that first waits for
 * the oldest (the executor never needs nearly as many). */
#define COLL_CUDA_EVENTS 256
#define COLL_CUDA_PINNED_POOLS 4

struct coll_cuda {
  coll_cuda_stats_t stats; /* first: cuda.c reads it without knowing the backend */
  int device, sm_count;
  cudaStream_t lanes[COLL_CUDA_LANES]; /* lanes[0] is the communicator's stream */
  cudaEvent_t ready; /* marks the caller's queued work (blocking calls) */
  cudaEvent_t lane_mark[COLL_CUDA_LANES]; /* coll_cuda_lane_after: recorded on the lane waited for */
  cudaEvent_t events[COLL_CUDA_LANES][COLL_CUDA_EVENTS];
  /* tickets per lane: issued so far, all <= completed are done (counts, not
   * ticket values: ticket = count * COLL_CUDA_LANES + lane) */
  uint64_t issued[COLL_CUDA_LANES], completed[COLL_CUDA_LANES];
  unsigned char *pinned[COLL_CUDA_PINNED_POOLS];
  size_t pinned_bytes[COLL_CUDA_PINNED_POOLS];
  void *scratch[2];
  size_t scratch_bytes[2];
};

#define TICKET(count, lane) ((count) * COLL_CUDA_LANES + (uint64_t)(lane))
#define TICKET_LANE(t) ((int)((t) % COLL_CUDA_LANES))
#define TICKET_COUNT(t) ((t) / COLL_CUDA_LANES)

/* Records the failed call's text once, clears CUDA's last error (a sticky
 * error stays: the context is then unusable, and the next call says so). */
#define COLL_CUDACHECK(comm, call)                                                      \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      (void)cudaGetLastError();                                                         \
      return cuda_error((comm), #call, e_);                                             \
    }                                                                                   \
  } while (0)

static __thread char last_text[512];

static coll_result_t cuda_error(coll_comm_t *comm, const char *call, cudaError_t e) {
  snprintf(last_text, sizeof last_text, "%s failed: %s (%s)", call, cudaGetErrorString(e),
           cudaGetErrorName(e));
  if (!comm) return COLL_CUDA_ERROR;
  return coll_error(comm, COLL_CUDA_ERROR, "rank %d: %s", comm->rank, last_text);
}

const char *coll_cudart_error_text(void) { return last_text; }

int coll_cudart_built(void) { return 1; }

int coll_cudart_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

int coll_cudart_pointer_device(const void *p) {
  struct cudaPointerAttributes a;
  if (coll_cuda_device_count() == 0 || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

coll_result_t coll_cudart_alloc(int device, size_t n, void **p) {
  *p = NULL;
  COLL_CUDACHECK(NULL, cudaSetDevice(device));
  COLL_CUDACHECK(NULL, cudaMalloc(p, n ? n : 1));
  return COLL_SUCCESS;
}

void coll_cudart_free(void *p) {
  if (p && cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
}

coll_result_t coll_cudart_memcpy(void *dst, const void *src, size_t n) {
  if (n) COLL_CUDACHECK(NULL, cudaMemcpy(dst, src, n, cudaMemcpyDefault));
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_copy_bandwidth(int device, size_t n, int iters, double *gbps) {
  void *a = NULL, *b = NULL;
  cudaEvent_t t0 = NULL, t1 = NULL;
  coll_result_t res = COLL_CUDA_ERROR;
  float ms = 0;
  *gbps = 0;
  if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&a, n) != cudaSuccess ||
      cudaMalloc(&b, n) != cudaSuccess || cudaEventCreate(&t0) != cudaSuccess ||
      cudaEventCreate(&t1) != cudaSuccess || cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice))
    goto out;
  cudaEventRecord(t0, 0);
  for (int i = 0; i < iters; i++) cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0);
  cudaEventRecord(t1, 0);
  if (cudaEventSynchronize(t1) != cudaSuccess || cudaEventElapsedTime(&ms, t0, t1) != cudaSuccess)
    goto out;
  /* A copy reads n and writes n bytes; nvbandwidth and nccl-tests report n / t. */
  *gbps = ms > 0 ? (double)n * iters / (ms * 1e-3) / 1e9 : 0;
  res = COLL_SUCCESS;
out:
  (void)cudaGetLastError();
  if (t0) cudaEventDestroy(t0);
  if (t1) cudaEventDestroy(t1);
  if (a) cudaFree(a);
  if (b) cudaFree(b);
  return res;
}

static cudaError_t new_event(cudaEvent_t *e) {
  /* Blocking sync: a waiting rank sleeps in the driver instead of spinning
   * on a core a peer needs. */
  return cudaEventCreateWithFlags(e, cudaEventDisableTiming | cudaEventBlockingSync);
}

coll_result_t coll_cudart_record_ready(int device, void *stream, void **event) {
  cudaEvent_t e = NULL;
  *event = NULL;
  COLL_CUDACHECK(NULL, cudaSetDevice(device));
  COLL_CUDACHECK(NULL, new_event(&e));
  cudaError_t err = cudaEventRecord(e, (cudaStream_t)stream);
  if (err != cudaSuccess) {
    cudaEventDestroy(e);
    COLL_CUDACHECK(NULL, err);
  }
  *event = e;
  return COLL_SUCCESS;
}

void coll_cudart_event_destroy(void *event) {
  if (event) cudaEventDestroy((cudaEvent_t)event);
}

static coll_result_t state_create(coll_comm_t *comm, int device) {
  struct coll_cuda *c = calloc(1, sizeof *c);
  if (!c) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
  comm->cuda = c;
  c->device = device;
  COLL_CUDACHECK(comm, cudaSetDevice(device));
  COLL_CUDACHECK(comm, cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, device));
  /* Non-blocking: the legacy default stream of the framework never
   * serializes against ours (ordering is by the ready event instead). */
  for (int l = 0; l < COLL_CUDA_LANES; l++)
    COLL_CUDACHECK(comm, cudaStreamCreateWithFlags(&c->lanes[l], cudaStreamNonBlocking));
  COLL_CUDACHECK(comm, new_event(&c->ready));
  for (int l = 0; l < COLL_CUDA_LANES; l++)
    COLL_CUDACHECK(comm, cudaEventCreateWithFlags(&c->lane_mark[l], cudaEventDisableTiming));
  for (int l = 0; l < COLL_CUDA_LANES; l++)
    for (int i = 0; i < COLL_CUDA_EVENTS; i++) COLL_CUDACHECK(comm, new_event(&c->events[l][i]));
  COLL_INFO(COLL_LOG_CUDA, "rank %d bound to CUDA device %d (%d SMs)", comm->rank, device,
            c->sm_count);
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_begin(coll_comm_t *comm, int device, void *stream, void *ready) {
  if (!comm->cuda) {
    coll_result_t res = state_create(comm, device);
    if (res != COLL_SUCCESS) {
      if (ready) cudaEventDestroy((cudaEvent_t)ready);
      coll_cuda_destroy(comm);
      return res;
    }
  }
  if (comm->cuda->device != device) {
    if (ready) cudaEventDestroy((cudaEvent_t)ready);
    return coll_error(comm, COLL_INVALID_ARGUMENT,
                      "rank %d: the communicator runs on CUDA device %d; this buffer is on device "
                      "%d (use one communicator per device)",
                      comm->rank, comm->cuda->device, device);
  }
  COLL_CUDACHECK(comm, cudaSetDevice(device));
  cudaEvent_t e = (cudaEvent_t)ready;
  if (!e) {
    e = comm->cuda->ready;
    COLL_CUDACHECK(comm, cudaEventRecord(e, (cudaStream_t)stream));
  }
  cudaError_t err = cudaEventSynchronize(e);
  if (ready) cudaEventDestroy(e);
  COLL_CUDACHECK(comm, err);
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_copy_on(coll_comm_t *comm, int lane, void *dst, const void *src, size_t n) {
  if (n && dst != src)
    COLL_CUDACHECK(comm, cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, comm->cuda->lanes[lane]));
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_reduce(coll_comm_t *comm, void *out, const void *in1, const void *in2,
                               size_t count, coll_dtype_t dtype, coll_op_t op) {
  struct coll_cuda *c = comm->cuda;
  COLL_CUDACHECK(comm, coll_cuda_launch_reduce(out, in1, in2, count, dtype, op, c->sm_count, c->lanes[0]));
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_scale(coll_comm_t *comm, void *out, const void *in, size_t count,
                              coll_dtype_t dtype, double divisor) {
  struct coll_cuda *c = comm->cuda;
  COLL_CUDACHECK(comm, coll_cuda_launch_scale(out, in, count, dtype, divisor, c->sm_count, c->lanes[0]));
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_fence_on(coll_comm_t *comm, int lane, uint64_t *ticket) {
  struct coll_cuda *c = comm->cuda;
  if (c->issued[lane] - c->completed[lane] >= COLL_CUDA_EVENTS)
    COLL_CHECK(coll_cuda_wait(comm, TICKET(c->issued[lane] - COLL_CUDA_EVENTS + 1, lane)));
  uint64_t k = ++c->issued[lane];
  COLL_CUDACHECK(comm, cudaEventRecord(c->events[lane][k % COLL_CUDA_EVENTS], c->lanes[lane]));
  *ticket = TICKET(k, lane);
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_poll(coll_comm_t *comm, uint64_t ticket, int *done) {
  struct coll_cuda *c = comm->cuda;
  int lane = TICKET_LANE(ticket);
  uint64_t k = TICKET_COUNT(ticket);
  *done = 1;
  if (k <= c->completed[lane]) return COLL_SUCCESS;
  cudaError_t e = cudaEventQuery(c->events[lane][k % COLL_CUDA_EVENTS]);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    *done = 0;
    return COLL_SUCCESS;
  }
  COLL_CUDACHECK(comm, e);
  c->completed[lane] = k;
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_wait(coll_comm_t *comm, uint64_t ticket) {
  struct coll_cuda *c = comm->cuda;
  int lane = TICKET_LANE(ticket);
  uint64_t k = TICKET_COUNT(ticket);
  if (k <= c->completed[lane]) return COLL_SUCCESS;
  COLL_CUDACHECK(comm, cudaEventSynchronize(c->events[lane][k % COLL_CUDA_EVENTS]));
  c->completed[lane] = k;
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_finish(coll_comm_t *comm) {
  if (!comm->cuda) return COLL_SUCCESS;
  for (int l = 0; l < COLL_CUDA_LANES; l++) {
    uint64_t t = 0;
    COLL_CHECK(coll_cuda_fence_on(comm, l, &t));
    COLL_CHECK(coll_cuda_wait(comm, t));
  }
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_pinned(coll_comm_t *comm, int which, size_t n, unsigned char **p) {
  struct coll_cuda *c = comm->cuda;
  if (which < 0 || which >= COLL_CUDA_PINNED_POOLS)
    return coll_error(comm, COLL_INTERNAL_ERROR, "rank %d: pinned pool %d", comm->rank, which);
  if (c->pinned_bytes[which] < n) {
    if (c->pinned[which]) cudaFreeHost(c->pinned[which]);
    c->pinned[which] = NULL;
    c->pinned_bytes[which] = 0;
    /* Portable and mapped: any device's kernel reads it (unified addressing
     * makes the host pointer the device pointer). */
    COLL_CUDACHECK(comm, cudaHostAlloc((void **)&c->pinned[which], n,
                                       cudaHostAllocPortable | cudaHostAllocMapped));
    c->pinned_bytes[which] = n;
  }
  *p = c->pinned[which];
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_scratch(coll_comm_t *comm, int which, size_t n, void **p) {
  struct coll_cuda *c = comm->cuda;
  if (which < 0 || which > 1)
    return coll_error(comm, COLL_INTERNAL_ERROR, "rank %d: scratch pool %d", comm->rank, which);
  if (c->scratch_bytes[which] < n) {
    /* The stream may still read the old scratch. */
    COLL_CHECK(coll_cuda_finish(comm));
    if (c->scratch[which]) cudaFree(c->scratch[which]);
    c->scratch[which] = NULL;
    c->scratch_bytes[which] = 0;
    COLL_CUDACHECK(comm, cudaMalloc(&c->scratch[which], n));
    c->scratch_bytes[which] = n;
  }
  *p = c->scratch[which];
  return COLL_SUCCESS;
}

/* cuMemGetAddressRange from the driver, found at run time (linking libcuda
 * would make the module fail to import on machines without a driver). */
typedef int (*mem_range_fn)(uintptr_t *base, size_t *size, uintptr_t p);

static mem_range_fn mem_range(void) {
  static mem_range_fn fn;
  static int looked;
  if (!looked) {
    void *f = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = (mem_range_fn)f;
    (void)cudaGetLastError();
    looked = 1;
  }
  return fn;
}

coll_result_t coll_cudart_ipc_export(coll_comm_t *comm, const void *p,
                                   unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES],
                                   uint64_t *offset, uint64_t *alloc_base) {
  mem_range_fn fn = mem_range();
  uintptr_t base = 0;
  size_t size = 0;
  if (!fn || fn(&base, &size, (uintptr_t)p) != 0 || base == 0)
    return coll_error(comm, COLL_CUDA_ERROR,
                      "rank %d: cannot find the CUDA allocation holding %p for CUDA IPC", comm->rank,
                      p);
  cudaIpcMemHandle_t h;
  /* A handle names the whole allocation; the peer adds the offset. Memory
   * from a virtual-memory allocator (cuMemCreate, e.g. PyTorch's expandable
   * segments) has no such handle: the error says so, and
   * COLLECTIVES_CUDA_IPC=0 stages through host memory instead. */
  COLL_CUDACHECK(comm, cudaIpcGetMemHandle(&h, (void *)base));
  memcpy(handle, &h, COLL_CUDA_IPC_HANDLE_BYTES);
  *offset = (uint64_t)((uintptr_t)p - base);
  *alloc_base = (uint64_t)base;
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_ipc_open(coll_comm_t *comm, int peer,
                                   const unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES],
                                   void **base, size_t *size, int *already_mapped) {
  cudaIpcMemHandle_t h;
  memcpy(&h, handle, COLL_CUDA_IPC_HANDLE_BYTES);
  void *p = NULL;
  *base = NULL;
  *size = 0;
  *already_mapped = 0;
  cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (e == cudaErrorAlreadyMapped) {
    (void)cudaGetLastError();
    *already_mapped = 1;
    return COLL_SUCCESS;
  }
  COLL_CUDACHECK(comm, e);
  /* The mapping's extent bounds what a DESC may ask to read. */
  mem_range_fn fn = mem_range();
  uintptr_t b = 0;
  size_t n = 0;
  if (!fn || fn(&b, &n, (uintptr_t)p) != 0 || (uintptr_t)p < b || (uintptr_t)p - b >= n) {
    cudaIpcCloseMemHandle(p);
    (void)cudaGetLastError();
    return coll_error(comm, COLL_CUDA_ERROR,
                      "rank %d: cannot find the extent of rank %d's allocation mapped at %p",
                      comm->rank, peer, p);
  }
  COLL_INFO(COLL_LOG_CUDA, "rank %d mapped an allocation of rank %d at %p (%zu bytes)", comm->rank,
            peer, p, n);
  *base = p;
  *size = n - ((uintptr_t)p - b);
  return COLL_SUCCESS;
}

void coll_cudart_ipc_close(int device, void *base, size_t size) {
  (void)size;
  /* Reads of it may still be queued, on any stream of this process. */
  if (device >= 0) cudaSetDevice(device);
  cudaDeviceSynchronize();
  cudaIpcCloseMemHandle(base);
  (void)cudaGetLastError();
}

coll_result_t coll_cudart_xevent_create(coll_comm_t *comm, void **ev,
                                        unsigned char handle[COLL_CUDA_IPC_EVENT_BYTES]) {
  cudaEvent_t e = NULL;
  cudaIpcEventHandle_t h;
  *ev = NULL;
  /* Interprocess events must not time; they are never waited on by a host
   * here (the streams wait), so no blocking-sync flag either. */
  COLL_CUDACHECK(comm, cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventInterprocess));
  cudaError_t err = cudaIpcGetEventHandle(&h, e);
  if (err != cudaSuccess) {
    cudaEventDestroy(e);
    COLL_CUDACHECK(comm, err);
  }
  memcpy(handle, &h, COLL_CUDA_IPC_EVENT_BYTES);
  *ev = e;
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_xevent_open(coll_comm_t *comm, int peer,
                                      const unsigned char handle[COLL_CUDA_IPC_EVENT_BYTES], void **ev) {
  cudaIpcEventHandle_t h;
  cudaEvent_t e = NULL;
  (void)peer;
  memcpy(&h, handle, COLL_CUDA_IPC_EVENT_BYTES);
  *ev = NULL;
  COLL_CUDACHECK(comm, cudaIpcOpenEventHandle(&e, h));
  *ev = e;
  return COLL_SUCCESS;
}

void coll_cudart_xevent_destroy(void *ev, int own) {
  (void)own; /* an opened event is released the same way */
  if (ev && cudaEventDestroy((cudaEvent_t)ev) != cudaSuccess) (void)cudaGetLastError();
}

coll_result_t coll_cudart_xevent_record(coll_comm_t *comm, void *ev) {
  COLL_CUDACHECK(comm, cudaEventRecord((cudaEvent_t)ev, comm->cuda->lanes[0]));
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_xevent_wait(coll_comm_t *comm, void *ev) {
  COLL_CUDACHECK(comm, cudaStreamWaitEvent(comm->cuda->lanes[0], (cudaEvent_t)ev, 0));
  return COLL_SUCCESS;
}

coll_result_t coll_cudart_lane_after(coll_comm_t *comm, int lane, int after) {
  struct coll_cuda *c = comm->cuda;
  /* Re-recording the mark is safe: the wait below takes the record just made. */
  COLL_CUDACHECK(comm, cudaEventRecord(c->lane_mark[after], c->lanes[after]));
  COLL_CUDACHECK(comm, cudaStreamWaitEvent(c->lanes[lane], c->lane_mark[after], 0));
  return COLL_SUCCESS;
}

void coll_cudart_destroy(coll_comm_t *comm) {
  struct coll_cuda *c = comm->cuda;
  if (!c) return;
  cudaSetDevice(c->device);
  for (int l = 0; l < COLL_CUDA_LANES; l++)
    if (c->lanes[l]) cudaStreamSynchronize(c->lanes[l]);
  if (c->ready) cudaEventDestroy(c->ready);
  for (int l = 0; l < COLL_CUDA_LANES; l++)
    if (c->lane_mark[l]) cudaEventDestroy(c->lane_mark[l]);
  for (int l = 0; l < COLL_CUDA_LANES; l++)
    for (int i = 0; i < COLL_CUDA_EVENTS; i++)
      if (c->events[l][i]) cudaEventDestroy(c->events[l][i]);
  for (int i = 0; i < COLL_CUDA_PINNED_POOLS; i++)
    if (c->pinned[i]) cudaFreeHost(c->pinned[i]);
  for (int i = 0; i < 2; i++)
    if (c->scratch[i]) cudaFree(c->scratch[i]);
  for (int l = 0; l < COLL_CUDA_LANES; l++)
    if (c->lanes[l]) cudaStreamDestroy(c->lanes[l]);
  (void)cudaGetLastError();
  free(c);
  comm->cuda = NULL;
}

#else /* built without CUDA */

#define NOT_BUILT_TEXT                                                                   \
  "GPU buffers need a CUDA build of collectives (nvcc was not found when it was built; " \
  "reinstall with nvcc on PATH or COLLECTIVES_CUDA=1)"

static coll_result_t not_built(coll_comm_t *comm) {
  return coll_error(comm, COLL_INVALID_ARGUMENT, "%s", NOT_BUILT_TEXT);
}

const char *coll_cudart_error_text(void) { return NOT_BUILT_TEXT; }

int coll_cudart_built(void) { return 0; }
int coll_cudart_device_count(void) { return 0; }
int coll_cudart_pointer_device(const void *p) { (void)p; return -1; }
coll_result_t coll_cudart_alloc(int device, size_t n, void **p) {
  (void)device; (void)n; *p = NULL;
  return not_built(NULL);
}
void coll_cudart_free(void *p) { (void)p; }
coll_result_t coll_cudart_memcpy(void *dst, const void *src, size_t n) {
  (void)dst; (void)src; (void)n;
  return not_built(NULL);
}
coll_result_t coll_cudart_copy_bandwidth(int device, size_t n, int iters, double *gbps) {
  (void)device; (void)n; (void)iters; *gbps = 0;
  return not_built(NULL);
}
coll_result_t coll_cudart_record_ready(int device, void *stream, void **event) {
  (void)device; (void)stream; *event = NULL;
  return not_built(NULL);
}
coll_result_t coll_cudart_begin(coll_comm_t *comm, int device, void *stream, void *ready) {
  (void)device; (void)stream; (void)ready;
  return not_built(comm);
}
coll_result_t coll_cudart_copy_on(coll_comm_t *comm, int lane, void *dst, const void *src, size_t n) {
  (void)lane; (void)dst; (void)src; (void)n;
  return not_built(comm);
}
coll_result_t coll_cudart_reduce(coll_comm_t *comm, void *out, const void *in1, const void *in2,
                               size_t count, coll_dtype_t dtype, coll_op_t op) {
  (void)out; (void)in1; (void)in2; (void)count; (void)dtype; (void)op;
  return not_built(comm);
}
coll_result_t coll_cudart_scale(coll_comm_t *comm, void *out, const void *in, size_t count,
                              coll_dtype_t dtype, double divisor) {
  (void)out; (void)in; (void)count; (void)dtype; (void)divisor;
  return not_built(comm);
}
coll_result_t coll_cudart_fence_on(coll_comm_t *comm, int lane, uint64_t *ticket) {
  (void)lane; *ticket = 0;
  return not_built(comm);
}
coll_result_t coll_cudart_poll(coll_comm_t *comm, uint64_t ticket, int *done) {
  (void)ticket; *done = 1;
  return not_built(comm);
}
coll_result_t coll_cudart_wait(coll_comm_t *comm, uint64_t ticket) { (void)ticket; return not_built(comm); }
coll_result_t coll_cudart_finish(coll_comm_t *comm) { (void)comm; return COLL_SUCCESS; }
coll_result_t coll_cudart_pinned(coll_comm_t *comm, int which, size_t n, unsigned char **p) {
  (void)which; (void)n; *p = NULL;
  return not_built(comm);
}
coll_result_t coll_cudart_scratch(coll_comm_t *comm, int which, size_t n, void **p) {
  (void)which; (void)n; *p = NULL;
  return not_built(comm);
}
coll_result_t coll_cudart_ipc_export(coll_comm_t *comm, const void *p,
                                   unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES],
                                   uint64_t *offset, uint64_t *alloc_base) {
  (void)p; (void)handle; *offset = 0; *alloc_base = 0;
  return not_built(comm);
}
coll_result_t coll_cudart_ipc_open(coll_comm_t *comm, int peer,
                                   const unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES],
                                   void **base, size_t *size, int *already_mapped) {
  (void)peer; (void)handle; *base = NULL; *size = 0; *already_mapped = 0;
  return not_built(comm);
}
void coll_cudart_ipc_close(int device, void *base, size_t size) {
  (void)device; (void)base; (void)size;
}
void coll_cudart_event_destroy(void *event) { (void)event; }
coll_result_t coll_cudart_xevent_create(coll_comm_t *comm, void **ev,
                                        unsigned char handle[COLL_CUDA_IPC_EVENT_BYTES]) {
  (void)handle; *ev = NULL;
  return not_built(comm);
}
coll_result_t coll_cudart_xevent_open(coll_comm_t *comm, int peer,
                                      const unsigned char handle[COLL_CUDA_IPC_EVENT_BYTES], void **ev) {
  (void)peer; (void)handle; *ev = NULL;
  return not_built(comm);
}
void coll_cudart_xevent_destroy(void *ev, int own) { (void)ev; (void)own; }
coll_result_t coll_cudart_xevent_record(coll_comm_t *comm, void *ev) { (void)ev; return not_built(comm); }
coll_result_t coll_cudart_xevent_wait(coll_comm_t *comm, void *ev) { (void)ev; return not_built(comm); }
coll_result_t coll_cudart_lane_after(coll_comm_t *comm, int lane, int after) {
  (void)lane; (void)after;
  return not_built(comm);
}
void coll_cudart_destroy(coll_comm_t *comm) { (void)comm; }

#endif
