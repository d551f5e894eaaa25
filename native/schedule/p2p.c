/*
 * p2p.c -- point-to-point messages (contracts in coll.h), over the links the
 * collectives use.
 *
 * A message is one wire header (kind COLL_KIND_P2P: tag in aux, elements in
 * count, and a per-sender sequence number checked on receipt) followed by
 * its payload. Per peer, sends leave strictly in posting order, one message
 * at a time, so messages between a pair never overtake each other.
 *
 * Receiving reads the header alone, then matches it as MPI does: to the
 * earliest posted receive that fits (source or ANY_SOURCE, tag or ANY_TAG),
 * whose buffer the payload then goes straight into; else the message is set
 * aside (COLLECTIVES_P2P_BUFFER_BYTES at most, in all) for a receive posted
 * later, which looks there first, in arrival order. A header that belongs to
 * a collective is handed back to the link (transport/unread.c): that peer is not
 * read past it until the collective has taken it.
 *
 *   post (isend/irecv)  -> queued; sends try to leave at once
 *   wait/test           -> take the communicator, run every pending
 *                          message (sends, receives, link set-up) until the
 *                          one waited for is done, sleeping in poll()
 *   collective starts   -> coll_p2p_quiesce: half-read headers go back; then
 *                          before its first message on a link, the executor
 *                          moves a message half sent or half received there
 *                          to its end (coll_p2p_drain, comm_state.h says why)
 *   collective reads a p2p header -> coll_p2p_divert: delivered or set aside
 *
 * Links are set up without blocking here: a higher peer is dialed (its
 * kernel takes the connection and the opening without its help) and its
 * answer read when it comes; a lower one dials us, and every wait serves the
 * listener. So a receive from any source waits on every peer at once and
 * never on one that has nothing to say.
 *
 * Lists (posted receives, send queues, messages set aside, request states)
 * are changed under comm->mu: a receive may be posted while a collective on
 * the progress thread delivers into the list. Links are only touched by the
 * holder of the communicator (coll_comm_enter).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/comm_state.h"
#include "base/param.h"
#include "schedule/p2p.h"
#include "schedule/schedule.h"
#include "base/status.h"
#include "transport/transport.h"
#include "transport/wire.h"

static const size_t MAX_BYTES = (size_t)1 << 48;

coll_result_t p2p_state_get(coll_comm_t *comm) {
  if (comm->p2p) return COLL_SUCCESS;
  struct coll_p2p *p = calloc(1, sizeof *p);
  if (p) p->peers = calloc((size_t)comm->size, sizeof *p->peers);
  if (p) p->npfs_cap = comm->max_pending + 1 + 3 * comm->size;
  if (p && p->peers) p->pfs = calloc((size_t)p->npfs_cap, sizeof *p->pfs);
  if (!p || !p->peers || !p->pfs) {
    if (p) { free(p->peers); free(p); }
    return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
  }
  long long lim = coll_param_int(COLL_PARAM_P2P_BUFFER_BYTES);
  p->unexp_limit = lim > 0 ? (size_t)lim : 0;
  comm->p2p = p;
  return COLL_SUCCESS;
}

/* An Ssend that completes (acked, failed, freed) is nobody's to complete any
 * more: out of the list waiting for acks, and no message of its own (a send to
 * itself) names it. Under comm->mu. */
static void forget_sync(struct coll_p2p *p, coll_p2p_op_t *op) {
  coll_p2p_op_t *prev = NULL;
  for (coll_p2p_op_t *x = p->acked; x; prev = x, x = x->next) {
    if (x != op) continue;
    if (prev) prev->next = x->next; else p->acked = x->next;
    x->next = NULL;
    break;
  }
  for (p2p_msg_t *m = p->unexp; m; m = m->next)
    if (m->sync_op == op) m->sync_op = NULL;
}

/* Under comm->mu. */
void p2p_op_done(coll_comm_t *comm, coll_p2p_op_t *op, coll_result_t res) {
  if (op->state == OP_DONE) return;
  struct coll_p2p *p = comm->p2p;
  if (op->sync && p) forget_sync(p, op);
  op->state = OP_DONE;
  if (op->ack) { /* the engine's own: nobody waits on it */
    if (p) p->nacks--;
    free(op->req);
    return;
  }
  op->req->result = res;
  op->req->done = 1;
  pthread_cond_broadcast(&comm->cv);
}

/* ---- matching (under comm->mu) ---- */

static int fits(const coll_p2p_op_t *op, uint32_t ctx, int peer, int tag) {
  return op->ctx == ctx && (op->peer == COLL_ANY_SOURCE || op->peer == peer) &&
         (op->tag == COLL_ANY_TAG || op->tag == tag);
}

