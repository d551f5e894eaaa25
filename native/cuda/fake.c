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
 * caller, as on a GPU. Work nobody waits for still finishes on its own, late
 * (a thread runs what has been queued for 20 ms), as a GPU's does.
 *
 * Interprocess events (cudaEventInterprocess, cuda.h) are a page of shared
 * memory each: a record counts itself at call time and publishes its number
 * when its lane reaches it; a wait blocks its lane, and all work behind it,
 * until the record counted at the wait's call is published. So a reader
 * that skips its wait on the writer's event reads bytes the writer's lazy
 * lane has not produced yet, and a writer that overwrites what a peer has
 * not read yet changes the peer's result: both show as wrong values.
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

/* An interprocess event: one page of shared memory per event, which the
 * peer maps by name (its "handle"). `calls` counts the records called, at
 * call time; `done` is the number of the last record the lane has run. A
 * wait takes the `calls` of its call time as its target, as CUDA's wait
 * takes the most recent record called before it (cuda.h). */
typedef struct {
  uint64_t calls, done; /* accessed with __atomic builtins: other processes write them */
  int32_t owner;        /* the creating process: a wait on a dead one's event gives up */
} fake_xpage_t;

typedef struct {
  fake_xpage_t *pg;
  char name[48];
} fake_xevent_t;

#define FAKE_MAX_EVENTS 1024
static char evnames[FAKE_MAX_EVENTS][48]; /* own events' files, removed at exit */
static int nevnames;

/* Work queued on a lane, run in order when a ticket covering it is due.
 * SIGNAL publishes an interprocess event's record, XWAIT blocks the lane
 * until one is published, LANE until another lane has run its first
 * `value` ops (coll_cuda_lane_after): the lane then stops there, as a GPU
 * stream does, and everything after waits. */
enum { OP_COPY, OP_REDUCE, OP_SCALE, OP_SIGNAL, OP_XWAIT, OP_LANE };
typedef struct {
  int kind;
  void *dst;
  const void *src, *src2;
  size_t n; /* bytes (copy) or elements */
  coll_dtype_t dtype;
  coll_op_t op;
  double divisor;
  uint64_t fence; /* the count of the first fence that covers it */
  fake_xpage_t *ev; /* SIGNAL, XWAIT */
  uint64_t value;   /* SIGNAL: the record's number; XWAIT: the one waited for; LANE: op count */
  int lane;         /* LANE: the lane waited for */
  double queued;    /* when it was queued (the progress thread runs old work) */
} fake_op_t;

#define FAKE_QUEUE 1024

typedef struct fake_state {
  coll_cuda_stats_t stats; /* first: cuda.c reads it without knowing the backend */
  uint64_t issued[COLL_CUDA_LANES], completed[COLL_CUDA_LANES];
  fake_op_t q[COLL_CUDA_LANES][FAKE_QUEUE];
  size_t qhead[COLL_CUDA_LANES], qtail[COLL_CUDA_LANES]; /* ops run / queued, ever */
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

static void progress_start(void); /* the emulated GPU's own progress, below */

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
  for (int i = 0; i < nevnames; i++) shm_unlink(evnames[i]);
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
    progress_start();
  }
  return COLL_SUCCESS;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void nap(void) {
  struct timespec t = {0, 20000}; /* 20 us: a lane blocked on another process */
  nanosleep(&t, NULL);
}

static int owner_gone(const fake_xpage_t *pg) {
  return kill(pg->owner, 0) != 0 && errno == ESRCH;
}

static void run_lane(fake_state_t *s, int lane, uint64_t k, size_t upto, double older);

/* Whether o may run now (a blocked lane stops at it). qmu held. */
static int runnable(fake_state_t *s, const fake_op_t *o) {
  if (o->kind == OP_XWAIT)
    return __atomic_load_n(&o->ev->done, __ATOMIC_ACQUIRE) >= o->value || owner_gone(o->ev);
  if (o->kind == OP_LANE) {
    if (s->qhead[o->lane] < o->value) run_lane(s, o->lane, UINT64_MAX, o->value, 1e300);
    return s->qhead[o->lane] >= o->value;
  }
  return 1;
}

