/*
 * cuda/fake.c -- one GPU emulated in host memory (COLLECTIVES_CUDA_FAKE=1),
 * so that the device executor, the staging pipeline and the CUDA IPC record
 * protocol run, and are tested, on machines without a GPU (CI has none).
 *
 * "Device memory" is a shared-memory file per allocation, mapped where the
 * allocation lives; its "IPC handle" is the file's name, which a peer maps
 * the way cudaIpcOpenMemHandle maps a real handle. Copies are memcpy and the
 * reductions are the host kernels, but run late, as a GPU would: work queued
 * on a lane (cuda.h) only happens when a ticket covering it is waited for,
 * or found done by a poll, and every other poll of an unfinished ticket
 * answers "not yet" without running anything. So a caller that reads a
 * pinned buffer before its copy's ticket, reuses one before the reduction
 * reading it is done, or posts a CUDA IPC DESC before its bytes are final,
 * sees stale bytes here and fails the tests, as it would on a GPU, and the
 * executors' paths for unfinished work run. Nothing orders two lanes but the
 * caller, as on a GPU.
 *
 * Test double only: its allocation list is a process global (the real path
 * keeps all state on the communicator), guarded by a mutex.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/comm_state.h"
#include "cuda/backend.h"
#include "reduce/reduce.h"
#include "base/status.h"

#define FAKE_MAX_ALLOCS 4096
#define FAKE_MAX_OPEN 1024
/* Allocations under this size share a region, as the driver packs small
 * cudaMallocs: a process maps a region once (see ipc_open). */
#define FAKE_REGION_BYTES ((size_t)2 << 20)

typedef struct {
  void *p;
  size_t n;
  char name[COLL_CUDA_IPC_HANDLE_BYTES];
} fake_alloc_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static fake_alloc_t allocs[FAKE_MAX_ALLOCS];
static int nallocs;
static unsigned long serial;

/* The peer allocations this process maps, by name and region (process-wide,
 * as CUDA's are; cuda.c's cache decides what to open and close). */
typedef struct {
  char name[COLL_CUDA_IPC_HANDLE_BYTES];
  uint64_t region; /* 0: an allocation of its own region */
  void *base;
} fake_open_t;

static fake_open_t opened[FAKE_MAX_OPEN];
static int nopened;

/* Work queued on a lane, run in order when a ticket covering it is due. */
enum { OP_COPY, OP_REDUCE, OP_SCALE };
typedef struct {
  int kind;
  void *dst;
  const void *src, *src2;
  size_t n; /* bytes (copy) or elements */
  coll_dtype_t dtype;
  coll_op_t op;
  double divisor;
  uint64_t fence; /* the count of the first fence that covers it */
} fake_op_t;

#define FAKE_QUEUE 1024

typedef struct fake_state {
  coll_cuda_stats_t stats; /* first: cuda.c reads it without knowing the backend */
  uint64_t issued[COLL_CUDA_LANES], completed[COLL_CUDA_LANES];
  fake_op_t q[COLL_CUDA_LANES][FAKE_QUEUE];
  size_t qhead[COLL_CUDA_LANES], qtail[COLL_CUDA_LANES];
  unsigned polls;
  unsigned char *pinned[4];
  size_t pinned_bytes[4];
  void *scratch[2];
  size_t scratch_bytes[2];
  struct fake_state *next; /* every live state, for ipc_close */
} fake_state_t;

/* The queues of every communicator of the process: closing an IPC mapping
 * first runs all queued work (a GPU's cudaIpcCloseMemHandle path waits for
 * the device), and that work may belong to another communicator's thread. */
static pthread_mutex_t qmu = PTHREAD_MUTEX_INITIALIZER;
static fake_state_t *states;

static fake_state_t *state(coll_comm_t *comm) { return (fake_state_t *)comm->cuda; }

const char *coll_cudafake_error_text(void) { return "emulated CUDA call failed"; }
int coll_cudafake_built(void) { return 1; }
int coll_cudafake_device_count(void) { return 1; }

static const fake_alloc_t *find(const void *p) {
  for (int i = 0; i < nallocs; i++)
    if ((const char *)p >= (const char *)allocs[i].p &&
        (const char *)p < (const char *)allocs[i].p + allocs[i].n)
      return &allocs[i];
  return NULL;
}

int coll_cudafake_pointer_device(const void *p) {
  pthread_mutex_lock(&mu);
  int dev = find(p) ? 0 : -1;
  pthread_mutex_unlock(&mu);
  return dev;
}

/* At exit, remove the files of allocations never freed (as a process's
 * device memory goes away with it). */
