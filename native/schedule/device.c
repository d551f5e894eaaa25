/*
 * schedule/device.c -- runs a schedule whose buffers are GPU memory.
 *
 * The algorithms build the very same schedules for device buffers (their
 * pointers are device pointers); only the executor differs. Each link moves
 * a step's bytes one of two ways, chosen per link (identically on both ends):
 *
 *   CUDA IPC (same host, transport/cuda_ipc.c): the sender posts a DESC
 *     record naming its bytes; the receiver reads them straight out of the
 *     sender's allocation with a copy or a fused reduction kernel, then
 *     sends an ACK; the send step completes on the ACK. In stream order
 *     (the default) each record names an interprocess event recorded on
 *     the writer's stream just before it is sent, the other side's stream
 *     waits on it, and records go out as soon as the work is queued: the
 *     hosts never wait for their GPUs inside the call, so segments run
 *     back to back on the GPUs (one round of records per segment, off the
 *     GPUs' critical path).
 *
 *   staged (other hosts, or COLLECTIVES_CUDA_IPC=0 / COLLECTIVES_TRANSPORT=tcp):
 *     the usual header + payload on the byte stream, the payload going
 *     through pinned host memory in pieces of at most PIECE bytes (a piece
 *     never spans two steps), NSLOT pinned slots per direction and link.
 *     Sending, the device-to-host copies of the next pieces run on their
 *     own lane (cuda.h) up to NSLOT pieces ahead of the socket, across step
 *     boundaries: any later send step of the link whose bytes are final is
 *     staged while the head step is still on the wire, so small segments
 *     (COLLECTIVES_CUDA_SEGMENT_BYTES) pipeline as well as large ones.
 *     Receiving, each piece is handed to the GPU (a host-to-device copy, or
 *     a reduction reading the pinned piece directly: mapped host memory)
 *     as soon as it is in, and the next piece goes into the next slot while
 *     the GPU works; a slot is reused once its ticket is done. So the
 *     device-to-host copy of piece k+2, the socket transfer of piece k and,
 *     on the receiver, the copy or reduction of piece k-1 overlap, and no
 *     call waits for the whole device (events only).
 *
 * GPU work goes on the communicator's stream and is tracked by tickets
 * (cuda.h). In host order (COLLECTIVES_CUDA_IPC_EVENTS=0) a step that ends
 * in GPU work (a copy, an IPC read, a staged receive) completes once its
 * ticket is done, so its successors, and the ACK or DESC that depends on
 * it, only see final bytes. In stream order copies and IPC reads complete
 * when queued: their successors are queued behind them on the same stream,
 * IPC records carry events, and a staged send's device-to-host copies
 * (lane 1) first wait for the work queued on lane 0. When nothing can
 * move, the executor sleeps: in the driver on the oldest GPU ticket if GPU
 * work is outstanding, else in poll() on the links, up to the deadline.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/comm_state.h"
#include "base/param.h"
#include "cuda/cuda.h"
#include "schedule/schedule.h"
#include "base/status.h"
#include "transport/transport.h"
#include "transport/cuda_ipc.h"

/* Staging piece: large enough that a socket call and a DMA are each worth
 * their overhead, small enough that two per link and direction keep all
 * three stages busy within a segment (COLLECTIVES_CUDA_SEGMENT_BYTES). */
#define PIECE ((size_t)1 << 20)
/* Pinned slots per direction and link: one being filled (by the GPU, or by
 * the socket), one on the wire (or on the GPU), one spare that absorbs
 * jitter between the two (triple buffering). */
#define NSLOT 3
/* The lane of the device-to-host copies of staged sends (cuda.h). */
#define D2H_LANE 1

