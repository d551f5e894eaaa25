/*
 * comm.c -- the native communicator: creation, peers, the collectives' entry
 * points (validate -> serialize with queued requests -> build schedule ->
 * run -> break on failure), and the progress thread behind non-blocking
 * requests.
 */
#define _GNU_SOURCE
#include "base/comm_state.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "algorithms/algorithms.h"
#include "cuda/cuda.h"
#include "base/param.h"
#include "algorithms/pattern.h"
#include "algorithms/topology.h"
#include "base/status.h"
#include "comm/gpu_small.h"
#include "transport/cuda_ipc.h"
#include "transport/transport.h"
#include "transport/wire.h"

coll_result_t coll_comm_create(int rank, int size, const char *bind_host, const uint8_t comm_id[16],
                               coll_comm_t **out) {
  *out = NULL;
  coll_log_init();
  if (size < 1 || rank < 0 || rank >= size) return COLL_INVALID_ARGUMENT;
  coll_comm_t *c = calloc(1, sizeof *c);
  if (!c) return COLL_SYSTEM_ERROR;
  c->peers = calloc((size_t)size, sizeof *c->peers);
  if (!c->peers) { free(c); return COLL_SYSTEM_ERROR; }
  c->rank = rank;
  c->size = size;
  memcpy(c->id, comm_id, 16);
  c->listen_fd = -1;
  c->abort_from = -1;
  c->timeout = coll_param_double(COLL_PARAM_TIMEOUT);
  if (c->timeout <= 0) c->timeout = 300;
  long long seg = coll_param_int(COLL_PARAM_SEGMENT_BYTES);
  c->segment_bytes = seg > 0 ? (size_t)seg : 0; /* 0: auto, coll_comm_segment_bytes */
  c->sockbuf = strcasecmp(coll_param_str(COLL_PARAM_SOCKET_BUFFER), "auto") == 0
                   ? -1
                   : (int)coll_param_int(COLL_PARAM_SOCKET_BUFFER);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  coll_log_set_rank(rank);
  if (size > 1) {
    coll_result_t res = coll_tcp_listen(c, bind_host);
    if (res != COLL_SUCCESS) {
      /* Keep the text for the caller: it reads it before destroying. */
      *out = c;
      return res;
    }
  }
  COLL_INFO(COLL_LOG_INIT, "rank %d of %d created", rank, size);
  *out = c;
  return COLL_SUCCESS;
}

int coll_comm_port(const coll_comm_t *comm) { return comm->port; }

void coll_comm_set_spin(coll_comm_t *comm, double us) { comm->spin = us > 0 ? us * 1e-6 : 0; }

void coll_comm_set_job_oversubscribed(coll_comm_t *comm, int oversubscribed) {
  comm->job_oversubscribed = oversubscribed != 0;
}

void coll_comm_set_oversubscribed(coll_comm_t *comm, int oversubscribed) {
  comm->oversubscribed = oversubscribed != 0;
}

void coll_comm_bind_cpu(coll_comm_t *comm, int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) {
    COLL_WARN("rank %d: no CPU %d to bind to", comm->rank, cpu);
    return;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    COLL_WARN("rank %d: cannot bind to CPU %d: %s", comm->rank, cpu, strerror(errno));
    return;
  }
  /* That moved only this thread; the others (BLAS and framework pools, the
   * store's) would keep the mask they were created with, so each is moved
   * too. One that exits meanwhile is skipped. */
  int threads = 1;
  pid_t self = (pid_t)gettid();
  DIR *dir = opendir("/proc/self/task");
  for (struct dirent *e; dir && (e = readdir(dir)) != NULL;) {
    pid_t tid = (pid_t)atoi(e->d_name);
    if (tid > 0 && tid != self && sched_setaffinity(tid, sizeof set, &set) == 0) threads++;
  }
  if (dir) closedir(dir);
  COLL_INFO(COLL_LOG_INIT, "rank %d: bound %d thread%s to CPU %d", comm->rank, threads,
            threads == 1 ? "" : "s", cpu);
}

coll_result_t coll_comm_set_peer(coll_comm_t *comm, int peer, const char *host, int port) {
  if (peer < 0 || peer >= comm->size || !host || strlen(host) >= sizeof comm->peers[0].host ||
      port < 0 || port > 65535)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "invalid peer address for rank %d", peer);
  snprintf(comm->peers[peer].host, sizeof comm->peers[peer].host, "%s", host);
  comm->peers[peer].port = port;
  return COLL_SUCCESS;
}

