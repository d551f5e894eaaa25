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
 *                          to its end (coll_p2p_drain, comm.h says why)
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

#include "base/comm.h"
#include "base/param.h"
#include "schedule/schedule.h"
#include "base/status.h"
#include "transport/transport.h"
#include "transport/wire.h"

enum { OP_QUEUED = 0, OP_MOVING = 1, OP_DONE = 2 };

typedef struct coll_p2p_op {
  struct coll_p2p_op *next; /* posted receives, or the peer's send queue */
  coll_request_t *req;
  int is_send, state;
  int alloc;                /* receive of any size: buf is allocated at the match */
  int peer, tag;            /* a receive's may be COLL_ANY_* */
  coll_dtype_t dtype;
  void *buf;                /* receive */
  const void *sbuf;         /* send */
  size_t count;             /* send: elements; receive: capacity */
  double start, deadline;
  coll_status_t status;
} coll_p2p_op_t;

typedef struct p2p_msg {    /* arrived before its receive was posted */
  struct p2p_msg *next;
  int peer, tag;
  coll_dtype_t dtype;
  size_t count, nbytes, got;
  unsigned char *data;
  coll_p2p_op_t *claimed;   /* a receive posted while the payload was still arriving */
} p2p_msg_t;

enum { HELD_NO = 0, HELD_COLLECTIVE = 1, HELD_FULL = 2 };

typedef struct {
  coll_p2p_op_t *sq, *sq_tail;
  uint8_t shdr[COLL_WIRE_HDR_BYTES];
  size_t shdr_done, sdone;
  int sending;              /* the head's header is encoded */
  uint32_t send_seq, recv_seq;
  uint8_t rhdr[COLL_WIRE_HDR_BYTES];
  size_t rhdr_got;
  int reading;              /* a payload is arriving into rdst */
  unsigned char *rdst;
  size_t rnbytes, rdone;
  coll_p2p_op_t *rop;
  p2p_msg_t *rmsg;
  int held;                 /* per pass: the next bytes are not for us now */
} p2p_peer_t;

struct coll_p2p {
  p2p_peer_t *peers;
  coll_p2p_op_t *posted, *posted_tail;
  p2p_msg_t *unexp, *unexp_tail;
  size_t unexp_bytes, unexp_limit;
  struct pollfd *pfs;
  int npfs_cap;
  int nhalf; /* during a collective: links with a message of ours half sent */
};

static const size_t MAX_BYTES = (size_t)1 << 48;

