/*
 * transport/cuda_ipc.c -- CUDA IPC between ranks on one host: the records
 * that replace payload bytes on a link when both ends hold GPU buffers.
 *
 * A link between same-host ranks carries, for device collectives, fixed
 * 128-byte records over its usual byte stream (TCP or shm) instead of data:
 *
 *   DESC  sender -> receiver  "the bytes of this step are at offset X of the
 *                              allocation behind this cudaIpcMemHandle"
 *   ACK   receiver -> sender  "done reading them; you may overwrite them"
 *
 *   byte  0  wire header (wire.h), flags COLL_WIRE_IPC_DESC or _ACK, with the
 *            step's nbytes and offset, checked like any message header
 *         40 cudaIpcMemHandle_t of the sender's allocation (DESC; 64 bytes)
 *        104 u64 byte offset of the step's bytes in that allocation (DESC)
 *        112 u64 the allocation's address in the sender (DESC)
 *        120 u64 the sender's process id (DESC)
 *
 * The receiver maps the handle once (the process's cache of mappings,
 * cuda/cuda.c, keyed by the handle; the sender's process and address tell it
 * when an allocation was freed and its mapping should go) and reads the
 * peer's memory directly, never past the end of the mapping: a copy,
 * or the reduction kernel taking the peer's bytes as its second input. The
 * sender posts a DESC only once the bytes are final on the device (the step
 * that produced them has completed on the GPU) and completes its send step
 * only on the ACK, which the receiver sends once its read has completed on
 * the GPU. So the host orders every cross-process access; no IPC events are
 * needed, at the price of one record round trip per pipelining segment
 * (segments are large on the device: COLLECTIVES_CUDA_SEGMENT_BYTES).
 *
 * Whether a link uses IPC is decided identically on both ends (same host id,
 * COLLECTIVES_CUDA_IPC on, transport not forced to tcp); ranks configured
 * differently fail with a flags mismatch naming both sides.
 */
#include "transport/cuda_ipc.h"

#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/comm_state.h"
#include "cuda/cuda.h"
#include "base/param.h"
#include "base/status.h"

int coll_cuda_ipc_usable(coll_comm_t *comm, int peer) {
  if (coll_param_int(COLL_PARAM_CUDA_IPC) == 0) return 0;
  const char *forced = coll_param_str(COLL_PARAM_TRANSPORT);
  if (forced && strcasecmp(forced, "tcp") == 0) return 0;
  const char *a = comm->peers[comm->rank].host_id, *b = comm->peers[peer].host_id;
  return a[0] && strcmp(a, b) == 0;
}

static void put_u64(unsigned char *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_u64(const unsigned char *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
  return v;
}

coll_result_t coll_ipc_desc_encode(coll_comm_t *comm, const coll_wire_hdr_t *h, const void *src,
                                   unsigned char rec[COLL_IPC_RECORD_BYTES]) {
  memset(rec, 0, COLL_IPC_RECORD_BYTES);
  coll_wire_hdr_t d = *h;
  d.flags = COLL_WIRE_IPC_DESC;
  coll_wire_encode(rec, &d);
  if (h->nbytes == 0) return COLL_SUCCESS; /* nothing to read: no handle */
  uint64_t off = 0, base = 0;
  COLL_CHECK(coll_cuda_ipc_export(comm, src, rec + COLL_WIRE_HDR_BYTES, &off, &base));
  put_u64(rec + 104, off);
  put_u64(rec + 112, base);
  put_u64(rec + 120, (uint64_t)getpid());
  return COLL_SUCCESS;
}

void coll_ipc_ack_encode(const coll_wire_hdr_t *h, unsigned char rec[COLL_IPC_RECORD_BYTES]) {
  memset(rec, 0, COLL_IPC_RECORD_BYTES);
  coll_wire_hdr_t a = *h;
  a.flags = COLL_WIRE_IPC_ACK;
  coll_wire_encode(rec, &a);
}

uint32_t coll_ipc_record_flags(const unsigned char rec[COLL_IPC_RECORD_BYTES]) {
  return (uint32_t)rec[20] | (uint32_t)rec[21] << 8 | (uint32_t)rec[22] << 16 |
         (uint32_t)rec[23] << 24;
}

coll_result_t coll_ipc_desc_map(coll_comm_t *comm, int peer,
                                const unsigned char rec[COLL_IPC_RECORD_BYTES], size_t nbytes,
                                const void **p, void **pinned) {
  *p = NULL;
  *pinned = NULL;
  if (nbytes == 0) return COLL_SUCCESS;
  uint64_t off = get_u64(rec + 104);
  void *base = NULL;
  size_t size = 0;
  COLL_CHECK(coll_cuda_ipc_import(comm, peer, rec + COLL_WIRE_HDR_BYTES, get_u64(rec + 120),
                                  get_u64(rec + 112), &base, &size));
  if (off > size || nbytes > size - off) {
    coll_cuda_ipc_release(base);
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: rank %d's CUDA IPC descriptor reads %zu bytes at offset %llu of an "
                      "allocation of %zu bytes",
                      comm->rank, peer, nbytes, (unsigned long long)off, size);
  }
  *p = (const char *)base + off;
  *pinned = base;
  return COLL_SUCCESS;
}

void coll_ipc_desc_release(void *pinned) {
  if (pinned) coll_cuda_ipc_release(pinned);
}