typedef struct {
  int peer;
  coll_link_t *link;
  int ipc;
  int *sq, nsq;
  int *rq, nrq;
  int hup;
  /* IPC */
  unsigned char *out;            /* queued records, sent in order */
  size_t out_len, out_done;
  int posted, acked;             /* send steps with a DESC out / with their ACK back */
  int bouncing;                  /* sq[posted] is being copied to its bounce space */
  char *bounce;                  /* this link's bounce space (device), see ipc_post */
  size_t bounce_used;
  unsigned char *descs;          /* DESC received for rq[i] */
  int ndesc, launched;           /* DESCs received / reads launched */
  unsigned char in[COLL_IPC_RECORD_BYTES];
  size_t in_got;
  /* staged send: head step sq[sh] on the wire; pieces staged in slots, a
   * ring: piece i in slot i % NSLOT, pieces [shead, stail) staged, not yet sent */
  int sh;
  uint8_t shdr[COLL_WIRE_HDR_BYTES];
  size_t shdr_done, sent;         /* header bytes sent; payload of the head step sent */
  int shdr_ready;
  int stg;                        /* next step (sq index) to stage, from byte stg_off */
  size_t stg_off;
  unsigned char *sbuf[NSLOT];
  uint64_t sticket[NSLOT];        /* D2H of the piece in sbuf[i] */
  size_t slen[NSLOT];
  size_t shead, stail, spos;      /* pieces sent / staged; bytes of the head piece sent */
  /* staged receive: head step rq[rh] */
  int rh;
  uint8_t rhdr[COLL_WIRE_HDR_BYTES];
  size_t rhdr_got, got, applied;  /* header bytes; payload received; payload handed to the GPU */
  unsigned char *rbuf[NSLOT];
  uint64_t rticket[NSLOT];        /* GPU work still reading rbuf[i] */
  int rbusy[NSLOT];               /* ... not yet seen done */
  size_t rpiece;
} dpeer_t;

/* GPU work whose completion completes a step (and for an IPC read, sends
 * the ACK), in ticket order. */
typedef struct {
  uint64_t ticket;
  int step;
  int ack_peer;    /* index into the peers, or -1 */
  int desc_peer;   /* a bounced send: post its DESC (peer index), or -1 */
  const void *src; /* ... naming these device bytes */
} pending_t;

typedef struct {
  coll_sched_t *s;
  coll_comm_t *comm;
  int *succ;
  int *ready, nready;   /* COPY steps whose predecessors are done */
  int remaining;
  dpeer_t *ps;
  int nps;
  pending_t *pend;
  int phead, ptail;
  coll_cuda_stats_t *stats;
  int so;                      /* stream order (see the top): steps complete when queued */
  int skip_wait, skip_ack;     /* COLLECTIVES_CUDA_IPC_FAULT (tests only) */
} dexec_t;

static void complete(dexec_t *x, int id) {
  coll_step_t *st = &x->s->steps[id];
  x->remaining--;
  for (int e = st->succ_begin; e < st->succ_end; e++) {
    coll_step_t *nx = &x->s->steps[x->succ[e]];
    if (--nx->npred == 0 && nx->kind == COLL_STEP_COPY) x->ready[x->nready++] = x->succ[e];
  }
}

/* Queues GPU work's completion for step `id` (after the work was launched). */
static coll_result_t track(dexec_t *x, int id, int ack_peer) {
  uint64_t t;
  COLL_CHECK(coll_cuda_fence(x->comm, &t));
  pending_t *p = &x->pend[x->ptail++];
  p->ticket = t;
  p->step = id;
  p->ack_peer = ack_peer;
  p->desc_peer = -1;
  p->src = NULL;
  return COLL_SUCCESS;
}

static void note_posted(dexec_t *x, const dpeer_t *p) {
  if (!x->stats) return;
  x->stats->ipc_descs++;
  if ((uint64_t)(p->posted - p->acked) > x->stats->ipc_max_posted)
    x->stats->ipc_max_posted = (uint64_t)(p->posted - p->acked);
}

static void queue_record(dpeer_t *p, const unsigned char *rec) {
  memcpy(p->out + p->out_len, rec, COLL_IPC_RECORD_BYTES);
  p->out_len += COLL_IPC_RECORD_BYTES;
}

/* Completes steps whose GPU work is done; with `block`, first sleeps until
 * the oldest is. */
static coll_result_t reap(dexec_t *x, int block, int *moved) {
  while (x->phead < x->ptail) {
    pending_t *p = &x->pend[x->phead];
    int done = 0;
    if (block) {
      COLL_CHECK(coll_cuda_wait(x->comm, p->ticket));
      done = 1;
      block = 0;
    } else {
      COLL_CHECK(coll_cuda_poll(x->comm, p->ticket, &done));
    }
    if (!done) return COLL_SUCCESS;
    unsigned char rec[COLL_IPC_RECORD_BYTES];
    coll_wire_hdr_t h = coll_sched_step_hdr(x->s, &x->s->steps[p->step]);
    if (p->ack_peer >= 0) {
      coll_ipc_ack_encode(&h, rec);
      queue_record(&x->ps[p->ack_peer], rec);
    }
    if (p->desc_peer >= 0) {
      dpeer_t *d = &x->ps[p->desc_peer];
      COLL_CHECK(coll_ipc_desc_encode(x->comm, &h, p->src, rec));
      queue_record(d, rec);
      d->posted++;
      d->bouncing = 0;
      note_posted(x, d);
    }
    complete(x, p->step);
    x->phead++;
    *moved = 1;
  }
  return COLL_SUCCESS;
}