static coll_result_t check_match(coll_comm_t *comm, const coll_p2p_op_t *op, int peer, int tag,
                                 coll_dtype_t dtype, size_t count) {
  if (dtype != op->dtype)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: dtype mismatch in send/recv: rank %d sent %zu %s elements with tag %d, "
                      "the receive on this rank takes %s",
                      comm->rank, peer, count, coll_dtype_name(dtype), tag, coll_dtype_name(op->dtype));
  if (count > op->count && !op->alloc)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: count mismatch in send/recv: rank %d sent %zu %s elements with tag %d, "
                      "the receive on this rank holds %zu",
                      comm->rank, peer, count, coll_dtype_name(dtype), tag, op->count);
  return COLL_SUCCESS;
}

static void set_status(coll_p2p_op_t *op, int peer, int tag, size_t count) {
  /* peer is a root rank; a subcommunicator's status names its own rank */
  op->status.source = op->local && peer >= 0 ? op->local[peer] : peer;
  op->status.tag = tag;
  op->status.count = count;
  op->status.nbytes = count * coll_dtype_size(op->dtype);
  op->status.dtype = op->dtype;
}

static void unexp_remove(struct coll_p2p *p, p2p_msg_t *m);

static coll_p2p_op_t *take_posted(struct coll_p2p *p, uint32_t ctx, int peer, int tag) {
  coll_p2p_op_t *prev = NULL;
  for (coll_p2p_op_t *op = p->posted; op; prev = op, op = op->next) {
    if (!fits(op, ctx, peer, tag)) continue;
    if (prev) prev->next = op->next; else p->posted = op->next;
    if (p->posted_tail == op) p->posted_tail = prev;
    op->next = NULL;
    return op;
  }
  return NULL;
}

/* Queues to root rank `peer` the ack of its Ssend that left with seq: a
 * header alone, sent by whoever runs the engine next (under comm->mu). */
static coll_result_t enqueue_ack(coll_comm_t *comm, int peer, uint32_t seq) {
  struct coll_p2p *p = comm->p2p;
  coll_request_t *req = calloc(1, sizeof *req + sizeof(coll_p2p_op_t));
  if (!req)
    return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory for the ack of an Ssend "
                      "from rank %d", comm->rank, peer);
  coll_p2p_op_t *op = (coll_p2p_op_t *)(req + 1);
  req->comm = comm;
  req->p2p = op;
  op->req = req;
  op->is_send = 1;
  op->ack = 1;
  op->peer = peer;
  op->tag = (int)seq; /* the header's aux: (uint32_t) gives seq back */
  op->dtype = COLL_UINT8;
  op->start = coll_now();
  op->deadline = op->start + 1e9; /* never waited on: the engine moves it with the others */
  p2p_peer_t *pp = &p->peers[peer];
  if (pp->sq_tail) pp->sq_tail->next = op; else pp->sq = op;
  pp->sq_tail = op;
  p->nacks++;
  return COLL_SUCCESS;
}

/* A kept message met its receive: an Ssend's sender learns it (under comm->mu). */
static void kept_matched(coll_comm_t *comm, p2p_msg_t *m) {
  coll_p2p_op_t *op = m->sync_op;
  int sync = m->sync;
  m->sync_op = NULL;
  m->sync = 0;
  if (op) p2p_op_done(comm, op, COLL_SUCCESS); /* sent to itself */
  else if (sync) (void)enqueue_ack(comm, m->peer, m->sync_seq); /* on failure its sender times out */
}

int p2p_probe_find(coll_comm_t *comm, uint32_t ctx, int peer, int tag, const int *local,
                   coll_status_t *st) {
  struct coll_p2p *p = comm->p2p;
  coll_p2p_op_t want;
  memset(&want, 0, sizeof want);
  want.ctx = ctx;
  want.peer = peer;
  want.tag = tag;
  int from = -1, mtag = 0;
  size_t count = 0;
  coll_dtype_t dtype = COLL_UINT8;
  for (p2p_msg_t *m = p->unexp; m && from < 0; m = m->next)
    if (!m->claimed && fits(&want, m->ctx, m->peer, m->tag)) {
      from = m->peer; mtag = m->tag; count = m->count; dtype = m->dtype;
    }
  /* then the ones too big to keep, left in their link (arrived later than any
   * kept one from the same peer) */
  for (int r = 0; r < comm->size && from < 0; r++) {
    const p2p_peer_t *pp = &p->peers[r];
    if (pp->hvalid && fits(&want, pp->hctx, r, pp->htag)) {
      from = r; mtag = pp->htag; count = pp->hcount; dtype = pp->hdtype;
    }
  }
  if (from < 0) return 0;
  st->source = local ? local[from] : from;
  st->tag = mtag;
  st->count = count;
  st->nbytes = count * coll_dtype_size(dtype);
  st->dtype = dtype;
  return 1;
}

