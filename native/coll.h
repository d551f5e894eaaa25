/*
 * coll.h -- the C API of the collectives core (what _core.pxd declares).
 *
 * API
 *   coll_comm_create / coll_comm_port / coll_comm_set_peer / coll_comm_destroy
 *   coll_allreduce, coll_allgatherv, coll_broadcast, coll_reduce_scatter_block,
 *   coll_barrier                       blocking collectives
 *   coll_iallreduce + coll_request_*   non-blocking allreduce on the progress thread
 *   coll_reduce, coll_gatherv, coll_scatterv
 *                                      blocking rooted collectives (rooted.c); GPU
 *                                      buffers are staged whole through pinned memory
 *   coll_alltoallv                     pairwise exchange (alltoall.c); GPU buffers as above
 *   coll_isend / coll_irecv / coll_send / coll_recv / coll_sendrecv
 *                                      point-to-point messages with tags (p2p.c)
 *   coll_ssend / coll_issend / coll_probe
 *                                      synchronous-mode sends; probes (p2p.c)
 *   coll_comm_split / coll_comm_dup / coll_comm_free
 *                                      subcommunicators over the same links (comm/subcomm.c)
 *   coll_request_status / coll_request_wait_any
 *                                      what a receive got; the first of several to finish
 *   coll_comm_last_error               text of the last failure (rank, peer, seq, values)
 *   coll_reduce_local                  one host reduction kernel, for tests and adapters
 *   coll_param_*                       the declared COLLECTIVES_* tunables
 *
 * Contracts shared by every collective:
 *   - every rank of the communicator calls the same collectives in the same
 *     order with the same count, dtype, op and root; a rank that disagrees
 *     makes the call fail with COLL_REMOTE_ERROR on the ranks that see it,
 *     and the failure spreads to every rank by closing links (a broadcast
 *     whose ranks name different roots fails on every rank in that call,
 *     with COLL_INVALID_USAGE naming the roots, and nothing else breaks);
 *   - sendbuf == recvbuf is the in-place form; otherwise the two must not
 *     overlap;
 *   - blocking calls return when this rank's part is done: recvbuf is final;
 *   - timeout <= 0 means the communicator default (COLLECTIVES_TIMEOUT);
 *   - after any error other than COLL_INVALID_ARGUMENT or COLL_INVALID_USAGE
 *     the communicator is broken: its links are closed and every later call
 *     fails at once.
 */
#ifndef COLL_H
#define COLL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  COLL_SUCCESS = 0,
  COLL_INVALID_ARGUMENT = 1, /* bad buffer, count, dtype, op, root: nothing was sent */
  COLL_INVALID_USAGE = 2,    /* call not allowed in this state (broken communicator) */
  COLL_SYSTEM_ERROR = 3,     /* a syscall failed (socket, poll, memory) */
  COLL_REMOTE_ERROR = 4,     /* a peer closed, died, disagreed or sent garbage */
  COLL_TIMEOUT = 5,          /* the deadline passed while waiting on a peer */
  COLL_INTERNAL_ERROR = 6,   /* a bug in this library */
  COLL_CUDA_ERROR = 7
} coll_result_t;

typedef enum {
  COLL_INT8 = 0,
  COLL_UINT8 = 1,
  COLL_INT32 = 2,
  COLL_INT64 = 3,
  COLL_FLOAT16 = 4,
  COLL_BFLOAT16 = 5,
  COLL_FLOAT32 = 6,
  COLL_FLOAT64 = 7,
  COLL_NUM_DTYPES = 8
} coll_dtype_t;

typedef enum {
  COLL_SUM = 0,
  COLL_PROD = 1,
  COLL_MIN = 2,
  COLL_MAX = 3,
  COLL_AVG = 4, /* SUM, then divided by the rank count once at the end */
  COLL_NUM_OPS = 5
} coll_op_t;

typedef enum {
  COLL_ALGO_AUTO = 0,
  COLL_ALGO_RING = 1,
  COLL_ALGO_TREE = 2,
  COLL_ALGO_BUTTERFLY = 3,
  COLL_ALGO_TWO_LEVEL = 4, /* inside hosts, then across them on rails (allreduce_two_level.c) */
  COLL_NUM_ALGOS = 5
} coll_algo_t;

typedef enum {
  COLL_MEMORY_HOST = 0,
  COLL_MEMORY_CUDA = 1 /* a build without CUDA rejects it with COLL_INVALID_ARGUMENT */
} coll_memory_t;