static coll_result_t run_copies(dexec_t *x, int *moved) {
  while (x->nready > 0) {
    int id = x->ready[--x->nready];
    coll_step_t *st = &x->s->steps[id];
    *moved = 1;
    if (st->nbytes == 0 || st->dst == st->src) {
      complete(x, id);
      continue;
    }
    COLL_CHECK(coll_cuda_copy(x->comm, st->dst, st->src, st->nbytes));
    if (x->so)
      complete(x, id); /* its successors queue behind it */
    else
      COLL_CHECK(track(x, id, -1));
  }
  return COLL_SUCCESS;
}

/* out[off, off + n) op= the peer's (or a staged) bytes, or a copy of them. */
static coll_result_t apply(dexec_t *x, coll_step_t *st, size_t off, const void *from, size_t n) {
  coll_sched_t *s = x->s;
  if (st->kind == COLL_STEP_RECV_REDUCE)
    return coll_cuda_reduce(x->comm, (char *)st->dst + off, (const char *)st->src + off, from,
                            n / s->elem, (coll_dtype_t)s->hdr.dtype, (coll_op_t)s->hdr.redop);
  return coll_cuda_copy(x->comm, (char *)st->dst + off, from, n);
}

/* ---- CUDA IPC links ---- */

static int bounced(const coll_step_t *st) { return st->succ_end > st->succ_begin; }

/* Bounce space a send takes, rounded so every copy starts 256-byte aligned
 * (the kernels' vector loads want 16). */
static size_t bounce_bytes(const coll_step_t *st) { return (st->nbytes + 255) & ~(size_t)255; }