int p2p_cancel_self_ssend(coll_comm_t *comm, coll_p2p_op_t *op) {
  for (p2p_msg_t *m = comm->p2p->unexp; m; m = m->next) {
    if (m->sync_op != op || m->claimed) continue;
    unexp_remove(comm->p2p, m);
    free(m->data);
    free(m);
    return 1;
  }
  return 0;
}

static void unexp_remove(struct coll_p2p *p, p2p_msg_t *m) {
  p2p_msg_t *prev = NULL;
  for (p2p_msg_t *x = p->unexp; x; prev = x, x = x->next) {
    if (x != m) continue;
    if (prev) prev->next = x->next; else p->unexp = x->next;
    if (p->unexp_tail == x) p->unexp_tail = prev;
    p->unexp_bytes -= x->nbytes;
    return;
  }
}

/* A set-aside message reached its receive: copy it out, complete both. */
static coll_result_t deliver_kept(coll_comm_t *comm, p2p_msg_t *m, coll_p2p_op_t *op) {
  unexp_remove(comm->p2p, m);
  kept_matched(comm, m);
  coll_result_t res = check_match(comm, op, m->peer, m->tag, m->dtype, m->count);
  if (res == COLL_SUCCESS) {
    if (op->alloc) {
      op->buf = m->data; /* handed over whole */
      m->data = NULL;
    } else if (m->nbytes) {
      memcpy(op->buf, m->data, m->nbytes);
    }
    set_status(op, m->peer, m->tag, m->count);
  }
  p2p_op_done(comm, op, res);
  free(m->data);
  free(m);
  return res;
}

/* ---- posting ---- */

static coll_result_t check_peer_tag(coll_comm_t *comm, const coll_args_t *a, const char *what);

coll_result_t p2p_check_args(coll_comm_t *comm, const coll_args_t *a, int is_send) {
  comm->err_set = 0;
  const char *what = is_send ? "send" : "recv";
  if ((unsigned)a->dtype >= COLL_NUM_DTYPES)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "invalid dtype %d", (int)a->dtype);
  if (!is_send && a->count == COLL_COUNT_ANY && !a->recvbuf) return check_peer_tag(comm, a, what);
  if (a->count > MAX_BYTES / coll_dtype_size(a->dtype))
    return coll_error(comm, COLL_INVALID_ARGUMENT, "%s: count %zu too large", what, a->count);
  if (a->count > 0 && !(is_send ? a->sendbuf : a->recvbuf))
    return coll_error(comm, COLL_INVALID_ARGUMENT, "%s: NULL buffer with count %zu", what, a->count);
  if (a->memory != COLL_MEMORY_HOST)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "%s: point-to-point takes host memory", what);
  return check_peer_tag(comm, a, what);
}

static coll_result_t check_peer_tag(coll_comm_t *comm, const coll_args_t *a, const char *what) {
  int any_ok = strcmp(what, "recv") == 0;
  if (!(a->peer >= 0 && a->peer < comm->size) && !(any_ok && a->peer == COLL_ANY_SOURCE) &&
      a->peer != COLL_PROC_NULL)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "%s: rank %d out of range for %d ranks", what,
                      a->peer, comm->size);
  if (!(a->tag >= 0 && a->tag <= COLL_TAG_MAX) && !(any_ok && a->tag == COLL_ANY_TAG))
    return coll_error(comm, COLL_INVALID_ARGUMENT, "%s: invalid tag %d (0 to %d%s)", what, a->tag,
                      COLL_TAG_MAX, any_ok ? ", or ANY_TAG" : "");
  return COLL_SUCCESS;
}

