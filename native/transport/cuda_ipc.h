/*
 * transport/cuda_ipc.h -- the CUDA IPC records a device collective exchanges
 * on a same-host link instead of payload bytes (protocol in
 * transport/cuda_ipc.c). Used by the device executor, schedule/device.c.
 */
#ifndef COLL_TRANSPORT_CUDA_IPC_H
#define COLL_TRANSPORT_CUDA_IPC_H

#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "transport/wire.h"

#define COLL_IPC_RECORD_BYTES 256
/* COLLECTIVES_CUDA_IPC_SLOTS's bound: interprocess events per link and direction. */
#define COLL_IPC_MAX_SLOTS 64

/* Nonzero if device collectives with `peer` go over CUDA IPC (the same answer
 * on both ends when both run with the same settings). */
int coll_cuda_ipc_usable(coll_comm_t *comm, int peer);
/* Nonzero if IPC records are ordered on the GPU streams by interprocess
 * events (COLLECTIVES_CUDA_IPC_EVENTS=1), else on the hosts. */
int coll_ipc_stream_ordered(void);

/* DESC for a send step (h: its header, src: its device bytes). */
coll_result_t coll_ipc_desc_encode(coll_comm_t *comm, const coll_wire_hdr_t *h, const void *src,
                                   unsigned char rec[COLL_IPC_RECORD_BYTES]);
/* ACK for a receive step (h: its header). */
void coll_ipc_ack_encode(const coll_wire_hdr_t *h, unsigned char rec[COLL_IPC_RECORD_BYTES]);
/* Stream-ordered records: records the next interprocess event of the link
 * to `peer` on lane 0, after all work queued there so far, and names it in
 * the encoded record `rec` (which is then sent: never before the record). */
coll_result_t coll_ipc_signal(coll_comm_t *comm, int peer, unsigned char rec[COLL_IPC_RECORD_BYTES]);
/* A received record: fails, naming both sides, unless it is ordered the way
 * this rank orders its own; for a stream-ordered one, lane 0 then waits on
 * the event it names (skipped with `skip`: fault injection for tests). */
coll_result_t coll_ipc_wait_signal(coll_comm_t *comm, int peer,
                                   const unsigned char rec[COLL_IPC_RECORD_BYTES], int skip);
/* The communicator's events (at destroy). */
void coll_ipc_signals_free(coll_comm_t *comm);
/* The flags word of a received record's header (which kind it is). */
uint32_t coll_ipc_record_flags(const unsigned char rec[COLL_IPC_RECORD_BYTES]);
/* The local address of the peer's bytes a checked DESC names (NULL if none),
 * within the mapping of its allocation; that mapping stays pinned (never
 * closed) until coll_ipc_desc_release(*pinned), once the read is queued. */
coll_result_t coll_ipc_desc_map(coll_comm_t *comm, int peer,
                                const unsigned char rec[COLL_IPC_RECORD_BYTES], size_t nbytes,
                                const void **p, void **pinned);
void coll_ipc_desc_release(void *pinned);

#endif