static coll_result_t ipc_progress(dexec_t *x, int pi, int *moved) {
  coll_sched_t *s = x->s;
  dpeer_t *p = &x->ps[pi];
  /* Post a DESC for every send step whose bytes are final, in order. A send
   * that other steps wait for is bounced: its bytes are copied to this
   * link's bounce space and the step completes once the copy is done,
   * not on the ACK. Otherwise an exchange where each side receives into the
   * buffer it sends from only after its send completed (small butterfly)
   * would wait on itself: each side's ACK needs its own receive first. */
  while (!p->bouncing && p->posted < p->nsq && s->steps[p->sq[p->posted]].npred == 0) {
    int id = p->sq[p->posted];
    coll_step_t *st = &s->steps[id];
    *moved = 1;
    unsigned char rec[COLL_IPC_RECORD_BYTES];
    coll_wire_hdr_t h = coll_sched_step_hdr(s, st);
    if (bounced(st)) {
      char *to = p->bounce + p->bounce_used;
      p->bounce_used += bounce_bytes(st);
      COLL_CHECK(coll_cuda_copy(x->comm, to, st->src, st->nbytes));
      if (x->so) { /* the DESC's event follows the copy; the source is free once it is queued */
        COLL_CHECK(coll_ipc_desc_encode(x->comm, &h, to, rec));
        COLL_CHECK(coll_ipc_signal(x->comm, p->peer, rec));
        queue_record(p, rec);
        p->posted++;
        note_posted(x, p);
        complete(x, id);
        continue;
      }
      COLL_CHECK(track(x, id, -1));
      x->pend[x->ptail - 1].desc_peer = pi;
      x->pend[x->ptail - 1].src = to;
      p->bouncing = 1;
      break;
    }
    COLL_CHECK(coll_ipc_desc_encode(x->comm, &h, st->src, rec));
    if (x->so) COLL_CHECK(coll_ipc_signal(x->comm, p->peer, rec));
    queue_record(p, rec);
    p->posted++;
    note_posted(x, p);
  }
  if (p->out_done < p->out_len) {
    struct iovec iov = {p->out + p->out_done, p->out_len - p->out_done};
    size_t n = 0;
    COLL_CHECK(p->link->tp->send(p->link, &iov, 1, &n));
    p->out_done += n;
    if (n) *moved = 1;
  }
  /* Records in: ACKs for our sends, DESCs for our receives. */
  while (p->acked < p->posted || p->ndesc < p->nrq) {
    struct iovec iov = {p->in + p->in_got, COLL_IPC_RECORD_BYTES - p->in_got};
    size_t n = 0;
    COLL_CHECK(coll_link_recv(p->link, &iov, 1, &n));
    if (n == 0) break;
    *moved = 1;
    p->in_got += n;
    if (p->in_got < COLL_IPC_RECORD_BYTES) break;
    p->in_got = 0;
    int ack = coll_ipc_record_flags(p->in) == COLL_WIRE_IPC_ACK;
    if (ack && p->acked < p->posted) {
      int id = p->sq[p->acked];
      coll_wire_hdr_t e = coll_sched_step_hdr(s, &s->steps[id]);
      e.flags = COLL_WIRE_IPC_ACK;
      COLL_CHECK(coll_wire_check(x->comm, p->peer, p->in, &e));
      /* Stream order: what we queue from now on (the next overwrite of the
       * bytes) runs after the peer's read. */
      COLL_CHECK(coll_ipc_wait_signal(x->comm, p->peer, p->in, x->skip_ack));
      p->acked++;
      if (!bounced(&s->steps[id])) complete(x, id); /* a bounced one completed at its copy */
    } else if (!ack && p->ndesc < p->nrq) {
      coll_wire_hdr_t e = coll_sched_step_hdr(s, &s->steps[p->rq[p->ndesc]]);
      e.flags = COLL_WIRE_IPC_DESC;
      COLL_CHECK(coll_wire_check(x->comm, p->peer, p->in, &e));
      memcpy(p->descs + (size_t)p->ndesc * COLL_IPC_RECORD_BYTES, p->in, COLL_IPC_RECORD_BYTES);
      p->ndesc++;
    } else {
      return coll_error(x->comm, COLL_REMOTE_ERROR,
                        "rank %d: unexpected CUDA IPC %s from rank %d in %s #%u", x->comm->rank,
                        ack ? "acknowledgement" : "descriptor", p->peer,
                        coll_kind_name(s->hdr.coll), s->hdr.seq);
    }
  }
  /* Read what the peer offered, in order, once our side may be written. */
  while (p->launched < p->ndesc && s->steps[p->rq[p->launched]].npred == 0) {
    int id = p->rq[p->launched];
    coll_step_t *st = &s->steps[id];
    const void *from = NULL;
    void *pinned = NULL;
    const unsigned char *desc = p->descs + (size_t)p->launched * COLL_IPC_RECORD_BYTES;
    /* Stream order: the read waits on the GPU for the writer's bytes. */
    COLL_CHECK(coll_ipc_wait_signal(x->comm, p->peer, desc, x->skip_wait));
    COLL_CHECK(coll_ipc_desc_map(x->comm, p->peer, desc, st->nbytes, &from, &pinned));
    coll_result_t r = st->nbytes ? apply(x, st, 0, from, st->nbytes) : COLL_SUCCESS;
    coll_ipc_desc_release(pinned);
    COLL_CHECK(r);
    if (x->so) {
      unsigned char rec[COLL_IPC_RECORD_BYTES];
      coll_wire_hdr_t h = coll_sched_step_hdr(s, st);
      coll_ipc_ack_encode(&h, rec);
      COLL_CHECK(coll_ipc_signal(x->comm, p->peer, rec));
      queue_record(p, rec);
      complete(x, id);
    } else {
      COLL_CHECK(track(x, id, pi));
    }
    p->launched++;
    *moved = 1;
  }
  return COLL_SUCCESS;
}

/* ---- staged links ---- */

/* Stages pieces of the link's ready send steps, in order, while a slot is
 * free: the D2H copies run on their own lane, ahead of the socket. */
static coll_result_t stage_ahead(dexec_t *x, dpeer_t *p, int *moved) {
  coll_sched_t *s = x->s;
  while (p->stail - p->shead < NSLOT && p->stg < p->nsq) {
    coll_step_t *st = &s->steps[p->sq[p->stg]];
    if (st->npred > 0) return COLL_SUCCESS; /* its bytes are not final yet */
    if (p->stg_off >= st->nbytes) {
      p->stg++;
      p->stg_off = 0;
      continue;
    }
    size_t len = st->nbytes - p->stg_off < PIECE ? st->nbytes - p->stg_off : PIECE;
    int b = (int)(p->stail % NSLOT);
    /* Stream order: the step's bytes may still be in the making on lane 0. */
    if (x->so && p->stg_off == 0) COLL_CHECK(coll_cuda_lane_after(x->comm, D2H_LANE, 0));
    COLL_CHECK(coll_cuda_copy_on(x->comm, D2H_LANE, p->sbuf[b], (const char *)st->src + p->stg_off, len));
    COLL_CHECK(coll_cuda_fence_on(x->comm, D2H_LANE, &p->sticket[b]));
    p->slen[b] = len;
    p->stail++;
    p->stg_off += len;
    if (x->stats && p->stail - p->shead > x->stats->staged_max_ahead)
      x->stats->staged_max_ahead = p->stail - p->shead;
    *moved = 1;
  }
  return COLL_SUCCESS;
}