coll_result_t coll_comm_set_peer_host(coll_comm_t *comm, int peer, const char *host_id) {
  if (peer < 0 || peer >= comm->size || !host_id ||
      strlen(host_id) >= sizeof comm->peers[0].host_id)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "invalid host id for rank %d", peer);
  snprintf(comm->peers[peer].host_id, sizeof comm->peers[peer].host_id, "%s", host_id);
  comm->all_shm = 0; /* recomputed on the next AUTO choice */
  coll_comm_topo_forget(comm); /* and the topology on next use */
  return COLL_SUCCESS;
}

const char *coll_comm_peer_host(const coll_comm_t *comm, int peer) {
  return peer >= 0 && peer < comm->size ? comm->peers[peer].host_id : "";
}

const char *coll_comm_last_error(const coll_comm_t *comm) {
  /* A subcommunicator's link and point-to-point failures are recorded on
   * its root, which runs them. */
  return comm->root && !comm->err[0] ? comm->root->err : comm->err;
}
int coll_comm_is_broken(const coll_comm_t *comm) {
  return comm->broken || (comm->root && comm->root->broken); /* shared links */
}

int coll_comm_num_links(const coll_comm_t *comm) {
  int n = 0;
  for (int i = 0; i < comm->size; i++) n += comm->peers[i].link != NULL;
  return n;
}

void coll_comm_break(coll_comm_t *comm, coll_result_t code) {
  if (comm->root) { /* the links are the root's: break it (and so every sub over it) */
    if (!comm->broken) {
      comm->broken = 1;
      comm->broken_code = code;
      coll_subcomm_explain(comm);
    }
    coll_comm_break(comm->root, code);
    return;
  }
  if (comm->broken) return;
  comm->broken = 1;
  comm->broken_code = code;
  /* Peers without a link may be waiting for us to connect: tell them, unless
   * we are failing because a peer told us (its notice reached the others). */
  unsigned char *unlinked = comm->abort_from < 0 ? calloc((size_t)comm->size, 1) : NULL;
  for (int i = 0; unlinked && i < comm->size; i++) unlinked[i] = comm->peers[i].link == NULL;
  coll_links_close_all(comm);
  if (unlinked) coll_tcp_send_aborts(comm, unlinked);
  free(unlinked);
  coll_p2p_fail_all(comm, code);
}

/* ---- argument checks (before any byte is sent; never break the comm) ---- */

static coll_result_t check_common(coll_comm_t *comm, const coll_args_t *a, int needs_op) {
  comm->err_set = 0;
  if ((unsigned)a->dtype >= COLL_NUM_DTYPES)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "invalid dtype %d", (int)a->dtype);
  if (needs_op && (unsigned)a->op >= COLL_NUM_OPS)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "invalid op %d", (int)a->op);
  if (a->count > 0 && (!a->recvbuf || !a->sendbuf))
    return coll_error(comm, COLL_INVALID_ARGUMENT, "NULL buffer with count %zu", a->count);
  if (a->count > ((size_t)1 << 48))
    return coll_error(comm, COLL_INVALID_ARGUMENT, "count %zu too large", a->count);
  if (a->memory == COLL_MEMORY_CUDA) {
    if (!coll_cuda_built()) return coll_cuda_begin(comm, a->device, NULL, NULL); /* says why */
    if (a->device < 0)
      return coll_error(comm, COLL_INVALID_ARGUMENT, "invalid CUDA device %d", a->device);
  } else if (a->memory != COLL_MEMORY_HOST) {
    return coll_error(comm, COLL_INVALID_ARGUMENT, "invalid memory kind %d", (int)a->memory);
  }
  return COLL_SUCCESS;
}

/* ---- serialization with the progress thread ---- */

static coll_result_t enter(coll_comm_t *comm) {
  coll_result_t res = coll_comm_enter(comm);
  /* Half-read point-to-point headers go back to their links (comm_state.h). */
  if (res == COLL_SUCCESS) res = coll_p2p_quiesce(comm, coll_comm_deadline(comm, 0));
  return res;
}

coll_result_t coll_comm_enter(coll_comm_t *comm) {
  coll_comm_t *L = coll_comm_root(comm);
  pthread_mutex_lock(&L->mu);
  while (L->busy || L->qhead) pthread_cond_wait(&L->cv, &L->mu);
  L->busy = 1;
  pthread_mutex_unlock(&L->mu);
  comm->err_set = 0;
  comm->err[0] = 0;
  L->err_set = 0;
  L->err[0] = 0;
  if (L->broken && !comm->broken) {
    comm->broken = 1;
    comm->broken_code = L->broken_code;
  }
  if (L->zombie) {
    snprintf(comm->err, sizeof comm->err,
             "rank %d: the communicator this subcommunicator was made from is closed", comm->rank);
    comm->err_set = 1;
    return COLL_INVALID_USAGE;
  }
  if (comm->broken) {
    snprintf(comm->err, sizeof comm->err,
             "rank %d: the communicator is broken by an earlier failure (%s); create a new one",
             comm->rank, coll_strerror(comm->broken_code));
    comm->err_set = 1;
    return COLL_INVALID_USAGE;
  }
  return COLL_SUCCESS;
}

