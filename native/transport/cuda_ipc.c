/*
 * transport/cuda_ipc.c -- CUDA IPC between ranks on one host: the records
 * that replace payload bytes on a link when both ends hold GPU buffers.
 *
 * A link between same-host ranks carries, for device collectives, fixed
 * 256-byte records over its usual byte stream (TCP or shm) instead of data:
 *
 *   DESC  sender -> receiver  "the bytes of this step are at offset X of the
 *                              allocation behind this cudaIpcMemHandle"
 *   ACK   receiver -> sender  "my read of them is queued / done; you may
 *                              overwrite them"
 *
 *   byte  0  wire header (wire.h), flags COLL_WIRE_IPC_DESC or _ACK, with the
 *            step's nbytes and offset, checked like any message header
 *         48 cudaIpcMemHandle_t of the sender's allocation (DESC; 64 bytes)
 *        112 cudaIpcEventHandle_t of the record's signal (stream order; 64)
 *        176 u64 byte offset of the step's bytes in that allocation (DESC)
 *        184 u64 the allocation's address in the sender (DESC)
 *        192 u64 the sender's process id (DESC)
 *        200 u32 order: 0 host order, 1 stream order (COLLECTIVES_CUDA_IPC_EVENTS)
 *        204 u32 the signal's slot in the writer's ring of events, < 64
 *        208 zero
 *
 * The receiver maps the handle once (the process's cache of mappings,
 * cuda/cuda.c, keyed by the handle; the sender's process and address tell it
 * when an allocation was freed and its mapping should go) and reads the
 * peer's memory directly, never past the end of the mapping: a copy,
 * or the reduction kernel taking the peer's bytes as its second input.
 *
 * Two orders, the same on every rank (a record of the other order fails,
 * naming both sides):
 *
 * Host order (COLLECTIVES_CUDA_IPC_EVENTS=0). The sender posts a DESC only
 * once the bytes are final on the device (the step that produced them has
 * completed on the GPU) and completes its send step only on the ACK, which
 * the receiver sends once its read has completed on the GPU. Every segment
 * costs a record round trip plus two waits of a host on its GPU.
 *
 * Stream order (the default), as NCCL's P2P transport keeps NCCL_STEPS
 * slots of a FIFO in flight with head and tail counters that the GPUs
 * themselves advance (ncclSendMem.head, ncclRecvMem.tail, mapped to the
 * peer in src/transport/p2p.cc), but with interprocess events instead of
 * polled counters, since our kernels are one per step, not persistent. Each end of a
 * link keeps a ring of COLLECTIVES_CUDA_IPC_SLOTS events of its own (created
 * once per communicator and peer, their handles travel in the records and
 * the peer opens each once) and the peer's ones it has opened:
 *
 *   sender    queues the producing work on its stream, records its next event
 *             E_s there, sends DESC(E_s) at once
 *   receiver  on DESC: its stream waits on E_s, queues the read, records its
 *             next event E_r, sends ACK(E_r) at once
 *   sender    on ACK: its stream waits on E_r, so nothing it queues later
 *             (the next overwrite of those bytes) runs before the read
 *
 * No host waits for a GPU: a step completes when its work is queued, and a
 * collective's hosts exchange all its records while the GPUs run the
 * segments back to back. Only the call's end waits, for its own stream,
 * which has waited on every reader's event. Why a small ring suffices: CUDA
 * lets a wait take the record of an event called last before the wait
 * (cuda.h); every record here is called before it is sent, so a wait never
 * takes an older one (too short), and a slot re-recorded before the peer
 * waited on it only makes the wait longer, never a deadlock: every wait is
 * on work called earlier in real time. The ring keeps such longer waits rare.
 *
 * Whether a link uses IPC is decided identically on both ends (same host id,
 * COLLECTIVES_CUDA_IPC on, transport not forced to tcp); ranks configured
 * differently fail with a flags mismatch naming both sides.
 */
#include "transport/cuda_ipc.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/comm_state.h"
#include "base/param.h"
#include "base/status.h"
#include "cuda/cuda.h"

/* One link's events: ours (created on first use, recorded in turn) and the
 * peer's (opened on first sight, reopened if a slot's handle changes). */
typedef struct {
  void *own[COLL_IPC_MAX_SLOTS];
  unsigned char own_handle[COLL_IPC_MAX_SLOTS][COLL_CUDA_IPC_EVENT_BYTES];
  uint64_t recorded;
  void *theirs[COLL_IPC_MAX_SLOTS];
  unsigned char their_handle[COLL_IPC_MAX_SLOTS][COLL_CUDA_IPC_EVENT_BYTES];
} link_sig_t;

struct coll_ipc_sig {
  int size, nslots;
  link_sig_t *peers[]; /* by rank, allocated on first use */
};

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
  put_u64(rec + 176, off);
  put_u64(rec + 184, base);
  put_u64(rec + 192, (uint64_t)getpid());
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
  uint64_t off = get_u64(rec + 176);
  void *base = NULL;
  size_t size = 0;
  COLL_CHECK(coll_cuda_ipc_import(comm, peer, rec + COLL_WIRE_HDR_BYTES, get_u64(rec + 192),
                                  get_u64(rec + 184), &base, &size));
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