static coll_result_t staged_send(dexec_t *x, dpeer_t *p, int *moved) {
  coll_sched_t *s = x->s;
  while (p->sh < p->nsq) {
    int id = p->sq[p->sh];
    coll_step_t *st = &s->steps[id];
    if (st->npred > 0) return COLL_SUCCESS;
    COLL_CHECK(stage_ahead(x, p, moved));
    if (!p->shdr_ready) {
      coll_wire_hdr_t h = coll_sched_step_hdr(s, st);
      coll_wire_encode(p->shdr, &h);
      p->shdr_ready = 1;
      p->shdr_done = p->sent = 0;
    }
    /* Send from the oldest staged piece (it belongs to this step: pieces
     * are staged in step order), once its copy is done. */
    const void *from = NULL;
    size_t len = 0;
    int b = (int)(p->shead % NSLOT);
    if (p->sent < st->nbytes && p->shead < p->stail) {
      int done = 0;
      COLL_CHECK(coll_cuda_poll(x->comm, p->sticket[b], &done));
      if (done) {
        from = p->sbuf[b] + p->spos;
        len = p->slen[b] - p->spos;
      }
    }
    size_t before = p->shdr_done, was = p->sent;
    int full = 0;
    COLL_CHECK(coll_link_send_framed(p->link, p->shdr, &p->shdr_done, from, len, &p->sent, &full));
    if (p->shdr_done == before && p->sent == was) return COLL_SUCCESS; /* link or device busy */
    *moved = 1;
    p->spos += p->sent - was;
    if (len && p->spos == p->slen[b]) { /* the piece is out: its slot is free */
      p->shead++;
      p->spos = 0;
      if (x->stats) x->stats->staged_pieces++;
    }
    if (p->shdr_done < COLL_WIRE_HDR_BYTES || p->sent < st->nbytes) {
      if (full) return COLL_SUCCESS; /* socket full */
      continue;
    }
    p->shdr_ready = 0;
    p->sh++;
    complete(x, id);
  }
  return COLL_SUCCESS;
}

static coll_result_t staged_recv(dexec_t *x, int pi, int *moved) {
  coll_sched_t *s = x->s;
  dpeer_t *p = &x->ps[pi];
  while (p->rh < p->nrq) {
    int id = p->rq[p->rh];
    coll_step_t *st = &s->steps[id];
    if (st->npred > 0) return COLL_SUCCESS;
    if (p->rhdr_got < COLL_WIRE_HDR_BYTES) {
      struct iovec iov = {p->rhdr + p->rhdr_got, COLL_WIRE_HDR_BYTES - p->rhdr_got};
      size_t n = 0;
      COLL_CHECK(coll_link_recv(p->link, &iov, 1, &n));
      if (n) *moved = 1;
      p->rhdr_got += n;
      if (p->rhdr_got < COLL_WIRE_HDR_BYTES) return COLL_SUCCESS;
      coll_wire_hdr_t e = coll_sched_step_hdr(s, st);
      COLL_CHECK(coll_wire_check(x->comm, p->peer, p->rhdr, &e));
      p->got = p->applied = 0;
    }
    while (p->got < st->nbytes) {
      int b = (int)(p->rpiece % NSLOT);
      if (p->got == p->applied && p->rbusy[b]) {
        /* Starting a piece: its slot must be free of earlier GPU reads. */
        int done = 0;
        COLL_CHECK(coll_cuda_poll(x->comm, p->rticket[b], &done));
        if (!done) return COLL_SUCCESS;
        p->rbusy[b] = 0;
      }
      size_t start = p->applied, end = start + PIECE < st->nbytes ? start + PIECE : st->nbytes;
      struct iovec iov = {p->rbuf[b] + (p->got - start), end - p->got};
      size_t n = 0;
      COLL_CHECK(coll_link_recv(p->link, &iov, 1, &n));
      if (n == 0) return COLL_SUCCESS;
      *moved = 1;
      p->got += n;
      if (p->got < end) return COLL_SUCCESS;
      COLL_CHECK(apply(x, st, start, p->rbuf[b], end - start));
      COLL_CHECK(coll_cuda_fence(x->comm, &p->rticket[b]));
      p->rbusy[b] = 1;
      p->applied = end;
      p->rpiece++;
      if (x->stats) {
        uint64_t busy = 0;
        for (int i = 0; i < NSLOT; i++) busy += (uint64_t)p->rbusy[i];
        if (busy > x->stats->staged_max_apply) x->stats->staged_max_apply = busy;
      }
    }
    /* Every piece is on the GPU: the step completes with the last one. */
    COLL_CHECK(track(x, id, -1));
    p->rhdr_got = 0;
    p->rh++;
  }
  return COLL_SUCCESS;
}