static coll_result_t state_get(coll_comm_t *comm) {
  if (comm->p2p) return COLL_SUCCESS;
  struct coll_p2p *p = calloc(1, sizeof *p);
  if (p) p->peers = calloc((size_t)comm->size, sizeof *p->peers);
  if (p) p->npfs_cap = COLL_MAX_PENDING + 1 + 3 * comm->size;
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

/* Under comm->mu. */
static void op_done(coll_comm_t *comm, coll_p2p_op_t *op, coll_result_t res) {
  if (op->state == OP_DONE) return;
  op->state = OP_DONE;
  op->req->result = res;
  op->req->done = 1;
  pthread_cond_broadcast(&comm->cv);
}

static const char *source_text(int peer, char *buf, size_t n) {
  if (peer == COLL_ANY_SOURCE) snprintf(buf, n, "any rank");
  else snprintf(buf, n, "rank %d", peer);
  return buf;
}

static const char *tag_text(int tag, char *buf, size_t n) {
  if (tag == COLL_ANY_TAG) snprintf(buf, n, "any tag");
  else snprintf(buf, n, "tag %d", tag);
  return buf;
}

/* ---- matching (under comm->mu) ---- */

static int fits(const coll_p2p_op_t *op, int peer, int tag) {
  return (op->peer == COLL_ANY_SOURCE || op->peer == peer) && (op->tag == COLL_ANY_TAG || op->tag == tag);
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
  op->status.source = peer;
  op->status.tag = tag;
  op->status.count = count;
  op->status.nbytes = count * coll_dtype_size(op->dtype);
}

static coll_p2p_op_t *take_posted(struct coll_p2p *p, int peer, int tag) {
  coll_p2p_op_t *prev = NULL;
  for (coll_p2p_op_t *op = p->posted; op; prev = op, op = op->next) {
    if (!fits(op, peer, tag)) continue;
    if (prev) prev->next = op->next; else p->posted = op->next;
    if (p->posted_tail == op) p->posted_tail = prev;
    op->next = NULL;
    return op;
  }
  return NULL;
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
  op_done(comm, op, res);
  free(m->data);
  free(m);
  return res;
}

/* ---- posting ---- */

static coll_result_t check_peer_tag(coll_comm_t *comm, const coll_args_t *a, const char *what);

static coll_result_t check_args(coll_comm_t *comm, const coll_args_t *a, int is_send) {
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
  if (!(a->peer >= 0 && a->peer < comm->size) && !(any_ok && a->peer == COLL_ANY_SOURCE))
    return coll_error(comm, COLL_INVALID_ARGUMENT, "%s: rank %d out of range for %d ranks", what,
                      a->peer, comm->size);
  if (!(a->tag >= 0 && a->tag <= COLL_TAG_MAX) && !(any_ok && a->tag == COLL_ANY_TAG))
    return coll_error(comm, COLL_INVALID_ARGUMENT, "%s: invalid tag %d (0 to %d%s)", what, a->tag,
                      COLL_TAG_MAX, any_ok ? ", or ANY_TAG" : "");
  return COLL_SUCCESS;
}

static coll_result_t post(coll_comm_t *comm, const coll_args_t *a, int is_send, coll_request_t **out) {
  *out = NULL;
  COLL_CHECK(check_args(comm, a, is_send));
  if (comm->broken)
    return coll_error(comm, COLL_INVALID_USAGE,
                      "rank %d: the communicator is broken by an earlier failure (%s); create a new one",
                      comm->rank, coll_strerror(comm->broken_code));
  pthread_mutex_lock(&comm->mu);
  coll_result_t res = state_get(comm);
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
  if (is_send && a->peer == comm->rank) {
    /* To itself: delivered (or set aside) now, like a message that arrived. */
    coll_p2p_op_t *r = take_posted(p, comm->rank, a->tag);
    if (r) {
      res = check_match(comm, r, comm->rank, a->tag, a->dtype, a->count);
      if (res == COLL_SUCCESS && r->alloc && !(r->buf = malloc(nbytes + 1)))
        res = coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
      if (res == COLL_SUCCESS && nbytes) memcpy(r->buf, a->sendbuf, nbytes);
      if (res == COLL_SUCCESS) set_status(r, comm->rank, a->tag, a->count);
      op_done(comm, r, res);
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
      *m = (p2p_msg_t){NULL, comm->rank, a->tag, a->dtype, a->count, nbytes, nbytes, data, NULL};
      if (p->unexp_tail) p->unexp_tail->next = m; else p->unexp = m;
      p->unexp_tail = m;
      p->unexp_bytes += nbytes;
    }
    op_done(comm, op, COLL_SUCCESS);
  } else if (is_send) {
    p2p_peer_t *pp = &p->peers[a->peer];
    if (pp->sq_tail) pp->sq_tail->next = op; else pp->sq = op;
    pp->sq_tail = op;
  } else {
    p2p_msg_t *m = p->unexp;
    while (m && !(fits(op, m->peer, m->tag) && !m->claimed)) m = m->next;
    if (m && m->got == m->nbytes) {
      res = deliver_kept(comm, m, op);
      if (res != COLL_SUCCESS) { /* a mismatch: reported here, and it breaks the communicator */
        pthread_mutex_unlock(&comm->mu);
        free(req);
        coll_comm_break(comm, res);
        return res;
      }
    } else if (m) {
      m->claimed = op;
      op->state = OP_MOVING;
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

static coll_result_t push_sends(coll_comm_t *comm, p2p_peer_t *pp, coll_link_t *link, int one,
                                int *moved) {
  for (;;) {
    pthread_mutex_lock(&comm->mu);
    coll_p2p_op_t *op = pp->sq;
    if (op && !pp->sending) op->state = OP_MOVING;
    pthread_mutex_unlock(&comm->mu);
    if (!op || (one && !pp->sending)) return COLL_SUCCESS;
    size_t nbytes = op->count * coll_dtype_size(op->dtype);
    if (!pp->sending) {
      coll_wire_hdr_t h;
      memset(&h, 0, sizeof h);
      h.coll = COLL_KIND_P2P;
      h.dtype = (uint8_t)op->dtype;
      h.seq = pp->send_seq;
      h.nbytes = (uint32_t)nbytes;
      h.aux = (uint32_t)op->tag;
      h.count = op->count;
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
    pp->send_seq++;
    pthread_mutex_lock(&comm->mu);
    pp->sq = op->next;
    if (!pp->sq) pp->sq_tail = NULL;
    op->next = NULL;
    op_done(comm, op, COLL_SUCCESS);
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
  unsigned dtype = b[7];
  if (dtype >= COLL_NUM_DTYPES || b[6] != 0 || flags != 0 || offset != 0 || tag > COLL_TAG_MAX ||
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
  coll_p2p_op_t *op = take_posted(p, peer, (int)tag);
  if (op) {
    res = check_match(comm, op, peer, (int)tag, (coll_dtype_t)dtype, (size_t)count);
    op->state = OP_MOVING;
    if (res == COLL_SUCCESS && op->alloc && !(op->buf = malloc(nbytes + 1)))
      res = coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory for a %zu-byte message from "
                       "rank %d", comm->rank, nbytes, peer);
    if (res != COLL_SUCCESS) op_done(comm, op, res);
    set_status(op, peer, (int)tag, (size_t)count);
    pp->rop = op;
    pp->rmsg = NULL;
    pp->rdst = op->buf;
  } else if (!diverting && p->unexp_bytes + nbytes > p->unexp_limit) {
    pp->held = HELD_FULL; /* left in the link until a receive for it is posted */
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
      *m = (p2p_msg_t){NULL, peer, (int)tag, (coll_dtype_t)dtype, (size_t)count, nbytes, 0, data, NULL};
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
    op_done(comm, pp->rop, COLL_SUCCESS);
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
static coll_result_t pull(coll_comm_t *comm, p2p_peer_t *pp, coll_link_t *link, int one, int *moved) {
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

/* Sleeps until `link` can move (or the deadline), for the blocking loops. */
static coll_result_t link_wait(coll_comm_t *comm, coll_link_t *link, int sending, int receiving,
                               double deadline, const char *what) {
  int ev = coll_link_wait_events(link, sending, receiving);
  if (ev < 0) return COLL_SUCCESS;
  struct pollfd pfs[2];
  int npf = coll_link_pollfds(link, ev, pfs);
  double left = deadline - coll_now();
  if (left <= 0 || poll(pfs, (nfds_t)npf, (int)(left * 1000) + 1) == 0)
    return coll_error(comm, COLL_TIMEOUT, "rank %d: timed out %s rank %d", comm->rank, what, link->peer);
  int hup = 0;
  return coll_link_polled(link, pfs, npf, &hup);
}

static int half_sent(const p2p_peer_t *pp) { return pp->sending && pp->shdr_done > 0; }

/* Before a collective over GPU buffers (whose executor has no drain hook):
 * every message half sent or half received on a link is finished. While ours wait for their receivers, this rank reads what its
 * peers send (delivering or setting it aside), since those peers may be
 * finishing theirs before the same collective: a ring of ranks that each
 * left a large Isend half sent would otherwise wait on one another. */
coll_result_t coll_p2p_finish(coll_comm_t *comm, double deadline) {
  struct coll_p2p *p = comm->p2p;
  if (!p) return COLL_SUCCESS;
  for (;;) {
    int busy = 0, moved = 0, stuck = 0;
    for (int peer = 0; peer < comm->size; peer++) {
      p2p_peer_t *pp = &p->peers[peer];
      coll_link_t *link = comm->peers[peer].link;
      if (peer == comm->rank || !link) continue;
      pp->held = HELD_NO;
      if (half_sent(pp)) COLL_CHECK(push_sends(comm, pp, link, 1, &moved));
      stuck |= half_sent(pp);
    }
    /* While a send of ours is stuck, read every peer: the one we wait for
     * may be stuck sending to us. */
    for (int peer = 0; peer < comm->size; peer++) {
      p2p_peer_t *pp = &p->peers[peer];
      coll_link_t *link = comm->peers[peer].link;
      if (peer == comm->rank || !link) continue;
      if (stuck || pp->reading) COLL_CHECK(pull(comm, pp, link, stuck ? 0 : 1, &moved));
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

int coll_p2p_pending(coll_comm_t *comm, int peer) {
  const p2p_peer_t *pp = &comm->p2p->peers[peer];
  int reading = pp->reading || pp->rhdr_got > 0 || (comm->p2p->nhalf > 0 && !pp->held);
  return (half_sent(pp) ? 1 : 0) | (reading ? 2 : 0);
}

coll_result_t coll_p2p_drain(coll_comm_t *comm, coll_link_t *link, int sending, int *moved,
                             int *clear) {
  struct coll_p2p *p = comm->p2p;
  p2p_peer_t *pp = &p->peers[link->peer];
  if (sending) {
    if (half_sent(pp)) {
      COLL_CHECK(push_sends(comm, pp, link, 1, moved));
      if (!half_sent(pp)) p->nhalf--;
    }
    *clear = !half_sent(pp);
    return COLL_SUCCESS;
  }
  if (pp->reading) {
    COLL_CHECK(pull(comm, pp, link, 1, moved));
  } else if (p->nhalf > 0 || pp->rhdr_got > 0) {
    /* Some rank may be stuck sending to us as we are stuck sending: read
     * its point-to-point messages even where no step of ours is ready, up
     * to the collective's next header (held, handed back). */
    pp->held = HELD_NO;
    COLL_CHECK(pull(comm, pp, link, 0, moved));
  }
  *clear = !pp->reading && pp->rhdr_got == 0;
  return COLL_SUCCESS;
}

coll_result_t coll_p2p_divert(coll_comm_t *comm, coll_link_t *link, const uint8_t *hdr,
                              const void *extra, size_t nextra, double deadline) {
  COLL_CHECK(state_get(comm));
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

/* ---- the engine: every pending message, until `target` is done ---- */

static int wants_from(struct coll_p2p *p, int peer) {
  for (coll_p2p_op_t *op = p->posted; op; op = op->next)
    if (op->peer == peer || op->peer == COLL_ANY_SOURCE) return 1;
  return 0;
}

/* One pass without blocking. */
static coll_result_t pass(coll_comm_t *comm, int *moved) {
  struct coll_p2p *p = comm->p2p;
  coll_tcp_serve(comm);
  for (int peer = 0; peer < comm->size; peer++) {
    if (peer == comm->rank) continue;
    p2p_peer_t *pp = &p->peers[peer];
    pp->held = HELD_NO;
    pthread_mutex_lock(&comm->mu);
    int recv = pp->reading || pp->rhdr_got || wants_from(p, peer), send = pp->sq != NULL;
    pthread_mutex_unlock(&comm->mu);
    if (!recv && !send) continue;
    coll_link_t *link = comm->peers[peer].link;
    if (!link && peer > comm->rank) {
      int done = 0;
      COLL_CHECK(coll_link_dial_start(comm, peer, coll_now() + 5.0));
      COLL_CHECK(coll_link_dial_poll(comm, peer, &done));
      link = comm->peers[peer].link;
    }
    if (!link) continue; /* a lower peer dials us; coll_tcp_serve adopts it */
    if (send) COLL_CHECK(push_sends(comm, pp, link, 0, moved));
    if (recv) COLL_CHECK(pull(comm, pp, link, 0, moved));
  }
  return COLL_SUCCESS;
}

static coll_result_t op_timeout(coll_comm_t *comm, coll_p2p_op_t *op) {
  char who[32], tag[32];
  int held = op->peer >= 0 && op->peer != comm->rank ? comm->p2p->peers[op->peer].held : HELD_NO;
  if (op->is_send)
    return coll_error(comm, COLL_TIMEOUT,
                      "rank %d: send to rank %d (tag %d, %zu %s elements) timed out after %.1f s: "
                      "rank %d did not take it",
                      comm->rank, op->peer, op->tag, op->count, coll_dtype_name(op->dtype),
                      coll_now() - op->start, op->peer);
  return coll_error(comm, COLL_TIMEOUT,
                    "rank %d: recv from %s (%s) timed out after %.1f s: no matching message came%s",
                    comm->rank, source_text(op->peer, who, sizeof who),
                    tag_text(op->tag, tag, sizeof tag), coll_now() - op->start,
                    held == HELD_COLLECTIVE ? " (that rank's next message is part of a collective)"
                    : held == HELD_FULL ? " (that rank's next message does not fit "
                                          "COLLECTIVES_P2P_BUFFER_BYTES and matches no receive)"
                                        : "");
}

static int is_done(coll_comm_t *comm, coll_p2p_op_t *op) {
  pthread_mutex_lock(&comm->mu);
  int d = op->state == OP_DONE;
  pthread_mutex_unlock(&comm->mu);
  return d;
}

/* Runs until target is done (block) or for one pass. */
static coll_result_t engine(coll_comm_t *comm, coll_p2p_op_t *target, int block) {
  struct coll_p2p *p = comm->p2p;
  for (;;) {
    int moved = 0;
    COLL_CHECK(pass(comm, &moved));
    if (is_done(comm, target)) return COLL_SUCCESS;
    if (coll_now() >= target->deadline) return op_timeout(comm, target);
    if (moved) continue;
    if (!block) return COLL_SUCCESS;
    int npf = coll_tcp_listen_pollfds(comm, p->pfs), retry = 0;
    for (int peer = 0; peer < comm->size && !retry; peer++) {
      if (peer == comm->rank) continue;
      coll_peer_t *cp = &comm->peers[peer];
      p2p_peer_t *pp = &p->peers[peer];
      if (cp->dialing) {
        p->pfs[npf].fd = cp->dialing->fd;
        p->pfs[npf].events = POLLIN;
        p->pfs[npf++].revents = 0;
      }
      if (!cp->link) continue;
      pthread_mutex_lock(&comm->mu);
      int recv = pp->reading || wants_from(p, peer), send = pp->sq != NULL;
      pthread_mutex_unlock(&comm->mu);
      if (pp->held) recv = 0;
      int ev = recv || send ? coll_link_wait_events(cp->link, send, recv)
               : pp->held   ? POLLRDHUP
                            : 0;
      if (ev < 0) retry = 1;
      else if (ev) npf += coll_link_pollfds(cp->link, ev, p->pfs + npf);
    }
    if (retry) continue;
    double left = target->deadline - coll_now();
    int r = poll(p->pfs, (nfds_t)npf, left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1);
    if (r < 0 && errno != EINTR)
      return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: poll failed: %s", comm->rank, strerror(errno));
    for (int peer = 0; r > 0 && peer < comm->size; peer++) {
      coll_link_t *link = comm->peers[peer].link;
      if (peer == comm->rank || !link) continue;
      int hup = 0;
      COLL_CHECK(coll_link_polled(link, p->pfs, npf, &hup));
      if (hup && p->peers[peer].held)
        return coll_error(comm, COLL_REMOTE_ERROR,
                          "rank %d: rank %d closed the connection (it exited or failed)", comm->rank,
                          peer);
    }
  }
}

/* ---- requests ---- */

coll_result_t coll_p2p_wait(coll_request_t *req) {
  coll_comm_t *comm = req->comm;
  if (is_done(comm, req->p2p)) return req->result;
  coll_result_t res = coll_comm_enter(comm);
  if (res == COLL_SUCCESS) res = engine(comm, req->p2p, 1);
  coll_comm_leave(comm, res);
  if (res != COLL_SUCCESS) {
    pthread_mutex_lock(&comm->mu);
    op_done(comm, req->p2p, res);
    pthread_mutex_unlock(&comm->mu);
  }
  return req->result;
}

coll_result_t coll_p2p_test(coll_request_t *req, int *done) {
  coll_comm_t *comm = req->comm;
  *done = 0;
  pthread_mutex_lock(&comm->mu);
  int take = req->p2p->state != OP_DONE && !comm->busy && !comm->qhead;
  if (take) comm->busy = 1; /* a collective under way may deliver it meanwhile */
  pthread_mutex_unlock(&comm->mu);
  if (take) {
    comm->err_set = 0;
    coll_result_t res = comm->broken ? COLL_INVALID_USAGE : engine(comm, req->p2p, 0);
    coll_comm_leave(comm, res == COLL_INVALID_USAGE ? COLL_SUCCESS : res);
    if (res != COLL_SUCCESS) {
      pthread_mutex_lock(&comm->mu);
      op_done(comm, req->p2p, res);
      pthread_mutex_unlock(&comm->mu);
    }
  }
  pthread_mutex_lock(&comm->mu);
  *done = req->p2p->state == OP_DONE;
  coll_result_t res = *done ? req->result : COLL_SUCCESS;
  pthread_mutex_unlock(&comm->mu);
  return res;
}

/* Unlinks an op that has not started moving (under comm->mu); 0 if it has. */
static int cancel(coll_comm_t *comm, coll_p2p_op_t *op) {
  struct coll_p2p *p = comm->p2p;
  if (op->state != OP_QUEUED) return 0;
  coll_p2p_op_t **head = op->is_send ? &p->peers[op->peer].sq : &p->posted;
  coll_p2p_op_t **tail = op->is_send ? &p->peers[op->peer].sq_tail : &p->posted_tail;
  coll_p2p_op_t *prev = NULL;
  for (coll_p2p_op_t *x = *head; x; prev = x, x = x->next) {
    if (x != op) continue;
    if (prev) prev->next = x->next; else *head = x->next;
    if (*tail == x) *tail = prev;
    op->state = OP_DONE;
    return 1;
  }
  return 0;
}

void coll_p2p_free(coll_request_t *req) {
  coll_comm_t *comm = req->comm;
  pthread_mutex_lock(&comm->mu);
  int gone = req->p2p->state == OP_DONE || cancel(comm, req->p2p);
  pthread_mutex_unlock(&comm->mu);
  if (!gone) coll_p2p_wait(req);
  if (req->p2p->alloc) free(req->p2p->buf);
  free(req);
}

void coll_p2p_fail_all(coll_comm_t *comm, coll_result_t code) {
  struct coll_p2p *p = comm->p2p;
  if (!p) return;
  pthread_mutex_lock(&comm->mu);
  for (coll_p2p_op_t *op = p->posted, *nx; op; op = nx) { nx = op->next; op->next = NULL; op_done(comm, op, code); }
  p->posted = p->posted_tail = NULL;
  for (int i = 0; i < comm->size; i++) {
    p2p_peer_t *pp = &p->peers[i];
    for (coll_p2p_op_t *op = pp->sq, *nx; op; op = nx) { nx = op->next; op->next = NULL; op_done(comm, op, code); }
    pp->sq = pp->sq_tail = NULL;
    if (pp->rop) op_done(comm, pp->rop, code);
    pp->rop = NULL;
    pp->reading = pp->sending = 0;
  }
  for (p2p_msg_t *m = p->unexp; m; m = m->next)
    if (m->claimed) op_done(comm, m->claimed, code);
  pthread_mutex_unlock(&comm->mu);
}

void coll_p2p_destroy(coll_comm_t *comm) {
  struct coll_p2p *p = comm->p2p;
  if (!p) return;
  coll_p2p_fail_all(comm, COLL_INVALID_USAGE);
  for (p2p_msg_t *m = p->unexp, *nx; m; m = nx) { nx = m->next; free(m->data); free(m); }
  free(p->pfs);
  free(p->peers);
  free(p);
  comm->p2p = NULL;
}

/* ---- the API ---- */

coll_result_t coll_isend(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req) {
  COLL_CHECK(post(comm, args, 1, req));
  int done;
  coll_p2p_test(*req, &done); /* a message that fits the link leaves now */
  return COLL_SUCCESS;
}

coll_result_t coll_irecv(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req) {
  return post(comm, args, 0, req);
}

coll_result_t coll_send(coll_comm_t *comm, const coll_args_t *args) {
  coll_request_t *req;
  COLL_CHECK(post(comm, args, 1, &req));
  coll_result_t res = coll_p2p_wait(req);
  free(req);
  return res;
}

coll_result_t coll_recv(coll_comm_t *comm, const coll_args_t *args, coll_status_t *status) {
  coll_request_t *req;
  COLL_CHECK(post(comm, args, 0, &req));
  coll_result_t res = coll_p2p_wait(req);
  if (res == COLL_SUCCESS && status) *status = req->p2p->status;
  if (req->p2p->alloc) free(req->p2p->buf); /* coll_irecv is the form that hands it over */
  free(req);
  return res;
}

coll_result_t coll_sendrecv(coll_comm_t *comm, const coll_args_t *send_args,
                            const coll_args_t *recv_args, coll_status_t *status) {
  coll_request_t *rr, *sr;
  COLL_CHECK(check_args(comm, send_args, 1));
  COLL_CHECK(post(comm, recv_args, 0, &rr));
  coll_result_t res = post(comm, send_args, 1, &sr);
  if (res != COLL_SUCCESS) {
    coll_p2p_free(rr);
    return res;
  }
  res = coll_p2p_wait(sr);
  coll_result_t rres = coll_p2p_wait(rr);
  if (res == COLL_SUCCESS) res = rres;
  if (res == COLL_SUCCESS && status) *status = rr->p2p->status;
  free(sr);
  free(rr);
  return res;
}

coll_result_t coll_request_status(const coll_request_t *req, coll_status_t *status) {
  if (!req->p2p || !req->done) return COLL_INVALID_USAGE;
  *status = req->p2p->status;
  return COLL_SUCCESS;
}

coll_result_t coll_request_take_buffer(coll_request_t *req, void **buf, size_t *nbytes) {
  *buf = NULL;
  *nbytes = 0;
  if (!req->p2p || !req->done || !req->p2p->alloc) return COLL_INVALID_USAGE;
  coll_p2p_op_t *op = req->p2p;
  *buf = op->buf;
  *nbytes = op->status.count * coll_dtype_size(op->dtype);
  op->buf = NULL;
  return COLL_SUCCESS;
}

coll_result_t coll_request_wait_any(coll_request_t **reqs, int n, int *index) {
  *index = -1;
  coll_comm_t *comm = NULL;
  for (int i = 0; i < n; i++)
    if (reqs[i]) {
      if (comm && reqs[i]->comm != comm) return COLL_INVALID_ARGUMENT;
      comm = reqs[i]->comm;
    }
  if (!comm) return COLL_SUCCESS;
  for (;;) {
    for (int i = 0; i < n; i++) {
      if (!reqs[i]) continue;
      int done = 0;
      coll_result_t res = reqs[i]->p2p ? coll_p2p_test(reqs[i], &done) : coll_request_test(reqs[i], &done);
      if (done) { *index = i; return res; }
    }
    /* Nothing finished: sleep until something might have. A point-to-point
     * request progresses only while someone runs the engine, so run it
     * (blocking, briefly) for the first one; collectives finish on the
     * progress thread, which signals cv. */
    coll_request_t *p2p = NULL;
    for (int i = 0; i < n && !p2p; i++) if (reqs[i] && reqs[i]->p2p) p2p = reqs[i];
    pthread_mutex_lock(&comm->mu);
    int take = p2p && !comm->busy && !comm->qhead;
    if (take) comm->busy = 1;
    else {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 5 * 1000 * 1000;
      if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
      pthread_cond_timedwait(&comm->cv, &comm->mu, &ts);
    }
    pthread_mutex_unlock(&comm->mu);
    if (take) {
      /* One blocking round, bounded: the others may finish meanwhile. */
      coll_p2p_op_t *op = p2p->p2p;
      double keep = op->deadline, soon = coll_now() + 0.01;
      int short_wait = soon < keep;
      if (short_wait) op->deadline = soon;
      comm->err_set = 0;
      coll_result_t res = comm->broken ? COLL_INVALID_USAGE : engine(comm, op, 1);
      if (short_wait) op->deadline = keep;
      if (res == COLL_TIMEOUT && short_wait) { /* only the round's bound */
        res = COLL_SUCCESS;
        comm->err_set = 0;
        comm->err[0] = 0;
      }
      coll_comm_leave(comm, res == COLL_INVALID_USAGE ? COLL_SUCCESS : res);
      if (res != COLL_SUCCESS) {
        pthread_mutex_lock(&comm->mu);
        op_done(comm, op, res);
        pthread_mutex_unlock(&comm->mu);
      }
    }
  }
}