static void unlink_all(void) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nallocs; i++) shm_unlink(allocs[i].name);
  pthread_mutex_unlock(&mu);
}

/* Once per process: remove the files of processes that died without
 * freeing (a killed rank), then arrange to remove our own at exit. */
static void register_exit(void) {
  DIR *d = opendir("/dev/shm");
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    int pid = 0;
    unsigned long k = 0;
    if (sscanf(e->d_name, "coll-fakegpu-%d-%lu", &pid, &k) == 2 && pid > 0 &&
        kill(pid, 0) != 0 && errno == ESRCH) {
      char name[300];
      snprintf(name, sizeof name, "/%s", e->d_name);
      shm_unlink(name);
    }
  }
  if (d) closedir(d);
  atexit(unlink_all);
}

coll_result_t coll_cudafake_alloc(int device, size_t n, void **p) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  *p = NULL;
  if (device != 0) return COLL_INVALID_ARGUMENT;
  if (n == 0) n = 1;
  pthread_once(&once, register_exit);
  pthread_mutex_lock(&mu);
  coll_result_t res = COLL_SYSTEM_ERROR;
  if (nallocs < FAKE_MAX_ALLOCS) {
    fake_alloc_t *a = &allocs[nallocs];
    snprintf(a->name, sizeof a->name, "/coll-fakegpu-%d-%lu", (int)getpid(), serial++);
    int fd = shm_open(a->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) {
      void *m = ftruncate(fd, (off_t)n) == 0
                    ? mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
      close(fd);
      if (m != MAP_FAILED) {
        a->p = m;
        a->n = n;
        nallocs++;
        *p = m;
        res = COLL_SUCCESS;
      } else {
        shm_unlink(a->name);
      }
    }
  }
  pthread_mutex_unlock(&mu);
  return res;
}

void coll_cudafake_free(void *p) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nallocs; i++) {
    if (allocs[i].p != p) continue;
    munmap(allocs[i].p, allocs[i].n);
    shm_unlink(allocs[i].name);
    allocs[i] = allocs[--nallocs];
    break;
  }
  pthread_mutex_unlock(&mu);
}