static coll_result_t leave(coll_comm_t *comm, coll_result_t res) {
  return coll_comm_leave(comm, res);
}

coll_result_t coll_comm_leave(coll_comm_t *comm, coll_result_t res) {
  if (res != COLL_SUCCESS && res != COLL_INVALID_ARGUMENT && res != COLL_INVALID_USAGE)
    coll_comm_break(comm, res);
  else if (res != COLL_SUCCESS)
    coll_subcomm_explain(comm);
  coll_comm_t *L = coll_comm_root(comm);
  pthread_mutex_lock(&L->mu);
  L->busy = 0;
  pthread_cond_broadcast(&L->cv);
  pthread_mutex_unlock(&L->mu);
  return res;
}

/* ---- where the buffers live ---- */

/* The arguments a run uses: for GPU buffers, the device's segment size by
 * default, after binding the device and waiting for the caller's queued
 * work (cuda.h's ordering model); a small call on GPU buffers becomes the
 * same call on a pinned host copy (comm/gpu_small.c). */
static coll_result_t memory_begin(coll_comm_t *comm, coll_kind_t kind, const coll_args_t *a,
                                  coll_args_t *out, coll_gpu_small_t *g) {
  *out = *a;
  out->ready_event = NULL;
  g->on = 0;
  if (a->memory != COLL_MEMORY_CUDA) return COLL_SUCCESS;
  if (!out->segment_bytes) {
    long long seg = coll_param_int(COLL_PARAM_CUDA_SEGMENT_BYTES);
    out->segment_bytes = seg > 0 ? (size_t)seg : (size_t)64 << 20;
  }
  COLL_CHECK(coll_cuda_begin(comm, a->device, a->stream, a->ready_event));
  return coll_gpu_small_begin(comm, kind, out, a->segment_bytes, g);
}

/* Returns once every copy and kernel of the call has finished. */
static coll_result_t memory_end(coll_comm_t *comm, const coll_args_t *a, const coll_gpu_small_t *g,
                                coll_result_t res) {
  if (g->on) return coll_gpu_small_end(comm, g, res);
  if (a->memory != COLL_MEMORY_CUDA || res != COLL_SUCCESS) return res;
  return coll_cuda_finish(comm);
}

static coll_result_t run_sched(coll_sched_t *s, const coll_args_t *a) {
  double deadline = coll_comm_deadline(s->comm, a->timeout);
  if (a->memory == COLL_MEMORY_CUDA) COLL_CHECK(coll_p2p_finish(s->comm, deadline));
  return a->memory == COLL_MEMORY_CUDA ? coll_sched_run_device(s, deadline)
                                       : coll_sched_run(s, deadline);
}

static coll_result_t local_copy(coll_comm_t *comm, const coll_args_t *a, void *dst, const void *src,
                                size_t n) {
  if (a->memory == COLL_MEMORY_CUDA) return coll_cuda_copy(comm, dst, src, n);
  if (n && dst != src) memcpy(dst, src, n);
  return COLL_SUCCESS;
}

/* AVG's last step: recvbuf /= the rank count. */
static coll_result_t local_average(coll_comm_t *comm, const coll_args_t *a, size_t count) {
  if (a->op != COLL_AVG) return COLL_SUCCESS;
  if (a->memory == COLL_MEMORY_CUDA)
    return coll_cuda_scale(comm, a->recvbuf, a->recvbuf, count, a->dtype, (double)comm->size);
  coll_scale(a->recvbuf, a->recvbuf, count, a->dtype, (double)comm->size);
  return COLL_SUCCESS;
}

/* ---- the collectives ---- */

static coll_result_t run_allreduce(coll_comm_t *comm, const coll_args_t *args) {
  coll_args_t d;
  coll_gpu_small_t g;
  COLL_CHECK(memory_begin(comm, COLL_KIND_ALLREDUCE, args, &d, &g));
  const coll_args_t *a = &d;
  size_t nbytes = a->count * coll_dtype_size(a->dtype);
  if (comm->size == 1) return memory_end(comm, a, &g, local_copy(comm, a, a->recvbuf, a->sendbuf, nbytes));
  coll_algo_t algo = a->algo == COLL_ALGO_AUTO ? coll_tune_choose_comm(comm, nbytes) : a->algo;
  int handled = 0;
  coll_result_t fast = coll_fast_allreduce(comm, a, algo, &handled);
  if (handled) return memory_end(comm, a, &g, fast == COLL_SUCCESS ? local_average(comm, a, a->count) : fast);
  const coll_algo_entry_t *e = coll_algo_entry(algo);
  coll_sched_t s;
  coll_sched_init(&s, comm, COLL_KIND_ALLREDUCE, a, (uint32_t)algo);
  COLL_INFO(COLL_LOG_TUNE, "allreduce #%u %zu bytes on %d ranks: %s", s.hdr.seq, nbytes, comm->size,
            coll_algo_name(algo));
  coll_result_t res = e->build(&s, a);
  if (res == COLL_SUCCESS) res = run_sched(&s, a);
  coll_sched_free(&s);
  if (res == COLL_SUCCESS) res = local_average(comm, a, a->count);
  return memory_end(comm, a, &g, res);
}

