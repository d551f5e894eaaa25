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

#define COLL_IPC_RECORD_BYTES 128

/* Nonzero if device collectives with `peer` go over CUDA IPC (the same answer
 * on both ends when both run with the same settings). */
int coll_cuda_ipc_usable(coll_comm_t *comm, int peer);

/* DESC for a send step (h: its header, src: its device bytes). */
coll_result_t coll_ipc_desc_encode(coll_comm_t *comm, const coll_wire_hdr_t *h, const void *src,
                                   unsigned char rec[COLL_IPC_RECORD_BYTES]);
/* ACK for a receive step (h: its header). */
void coll_ipc_ack_encode(const coll_wire_hdr_t *h, unsigned char rec[COLL_IPC_RECORD_BYTES]);
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
