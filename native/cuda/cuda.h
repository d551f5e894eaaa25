/*
 * cuda.h -- the core's only door to the CUDA runtime: device queries, the
 * communicator's stream and completion tickets, copies and reduction kernels
 * on that stream, pinned staging, device scratch, and CUDA IPC handles.
 *
 * Built two ways from one source (cuda.c): with COLL_HAVE_CUDA (nvcc found at
 * build time) these call the CUDA runtime, linked statically so that the
 * module still imports on a machine without a driver; without it every call
 * fails with "built without CUDA" and coll_cuda_built() is 0. Nothing above
 * this file includes a CUDA header.
 *
 * Ordering model. A device collective first waits on the host for the work
 * the caller queued on its stream before the call (an event recorded on that
 * stream), so the data it sends is final; it then runs every copy and kernel
 * on the communicator's own stream, and returns once they are done. So a
 * framework neither synchronizes the device before the call nor after it.
 * Completion is tracked by tickets: coll_cuda_fence records an event on the
 * stream and returns its number; work on one stream finishes in order, so
 * ticket t done means every earlier ticket is done. Waits sleep in the driver
 * (blocking-sync events) instead of spinning: ranks outnumber cores here.
 */
#ifndef COLL_CUDA_H
#define COLL_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "coll.h"

#define COLL_CUDA_IPC_HANDLE_BYTES 64

/* 1 if this module was built with CUDA. */
int coll_cuda_built(void);
/* Number of usable GPUs (0 without a driver or a device). */
int coll_cuda_device_count(void);
/* The device owning p, or -1 for host memory the runtime does not know. */
int coll_cuda_pointer_device(const void *p);

/* The text of the last failed call made without a communicator (this thread). */
const char *coll_cuda_error_text(void);

/* For the Python buffer helpers and tests (no communicator involved). */
coll_result_t coll_cuda_alloc(int device, size_t n, void **p);
void coll_cuda_free(void *p);
/* Synchronous copy between any two of host and device memory. */
coll_result_t coll_cuda_memcpy(void *dst, const void *src, size_t n);
/* Device-to-device copy bandwidth of `device` in GB/s, timed with events
 * (the physical limit the bench prints beside the IPC numbers). */
coll_result_t coll_cuda_copy_bandwidth(int device, size_t n, int iters, double *gbps);

/* Records, on the caller's thread, an event on `stream` marking the work
 * queued before a non-blocking call (*event is handed to coll_cuda_begin). */
coll_result_t coll_cuda_record_ready(int device, void *stream, void **event);

/* Destroys such an event when its call never runs (NULL is ignored). */
void coll_cuda_event_destroy(void *event);

/* Starts a device collective on `device`: binds the communicator to it on
 * first use (later calls must use the same device), makes this thread's
 * current device the same, and waits for the caller's earlier work: on
 * `ready` if given (consumed), else on an event recorded on `stream` now. */
coll_result_t coll_cuda_begin(coll_comm_t *comm, int device, void *stream, void *ready);
/* Asynchronous on the communicator's stream. */
coll_result_t coll_cuda_copy(coll_comm_t *comm, void *dst, const void *src, size_t n);
coll_result_t coll_cuda_reduce(coll_comm_t *comm, void *out, const void *in1, const void *in2,
                               size_t count, coll_dtype_t dtype, coll_op_t op);
coll_result_t coll_cuda_scale(coll_comm_t *comm, void *out, const void *in, size_t count,
                              coll_dtype_t dtype, double divisor);
/* A ticket for the work queued so far (on lane 0, the communicator's stream). */
coll_result_t coll_cuda_fence(coll_comm_t *comm, uint64_t *ticket);

/* Lanes: independent streams of one communicator, so that work of one kind
 * does not queue behind another's. Lane 0 is the communicator's stream
 * (reductions, host-to-device copies, IPC reads: coll_cuda_copy/reduce/scale/
 * fence above); lane 1 carries the device-to-host copies of staged sends, so
 * that the copy of the next outgoing piece overlaps the reduction or copy of
 * the last incoming one (the copy engines of each direction run at once).
 * Nothing orders two lanes: the caller only queues work on lane 1 whose
 * inputs a completed ticket already made final. A ticket names its lane;
 * coll_cuda_poll/wait take tickets of any lane, and within one lane ticket t
 * done means every earlier ticket of that lane is done. */
#define COLL_CUDA_LANES 2
coll_result_t coll_cuda_copy_on(coll_comm_t *comm, int lane, void *dst, const void *src, size_t n);
coll_result_t coll_cuda_fence_on(coll_comm_t *comm, int lane, uint64_t *ticket);
/* *done = 1 once ticket's work has finished (never blocks). */
coll_result_t coll_cuda_poll(coll_comm_t *comm, uint64_t ticket, int *done);
/* Sleeps until ticket's work has finished. */
coll_result_t coll_cuda_wait(coll_comm_t *comm, uint64_t ticket);
/* Waits for everything queued on the communicator's lanes. */
coll_result_t coll_cuda_finish(coll_comm_t *comm);