coll_result_t coll_cudafake_memcpy(void *dst, const void *src, size_t n) {
  if (n) memcpy(dst, src, n);
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_copy_bandwidth(int device, size_t n, int iters, double *gbps) {
  (void)device;
  char *a = calloc(1, n), *b = calloc(1, n);
  struct timespec t0, t1;
  if (!a || !b) {
    free(a);
    free(b);
    return COLL_SYSTEM_ERROR;
  }
  memset(a, 1, n); /* touch every page, so the copies move real memory */
  memset(b, 2, n);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < iters; i++) {
    memcpy(b, a, n);
    __asm__ volatile("" : : "r"(b) : "memory"); /* keep each copy */
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  *gbps = s > 0 ? (double)n * iters / s / 1e9 : 0;
  free(a);
  free(b);
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_record_ready(int device, void *stream, void **event) {
  (void)device;
  (void)stream;
  *event = NULL;
  return COLL_SUCCESS;
}

void coll_cudafake_event_destroy(void *event) { (void)event; }

coll_result_t coll_cudafake_begin(coll_comm_t *comm, int device, void *stream, void *ready) {
  (void)stream;
  (void)ready;
  if (device != 0)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "rank %d: the emulated GPU is device 0, not %d",
                      comm->rank, device);
  if (!comm->cuda) {
    fake_state_t *s = calloc(1, sizeof(fake_state_t));
    if (!s) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
    comm->cuda = (struct coll_cuda *)s;
    pthread_mutex_lock(&qmu);
    s->next = states;
    states = s;
    pthread_mutex_unlock(&qmu);
  }
  return COLL_SUCCESS;
}

static void run_op(const fake_op_t *o) {
  if (o->kind == OP_COPY) {
    if (o->n && o->dst != o->src) memmove(o->dst, o->src, o->n);
  } else if (o->kind == OP_REDUCE) {
    coll_reduce_kernel(o->dtype, o->op)(o->dst, o->src, o->src2, o->n, NULL);
  } else {
    coll_scale(o->dst, o->src, o->n, o->dtype, o->divisor);
  }
}

/* Runs lane's work covered by fence count k (all of it: k = UINT64_MAX). qmu held. */
static void run_until(fake_state_t *s, int lane, uint64_t k) {
  while (s->qhead[lane] < s->qtail[lane]) {
    fake_op_t *o = &s->q[lane][s->qhead[lane] % FAKE_QUEUE];
    if (o->fence > k) break;
    run_op(o);
    s->qhead[lane]++;
  }
  if (k != UINT64_MAX && k > s->completed[lane]) s->completed[lane] = k;
}

static void run_all(fake_state_t *s) {
  for (int l = 0; l < COLL_CUDA_LANES; l++) {
    run_until(s, l, UINT64_MAX);
    s->completed[l] = s->issued[l];
  }
}

static void enqueue(fake_state_t *s, int lane, const fake_op_t *o) {
  pthread_mutex_lock(&qmu);
  if (s->qtail[lane] - s->qhead[lane] == FAKE_QUEUE) { /* full: the oldest finishes early */
    run_op(&s->q[lane][s->qhead[lane] % FAKE_QUEUE]);
    s->qhead[lane]++;
  }
  fake_op_t *slot = &s->q[lane][s->qtail[lane]++ % FAKE_QUEUE];
  *slot = *o;
  slot->fence = s->issued[lane] + 1;
  pthread_mutex_unlock(&qmu);
}

coll_result_t coll_cudafake_copy_on(coll_comm_t *comm, int lane, void *dst, const void *src, size_t n) {
  if (n == 0 || dst == src) return COLL_SUCCESS;
  fake_op_t o = {OP_COPY, dst, src, NULL, n, COLL_UINT8, COLL_SUM, 1.0, 0};
  enqueue(state(comm), lane, &o);
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_reduce(coll_comm_t *comm, void *out, const void *in1, const void *in2,
                                   size_t count, coll_dtype_t dtype, coll_op_t op) {
  if (!coll_reduce_kernel(dtype, op)) return coll_error(comm, COLL_INTERNAL_ERROR, "rank %d: no kernel", comm->rank);
  fake_op_t o = {OP_REDUCE, out, in1, in2, count, dtype, op, 1.0, 0};
  enqueue(state(comm), 0, &o);
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_scale(coll_comm_t *comm, void *out, const void *in, size_t count,
                                  coll_dtype_t dtype, double divisor) {
  fake_op_t o = {OP_SCALE, out, in, NULL, count, dtype, COLL_SUM, divisor, 0};
  enqueue(state(comm), 0, &o);
  return COLL_SUCCESS;
}

/* Tickets as the runtime's: count * COLL_CUDA_LANES + lane. */
coll_result_t coll_cudafake_fence_on(coll_comm_t *comm, int lane, uint64_t *ticket) {
  fake_state_t *s = state(comm);
  pthread_mutex_lock(&qmu);
  uint64_t k = ++s->issued[lane];
  pthread_mutex_unlock(&qmu);
  *ticket = k * COLL_CUDA_LANES + (uint64_t)lane;
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_poll(coll_comm_t *comm, uint64_t ticket, int *done) {
  fake_state_t *s = state(comm);
  int lane = (int)(ticket % COLL_CUDA_LANES);
  uint64_t k = ticket / COLL_CUDA_LANES;
  pthread_mutex_lock(&qmu);
  *done = 1;
  if (k > s->completed[lane]) {
    if (s->polls++ % 2 == 0) *done = 0; /* still "running" */
    else run_until(s, lane, k);
  }
  pthread_mutex_unlock(&qmu);
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_wait(coll_comm_t *comm, uint64_t ticket) {
  fake_state_t *s = state(comm);
  pthread_mutex_lock(&qmu);
  uint64_t k = ticket / COLL_CUDA_LANES;
  if (k > s->completed[ticket % COLL_CUDA_LANES]) run_until(s, (int)(ticket % COLL_CUDA_LANES), k);
  pthread_mutex_unlock(&qmu);
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_finish(coll_comm_t *comm) {
  fake_state_t *s = state(comm);
  if (!s) return COLL_SUCCESS;
  pthread_mutex_lock(&qmu);
  run_all(s);
  pthread_mutex_unlock(&qmu);
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_pinned(coll_comm_t *comm, int which, size_t n, unsigned char **p) {
  fake_state_t *s = state(comm);
  if (s->pinned_bytes[which] < n) {
    coll_cudafake_finish(comm); /* queued work may still use the old one */
    free(s->pinned[which]);
    s->pinned[which] = malloc(n);
    s->pinned_bytes[which] = s->pinned[which] ? n : 0;
    if (!s->pinned[which]) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
  }
  *p = s->pinned[which];
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_scratch(coll_comm_t *comm, int which, size_t n, void **p) {
  fake_state_t *s = state(comm);
  if (s->scratch_bytes[which] < n) {
    coll_cudafake_finish(comm); /* queued work may still use the old one */
    coll_cudafake_free(s->scratch[which]);
    s->scratch[which] = NULL;
    s->scratch_bytes[which] = 0;
    COLL_CHECK(coll_cudafake_alloc(0, n, &s->scratch[which]));
    s->scratch_bytes[which] = n;
  }
  *p = s->scratch[which];
  return COLL_SUCCESS;
}

/* A handle: the allocation's file name, then at byte 48 its region key
 * (the exporting process and the 2 MiB-aligned block of its address, for
 * allocations smaller than that; else 0). */
coll_result_t coll_cudafake_ipc_export(coll_comm_t *comm, const void *p,
                                       unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES],
                                       uint64_t *offset, uint64_t *alloc_base) {
  pthread_mutex_lock(&mu);
  const fake_alloc_t *a = find(p);
  if (a) {
    memset(handle, 0, COLL_CUDA_IPC_HANDLE_BYTES);
    snprintf((char *)handle, 48, "%s", a->name);
    uint64_t region = 0;
    if (a->n < FAKE_REGION_BYTES)
      region = (uint64_t)getpid() << 40 | ((uint64_t)(uintptr_t)a->p / FAKE_REGION_BYTES & 0xffffffffffu);
    memcpy(handle + 48, &region, sizeof region);
    *offset = (uint64_t)((const char *)p - (const char *)a->p);
    *alloc_base = (uint64_t)(uintptr_t)a->p;
  }
  pthread_mutex_unlock(&mu);
  if (!a)
    return coll_error(comm, COLL_CUDA_ERROR, "rank %d: %p is not emulated device memory",
                      comm->rank, p);
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_ipc_open(coll_comm_t *comm, int peer,
                                     const unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES],
                                     void **base, size_t *size, int *already_mapped) {
  char name[48];
  memcpy(name, handle, sizeof name);
  name[sizeof name - 1] = 0;
  uint64_t region;
  memcpy(&region, handle + 48, sizeof region);
  *base = NULL;
  *size = 0;
  *already_mapped = 0;
  pthread_mutex_lock(&mu);
  /* As cudaIpcOpenMemHandle: a handle, or other memory of a region, that this
   * process already maps cannot be opened again. */
  for (int i = 0; i < nopened; i++)
    if (!strcmp(opened[i].name, name) || (region && opened[i].region == region))
      *already_mapped = 1;
  pthread_mutex_unlock(&mu);
  if (*already_mapped) return COLL_SUCCESS;
  int fd = shm_open(name, O_RDWR, 0);
  struct stat st;
  void *m = MAP_FAILED;
  if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 0)
    m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (fd >= 0) close(fd);
  if (m == MAP_FAILED)
    return coll_error(comm, COLL_CUDA_ERROR, "rank %d: cannot map rank %d's emulated allocation %s",
                      comm->rank, peer, name);
  pthread_mutex_lock(&mu);
  if (nopened == FAKE_MAX_OPEN) {
    pthread_mutex_unlock(&mu);
    munmap(m, (size_t)st.st_size);
    return coll_error(comm, COLL_CUDA_ERROR, "rank %d: too many emulated IPC mappings", comm->rank);
  }
  snprintf(opened[nopened].name, sizeof opened[nopened].name, "%s", name);
  opened[nopened].region = region;
  opened[nopened].base = m;
  nopened++;
  pthread_mutex_unlock(&mu);
  *base = m;
  *size = (size_t)st.st_size;
  return COLL_SUCCESS;
}

void coll_cudafake_ipc_close(int device, void *base, size_t size) {
  (void)device;
  pthread_mutex_lock(&qmu); /* queued reads of it happen first */
  for (fake_state_t *s = states; s; s = s->next) run_all(s);
  pthread_mutex_unlock(&qmu);
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nopened; i++)
    if (opened[i].base == base) {
      opened[i] = opened[--nopened];
      break;
    }
  pthread_mutex_unlock(&mu);
  munmap(base, size);
}

void coll_cudafake_destroy(coll_comm_t *comm) {
  fake_state_t *s = state(comm);
  if (!s) return;
  pthread_mutex_lock(&qmu);
  run_all(s); /* its buffers may go right after */
  for (fake_state_t **pp = &states; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      break;
    }
  pthread_mutex_unlock(&qmu);
  for (int i = 0; i < 4; i++) free(s->pinned[i]);
  coll_cudafake_free(s->scratch[0]);
  coll_cudafake_free(s->scratch[1]);
  free(s);
  comm->cuda = NULL;
}