coll_result_t p2p_post(coll_comm_t *comm, const coll_args_t *args, int is_send, coll_request_t **out,
                       coll_comm_t **to_break) {
  *out = NULL;
  *to_break = NULL;
  int sync = is_send == P2P_SSEND;
  is_send = is_send != 0;
  COLL_CHECK(p2p_check_args(comm, args, is_send));
  /* A subcommunicator's messages go through its root's engine (base/comm_state.h),
   * to root ranks, with its context id. */
  coll_args_t ta = *args;
  const coll_args_t *a = &ta;
  coll_comm_t *sub = comm;
  if (comm->root) {
    if (ta.peer >= 0) ta.peer = comm->world[ta.peer];
    comm = comm->root;
    comm->err_set = 0;
    comm->err[0] = 0;
    sub->err[0] = 0;
    if (sub->broken && !comm->broken)
      return coll_error(sub, COLL_INVALID_USAGE, "rank %d: the communicator is broken by an "
                        "earlier failure; create a new one", sub->rank);
  }
  if (comm->broken)
    return coll_error(comm, COLL_INVALID_USAGE,
                      "rank %d: the communicator is broken by an earlier failure (%s); create a new one",
                      comm->rank, coll_strerror(comm->broken_code));
  pthread_mutex_lock(&comm->mu);
  coll_result_t res = p2p_state_get(comm);
  coll_request_t *req = res == COLL_SUCCESS ? calloc(1, sizeof *req + sizeof(coll_p2p_op_t)) : NULL;
  if (!req) {
    pthread_mutex_unlock(&comm->mu);
    return res != COLL_SUCCESS ? res : coll_error(comm, COLL_SYSTEM_ERROR, "out of memory");
  }
  coll_p2p_op_t *op = (coll_p2p_op_t *)(req + 1);
  struct coll_p2p *p = comm->p2p;
  req->comm = comm;
  req->p2p = op;
  op->req = req;
  op->is_send = is_send;
  op->sync = sync && a->peer != COLL_PROC_NULL;
  op->ctx = sub->ctx;
  op->local = sub->local;
  op->peer = a->peer;
  op->tag = a->tag;
  op->dtype = a->dtype;
  op->buf = a->recvbuf;
  op->sbuf = a->sendbuf;
  op->count = a->count;
  op->alloc = !is_send && a->count == COLL_COUNT_ANY && !a->recvbuf;
  if (op->alloc) op->count = 0;
  op->start = coll_now();
  op->deadline = coll_comm_deadline(comm, a->timeout);
  size_t nbytes = a->count * coll_dtype_size(a->dtype);
  if (is_send) set_status(op, a->peer, a->tag, a->count);
  if (a->peer == COLL_PROC_NULL) {
    /* MPI_PROC_NULL: nothing moves; a receive gets an empty message. */
    if (!is_send) set_status(op, COLL_PROC_NULL, COLL_ANY_TAG, 0);
    if (op->alloc && !(op->buf = malloc(1))) res = COLL_SYSTEM_ERROR;
    p2p_op_done(comm, op, res);
  } else if (is_send && a->peer == comm->rank) {
    /* To itself: delivered (or set aside) now, like a message that arrived. */
    coll_p2p_op_t *r = take_posted(p, op->ctx, comm->rank, a->tag);
    if (r) {
      res = check_match(comm, r, comm->rank, a->tag, a->dtype, a->count);
      if (res == COLL_SUCCESS && r->alloc && !(r->buf = malloc(nbytes + 1)))
        res = coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
      if (res == COLL_SUCCESS && nbytes) memcpy(r->buf, a->sendbuf, nbytes);
      if (res == COLL_SUCCESS) set_status(r, comm->rank, a->tag, a->count);
      p2p_op_done(comm, r, res);
    } else {
      p2p_msg_t *m = calloc(1, sizeof *m);
      unsigned char *data = m ? malloc(nbytes + 1) : NULL;
      if (!data) {
        free(m);
        free(req);
        pthread_mutex_unlock(&comm->mu);
        return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
      }
      if (nbytes) memcpy(data, a->sendbuf, nbytes);
      *m = (p2p_msg_t){NULL, comm->rank, a->tag, a->dtype, a->count, nbytes, nbytes, data, NULL,
                       op->ctx};
      m->sync_op = op->sync ? op : NULL; /* an Ssend completes when a receive takes it */
      if (p->unexp_tail) p->unexp_tail->next = m; else p->unexp = m;
      p->unexp_tail = m;
      p->unexp_bytes += nbytes;
    }
    if (r || !op->sync) p2p_op_done(comm, op, COLL_SUCCESS);
  } else if (is_send) {
    p2p_peer_t *pp = &p->peers[a->peer];
    if (pp->sq_tail) pp->sq_tail->next = op; else pp->sq = op;
    pp->sq_tail = op;
  } else {
    p2p_msg_t *m = p->unexp;
    while (m && !(fits(op, m->ctx, m->peer, m->tag) && !m->claimed)) m = m->next;
    if (m && m->got == m->nbytes) {
      res = deliver_kept(comm, m, op);
      if (res != COLL_SUCCESS) { /* a mismatch: reported here, and it breaks the communicator */
        pthread_mutex_unlock(&comm->mu);
        free(req);
        *to_break = comm; /* the communicator's layer breaks it (comm/p2p_wait.c) */
        return res;
      }
    } else if (m) {
      m->claimed = op;
      op->state = OP_MOVING;
      kept_matched(comm, m); /* the receive has started: an Ssend may complete */
    } else {
      if (p->posted_tail) p->posted_tail->next = op; else p->posted = op;
      p->posted_tail = op;
    }
  }
  pthread_mutex_unlock(&comm->mu);
  *out = req;
  return COLL_SUCCESS;
}