static coll_result_t check_allreduce(coll_comm_t *comm, const coll_args_t *a) {
  COLL_CHECK(check_common(comm, a, 1));
  if ((unsigned)a->algo >= COLL_NUM_ALGOS)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "invalid algorithm %d", (int)a->algo);
  return COLL_SUCCESS;
}

static coll_result_t check_allgatherv(coll_comm_t *comm, const coll_args_t *a) {
  COLL_CHECK(check_common(comm, a, 0));
  if (!a->counts || !a->displs)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "allgatherv needs counts and displacements");
  if (a->counts[comm->rank] != a->count)
    return coll_error(comm, COLL_INVALID_ARGUMENT,
                      "rank %d: send count %zu differs from counts[%d] = %zu", comm->rank, a->count,
                      comm->rank, a->counts[comm->rank]);
  return COLL_SUCCESS;
}

static coll_result_t run_allgatherv(coll_comm_t *comm, const coll_args_t *args) {
  coll_args_t d;
  coll_gpu_small_t g;
  COLL_CHECK(memory_begin(comm, COLL_KIND_ALLGATHERV, args, &d, &g));
  coll_sched_t s;
  int two = comm->size > 1 && coll_tune_two_level(comm);
  coll_sched_init(&s, comm, COLL_KIND_ALLGATHERV, &d, (uint32_t)two);
  COLL_INFO(COLL_LOG_TUNE, "allgatherv #%u on %d ranks: %s", s.hdr.seq, comm->size,
            two ? "two_level" : "ring");
  coll_result_t res = two ? coll_allgatherv_two_level(&s, &d) : coll_allgatherv_ring(&s, &d);
  if (res == COLL_SUCCESS) res = run_sched(&s, &d);
  coll_sched_free(&s);
  return memory_end(comm, &d, &g, res);
}

static coll_result_t check_broadcast(coll_comm_t *comm, const coll_args_t *a) {
  if (a->root == COLL_ROOT_REFUSED) { /* run_broadcast_refused: no buffer is touched */
    comm->err_set = 0;
    if ((unsigned)a->dtype >= COLL_NUM_DTYPES)
      return coll_error(comm, COLL_INVALID_ARGUMENT, "invalid dtype %d", (int)a->dtype);
    return COLL_SUCCESS;
  }
  COLL_CHECK(check_common(comm, a, 0));
  if (a->root < 0 || a->root >= comm->size)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "root %d out of range for %d ranks", a->root,
                      comm->size);
  return COLL_SUCCESS;
}

/* This rank refused its arguments (COLL_ROOT_REFUSED, coll.h): the root agreement alone,
 * under the count, dtype and memory kind the rank read from its buffer (they are in the
 * agreement's header, and a small host broadcast's data rides in it: broadcast_agree.c),
 * with no buffer; every other rank fails there naming this one. */
static coll_result_t run_broadcast_refused(coll_comm_t *comm, const coll_args_t *args) {
  if (comm->size > 1) {
    coll_args_t h = *args;
    h.sendbuf = h.recvbuf = NULL; /* never the root, and nothing is copied on disagreement */
    int done;
    coll_result_t res = coll_root_agree(comm, &h, COLL_KIND_BROADCAST, &done);
    if (res != COLL_SUCCESS && res != COLL_INVALID_USAGE) return res;
  }
  return coll_error(comm, COLL_INVALID_ARGUMENT,
                    "rank %d: broadcast: this rank refused its arguments; the other ranks were "
                    "told and nothing was sent", comm->rank);
}

static coll_result_t run_broadcast(coll_comm_t *comm, const coll_args_t *args) {
  if (args->root == COLL_ROOT_REFUSED) return run_broadcast_refused(comm, args);
  coll_args_t d;
  coll_gpu_small_t g;
  COLL_CHECK(memory_begin(comm, COLL_KIND_BROADCAST, args, &d, &g));
  if (comm->size == 1) return COLL_SUCCESS;
  int done = 0;
  coll_result_t agreed = coll_root_agree(comm, &d, COLL_KIND_BROADCAST, &done);
  if (agreed != COLL_SUCCESS || done) return memory_end(comm, &d, &g, agreed);
  coll_sched_t s;
  coll_sched_init(&s, comm, COLL_KIND_BROADCAST, &d, (uint32_t)d.root);
  coll_result_t res = coll_broadcast_tree(&s, &d);
  if (res == COLL_SUCCESS) res = run_sched(&s, &d);
  coll_sched_free(&s);
  return memory_end(comm, &d, &g, res);
}