static void run_op(const fake_op_t *o) {
  if (o->kind == OP_COPY) {
    if (o->n && o->dst != o->src) memmove(o->dst, o->src, o->n);
  } else if (o->kind == OP_REDUCE) {
    coll_reduce_kernel(o->dtype, o->op)(o->dst, o->src, o->src2, o->n, NULL);
  } else if (o->kind == OP_SCALE) {
    coll_scale(o->dst, o->src, o->n, o->dtype, o->divisor);
  } else if (o->kind == OP_SIGNAL) {
    /* Records of one event run in call order (one lane), so done only grows;
     * release: the peer that sees it sees the bytes written before it. */
    __atomic_store_n(&o->ev->done, o->value, __ATOMIC_RELEASE);
  }
}

/* Runs lane's ops in order while they are covered by fence count k, are
 * among its first `upto`, were queued before `older` (seconds) and may run.
 * qmu held. */
static void run_lane(fake_state_t *s, int lane, uint64_t k, size_t upto, double older) {
  while (s->qhead[lane] < s->qtail[lane] && s->qhead[lane] < upto) {
    fake_op_t *o = &s->q[lane][s->qhead[lane] % FAKE_QUEUE];
    if (o->fence > k || o->queued > older || !runnable(s, o)) break;
    run_op(o);
    s->qhead[lane]++;
  }
}

/* Ticket count k of lane is done: no op it covers is left. qmu held. */
static int lane_done(fake_state_t *s, int lane, uint64_t k) {
  if (k <= s->completed[lane]) return 1;
  if (s->qhead[lane] < s->qtail[lane] && s->q[lane][s->qhead[lane] % FAKE_QUEUE].fence <= k)
    return 0;
  s->completed[lane] = k;
  return 1;
}

/* Runs everything queued on s, waiting out lanes blocked on other processes
 * (without holding qmu, so they and this process's other threads move). */
static void drain(fake_state_t *s) {
  for (;;) {
    pthread_mutex_lock(&qmu);
    int left = 0;
    for (int l = 0; l < COLL_CUDA_LANES; l++) {
      run_lane(s, l, UINT64_MAX, SIZE_MAX, 1e300);
      left |= s->qhead[l] < s->qtail[l];
    }
    if (!left)
      for (int l = 0; l < COLL_CUDA_LANES; l++) s->completed[l] = s->issued[l];
    pthread_mutex_unlock(&qmu);
    if (!left) return;
    nap();
  }
}

/* The emulated GPU's own progress: work left queued longer than
 * FAKE_LATE_S runs without the host asking, as a GPU finishes work nobody
 * waits for. Until then only a wait or every other poll runs it, so hosts
 * that race their GPU still see stale bytes; and a lane blocked on another
 * process's event moves once that process's record has run, even while
 * that process's host sleeps on a socket. */
#define FAKE_LATE_S 0.02
static int progress_started;

static void *progress_main(void *arg) {
  (void)arg;
  for (;;) {
    struct timespec t = {0, 2000000};
    nanosleep(&t, NULL);
    pthread_mutex_lock(&qmu);
    double older = now_s() - FAKE_LATE_S;
    for (fake_state_t *s = states; s; s = s->next)
      for (int l = 0; l < COLL_CUDA_LANES; l++) run_lane(s, l, UINT64_MAX, SIZE_MAX, older);
    pthread_mutex_unlock(&qmu);
  }
  return NULL;
}

static void progress_forked(void) { progress_started = 0; } /* the child has no such thread */
static void progress_atfork_register(void) { pthread_atfork(NULL, NULL, progress_forked); }

static void progress_start(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, progress_atfork_register);
  pthread_mutex_lock(&qmu);
  if (!progress_started) {
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &at, progress_main, NULL) == 0) progress_started = 1;
    pthread_attr_destroy(&at);
  }
  pthread_mutex_unlock(&qmu);
}