/* ---- moving bytes (holder of the communicator only) ---- */

coll_result_t p2p_push_sends(coll_comm_t *comm, p2p_peer_t *pp, coll_link_t *link, int one,
                                int *moved) {
  for (;;) {
    pthread_mutex_lock(&comm->mu);
    coll_p2p_op_t *op = pp->sq;
    int go = op && !(one && !pp->sending);
    if (go && !pp->sending) op->state = OP_MOVING; /* from now on it cannot be cancelled */
    pthread_mutex_unlock(&comm->mu);
    if (!go) return COLL_SUCCESS;
    size_t nbytes = op->count * coll_dtype_size(op->dtype);
    if (!pp->sending) {
      coll_wire_hdr_t h;
      memset(&h, 0, sizeof h);
      h.coll = COLL_KIND_P2P;
      h.dtype = (uint8_t)op->dtype;
      h.seq = pp->send_seq;
      h.nbytes = (uint32_t)nbytes;
      h.aux = (uint32_t)op->tag;
      h.flags = op->ack ? COLL_WIRE_P2P_ACK : op->sync ? COLL_WIRE_P2P_SYNC : 0;
      h.count = op->count;
      h.ctx = op->ctx;
      h.gen = coll_comm_root(comm)->gen;
      coll_wire_encode(pp->shdr, &h);
      pp->shdr_done = pp->sdone = 0;
      pp->sending = 1;
    }
    size_t before = pp->shdr_done + pp->sdone;
    int full = 0;
    COLL_CHECK(coll_link_send_framed(link, pp->shdr, &pp->shdr_done, (const char *)op->sbuf + pp->sdone,
                                     nbytes - pp->sdone, &pp->sdone, &full));
    if (pp->shdr_done + pp->sdone != before) *moved = 1;
    if (pp->shdr_done < COLL_WIRE_HDR_BYTES || pp->sdone < nbytes) return COLL_SUCCESS;
    pp->sending = 0;
    op->wseq = pp->send_seq++;
    pthread_mutex_lock(&comm->mu);
    pp->sq = op->next;
    if (!pp->sq) pp->sq_tail = NULL;
    op->next = NULL;
    if (op->sync) { /* done when the receiver's ack for wseq comes back */
      op->next = comm->p2p->acked;
      comm->p2p->acked = op;
    } else {
      p2p_op_done(comm, op, COLL_SUCCESS);
    }
    pthread_mutex_unlock(&comm->mu);
    if (one) return COLL_SUCCESS;
  }
}

static uint32_t get32(const uint8_t *b) { return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24; }
static uint64_t get64(const uint8_t *b) { return (uint64_t)get32(b) | (uint64_t)get32(b + 4) << 32; }

/* A whole header from `peer` is in pp->rhdr: check it and choose where its
 * payload goes. *held when it is not for us now (a collective's, or too big
 * to set aside outside a collective). */