static coll_result_t check_reduce_scatter(coll_comm_t *comm, const coll_args_t *a) {
  return check_common(comm, a, 1);
}

static coll_result_t run_reduce_scatter(coll_comm_t *comm, const coll_args_t *args) {
  coll_args_t d;
  coll_gpu_small_t g;
  COLL_CHECK(memory_begin(comm, COLL_KIND_REDUCE_SCATTER, args, &d, &g));
  const coll_args_t *a = &d;
  size_t elem = coll_dtype_size(a->dtype), block = a->count * elem;
  if (comm->size == 1) return memory_end(comm, a, &g, local_copy(comm, a, a->recvbuf, a->sendbuf, block));
  /* The ring reduces into a scratch copy of the whole vector, so that the
   * in-place form (input and result both in recvbuf) never overwrites input
   * that is still to be sent. */
  char *tmp = NULL;
  if (a->memory == COLL_MEMORY_CUDA) {
    COLL_CHECK(coll_cuda_scratch(comm, 0, block * (size_t)comm->size + 1, (void **)&tmp));
  } else {
    tmp = malloc(block * (size_t)comm->size + 1);
    if (!tmp) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
  }
  coll_sched_t s;
  int two = coll_tune_two_level(comm);
  coll_sched_init(&s, comm, COLL_KIND_REDUCE_SCATTER, a, (uint32_t)two);
  COLL_INFO(COLL_LOG_TUNE, "reduce_scatter #%u on %d ranks: %s", s.hdr.seq, comm->size,
            two ? "two_level" : "ring");
  coll_result_t res = two ? coll_reduce_scatter_two_level(&s, a, tmp)
                          : coll_reduce_scatter_ring(&s, a, tmp);
  if (res == COLL_SUCCESS) res = run_sched(&s, a);
  coll_sched_free(&s);
  if (res == COLL_SUCCESS) res = local_copy(comm, a, a->recvbuf, tmp + (size_t)comm->rank * block, block);
  if (res == COLL_SUCCESS) res = local_average(comm, a, a->count);
  if (a->memory != COLL_MEMORY_CUDA) free(tmp);
  return memory_end(comm, a, &g, res);
}

static coll_result_t check_barrier(coll_comm_t *comm, const coll_args_t *a) {
  (void)a;
  comm->err_set = 0;
  return COLL_SUCCESS;
}

static coll_result_t run_barrier(coll_comm_t *comm, const coll_args_t *args) {
  if (comm->size == 1) return COLL_SUCCESS;
  coll_args_t a;
  memset(&a, 0, sizeof a);
  a.dtype = COLL_UINT8;
  a.timeout = args->timeout;
  coll_sched_t s;
  coll_sched_init(&s, comm, COLL_KIND_BARRIER, &a, 0);
  coll_result_t res = coll_barrier_dissemination(&s, &a);
  if (res == COLL_SUCCESS) res = coll_sched_run(&s, coll_comm_deadline(comm, a.timeout));
  coll_sched_free(&s);
  return res;
}

typedef coll_result_t (*check_fn)(coll_comm_t *, const coll_args_t *);
typedef coll_result_t (*run_fn)(coll_comm_t *, const coll_args_t *);

/* A blocking collective: check (nothing sent on failure), wait for queued
 * requests, run, break the communicator on failure. */
coll_result_t coll_comm_blocking(coll_comm_t *comm, const coll_args_t *a,
                                 coll_result_t (*check)(coll_comm_t *, const coll_args_t *),
                                 coll_result_t (*run)(coll_comm_t *, const coll_args_t *)) {
  COLL_CHECK(check(comm, a));
  coll_result_t res = enter(comm);
  if (res == COLL_SUCCESS) res = run(comm, a);
  return leave(comm, res);
}

coll_result_t coll_allreduce(coll_comm_t *comm, const coll_args_t *a) {
  return coll_comm_blocking(comm, a, check_allreduce, run_allreduce);
}
coll_result_t coll_allgatherv(coll_comm_t *comm, const coll_args_t *a) {
  return coll_comm_blocking(comm, a, check_allgatherv, run_allgatherv);
}
coll_result_t coll_broadcast(coll_comm_t *comm, const coll_args_t *a) {
  return coll_comm_blocking(comm, a, check_broadcast, run_broadcast);
}
coll_result_t coll_reduce_scatter_block(coll_comm_t *comm, const coll_args_t *a) {
  return coll_comm_blocking(comm, a, check_reduce_scatter, run_reduce_scatter);
}
/* Reduce, gatherv, scatterv and alltoallv have host schedules only: on GPU
 * buffers the host check runs on the same arguments as host memory, and the
 * call is staged whole through pinned memory around the host run
 * (comm/gpu_small.c). */