int coll_ipc_stream_ordered(void) { return coll_param_int(COLL_PARAM_CUDA_IPC_EVENTS) != 0; }

static uint32_t get_u32(const unsigned char *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void put_u32(unsigned char *b, uint32_t v) {
  for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static coll_result_t link_sig(coll_comm_t *comm, int peer, link_sig_t **out) {
  if (!comm->ipc_sig) {
    long long k = coll_param_int(COLL_PARAM_CUDA_IPC_SLOTS);
    struct coll_ipc_sig *g = calloc(1, sizeof *g + (size_t)comm->size * sizeof(link_sig_t *));
    if (!g) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
    g->size = comm->size;
    g->nslots = k < 1 ? 1 : k > COLL_IPC_MAX_SLOTS ? COLL_IPC_MAX_SLOTS : (int)k;
    comm->ipc_sig = g;
  }
  struct coll_ipc_sig *g = comm->ipc_sig;
  if (!g->peers[peer] && !(g->peers[peer] = calloc(1, sizeof(link_sig_t))))
    return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
  *out = g->peers[peer];
  return COLL_SUCCESS;
}

coll_result_t coll_ipc_signal(coll_comm_t *comm, int peer, unsigned char rec[COLL_IPC_RECORD_BYTES]) {
  link_sig_t *l = NULL;
  COLL_CHECK(link_sig(comm, peer, &l));
  int slot = (int)(l->recorded % (uint64_t)comm->ipc_sig->nslots);
  if (!l->own[slot]) COLL_CHECK(coll_cuda_xevent_create(comm, &l->own[slot], l->own_handle[slot]));
  COLL_CHECK(coll_cuda_xevent_record(comm, l->own[slot]));
  coll_cuda_stats_t *st = coll_cuda_stats(comm);
  if (st) {
    st->ipc_signals++;
    if (l->recorded >= (uint64_t)comm->ipc_sig->nslots) st->ipc_slot_reuses++;
  }
  l->recorded++;
  memcpy(rec + 112, l->own_handle[slot], COLL_CUDA_IPC_EVENT_BYTES);
  put_u32(rec + 200, 1);
  put_u32(rec + 204, (uint32_t)slot);
  return COLL_SUCCESS;
}

coll_result_t coll_ipc_wait_signal(coll_comm_t *comm, int peer,
                                   const unsigned char rec[COLL_IPC_RECORD_BYTES], int skip) {
  uint32_t order = get_u32(rec + 200), mine = (uint32_t)coll_ipc_stream_ordered();
  if (order != mine)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: rank %d orders CUDA IPC records %s, this rank %s (set "
                      "COLLECTIVES_CUDA_IPC_EVENTS alike on every rank)",
                      comm->rank, peer, order == 1 ? "on the GPU streams (events)" : order == 0 ? "on the host" : "in an unknown way",
                      mine ? "on the GPU streams (events)" : "on the host");
  if (!order) return COLL_SUCCESS;
  uint32_t slot = get_u32(rec + 204);
  if (slot >= COLL_IPC_MAX_SLOTS)
    return coll_error(comm, COLL_REMOTE_ERROR, "rank %d: rank %d's CUDA IPC record names event slot %u (at most %d)",
                      comm->rank, peer, slot, COLL_IPC_MAX_SLOTS - 1);
  link_sig_t *l = NULL;
  COLL_CHECK(link_sig(comm, peer, &l));
  if (l->theirs[slot] && memcmp(l->their_handle[slot], rec + 112, COLL_CUDA_IPC_EVENT_BYTES) != 0) {
    coll_cuda_xevent_destroy(l->theirs[slot], 0);
    l->theirs[slot] = NULL;
  }
  if (!l->theirs[slot]) {
    COLL_CHECK(coll_cuda_xevent_open(comm, peer, rec + 112, &l->theirs[slot]));
    memcpy(l->their_handle[slot], rec + 112, COLL_CUDA_IPC_EVENT_BYTES);
  }
  if (skip) return COLL_SUCCESS;
  return coll_cuda_xevent_wait(comm, l->theirs[slot]);
}

void coll_ipc_signals_free(coll_comm_t *comm) {
  struct coll_ipc_sig *g = comm->ipc_sig;
  if (!g) return;
  /* Nothing queued may still record or wait on them (every call ends
   * waiting for its lanes; this holds after a failed one too). */
  if (comm->cuda) (void)coll_cuda_finish(comm);
  /* Our stream's waits on the peers' events are done (each call ended
   * waiting for its own stream). A peer may still hold ours open: its waits
   * were all called before it acknowledged the DESCs they name, but an ACK
   * event of ours that it has not waited on yet is freed under it; the
   * emulated GPU keeps the page, CUDA leaves that wait undefined. */
  for (int p = 0; p < g->size; p++) {
    link_sig_t *l = g->peers[p];
    if (!l) continue;
    for (int i = 0; i < COLL_IPC_MAX_SLOTS; i++) {
      coll_cuda_xevent_destroy(l->own[i], 1);
      coll_cuda_xevent_destroy(l->theirs[i], 0);
    }
    free(l);
  }
  free(g);
  comm->ipc_sig = NULL;
}