static coll_result_t header_arrived(coll_comm_t *comm, p2p_peer_t *pp, int peer, int diverting) {
  const uint8_t *b = pp->rhdr;
  if (get32(b) != COLL_WIRE_MAGIC || b[4] != COLL_WIRE_VERSION)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: malformed message from rank %d (magic 0x%08x version %u, expected "
                      "0x%08x version %u) during send/recv",
                      comm->rank, peer, get32(b), b[4], COLL_WIRE_MAGIC, COLL_WIRE_VERSION);
  if (b[5] != COLL_KIND_P2P) {
    pp->held = HELD_COLLECTIVE;
    return COLL_SUCCESS;
  }
  uint32_t seq = get32(b + 8), nb32 = get32(b + 12), tag = get32(b + 16), flags = get32(b + 20);
  uint64_t count = get64(b + 24), offset = get64(b + 32);
  uint32_t ctx = get32(b + 40); /* any: a message for a communicator with no receive posted is kept */
  unsigned dtype = b[7];
  if (get32(b + 44) != coll_comm_root(comm)->gen)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: rank %d sent a point-to-point message of communicator generation "
                      "%u to generation %u (a stale peer from before a shrink or grow)",
                      comm->rank, peer, get32(b + 44), coll_comm_root(comm)->gen);
  int ack = flags == COLL_WIRE_P2P_ACK, sync = flags == COLL_WIRE_P2P_SYNC;
  if (dtype >= COLL_NUM_DTYPES || b[6] != 0 || (flags != 0 && !ack && !sync) || offset != 0 ||
      (tag > COLL_TAG_MAX && !ack) || (ack && count != 0) ||
      count > MAX_BYTES / coll_dtype_size((coll_dtype_t)dtype) ||
      nb32 != (uint32_t)(count * coll_dtype_size((coll_dtype_t)dtype)))
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: malformed point-to-point header from rank %d (dtype %u, tag %u, "
                      "count %llu, flags %u, offset %llu)",
                      comm->rank, peer, dtype, tag, (unsigned long long)count, flags,
                      (unsigned long long)offset);
  if (seq != pp->recv_seq)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: point-to-point message #%u from rank %d arrived where #%u was due",
                      comm->rank, seq, peer, pp->recv_seq);
  size_t nbytes = (size_t)count * coll_dtype_size((coll_dtype_t)dtype);
  struct coll_p2p *p = comm->p2p;
  coll_result_t res = COLL_SUCCESS;
  pthread_mutex_lock(&comm->mu);
  pp->hvalid = 0;
  coll_p2p_op_t *op = ack ? NULL : take_posted(p, ctx, peer, (int)tag);
  if (ack) {
    /* A receive on `peer` matched our Ssend #tag: it completes. Not found: it
     * failed or was freed meanwhile, and nobody waits for it. */
    coll_p2p_op_t *prev = NULL, *x = p->acked;
    while (x && !(x->peer == peer && x->wseq == tag)) { prev = x; x = x->next; }
    if (x) {
      if (prev) prev->next = x->next; else p->acked = x->next;
      x->next = NULL;
      p2p_op_done(comm, x, COLL_SUCCESS);
    }
    pp->rop = NULL;
    pp->rmsg = NULL;
    pp->rdst = NULL;
  } else if (op) {
    res = check_match(comm, op, peer, (int)tag, (coll_dtype_t)dtype, (size_t)count);
    op->state = OP_MOVING;
    if (res == COLL_SUCCESS && op->alloc && !(op->buf = malloc(nbytes + 1)))
      res = coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory for a %zu-byte message from "
                       "rank %d", comm->rank, nbytes, peer);
    if (res != COLL_SUCCESS) p2p_op_done(comm, op, res);
    else if (sync) res = enqueue_ack(comm, peer, seq);
    set_status(op, peer, (int)tag, (size_t)count);
    pp->rop = op;
    pp->rmsg = NULL;
    pp->rdst = op->buf;
  } else if (!diverting && p->unexp_bytes + nbytes > p->unexp_limit) {
    pp->held = HELD_FULL; /* left in the link until a receive for it is posted */
    pp->hvalid = 1;       /* a probe sees it there */
    pp->htag = (int)tag;
    pp->hctx = ctx;
    pp->hdtype = (coll_dtype_t)dtype;
    pp->hcount = (size_t)count;
  } else if (p->unexp_bytes + nbytes > p->unexp_limit) {
    res = coll_error(comm, COLL_REMOTE_ERROR,
                     "rank %d: rank %d sent a %zu-byte point-to-point message (tag %u) before its "
                     "part of a collective, and no receive is posted for it: keeping it would "
                     "exceed COLLECTIVES_P2P_BUFFER_BYTES (%zu; %zu in use)",
                     comm->rank, peer, nbytes, tag, p->unexp_limit, p->unexp_bytes);
  } else {
    p2p_msg_t *m = calloc(1, sizeof *m);
    unsigned char *data = m ? malloc(nbytes + 1) : NULL;
    if (!data) {
      free(m);
      res = coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
    } else {
      *m = (p2p_msg_t){NULL, peer, (int)tag, (coll_dtype_t)dtype, (size_t)count, nbytes, 0, data, NULL,
                       ctx};
      m->sync = sync;
      m->sync_seq = seq;
      if (p->unexp_tail) p->unexp_tail->next = m; else p->unexp = m;
      p->unexp_tail = m;
      p->unexp_bytes += nbytes;
      pp->rop = NULL;
      pp->rmsg = m;
      pp->rdst = data;
    }
  }
  pthread_mutex_unlock(&comm->mu);
  if (res != COLL_SUCCESS || pp->held) return res;
  pp->reading = 1;
  pp->rnbytes = nbytes;
  pp->rdone = 0;
  pp->recv_seq++;
  pp->rhdr_got = 0;
  return COLL_SUCCESS;
}

static void payload_done(coll_comm_t *comm, p2p_peer_t *pp) {
  pp->reading = 0;
  pthread_mutex_lock(&comm->mu);
  if (pp->rop) {
    p2p_op_done(comm, pp->rop, COLL_SUCCESS);
  } else if (pp->rmsg) {
    pp->rmsg->got = pp->rmsg->nbytes;
    if (pp->rmsg->claimed) deliver_kept(comm, pp->rmsg, pp->rmsg->claimed);
  }
  pp->rop = NULL;
  pp->rmsg = NULL;
  pthread_mutex_unlock(&comm->mu);
}