static coll_result_t check_whole(coll_comm_t *comm, const coll_args_t *a, check_fn host_check) {
  if (a->memory != COLL_MEMORY_CUDA) return host_check(comm, a);
  coll_args_t h = *a;
  h.memory = COLL_MEMORY_HOST;
  COLL_CHECK(host_check(comm, &h));
  if (!coll_cuda_built()) return coll_cuda_begin(comm, a->device, NULL, NULL); /* says why */
  if (a->device < 0) return coll_error(comm, COLL_INVALID_ARGUMENT, "invalid CUDA device %d", a->device);
  return COLL_SUCCESS;
}

static coll_result_t run_whole(coll_comm_t *comm, const coll_args_t *a, coll_kind_t kind,
                               run_fn host_run) {
  if (a->memory != COLL_MEMORY_CUDA) return host_run(comm, a);
  coll_args_t d = *a;
  coll_gpu_small_t g;
  d.ready_event = NULL;
  COLL_CHECK(coll_cuda_begin(comm, a->device, a->stream, a->ready_event));
  COLL_CHECK(coll_gpu_whole_begin(comm, kind, &d, &g));
  if (!g.on) /* never run host code on device pointers */
    return coll_error(comm, COLL_INVALID_ARGUMENT, "rank %d: %s on GPU buffers needs counts and "
                      "displacements", comm->rank, coll_kind_name(kind));
  return coll_gpu_small_end(comm, &g, host_run(comm, &d));
}

static coll_result_t check_reduce(coll_comm_t *c, const coll_args_t *a) { return check_whole(c, a, coll_check_reduce); }
static coll_result_t check_gatherv(coll_comm_t *c, const coll_args_t *a) { return check_whole(c, a, coll_check_gatherv); }
static coll_result_t check_scatterv(coll_comm_t *c, const coll_args_t *a) { return check_whole(c, a, coll_check_scatterv); }
static coll_result_t check_alltoallv(coll_comm_t *c, const coll_args_t *a) { return check_whole(c, a, coll_check_alltoallv); }
static coll_result_t run_reduce(coll_comm_t *c, const coll_args_t *a) { return run_whole(c, a, COLL_KIND_REDUCE, coll_run_reduce); }
static coll_result_t run_gatherv(coll_comm_t *c, const coll_args_t *a) { return run_whole(c, a, COLL_KIND_GATHER, coll_run_gatherv); }
static coll_result_t run_scatterv(coll_comm_t *c, const coll_args_t *a) { return run_whole(c, a, COLL_KIND_SCATTER, coll_run_scatterv); }
static coll_result_t run_alltoallv(coll_comm_t *c, const coll_args_t *a) { return run_whole(c, a, COLL_KIND_ALLTOALL, coll_run_alltoallv); }

coll_result_t coll_reduce(coll_comm_t *comm, const coll_args_t *a) {
  return coll_comm_blocking(comm, a, check_reduce, run_reduce);
}
coll_result_t coll_gatherv(coll_comm_t *comm, const coll_args_t *a) {
  return coll_comm_blocking(comm, a, check_gatherv, run_gatherv);
}
coll_result_t coll_scatterv(coll_comm_t *comm, const coll_args_t *a) {
  return coll_comm_blocking(comm, a, check_scatterv, run_scatterv);
}
coll_result_t coll_alltoallv(coll_comm_t *comm, const coll_args_t *a) {
  return coll_comm_blocking(comm, a, check_alltoallv, run_alltoallv);
}
coll_result_t coll_barrier(coll_comm_t *comm, double timeout) {
  coll_args_t a;
  memset(&a, 0, sizeof a);
  a.timeout = timeout;
  return coll_comm_blocking(comm, &a, check_barrier, run_barrier);
}

/* ---- non-blocking requests on the progress thread ---- */

/* Runs the request at the head of the queue, which the caller took (busy set,
 * the mutex released): on the progress thread, or on a thread that waits for
 * it (coll_request_wait). Returns with the mutex held, the request done and
 * off the queue. */