/* ---- the loop ---- */

static int wants_bytes(const coll_sched_t *s, const dpeer_t *p, int *sending) {
  if (p->ipc) {
    *sending = p->out_done < p->out_len;
    return p->acked < p->posted || p->ndesc < p->nrq;
  }
  *sending = p->sh < p->nsq && s->steps[p->sq[p->sh]].npred == 0;
  return p->rh < p->nrq && s->steps[p->rq[p->rh]].npred == 0;
}

static int peer_busy(const dpeer_t *p) {
  return p->ipc ? (p->acked < p->nsq || p->bouncing || p->launched < p->nrq || p->out_done < p->out_len)
                : (p->sh < p->nsq || p->rh < p->nrq);
}

static coll_result_t timed_out(dexec_t *x, double start) {
  char who[256] = "";
  size_t used = 0;
  for (int i = 0; i < x->nps && used < sizeof who - 16; i++)
    if (peer_busy(&x->ps[i]))
      used += (size_t)snprintf(who + used, sizeof who - used, "%s%d", used ? ", " : "", x->ps[i].peer);
  return coll_error(x->comm, COLL_TIMEOUT,
                    "rank %d: %s #%u on GPU buffers timed out after %.1f s waiting for rank %s "
                    "(stopped, stuck or not calling the same collective)",
                    x->comm->rank, coll_kind_name(x->s->hdr.coll), x->s->hdr.seq,
                    coll_now() - start, who);
}

/* Steps left, records (the last ACKs) not yet handed to a link, or ACKs
 * still due for bounced sends: the peer may be reading our bounce space,
 * which the next collective reuses, and its ACK must not spill into it. */
static int unfinished(const dexec_t *x) {
  if (x->remaining > 0) return 1;
  for (int i = 0; i < x->nps; i++) {
    const dpeer_t *p = &x->ps[i];
    if (p->out_done < p->out_len || (p->ipc && p->acked < p->nsq)) return 1;
  }
  return 0;
}