/* Reads what has arrived from `peer`: headers, payloads, as far as the link
 * goes. `one`: finish the message under way only. */
coll_result_t p2p_pull(coll_comm_t *comm, p2p_peer_t *pp, coll_link_t *link, int one, int *moved) {
  for (;;) {
    if (!pp->reading) {
      if (one) return COLL_SUCCESS;
      struct iovec iov = {pp->rhdr + pp->rhdr_got, COLL_WIRE_HDR_BYTES - pp->rhdr_got};
      size_t n = 0;
      COLL_CHECK(coll_link_recv(link, &iov, 1, &n));
      pp->rhdr_got += n;
      if (pp->rhdr_got < COLL_WIRE_HDR_BYTES) {
        if (n) *moved = 1;
        return COLL_SUCCESS;
      }
      COLL_CHECK(header_arrived(comm, pp, link->peer, 0));
      if (pp->held) {
        /* Not ours now: handed back, and no progress (the next pass would
         * read the same bytes back again). */
        COLL_CHECK(coll_link_unread(link, pp->rhdr, COLL_WIRE_HDR_BYTES));
        pp->rhdr_got = 0;
        return COLL_SUCCESS;
      }
      *moved = 1;
    }
    if (pp->rdone < pp->rnbytes) {
      struct iovec iov = {pp->rdst + pp->rdone, pp->rnbytes - pp->rdone};
      size_t n = 0;
      COLL_CHECK(coll_link_recv(link, &iov, 1, &n));
      if (n) *moved = 1;
      pp->rdone += n;
      if (pp->rdone < pp->rnbytes) return COLL_SUCCESS;
    }
    payload_done(comm, pp);
    if (one) return COLL_SUCCESS;
  }
}

/* Before a collective over GPU buffers (whose executor has no drain hook):
 * every message half sent or half received on a link is finished. While ours wait for their receivers, this rank reads what its
 * peers send (delivering or setting it aside), since those peers may be
 * finishing theirs before the same collective: a ring of ranks that each
 * left a large Isend half sent would otherwise wait on one another. */
coll_result_t coll_p2p_finish(coll_comm_t *comm, double deadline) {
  comm = coll_comm_root(comm); /* a subcommunicator's messages are its root's */
  struct coll_p2p *p = comm->p2p;
  if (!p) return COLL_SUCCESS;
  for (;;) {
    int busy = 0, moved = 0, stuck = 0;
    for (int peer = 0; peer < comm->size; peer++) {
      p2p_peer_t *pp = &p->peers[peer];
      coll_link_t *link = comm->peers[peer].link;
      if (peer == comm->rank || !link) continue;
      pp->held = HELD_NO;
      if (half_sent(pp)) COLL_CHECK(p2p_push_sends(comm, pp, link, 1, &moved));
      stuck |= half_sent(pp);
    }
    /* While a send of ours is stuck, read every peer: the one we wait for
     * may be stuck sending to us. */
    for (int peer = 0; peer < comm->size; peer++) {
      p2p_peer_t *pp = &p->peers[peer];
      coll_link_t *link = comm->peers[peer].link;
      if (peer == comm->rank || !link) continue;
      if (stuck || pp->reading) COLL_CHECK(p2p_pull(comm, pp, link, stuck ? 0 : 1, &moved));
      busy |= half_sent(pp) || pp->reading;
    }
    if (!busy) break;
    if (moved) continue;
    int npf = 0;
    for (int peer = 0; peer < comm->size; peer++) {
      p2p_peer_t *pp = &p->peers[peer];
      coll_link_t *link = comm->peers[peer].link;
      if (peer == comm->rank || !link) continue;
      int sending = half_sent(pp), receiving = (pp->reading || stuck) && !pp->held;
      if (!sending && !receiving) continue;
      int ev = coll_link_wait_events(link, sending, receiving);
      if (ev < 0) { npf = -1; break; }
      npf += coll_link_pollfds(link, ev, p->pfs + npf);
    }
    if (npf < 0) continue;
    double left = deadline - coll_now();
    if (left <= 0 || poll(p->pfs, (nfds_t)npf, (int)(left * 1000) + 1) == 0)
      return coll_error(comm, COLL_TIMEOUT,
                        "rank %d: timed out finishing point-to-point messages before a collective",
                        comm->rank);
    for (int peer = 0; peer < comm->size; peer++) {
      coll_link_t *link = comm->peers[peer].link;
      int hup = 0;
      if (peer != comm->rank && link) COLL_CHECK(coll_link_polled(link, p->pfs, npf, &hup));
    }
  }
  for (int peer = 0; peer < comm->size; peer++) {
    p2p_peer_t *pp = &p->peers[peer];
    coll_link_t *link = comm->peers[peer].link;
    pp->sending = 0; /* a header encoded but not sent is encoded again later */
    if (link && pp->rhdr_got > 0) COLL_CHECK(coll_link_unread(link, pp->rhdr, pp->rhdr_got));
    pp->rhdr_got = 0;
  }
  return COLL_SUCCESS;
}