static void run_head(coll_comm_t *comm, coll_request_t *req) {
  /* A subcommunicator's requests are queued here too (comm_state.h): each runs
   * on the communicator it was made on. */
  coll_comm_t *rc = req->comm;
  comm->err_set = 0;
  comm->err[0] = 0;
  rc->err_set = 0;
  rc->err[0] = 0;
  coll_result_t res;
  if (rc->broken || comm->broken) {
    snprintf(rc->err, sizeof rc->err, "rank %d: the communicator is broken by an earlier failure",
             rc->rank);
    res = COLL_INVALID_USAGE;
    coll_cuda_event_destroy(req->args.ready_event);
  } else {
    res = coll_p2p_quiesce(rc, coll_comm_deadline(rc, 0));
    if (res == COLL_SUCCESS) res = req->run(rc, &req->args);
    /* As coll_comm_leave: errors every rank saw alike leave it usable. */
    if (res != COLL_SUCCESS && res != COLL_INVALID_ARGUMENT && res != COLL_INVALID_USAGE)
      coll_comm_break(rc, res);
    else if (res != COLL_SUCCESS)
      coll_subcomm_explain(rc);
  }

  pthread_mutex_lock(&comm->mu);
  comm->qhead = req->next;
  if (!comm->qhead) comm->qtail = NULL;
  req->result = res;
  req->done = 1;
  comm->busy = 0;
  pthread_cond_broadcast(&comm->cv);
}

static void *progress_main(void *arg) {
  coll_comm_t *comm = arg;
  pthread_mutex_lock(&comm->mu);
  for (;;) {
    /* Waits for `busy` too: a point-to-point wait on another thread holds
     * the links (as does a blocking collective there, or a waiter running
     * its own request, coll_request_wait). */
    while ((!comm->qhead || comm->busy) && !comm->stopping) pthread_cond_wait(&comm->cv, &comm->mu);
    if (!comm->qhead && comm->stopping) break;
    while (comm->busy) pthread_cond_wait(&comm->cv, &comm->mu);
    if (!comm->qhead) continue;  /* a waiter ran it meanwhile */
    coll_request_t *req = comm->qhead;
    comm->busy = 1;
    pthread_mutex_unlock(&comm->mu);
    run_head(comm, req);
  }
  pthread_mutex_unlock(&comm->mu);
  return NULL;
}

/* Queues a collective on the progress thread (started on first use). The
 * request keeps its own copy of the arguments, counts and displacements
 * included; the buffers stay the caller's to keep alive. */
/* Queues a request; counts and displs (per_rank x size entries each: 2 for
 * alltoallv's send and receive sides) are copied into it. */
static coll_result_t submit_v(coll_comm_t *sub, const coll_args_t *a, check_fn check, run_fn run,
                              coll_request_t **out, size_t per_rank) {
  *out = NULL;
  COLL_CHECK(check(sub, a));
  coll_comm_t *comm = coll_comm_root(sub); /* its queue and thread run the request */
  size_t nv = a->counts ? per_rank * (size_t)sub->size : 0;
  coll_request_t *req = calloc(1, sizeof *req + 2 * nv * sizeof(size_t));
  if (!req) return coll_error(comm, COLL_SYSTEM_ERROR, "out of memory");
  req->args = *a;
  req->run = run;
  if (a->memory == COLL_MEMORY_CUDA) {
    /* Mark the caller's queued work now, on the caller's thread: the
     * progress thread runs the call later, when the stream holds more. */
    coll_result_t res = coll_cuda_record_ready(a->device, a->stream, &req->args.ready_event);
    if (res != COLL_SUCCESS) {
      free(req);
      return coll_error(sub, res, "rank %d: %s", sub->rank, coll_cuda_error_text());
    }
  }
  if (nv) {
    size_t *v = (size_t *)(req + 1);
    memcpy(v, a->counts, nv * sizeof(size_t));
    memcpy(v + nv, a->displs, nv * sizeof(size_t));
    req->args.counts = v;
    req->args.displs = v + nv;
  }
  pthread_mutex_lock(&comm->mu);
  if (!comm->thread_started) {
    if (pthread_create(&comm->thread, NULL, progress_main, comm) != 0) {
      pthread_mutex_unlock(&comm->mu);
      free(req);
      return coll_error(comm, COLL_SYSTEM_ERROR, "cannot start the progress thread");
    }
    comm->thread_started = 1;
  }
  if (comm->qtail) comm->qtail->next = req; else comm->qhead = req;
  comm->qtail = req;
  req->comm = sub;
  pthread_cond_broadcast(&comm->cv);
  pthread_mutex_unlock(&comm->mu);
  *out = req;
  return COLL_SUCCESS;
}

static coll_result_t submit(coll_comm_t *sub, const coll_args_t *a, check_fn check, run_fn run,
                            coll_request_t **out) {
  return submit_v(sub, a, check, run, out, 1);
}