typedef struct coll_comm coll_comm_t;
typedef struct coll_request coll_request_t;

/* The one options struct every collective takes. Fields a collective does not
 * use are ignored. */
typedef struct {
  const void *sendbuf;   /* == recvbuf for in place */
  void *recvbuf;
  size_t count;          /* elements: allreduce/broadcast total, reduce_scatter per rank,
                            allgatherv this rank's contribution */
  const size_t *counts;  /* allgatherv: elements from each rank (size entries) */
  const size_t *displs;  /* allgatherv: element offset of each rank's block in recvbuf */
  coll_dtype_t dtype;
  coll_op_t op;
  int root;              /* broadcast */
  coll_algo_t algo;      /* allreduce; AUTO reads the tuning table */
  double timeout;        /* seconds; <= 0: communicator default */
  size_t segment_bytes;  /* pipelining segment; 0: COLLECTIVES_SEGMENT_BYTES (host) or
                            COLLECTIVES_CUDA_SEGMENT_BYTES (device) */
  coll_memory_t memory;  /* where both buffers live; zero (host) when memset */
  int device;            /* COLL_MEMORY_CUDA: the device holding them */
  void *stream;          /* device buffers: the caller's cudaStream_t; the call waits for
                            the work queued on it before the call (NULL: legacy default) */
  void *ready_event;     /* set by the core for queued calls; callers leave it NULL */
  int peer;              /* point-to-point: destination (send) or source (recv, or
                            COLL_ANY_SOURCE) */
  int tag;               /* point-to-point: >= 0, or COLL_ANY_TAG on a receive */
} coll_args_t;