coll_result_t coll_p2p_quiesce(coll_comm_t *comm, double deadline) {
  comm = coll_comm_root(comm); /* a subcommunicator's messages are its root's */
  (void)deadline;
  struct coll_p2p *p = comm->p2p;
  if (!p) return COLL_SUCCESS;
  p->nhalf = 0;
  for (int peer = 0; peer < comm->size; peer++) {
    p2p_peer_t *pp = &p->peers[peer];
    coll_link_t *link = comm->peers[peer].link;
    if (!half_sent(pp)) pp->sending = 0; /* encoded again later */
    p->nhalf += half_sent(pp);
    pp->held = HELD_NO;
    if (link && pp->rhdr_got > 0 && !pp->reading) COLL_CHECK(coll_link_unread(link, pp->rhdr, pp->rhdr_got));
    if (!pp->reading) pp->rhdr_got = 0;
  }
  return COLL_SUCCESS;
}

int coll_p2p_unmatched(coll_comm_t *root, const int *local, int forget) {
  int n = 0;
  pthread_mutex_lock(&root->mu);
  struct coll_p2p *p = root->p2p;
  for (coll_p2p_op_t *op = p ? p->posted : NULL; op; op = op->next)
    if (op->local == local) {
      n++;
      if (forget) op->local = NULL;
    }
  for (p2p_msg_t *m = p ? p->unexp : NULL; m; m = m->next)
    if (m->claimed && m->claimed->local == local) {
      n++;
      if (forget) m->claimed->local = NULL;
    }
  pthread_mutex_unlock(&root->mu);
  return n;
}

int coll_p2p_pending(coll_comm_t *comm, int peer) {
  if (comm->root) {
    peer = comm->world[peer];
    comm = comm->root;
  }
  const p2p_peer_t *pp = &comm->p2p->peers[peer];
  int reading = pp->reading || pp->rhdr_got > 0 || (comm->p2p->nhalf > 0 && !pp->held);
  return (half_sent(pp) ? 1 : 0) | (reading ? 2 : 0);
}

coll_result_t coll_p2p_drain(coll_comm_t *comm, coll_link_t *link, int sending, int *moved,
                             int *clear) {
  comm = coll_comm_root(comm); /* link->peer is a root rank */
  struct coll_p2p *p = comm->p2p;
  p2p_peer_t *pp = &p->peers[link->peer];
  if (sending) {
    if (half_sent(pp)) {
      COLL_CHECK(p2p_push_sends(comm, pp, link, 1, moved));
      if (!half_sent(pp)) p->nhalf--;
    }
    *clear = !half_sent(pp);
    return COLL_SUCCESS;
  }
  if (pp->reading) {
    COLL_CHECK(p2p_pull(comm, pp, link, 1, moved));
  } else if (p->nhalf > 0 || pp->rhdr_got > 0) {
    /* Some rank may be stuck sending to us as we are stuck sending: read
     * its point-to-point messages even where no step of ours is ready, up
     * to the collective's next header (held, handed back). */
    pp->held = HELD_NO;
    COLL_CHECK(p2p_pull(comm, pp, link, 0, moved));
  }
  *clear = !pp->reading && pp->rhdr_got == 0;
  return COLL_SUCCESS;
}

coll_result_t coll_p2p_divert(coll_comm_t *comm, coll_link_t *link, const uint8_t *hdr,
                              const void *extra, size_t nextra, double deadline) {
  comm = coll_comm_root(comm);
  COLL_CHECK(p2p_state_get(comm));
  p2p_peer_t *pp = &comm->p2p->peers[link->peer];
  memcpy(pp->rhdr, hdr, COLL_WIRE_HDR_BYTES);
  pp->rhdr_got = COLL_WIRE_HDR_BYTES;
  COLL_CHECK(header_arrived(comm, pp, link->peer, 1));
  size_t take = nextra < pp->rnbytes ? nextra : pp->rnbytes;
  if (take) memcpy(pp->rdst, extra, take);
  pp->rdone = take;
  COLL_CHECK(coll_link_unread(link, (const char *)extra + take, nextra - take));
  (void)deadline;
  if (pp->rdone == pp->rnbytes) payload_done(comm, pp);
  return COLL_SUCCESS; /* the rest comes through coll_p2p_drain */
}