coll_result_t coll_iallreduce(coll_comm_t *comm, const coll_args_t *a, coll_request_t **req) {
  return submit(comm, a, check_allreduce, run_allreduce, req);
}
coll_result_t coll_iallgatherv(coll_comm_t *comm, const coll_args_t *a, coll_request_t **req) {
  return submit(comm, a, check_allgatherv, run_allgatherv, req);
}
coll_result_t coll_ibroadcast(coll_comm_t *comm, const coll_args_t *a, coll_request_t **req) {
  return submit(comm, a, check_broadcast, run_broadcast, req);
}
coll_result_t coll_ireduce_scatter_block(coll_comm_t *comm, const coll_args_t *a,
                                         coll_request_t **req) {
  return submit(comm, a, check_reduce_scatter, run_reduce_scatter, req);
}
coll_result_t coll_ireduce(coll_comm_t *comm, const coll_args_t *a, coll_request_t **req) {
  return submit(comm, a, coll_check_reduce, coll_run_reduce, req);
}
coll_result_t coll_igatherv(coll_comm_t *comm, const coll_args_t *a, coll_request_t **req) {
  return submit(comm, a, coll_check_gatherv, coll_run_gatherv, req);
}
coll_result_t coll_iscatterv(coll_comm_t *comm, const coll_args_t *a, coll_request_t **req) {
  return submit(comm, a, coll_check_scatterv, coll_run_scatterv, req);
}
coll_result_t coll_ialltoallv(coll_comm_t *comm, const coll_args_t *a, coll_request_t **req) {
  return submit_v(comm, a, check_alltoallv, run_alltoallv, req, 2);
}
coll_result_t coll_ibarrier(coll_comm_t *comm, double timeout, coll_request_t **req) {
  coll_args_t a;
  memset(&a, 0, sizeof a);
  a.timeout = timeout;
  return submit(comm, &a, check_barrier, run_barrier, req);
}

coll_result_t coll_request_wait(coll_request_t *req) {
  if (req->p2p) return coll_p2p_wait(req);
  coll_comm_t *comm = coll_comm_root(req->comm);
  pthread_mutex_lock(&comm->mu);
  /* A host-memory request that is next and not yet taken runs on this thread:
   * the caller would only sleep until the progress thread ran it, and the two
   * hand-offs cost a small collective several times its own time (bench/README.md,
   * "Through the frameworks"). GPU requests stay on the progress thread, which
   * holds their device and streams. */
  if (!req->done && comm->qhead == req && !comm->busy && req->args.memory != COLL_MEMORY_CUDA) {
    comm->busy = 1;
    pthread_mutex_unlock(&comm->mu);
    run_head(comm, req);
  }
  while (!req->done) pthread_cond_wait(&comm->cv, &comm->mu);
  pthread_mutex_unlock(&comm->mu);
  return req->result;
}

coll_result_t coll_request_test(coll_request_t *req, int *done) {
  if (req->p2p) return coll_p2p_test(req, done);
  coll_comm_t *comm = coll_comm_root(req->comm);
  pthread_mutex_lock(&comm->mu);
  *done = req->done;
  coll_result_t res = req->done ? req->result : COLL_SUCCESS;
  pthread_mutex_unlock(&comm->mu);
  return res;
}

void coll_request_free(coll_request_t *req) {
  if (!req) return;
  if (req->p2p) { coll_p2p_free(req); return; }
  coll_request_wait(req);
  free(req);
}

void coll_comm_destroy(coll_comm_t *comm) {
  if (!comm) return;
  coll_comm_forget_id(comm);
  if (comm->root) {
    coll_subcomm_destroy(comm);
    return;
  }
  pthread_mutex_lock(&comm->mu);
  comm->stopping = 1;
  pthread_cond_broadcast(&comm->cv);
  int started = comm->thread_started;
  pthread_mutex_unlock(&comm->mu);
  if (started) pthread_join(comm->thread, NULL);
  /* A blocking collective still running on another thread (an adapter's
   * worker) ends by its deadline at the latest; free nothing under it. */
  pthread_mutex_lock(&comm->mu);
  while (comm->busy) pthread_cond_wait(&comm->cv, &comm->mu);
  pthread_mutex_unlock(&comm->mu);
  coll_p2p_destroy(comm);
  coll_comm_topo_forget(comm);
  coll_links_close_all(comm);
  coll_tcp_shutdown(comm);
  coll_ipc_signals_free(comm); /* before the CUDA state: they are events of its device */
  coll_cuda_destroy(comm);
  free(comm->keep.steps);
  free(comm->keep.edges);
  free(comm->keep.scratch);
  if (coll_subcomm_keep(comm)) return; /* its subcommunicators still point at it */
  pthread_mutex_destroy(&comm->mu);
  pthread_cond_destroy(&comm->cv);
  free(comm->peers);
  free(comm);
}