/* What the device paths did on this communicator since it bound its GPU
 * (counters for tests and the bench; see schedule/device.c and
 * comm/gpu_small.c). Each backend's state starts with this struct. */
typedef struct {
  uint64_t small_calls;      /* calls staged whole through pinned memory (small path) */
  uint64_t whole_calls;      /* rooted and all-to-all calls staged whole (any size) */
  uint64_t device_runs;      /* schedules run by the device executor */
  uint64_t staged_pieces;    /* pieces sent on staged (pinned host) links */
  uint64_t staged_max_ahead; /* most outgoing pieces staged on one link at once */
  uint64_t staged_max_apply; /* most incoming pieces on the GPU of one link at once */
  uint64_t ipc_descs;        /* CUDA IPC DESC records posted */
  uint64_t ipc_max_posted;   /* most DESCs of one link posted and not yet acknowledged */
  uint64_t ipc_signals;      /* CUDA IPC records ordered by an interprocess event */
  uint64_t ipc_slot_reuses;  /* ... whose event had been recorded before (a ring slot reused) */
  uint64_t gpu_waits;        /* times the device executor slept on the GPU inside a call
                                (not counting the final wait for its own work) */
} coll_cuda_stats_t;
/* NULL before the communicator's first device call. */
coll_cuda_stats_t *coll_cuda_stats(coll_comm_t *comm);

/* Pinned host memory of at least n bytes, mapped for the device, kept and
 * grown by the communicator; `which` picks one of a few independent pools. */
coll_result_t coll_cuda_pinned(coll_comm_t *comm, int which, size_t n, unsigned char **p);
/* The pools: 0 and 1 staged sends and receives (device executor), 2 the
 * small path's copy of a whole call (comm/gpu_small.c). */
#define COLL_CUDA_PINNED_SMALL 2
/* ... and 3 the whole-call copy of the collectives without a device schedule. */
#define COLL_CUDA_PINNED_WHOLE 3
/* Device scratch of at least n bytes on the bound device (kept, grown);
 * `which` picks one of two pools (0: reduce-scatter's vector, 1: the
 * device executor's IPC bounce space). */
coll_result_t coll_cuda_scratch(coll_comm_t *comm, int which, size_t n, void **p);

/* CUDA IPC (transport/cuda_ipc.c uses these). Export: the handle of the
 * allocation holding p, p's offset in it, and the allocation's address here
 * (a peer's cache key: an address seen again with another handle means the
 * old allocation was freed). Import: the local mapping of a peer's handle
 * and its size, from one cache per process (CUDA lets a process open a
 * handle, or any handle of memory it already maps, only once), pinned
 * against eviction until coll_cuda_ipc_release(base). */
coll_result_t coll_cuda_ipc_export(coll_comm_t *comm, const void *p,
                                   unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES],
                                   uint64_t *offset, uint64_t *alloc_base);
coll_result_t coll_cuda_ipc_import(coll_comm_t *comm, int peer,
                                   const unsigned char handle[COLL_CUDA_IPC_HANDLE_BYTES],
                                   uint64_t owner, uint64_t owner_base, void **base, size_t *size);
void coll_cuda_ipc_release(const void *base);
/* Mappings open in this process (tests, and the leak check of issue 26). */
int coll_cuda_ipc_open_count(void);

/* Interprocess events (cudaEventInterprocess): stream-ordered signals between
 * the ranks of one host, which let a CUDA IPC link order the reader's read
 * after the writer's producing work, and the writer's next overwrite after
 * the read, on the GPU instead of on the hosts (transport/cuda_ipc.c).
 * CUDA's rule, which the emulated GPU follows: a wait orders the waiting
 * stream after the most recent record of the event *called* before the
 * wait was called, in whichever process; a record called later does not
 * count, and one called earlier but overwritten by a later record before the
 * wait is called makes the wait longer (never shorter). So a record must be
 * called before its peer hears of it, and a reused event only delays.
 * Create: a new event of this process and its handle for peers. Open: a
 * peer's event from its handle. Destroy (own or opened; NULL is ignored).
 * Record and wait are on lane 0, the communicator's stream. */
#define COLL_CUDA_IPC_EVENT_BYTES 64
coll_result_t coll_cuda_xevent_create(coll_comm_t *comm, void **ev,
                                      unsigned char handle[COLL_CUDA_IPC_EVENT_BYTES]);
coll_result_t coll_cuda_xevent_open(coll_comm_t *comm, int peer,
                                    const unsigned char handle[COLL_CUDA_IPC_EVENT_BYTES], void **ev);
void coll_cuda_xevent_destroy(void *ev, int own);
coll_result_t coll_cuda_xevent_record(coll_comm_t *comm, void *ev);
coll_result_t coll_cuda_xevent_wait(coll_comm_t *comm, void *ev);
/* Work queued on `lane` from now on runs after the work queued so far on
 * lane `after` (an event recorded there, waited on by the other). */
coll_result_t coll_cuda_lane_after(coll_comm_t *comm, int lane, int after);

/* Frees the stream, events, pools and IPC mappings (at communicator destroy). */
void coll_cuda_destroy(coll_comm_t *comm);

#endif