static void enqueue(fake_state_t *s, int lane, const fake_op_t *o) {
  pthread_mutex_lock(&qmu);
  while (s->qtail[lane] - s->qhead[lane] == FAKE_QUEUE) { /* full: the oldest finishes early */
    run_lane(s, lane, UINT64_MAX, s->qhead[lane] + 1, 1e300);
    if (s->qtail[lane] - s->qhead[lane] < FAKE_QUEUE) break;
    pthread_mutex_unlock(&qmu); /* blocked on another process */
    nap();
    pthread_mutex_lock(&qmu);
  }
  fake_op_t *slot = &s->q[lane][s->qtail[lane]++ % FAKE_QUEUE];
  *slot = *o;
  slot->fence = s->issued[lane] + 1;
  slot->queued = now_s();
  pthread_mutex_unlock(&qmu);
}

coll_result_t coll_cudafake_copy_on(coll_comm_t *comm, int lane, void *dst, const void *src, size_t n) {
  if (n == 0 || dst == src) return COLL_SUCCESS;
  fake_op_t o = {.kind = OP_COPY, .dst = dst, .src = src, .n = n};
  enqueue(state(comm), lane, &o);
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_reduce(coll_comm_t *comm, void *out, const void *in1, const void *in2,
                                   size_t count, coll_dtype_t dtype, coll_op_t op) {
  if (!coll_reduce_kernel(dtype, op)) return coll_error(comm, COLL_INTERNAL_ERROR, "rank %d: no kernel", comm->rank);
  fake_op_t o = {.kind = OP_REDUCE, .dst = out, .src = in1, .src2 = in2, .n = count,
                 .dtype = dtype, .op = op};
  enqueue(state(comm), 0, &o);
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_scale(coll_comm_t *comm, void *out, const void *in, size_t count,
                                  coll_dtype_t dtype, double divisor) {
  fake_op_t o = {.kind = OP_SCALE, .dst = out, .src = in, .n = count, .dtype = dtype,
                 .divisor = divisor};
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
    if (s->polls++ % 2 == 0) {
      *done = 0; /* still "running" */
    } else {
      run_lane(s, lane, k, SIZE_MAX, 1e300);
      *done = lane_done(s, lane, k);
    }
  }
  pthread_mutex_unlock(&qmu);
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_wait(coll_comm_t *comm, uint64_t ticket) {
  fake_state_t *s = state(comm);
  int lane = (int)(ticket % COLL_CUDA_LANES);
  uint64_t k = ticket / COLL_CUDA_LANES;
  for (;;) {
    pthread_mutex_lock(&qmu);
    run_lane(s, lane, k, SIZE_MAX, 1e300);
    int done = lane_done(s, lane, k);
    pthread_mutex_unlock(&qmu);
    if (done) return COLL_SUCCESS;
    nap();
  }
}

coll_result_t coll_cudafake_finish(coll_comm_t *comm) {
  fake_state_t *s = state(comm);
  if (s) drain(s);
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_lane_after(coll_comm_t *comm, int lane, int after) {
  fake_state_t *s = state(comm);
  pthread_mutex_lock(&qmu);
  size_t queued = s->qtail[after];
  pthread_mutex_unlock(&qmu);
  fake_op_t o = {.kind = OP_LANE, .lane = after, .value = queued};
  enqueue(s, lane, &o);
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_xevent_create(coll_comm_t *comm, void **ev,
                                          unsigned char handle[COLL_CUDA_IPC_EVENT_BYTES]) {
  fake_xevent_t *e = calloc(1, sizeof *e);
  *ev = NULL;
  if (!e) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
  pthread_mutex_lock(&mu);
  snprintf(e->name, sizeof e->name, "/coll-fakegpu-%d-%lu", (int)getpid(), serial++);
  int fd = shm_open(e->name, O_CREAT | O_EXCL | O_RDWR, 0600);
  void *m = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, (off_t)sizeof(fake_xpage_t)) == 0)
    m = mmap(NULL, sizeof(fake_xpage_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (fd >= 0) close(fd);
  if (m != MAP_FAILED && nevnames < FAKE_MAX_EVENTS) {
    snprintf(evnames[nevnames++], sizeof evnames[0], "%s", e->name);
  } else {
    if (m != MAP_FAILED) munmap(m, sizeof(fake_xpage_t));
    if (fd >= 0) shm_unlink(e->name);
    m = MAP_FAILED;
  }
  pthread_mutex_unlock(&mu);
  if (m == MAP_FAILED) {
    free(e);
    return coll_error(comm, COLL_CUDA_ERROR, "rank %d: cannot create an emulated interprocess event",
                      comm->rank);
  }
  e->pg = m;
  e->pg->owner = (int32_t)getpid();
  memset(handle, 0, COLL_CUDA_IPC_EVENT_BYTES);
  memcpy(handle, e->name, sizeof e->name);
  *ev = e;
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_xevent_open(coll_comm_t *comm, int peer,
                                        const unsigned char handle[COLL_CUDA_IPC_EVENT_BYTES], void **ev) {
  fake_xevent_t *e = calloc(1, sizeof *e);
  *ev = NULL;
  if (!e) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
  memcpy(e->name, handle, sizeof e->name);
  e->name[sizeof e->name - 1] = 0;
  void *m = MAP_FAILED;
  if (strncmp(e->name, "/coll-fakegpu-", 14) == 0) {
    int fd = shm_open(e->name, O_RDWR, 0);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(fake_xpage_t))
      m = mmap(NULL, sizeof(fake_xpage_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
  }
  if (m == MAP_FAILED) {
    coll_result_t r = coll_error(comm, COLL_CUDA_ERROR,
                                 "rank %d: cannot open rank %d's emulated interprocess event %s",
                                 comm->rank, peer, e->name);
    free(e);
    return r;
  }
  e->pg = m;
  *ev = e;
  return COLL_SUCCESS;
}

void coll_cudafake_xevent_destroy(void *ev, int own) {
  fake_xevent_t *e = ev;
  munmap(e->pg, sizeof(fake_xpage_t));
  if (own) {
    pthread_mutex_lock(&mu);
    shm_unlink(e->name);
    for (int i = 0; i < nevnames; i++)
      if (!strcmp(evnames[i], e->name)) {
        memcpy(evnames[i], evnames[--nevnames], sizeof evnames[0]);
        break;
      }
    pthread_mutex_unlock(&mu);
  }
  free(e);
}

coll_result_t coll_cudafake_xevent_record(coll_comm_t *comm, void *ev) {
  fake_xevent_t *e = ev;
  /* Counted at call time: a wait called after this returns waits for it. */
  uint64_t v = __atomic_add_fetch(&e->pg->calls, 1, __ATOMIC_ACQ_REL);
  fake_op_t o = {.kind = OP_SIGNAL, .ev = e->pg, .value = v};
  enqueue(state(comm), 0, &o);
  return COLL_SUCCESS;
}

coll_result_t coll_cudafake_xevent_wait(coll_comm_t *comm, void *ev) {
  fake_xevent_t *e = ev;
  uint64_t target = __atomic_load_n(&e->pg->calls, __ATOMIC_ACQUIRE);
  if (target == 0) return COLL_SUCCESS; /* never recorded: CUDA's wait is then a no-op */
  fake_op_t o = {.kind = OP_XWAIT, .ev = e->pg, .value = target};
  enqueue(state(comm), 0, &o);
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
  /* Queued reads of it happen first: every state's work, the list walked
   * afresh after each nap (a state may go meanwhile). */
  pthread_mutex_lock(&qmu);
  for (;;) {
    int left = 0;
    for (fake_state_t *s = states; s; s = s->next)
      for (int l = 0; l < COLL_CUDA_LANES; l++) {
        run_lane(s, l, UINT64_MAX, SIZE_MAX, 1e300);
        left |= s->qhead[l] < s->qtail[l];
      }
    if (!left) break;
    pthread_mutex_unlock(&qmu);
    nap();
    pthread_mutex_lock(&qmu);
  }
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
  drain(s); /* its buffers may go right after */
  pthread_mutex_lock(&qmu);
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