#define COLL_ANY_SOURCE (-1)
#define COLL_ANY_TAG (-1)
#define COLL_PROC_NULL (-2) /* a send to it or receive from it completes at once, moving
                               nothing (the receive's status: source PROC_NULL, count 0) */
#define COLL_TAG_MAX 0x7fffffff
#define COLL_COUNT_ANY ((size_t)-1) /* a receive (recvbuf NULL) of any size: see
                                       coll_request_take_buffer */

/* What a completed point-to-point receive got. */
typedef struct {
  int source;
  int tag;
  size_t count;  /* elements received (at most the receive's count) */
  size_t nbytes; /* their bytes */
  coll_dtype_t dtype; /* the message's element type (a probe's: the sender's) */
} coll_status_t;

/* Creates rank `rank` of `size` and starts listening on bind_host (numeric
 * IPv4/IPv6 address, "" for any). comm_id (16 bytes) must be equal on all
 * ranks: it guards links against strays from another job. */
coll_result_t coll_comm_create(int rank, int size, const char *bind_host,
                               const uint8_t comm_id[16], coll_comm_t **out);
/* The 32-byte key that authenticates this communicator's link openings and
 * abort notices (derived from the job secret, collectives/rendezvous/auth.py); set it
 * before the first collective, equal on every rank. Unset: all zeros. */
coll_result_t coll_comm_set_link_key(coll_comm_t *comm, const uint8_t *key, size_t n);
/* HMAC-SHA256 of msg under key (native/auth.c; exposed for its tests). */
void coll_hmac_sha256(const uint8_t *key, size_t keylen, const uint8_t *msg, size_t n,
                      uint8_t out[32]);
/* Whether a shared-memory path offered by rank `from` to rank `to` is one
 * the core itself makes (transport/shm.c; exposed for its tests). */
int coll_shm_path_ok(const char *path, int from, int to, uint64_t token);
/* The TCP port this rank listens on (publish it for the peers). */
int coll_comm_port(const coll_comm_t *comm);
/* Where to reach `peer`; every peer must be set before the first collective. */
coll_result_t coll_comm_set_peer(coll_comm_t *comm, int peer, const char *host, int port);
/* An identifier equal for ranks on the same host (hostname + boot id): such
 * peers may use the shared-memory transport. Optional; "" means unknown. */
coll_result_t coll_comm_set_peer_host(coll_comm_t *comm, int peer, const char *host_id);
/* The host id set for `peer` ("" if none or out of range). */
const char *coll_comm_peer_host(const coll_comm_t *comm, int peer);
/* How long a rank that cannot progress keeps checking before it sleeps in
 * poll() (microseconds; 0: sleep at once). */
void coll_comm_set_spin(coll_comm_t *comm, double us);
/* Whether this host runs more ranks than it has cores; set before the first
 * collective. Such a rank yields its core between checks (sched_yield): one
 * that spins without yielding steals the core a peer needs to make progress,
 * while one that yields hands it over and still avoids the slow wake-up from
 * poll(). And with COLLECTIVES_SOCKET_BUFFER=auto its TCP links keep the
 * kernel's buffer autotuning instead of fixed 4 MiB buffers: loopback
 * allreduce took 5-40 % less time and less CPU that way (4 ranks on 2 cores,
 * 2 on 1; less data queued in the kernel while a peer waits for its turn on
 * a core is the likely cause), while with a core per rank the fixed buffers
 * took up to 2x less time (2 ranks on 2 cores, 1-8 MiB). */
void coll_comm_set_oversubscribed(coll_comm_t *comm, int oversubscribed);
/* Whether some host of the job runs more ranks than it has cores; set
 * before the first collective, with the same value on every rank (the
 * rendezvous derives it from what all ranks published). Unlike the host's own
 * state above, it may change the wire schedule: the automatic segment size
 * (coll_comm_segment_bytes) follows it, so ranks on a busy host and on an
 * idle one still cut messages alike. */
void coll_comm_set_job_oversubscribed(coll_comm_t *comm, int oversubscribed);
/* Pins every thread of this process to `cpu` (COLLECTIVES_BIND; the policy
 * in collectives/rendezvous/world.py picks the CPU). With more ranks than cores, the
 * scheduler otherwise tends to put a ring's neighbours on one core, where
 * each hand-off waits for the other to be descheduled while the second core
 * idles: 4 ranks on 2 cores took 25-30 % less time at 4 MiB bound round
 * robin. Best effort: a CPU the process may not use is a warning. */
void coll_comm_bind_cpu(coll_comm_t *comm, int cpu);
/* Stops the progress thread, closes every link and the listener, frees comm.
 * On a subcommunicator: frees only what it owns (its rank maps), never the
 * shared links; COLL_INVALID_USAGE from coll_comm_free while it has live
 * subcommunicators of its own. */
void coll_comm_destroy(coll_comm_t *comm);
/* Subcommunicators (comm/subcomm.c), with MPI_Comm_split's semantics: a
 * collective on `comm` (an allgather of every rank's color and key) after
 * which ranks with the same color >= 0 form a new communicator, ranked by
 * key, ties by their rank in comm; color COLL_UNDEFINED gives *out = NULL.
 * The new one shares comm's links (and root's lock, queue and point-to-point
 * engine): no socket is opened for it, a link to a peer not yet connected is
 * opened on the root when first needed. Its context id (in every header) is
 * derived from comm's, a per-communicator split counter and the color, the
 * same on every member. coll_comm_dup is split(0, rank). */
#define COLL_UNDEFINED (-32766)
coll_result_t coll_comm_split(coll_comm_t *comm, int color, int key, double timeout,
                              coll_comm_t **out);
coll_result_t coll_comm_dup(coll_comm_t *comm, double timeout, coll_comm_t **out);
/* A subcommunicator over comm's ranks ranks[0..n-1] (its rank i is ranks[i]),
 * made by the members alone (MPI_Comm_create_group; no message): every
 * member passes the same ranks and tag, and the tag (e.g. a hash of the
 * group's name) must differ between live groups over comm. Invalid argument
 * if a rank repeats, is out of range, or this rank is not listed. */
coll_result_t coll_comm_create_group(coll_comm_t *comm, const int *ranks, int n, uint32_t tag,
                                     coll_comm_t **out);
/* Frees a subcommunicator (refused, COLL_INVALID_USAGE, while it has live
 * subcommunicators) or, on a root, the same as coll_comm_destroy (refused
 * while it has subcommunicators). */
coll_result_t coll_comm_free(coll_comm_t *comm);
/* comm's rank `rank` as a rank of its root (the world); the root rank r as
 * a rank of comm, or -1 (coll_comm_local_rank). */
int coll_comm_world_rank(const coll_comm_t *comm, int rank);
int coll_comm_local_rank(const coll_comm_t *comm, int world_rank);
/* The generation in every header of comm (its root's; transport/wire.h):
 * set it on a root before its first message, equal on every rank (the elastic
 * layer numbers the worlds a job forms after a shrink or grow); a message of
 * another generation fails the receiving call with COLL_REMOTE_ERROR naming
 * both. COLL_INVALID_USAGE once a message went; COLL_INVALID_ARGUMENT on a
 * subcommunicator. New communicators are generation 0. */
coll_result_t coll_comm_set_generation(coll_comm_t *comm, uint32_t gen);
uint32_t coll_comm_generation(const coll_comm_t *comm);
/* The context id in comm's headers (0 on a root). */
uint32_t coll_comm_ctx(const coll_comm_t *comm);
int coll_comm_rank(const coll_comm_t *comm);
int coll_comm_size(const coll_comm_t *comm);
/* The text of the last error (empty if none). Valid until the next call. */
const char *coll_comm_last_error(const coll_comm_t *comm);
/* Nonzero once an error broke the communicator. */
int coll_comm_is_broken(const coll_comm_t *comm);
/* Number of open links (for tests that check finalize closes everything). */
int coll_comm_num_links(const coll_comm_t *comm);
/* The pipelining segment of host-memory schedules: COLLECTIVES_SEGMENT_BYTES,
 * or for "auto" 512 KiB, and 1 MiB when some host of the job is
 * oversubscribed (coll_comm_set_job_oversubscribed) and some peer is reached
 * over TCP: both facts every rank sees alike, as the schedule needs. There, 4 ranks on 2 cores took 6-14 % less time
 * at 4-128 MiB with 1 MiB segments (fewer hand-offs between ranks sharing a
 * core), while over shared memory they took 1.4-1.5x longer and with a core
 * per rank 512 KiB was as fast or faster. */
size_t coll_comm_segment_bytes(coll_comm_t *comm);

/* Blocking collectives (see the contracts at the top). */
coll_result_t coll_allreduce(coll_comm_t *comm, const coll_args_t *args);
coll_result_t coll_allgatherv(coll_comm_t *comm, const coll_args_t *args);
coll_result_t coll_broadcast(coll_comm_t *comm, const coll_args_t *args);
coll_result_t coll_reduce_scatter_block(coll_comm_t *comm, const coll_args_t *args);
coll_result_t coll_barrier(coll_comm_t *comm, double timeout);

/* Rooted collectives (rooted.c), host memory (GPU buffers: staged whole through pinned
 * memory by the communicator, comm/gpu_small.c); root in args->root.
 * reduce: recvbuf (root only; ignored elsewhere, may be NULL) = op over the
 *   ranks' sendbuf, count elements each; sendbuf == recvbuf at the root is
 *   in place; AVG divides once at the root.
 * gatherv: each rank sends count elements from sendbuf; the root puts rank
 *   i's block at recvbuf + displs[i] (counts[i] elements; counts/displs and
 *   recvbuf only matter at the root, where counts[root] must equal count).
 *   sendbuf == recvbuf + displs[root] at the root is in place. A rank whose
 *   count differs from the root's counts[rank] fails, both values named.
 * scatterv: the root sends counts[i] elements from sendbuf + displs[i] to
 *   rank i, which receives count elements into recvbuf; recvbuf ==
 *   sendbuf + displs[root] at the root is in place.
 * A rank that refused its own arguments (a front end's check, before any byte
 * moved) still calls the same collective, with root COLL_ROOT_REFUSED and
 * count 0: it runs only the root agreement, so every other rank fails at once
 * with COLL_INVALID_USAGE naming it ("refused its arguments"), nothing is
 * sent, the communicator stays usable, and it returns COLL_INVALID_ARGUMENT.
 * coll_broadcast takes the same root, with no buffer but with the count, dtype
 * and memory kind the rank read from its own (the broadcast's agreement header
 * carries them, so a refusing rank whose count or dtype differs from the
 * root's makes the others fail with that mismatch instead, at once). */
#define COLL_ROOT_REFUSED (-3)
coll_result_t coll_reduce(coll_comm_t *comm, const coll_args_t *args);
coll_result_t coll_gatherv(coll_comm_t *comm, const coll_args_t *args);
coll_result_t coll_scatterv(coll_comm_t *comm, const coll_args_t *args);
/* alltoallv (alltoall.c), host memory (GPU buffers: as the rooted ones): rank r sends counts[j] elements from
 * sendbuf + displs[j] to rank j and receives counts[size + j] elements from
 * rank j into recvbuf + displs[size + j] (counts and displs hold 2 * size
 * entries: send side, then receive side). Every pair must agree on the
 * size of what passes between them, else the receiver fails naming both.
 * sendbuf == recvbuf is in place (the send side read from a copy). */
coll_result_t coll_alltoallv(coll_comm_t *comm, const coll_args_t *args);

/* Non-blocking collectives: queued on the communicator's progress thread and
 * run in call order with the other queued requests; a blocking collective
 * issued meanwhile waits for the queue to drain first. Arguments are checked
 * (and copied) at the call; buffers must stay alive and untouched until the
 * request completes. */
coll_result_t coll_iallreduce(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req);
coll_result_t coll_iallgatherv(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req);
coll_result_t coll_ibroadcast(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req);
/* Non-blocking reduce, gatherv, scatterv: the same contracts as the blocking calls, run on
 * the progress thread in submission order (counts and displs are copied). */
coll_result_t coll_ireduce(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req);
coll_result_t coll_igatherv(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req);
coll_result_t coll_iscatterv(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req);
coll_result_t coll_ireduce_scatter_block(coll_comm_t *comm, const coll_args_t *args,
                                         coll_request_t **req);
coll_result_t coll_ibarrier(coll_comm_t *comm, double timeout, coll_request_t **req);
/* coll_alltoallv as a request (host buffers; counts and displs are copied). */
coll_result_t coll_ialltoallv(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req);
/* Blocks (GIL released by the caller) until done; returns its result. */
coll_result_t coll_request_wait(coll_request_t *req);
/* *done = 1 and returns its result when finished, else *done = 0, COLL_SUCCESS. */
coll_result_t coll_request_test(coll_request_t *req, int *done);
/* Frees a finished request; an unfinished one is waited for first. */
void coll_request_free(coll_request_t *req);

/* Point-to-point (p2p.c), over the same links as the collectives.
 *
 * Arguments: sendbuf/recvbuf, count (a receive's count is its capacity),
 * dtype, peer, tag, timeout; host memory only. Contracts:
 *   - messages from one rank to another are matched in the order they were
 *     sent among those that fit a receive (same tag, or COLL_ANY_TAG; that
 *     source, or COLL_ANY_SOURCE), and receives in the order they were posted,
 *     as in MPI;
 *   - the message's dtype must be the receive's and its count at most the
 *     receive's: otherwise the receive fails with COLL_REMOTE_ERROR naming
 *     both sides; a shorter message is fine (coll_request_status says how long);
 *   - a send completes once its bytes are handed to the link: a message that
 *     fits the link's buffers (socket or shared-memory ring) completes without
 *     the receiver; a larger one needs the receiver to read it (MPI's
 *     standard mode). A message that arrives before its receive is posted is
 *     kept, up to COLLECTIVES_P2P_BUFFER_BYTES in all; beyond that it waits
 *     in the link;
 *   - a peer whose next message on a link belongs to a collective is not
 *     read past it: a receive that needs a later message times out;
 *   - every wait has the call's deadline (timeout <= 0: the communicator's);
 *     a timeout, a dead peer or a mismatch breaks the communicator, as for
 *     collectives; an argument error (COLL_INVALID_ARGUMENT) changes nothing;
 *   - non-blocking forms return a request at once; all pending point-to-point
 *     requests progress together whenever any is waited for or tested, so
 *     posting a receive and a send and then waiting for both never deadlocks;
 *     buffers stay the caller's until the request completes.
 */
coll_result_t coll_isend(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req);
coll_result_t coll_irecv(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req);
coll_result_t coll_send(coll_comm_t *comm, const coll_args_t *args);
/* status may be NULL. */
coll_result_t coll_recv(coll_comm_t *comm, const coll_args_t *args, coll_status_t *status);
/* Synchronous mode (MPI_Ssend/Issend): as coll_send/coll_isend, but the send
 * completes only once a receive on the destination has matched the message
 * (the receiver acks it: COLL_WIRE_P2P_ACK), never on the link's buffering.
 * To this rank itself: once a receive here takes it. */
coll_result_t coll_ssend(coll_comm_t *comm, const coll_args_t *args);
coll_result_t coll_issend(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req);
/* MPI_Probe (block) / MPI_Iprobe (!block): *flag = 1 and *status = the
 * envelope (source, tag, count, nbytes) of the message a receive with
 * (source, tag) would take next, without receiving it; it stays for that
 * receive. A blocking probe waits with the deadline of timeout (<= 0: the
 * communicator's), moving every pending message meanwhile; Iprobe makes one
 * pass and never waits for a collective under way. source COLL_PROC_NULL:
 * *flag = 1 at once with an empty status from COLL_PROC_NULL. */
coll_result_t coll_probe(coll_comm_t *comm, int source, int tag, double timeout, int block,
                         int *flag, coll_status_t *status);
/* Sends sendbuf (count elements of dtype to send_args->peer with its tag) and
 * receives into recv_args at once; neither waits for the other. */
coll_result_t coll_sendrecv(coll_comm_t *comm, const coll_args_t *send_args,
                            const coll_args_t *recv_args, coll_status_t *status);
/* A completed receive's source, tag and count (a send's: its peer, tag and
 * count). COLL_INVALID_USAGE if req is not point-to-point or not done. */
coll_result_t coll_request_status(const coll_request_t *req, coll_status_t *status);
/* A completed coll_irecv posted with recvbuf NULL and count COLL_COUNT_ANY
 * allocated its buffer when the message matched: hands it (malloc'd, the
 * caller frees it) and its size over. */
coll_result_t coll_request_take_buffer(coll_request_t *req, void **buf, size_t *nbytes);
/* Blocks until one of reqs[0, n) (all of one communicator; NULL entries
 * skipped) is done; *index = its position. The request is not freed. */
coll_result_t coll_request_wait_any(coll_request_t **reqs, int n, int *index);

/* out[i] = in1[i] op in2[i] for `count` elements; out may alias in1 or in2.
 * AVG reduces as SUM here. */
coll_result_t coll_reduce_local(void *out, const void *in1, const void *in2, size_t count,
                                coll_dtype_t dtype, coll_op_t op);
/* out[i] = in[i] / divisor (AVG's final step); out may alias in. */
coll_result_t coll_scale_local(void *out, const void *in, size_t count, coll_dtype_t dtype,
                               double divisor);

size_t coll_dtype_size(coll_dtype_t dtype);
const char *coll_dtype_name(coll_dtype_t dtype);
const char *coll_op_name(coll_op_t op);
const char *coll_algo_name(coll_algo_t algo);
const char *coll_strerror(coll_result_t res);

/* 1 if this module was built with CUDA; the number of usable GPUs. */
int coll_cuda_built(void);
int coll_cuda_device_count(void);

/* Which algorithm AUTO picks for nbytes on size ranks. */
coll_algo_t coll_tune_choose(int size, size_t nbytes);

/* The core's entry points as a table of function pointers, for adapters that
 * are compiled separately and must call the same core as the Python module
 * (the JAX FFI handler): collectives._core.api_table() returns its address. */
#define COLL_API_VERSION 3
typedef struct {
  int version; /* COLL_API_VERSION */
  coll_result_t (*allreduce)(coll_comm_t *, const coll_args_t *);
  coll_result_t (*allgatherv)(coll_comm_t *, const coll_args_t *);
  coll_result_t (*broadcast)(coll_comm_t *, const coll_args_t *);
  coll_result_t (*reduce_scatter_block)(coll_comm_t *, const coll_args_t *);
  coll_result_t (*barrier)(coll_comm_t *, double);
  const char *(*last_error)(const coll_comm_t *);
  /* version 2: the rooted collectives, alltoallv and point-to-point */
  coll_result_t (*reduce)(coll_comm_t *, const coll_args_t *);
  coll_result_t (*gatherv)(coll_comm_t *, const coll_args_t *);
  coll_result_t (*scatterv)(coll_comm_t *, const coll_args_t *);
  coll_result_t (*alltoallv)(coll_comm_t *, const coll_args_t *);
  coll_result_t (*send)(coll_comm_t *, const coll_args_t *);
  coll_result_t (*recv)(coll_comm_t *, const coll_args_t *, coll_status_t *);
  coll_result_t (*sendrecv)(coll_comm_t *, const coll_args_t *, const coll_args_t *,
                            coll_status_t *);
  /* version 3: communicators by id (coll_comm_id), NULL once freed */
  coll_comm_t *(*comm_from_id)(int64_t);
} coll_api_t;

/* A number for comm, never reused in this process (0: out of memory), for
 * callers that may outlive it (a compiled JAX function): coll_comm_from_id
 * gives the communicator back, or NULL once coll_comm_destroy freed it. */
int64_t coll_comm_id(coll_comm_t *comm);
coll_comm_t *coll_comm_from_id(int64_t id);
void coll_comm_forget_id(coll_comm_t *comm);

/* Declared tunables: index -> name, default text, description, current value. */
int coll_param_count(void);
const char *coll_param_name(int i);
const char *coll_param_default(int i);
const char *coll_param_description(int i);
const char *coll_param_allowed(int i); /* the rule: see param.c */

#ifdef __cplusplus
}
#endif
#endif