static coll_result_t loop(dexec_t *x, double deadline, struct pollfd *pfs) {
  coll_sched_t *s = x->s;
  double start = coll_now();
  while (unfinished(x)) {
    int moved = 0;
    COLL_CHECK(run_copies(x, &moved));
    for (int i = 0; i < x->nps; i++) {
      if (x->ps[i].ipc) {
        COLL_CHECK(ipc_progress(x, i, &moved));
      } else {
        COLL_CHECK(staged_send(x, &x->ps[i], &moved));
        COLL_CHECK(staged_recv(x, i, &moved));
      }
    }
    COLL_CHECK(reap(x, 0, &moved));
    if (moved || !unfinished(x)) continue;
    if (coll_now() >= deadline) return timed_out(x, start);
    /* GPU work outstanding: it finishes on its own, so sleep on it first. A
     * staged piece waiting on its copy is outstanding work too. */
    uint64_t issued = 0;
    if (x->phead < x->ptail) {
      if (x->stats) x->stats->gpu_waits++;
      COLL_CHECK(reap(x, 1, &moved));
      continue;
    }
    for (int i = 0; i < x->nps && !issued; i++) {
      dpeer_t *p = &x->ps[i];
      if (p->ipc) continue;
      for (size_t i = p->shead; i < p->stail && !issued; i++) {
        int done = 1, b = (int)(i % NSLOT);
        COLL_CHECK(coll_cuda_poll(x->comm, p->sticket[b], &done));
        if (!done) issued = p->sticket[b];
      }
      for (int b = 0; b < NSLOT && !issued; b++) {
        int done = 1;
        if (p->rbusy[b]) COLL_CHECK(coll_cuda_poll(x->comm, p->rticket[b], &done));
        if (!done) issued = p->rticket[b];
        else p->rbusy[b] = 0;
      }
    }
    if (issued) {
      if (x->stats) x->stats->gpu_waits++;
      COLL_CHECK(coll_cuda_wait(x->comm, issued));
      continue;
    }
    int npf = 0, retry = 0;
    for (int i = 0; i < x->nps; i++) {
      dpeer_t *p = &x->ps[i];
      int sending = 0, receiving = wants_bytes(s, p, &sending), ev = 0;
      if (sending || receiving) {
        ev = coll_link_wait_events(p->link, sending, receiving);
        if (ev < 0) { retry = 1; break; }
      } else if (!p->hup && peer_busy(p)) {
        ev = POLLRDHUP;
      }
      if (ev) npf += coll_link_pollfds(p->link, ev, pfs + npf);
    }
    if (retry) continue;
    if (npf == 0)
      return coll_error(x->comm, COLL_INTERNAL_ERROR,
                        "rank %d: %s #%u on GPU buffers stalled with %d steps left", x->comm->rank,
                        coll_kind_name(s->hdr.coll), s->hdr.seq, x->remaining);
    double left = deadline - coll_now();
    int ms = left > 2e6 ? 2000000000 : (int)(left * 1000.0) + 1;
    int r = poll(pfs, (nfds_t)npf, ms);
    if (r < 0 && errno != EINTR)
      return coll_error(x->comm, COLL_SYSTEM_ERROR, "rank %d: poll failed: %s", x->comm->rank,
                        strerror(errno));
    for (int i = 0; i < x->nps; i++)
      COLL_CHECK(coll_link_polled(x->ps[i].link, pfs, npf, &x->ps[i].hup));
  }
  return COLL_SUCCESS;
}

coll_result_t coll_sched_run_device(coll_sched_t *s, double deadline) {
  coll_comm_t *comm = s->comm;
  if (s->oom)
    return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory building a schedule", comm->rank);
  int n = s->nsteps;
  if (n == 0) return COLL_SUCCESS;
  coll_result_t res = COLL_SUCCESS;
  dexec_t x;
  memset(&x, 0, sizeof x);
  x.s = s;
  x.comm = comm;
  x.remaining = n;
  int *slot = NULL, *cnt = NULL, *queues = NULL;
  struct pollfd *pfs = NULL;
  unsigned char *records = NULL;
  x.succ = malloc((size_t)s->nedges * sizeof(int) + 1);
  cnt = malloc((size_t)n * sizeof(int) + 1);
  slot = malloc((size_t)comm->size * sizeof(int));
  if (!x.succ || !cnt || !slot) {
    res = coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory running a schedule", comm->rank);
    goto out;
  }
  coll_sched_link_edges(s, x.succ, cnt);
  x.ready = cnt; /* reuses the counting array, as the host executor does */
  for (int i = 0; i < n; i++)
    if (s->steps[i].kind == COLL_STEP_COPY && s->steps[i].npred == 0) x.ready[x.nready++] = i;

  /* Peers in first-use order, each with its send and receive FIFOs. */
  x.ps = calloc((size_t)(comm->size < n ? comm->size : n) + 1, sizeof *x.ps);
  queues = malloc((size_t)n * sizeof(int) + 1);
  x.pend = malloc((size_t)n * sizeof *x.pend + 1);
  /* Two descriptors per link at most (socket and doorbell). */
  pfs = malloc((2 * (size_t)(comm->size < n ? comm->size : n) + 1) * sizeof *pfs);
  if (!x.ps || !queues || !x.pend || !pfs) {
    res = coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory running a schedule", comm->rank);
    goto out;
  }
  for (int i = 0; i < comm->size; i++) slot[i] = -1;
  for (int i = 0; i < n; i++) {
    coll_step_t *st = &s->steps[i];
    if (st->kind == COLL_STEP_COPY) continue;
    if (st->peer < 0 || st->peer >= comm->size || st->peer == comm->rank) {
      res = coll_error(comm, COLL_INTERNAL_ERROR, "rank %d: schedule step to invalid peer %d",
                       comm->rank, st->peer);
      goto out;
    }
    if (slot[st->peer] < 0) { slot[st->peer] = x.nps; x.ps[x.nps++].peer = st->peer; }
    dpeer_t *p = &x.ps[slot[st->peer]];
    if (st->kind == COLL_STEP_SEND) p->nsq++; else p->nrq++;
  }
  int *q = queues;
  size_t nrec = 0;
  for (int i = 0; i < x.nps; i++) {
    x.ps[i].sq = q; q += x.ps[i].nsq;
    x.ps[i].rq = q; q += x.ps[i].nrq;
    nrec += 2 * (size_t)(x.ps[i].nsq + x.ps[i].nrq);
    x.ps[i].nsq = x.ps[i].nrq = 0;
  }
  for (int i = 0; i < n; i++) {
    coll_step_t *st = &s->steps[i];
    if (st->kind == COLL_STEP_COPY) continue;
    dpeer_t *p = &x.ps[slot[st->peer]];
    if (st->kind == COLL_STEP_SEND) p->sq[p->nsq++] = i; else p->rq[p->nrq++] = i;
  }
  /* IPC record space: every send posts a DESC and every receive an ACK
   * (out), and every receive keeps its DESC (in). */
  records = malloc(nrec * COLL_IPC_RECORD_BYTES + 1);
  if (!records) {
    res = coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory running a schedule", comm->rank);
    goto out;
  }
  unsigned char *r = records, *send_pool, *recv_pool;
  COLL_CHECK_GOTO(coll_cuda_pinned(comm, 0, NSLOT * PIECE * (size_t)x.nps, &send_pool), res, out);
  COLL_CHECK_GOTO(coll_cuda_pinned(comm, 1, NSLOT * PIECE * (size_t)x.nps, &recv_pool), res, out);
  x.stats = coll_cuda_stats(comm);
  if (x.stats) x.stats->device_runs++;
  x.so = coll_ipc_stream_ordered();
  const char *fault = coll_param_str(COLL_PARAM_CUDA_IPC_FAULT);
  x.skip_wait = fault && strcmp(fault, "nowait") == 0;
  x.skip_ack = fault && strcmp(fault, "noack") == 0;
  for (int i = 0; i < x.nps; i++) {
    dpeer_t *p = &x.ps[i];
    p->ipc = coll_cuda_ipc_usable(comm, p->peer);
    p->out = r; r += (size_t)(p->nsq + p->nrq) * COLL_IPC_RECORD_BYTES;
    p->descs = r; r += (size_t)(p->nsq + p->nrq) * COLL_IPC_RECORD_BYTES;
    for (int b = 0; b < NSLOT; b++) {
      p->sbuf[b] = send_pool + (NSLOT * (size_t)i + (size_t)b) * PIECE;
      p->rbuf[b] = recv_pool + (NSLOT * (size_t)i + (size_t)b) * PIECE;
    }
  }
  /* Bounce space for the IPC links' bounced sends, one region per link. */
  size_t bounce_total = 0;
  for (int i = 0; i < x.nps; i++)
    for (int j = 0; j < x.ps[i].nsq && x.ps[i].ipc; j++)
      if (bounced(&s->steps[x.ps[i].sq[j]])) bounce_total += bounce_bytes(&s->steps[x.ps[i].sq[j]]);
  if (bounce_total) {
    char *space = NULL;
    COLL_CHECK_GOTO(coll_cuda_scratch(comm, 1, bounce_total, (void **)&space), res, out);
    for (int i = 0; i < x.nps; i++) {
      if (!x.ps[i].ipc) continue;
      x.ps[i].bounce = space;
      for (int j = 0; j < x.ps[i].nsq; j++)
        if (bounced(&s->steps[x.ps[i].sq[j]])) space += bounce_bytes(&s->steps[x.ps[i].sq[j]]);
    }
  }
  /* Connect: higher peers first (connecting never waits), then lower. */
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < x.nps; i++)
      if ((x.ps[i].peer > comm->rank) == (pass == 0))
        COLL_CHECK_GOTO(coll_link_get(comm, x.ps[i].peer, deadline, &x.ps[i].link), res, out);
  COLL_INFO(COLL_LOG_CUDA, "rank %d: %s #%u on GPU buffers, %d steps over %d links", comm->rank,
            coll_kind_name(s->hdr.coll), s->hdr.seq, n, x.nps);
  res = loop(&x, deadline, pfs);
out:
  /* Never return (or fail) with GPU work still reading or writing buffers
   * the caller may free or a peer may reuse. */
  if (comm->cuda) {
    coll_result_t fin = coll_cuda_finish(comm);
    if (res == COLL_SUCCESS) res = fin;
  }
  free(x.succ);
  free(cnt);
  free(slot);
  free(queues);
  free(x.pend);
  free(x.ps);
  free(pfs);
  free(records);
  return res;
}
