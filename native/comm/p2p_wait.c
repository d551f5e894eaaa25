/*
 * p2p_wait.c -- point-to-point: the engine that runs every pending message
 * until the one waited for is done, requests (wait, test, free, wait-any),
 * and the API entry points (contracts in coll.h; design in
 * schedule/p2p.c). It is the communicator's: waiting takes the communicator
 * from the progress thread and the other callers (coll_comm_enter), and a
 * failure breaks it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/comm_state.h"
#include "schedule/p2p.h"
#include "schedule/schedule.h"
#include "base/status.h"
#include "transport/transport.h"

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

/* ---- the engine: every pending message, until `target` is done ---- */

static int wants_from(struct coll_p2p *p, int peer) {
  for (coll_p2p_op_t *op = p->posted; op; op = op->next)
    if (op->peer == peer || op->peer == COLL_ANY_SOURCE) return 1;
  for (coll_p2p_op_t *op = p->acked; op; op = op->next) /* an Ssend's ack comes from there */
    if (op->peer == peer) return 1;
  return p->probe && (p->probe->peer == peer || p->probe->peer == COLL_ANY_SOURCE);
}

/* One pass without blocking. */
static coll_result_t pass(coll_comm_t *comm, int *moved) {
  struct coll_p2p *p = comm->p2p;
  coll_tcp_serve(comm);
  /* A peer whose communicator broke told us (an abort notice on the
   * listener), or this rank refused a link opening: waiting on would only
   * reach the deadline, since that peer serves nobody any more. */
  COLL_CHECK(coll_tcp_aborted(comm));
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
    if (send) COLL_CHECK(p2p_push_sends(comm, pp, link, 0, moved));
    if (recv) COLL_CHECK(p2p_pull(comm, pp, link, 0, moved));
  }
  return COLL_SUCCESS;
}

static coll_result_t op_timeout(coll_comm_t *comm, coll_p2p_op_t *op) {
  char who[32], tag[32];
  int held = op->peer >= 0 && op->peer != comm->rank ? comm->p2p->peers[op->peer].held : HELD_NO;
  if (op->probe)
    return coll_error(comm, COLL_TIMEOUT,
                      "rank %d: probe for a message from %s (%s) timed out after %.1f s: none came",
                      comm->rank, source_text(op->peer, who, sizeof who),
                      tag_text(op->tag, tag, sizeof tag), coll_now() - op->start);
  if (op->is_send && op->sync && op->state == OP_MOVING)
    return coll_error(comm, COLL_TIMEOUT,
                      "rank %d: Ssend to rank %d (tag %d, %zu %s elements) timed out after %.1f s: "
                      "no receive on rank %d matched it",
                      comm->rank, op->peer, op->tag, op->count, coll_dtype_name(op->dtype),
                      coll_now() - op->start, op->peer);
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
    if (target->probe) {
      pthread_mutex_lock(&comm->mu);
      if (p2p_probe_find(comm, target->ctx, target->peer, target->tag, target->local,
                         &target->status))
        target->state = OP_DONE;
      pthread_mutex_unlock(&comm->mu);
    }
    if (is_done(comm, target)) {
      /* acks queued by this pass's reading leave now: their senders wait */
      if (p->nacks > 0) COLL_CHECK(pass(comm, &moved));
      return COLL_SUCCESS;
    }
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

/* Acks a receive queued while nobody ran the engine (it took a kept message)
 * leave now, if the communicator is free: their senders wait for them. */
static void flush_acks(coll_comm_t *comm) {
  pthread_mutex_lock(&comm->mu);
  int take = comm->p2p && comm->p2p->nacks > 0 && !comm->busy && !comm->qhead && !comm->broken;
  if (take) comm->busy = 1;
  pthread_mutex_unlock(&comm->mu);
  if (!take) return;
  int moved = 0;
  comm->err_set = 0;
  coll_comm_leave(comm, pass(comm, &moved));
}

coll_result_t coll_p2p_wait(coll_request_t *req) {
  coll_comm_t *comm = req->comm;
  if (is_done(comm, req->p2p)) {
    flush_acks(comm);
    return req->result;
  }
  coll_result_t res = coll_comm_enter(comm);
  if (res == COLL_SUCCESS) res = engine(comm, req->p2p, 1);
  coll_comm_leave(comm, res);
  if (res != COLL_SUCCESS) {
    pthread_mutex_lock(&comm->mu);
    p2p_op_done(comm, req->p2p, res);
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
      p2p_op_done(comm, req->p2p, res);
      pthread_mutex_unlock(&comm->mu);
    }
  }
  pthread_mutex_lock(&comm->mu);
  *done = req->p2p->state == OP_DONE;
  coll_result_t res = *done ? req->result : COLL_SUCCESS;
  pthread_mutex_unlock(&comm->mu);
  if (*done) flush_acks(comm);
  return res;
}

/* Unlinks an op that has not started moving (under comm->mu); 0 if it has. */
static int cancel(coll_comm_t *comm, coll_p2p_op_t *op) {
  struct coll_p2p *p = comm->p2p;
  if (op->state != OP_QUEUED) return 0;
  if (op->is_send && op->sync && op->peer == comm->rank) { /* its message waits unmatched */
    if (!p2p_cancel_self_ssend(comm, op)) return 0;
    op->state = OP_DONE;
    return 1;
  }
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
  for (coll_p2p_op_t *op = p->posted, *nx; op; op = nx) { nx = op->next; op->next = NULL; p2p_op_done(comm, op, code); }
  p->posted = p->posted_tail = NULL;
  for (int i = 0; i < comm->size; i++) {
    p2p_peer_t *pp = &p->peers[i];
    for (coll_p2p_op_t *op = pp->sq, *nx; op; op = nx) { nx = op->next; op->next = NULL; p2p_op_done(comm, op, code); }
    pp->sq = pp->sq_tail = NULL;
    if (pp->rop) p2p_op_done(comm, pp->rop, code);
    pp->rop = NULL;
    pp->reading = pp->sending = 0;
  }
  for (p2p_msg_t *m = p->unexp; m; m = m->next) {
    if (m->claimed) p2p_op_done(comm, m->claimed, code);
    if (m->sync_op) p2p_op_done(comm, m->sync_op, code);
  }
  coll_p2p_op_t *acked = p->acked;
  p->acked = NULL;
  for (coll_p2p_op_t *op = acked, *nx; op; op = nx) { nx = op->next; op->next = NULL; p2p_op_done(comm, op, code); }
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

/* p2p_post, and the break a mismatch with a kept message calls for. */
static coll_result_t post(coll_comm_t *comm, const coll_args_t *args, int is_send,
                          coll_request_t **out) {
  coll_comm_t *to_break;
  coll_result_t res = p2p_post(comm, args, is_send, out, &to_break);
  if (to_break) coll_comm_break(to_break, res);
  return res;
}

coll_result_t coll_isend(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req) {
  COLL_CHECK(post(comm, args, 1, req));
  int done;
  coll_p2p_test(*req, &done); /* a message that fits the link leaves now */
  return COLL_SUCCESS;
}

coll_result_t coll_irecv(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req) {
  COLL_CHECK(post(comm, args, 0, req));
  flush_acks((*req)->comm); /* it may have taken a kept Ssend's message */
  return COLL_SUCCESS;
}

coll_result_t coll_issend(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req) {
  COLL_CHECK(post(comm, args, P2P_SSEND, req));
  int done;
  coll_p2p_test(*req, &done);
  return COLL_SUCCESS;
}

coll_result_t coll_ssend(coll_comm_t *comm, const coll_args_t *args) {
  coll_request_t *req;
  COLL_CHECK(post(comm, args, P2P_SSEND, &req));
  coll_result_t res = coll_p2p_wait(req);
  coll_p2p_free(req); /* a failed one may still be listed (a send to itself) */
  return res;
}

coll_result_t coll_probe(coll_comm_t *comm, int source, int tag, double timeout, int block,
                         int *flag, coll_status_t *status) {
  *flag = 0;
  coll_args_t a;
  memset(&a, 0, sizeof a);
  a.peer = source;
  a.tag = tag;
  a.count = COLL_COUNT_ANY;
  a.dtype = COLL_UINT8;
  COLL_CHECK(p2p_check_args(comm, &a, 0));
  if (source == COLL_PROC_NULL) { /* MPI: at once, an empty message from PROC_NULL */
    *flag = 1;
    status->source = COLL_PROC_NULL;
    status->tag = COLL_ANY_TAG;
    status->count = status->nbytes = 0;
    return COLL_SUCCESS;
  }
  coll_comm_t *sub = comm;
  if (comm->root) {
    if (source >= 0) source = comm->world[source];
    comm = comm->root;
    comm->err_set = 0;
  }
  if (comm->broken || sub->broken)
    return coll_error(sub, COLL_INVALID_USAGE, "rank %d: the communicator is broken by an "
                      "earlier failure; create a new one", sub->rank);
  /* The engine runs for a target that is done once a message that fits has
   * its envelope here: kept, or held in its link (schedule/p2p.c). */
  coll_p2p_op_t t;
  memset(&t, 0, sizeof t);
  t.probe = 1;
  t.peer = source;
  t.tag = tag;
  t.ctx = sub->ctx;
  t.local = sub->local;
  t.start = coll_now();
  t.deadline = coll_comm_deadline(comm, timeout);
  pthread_mutex_lock(&comm->mu);
  coll_result_t res = p2p_state_get(comm);
  int found = res == COLL_SUCCESS && p2p_probe_find(comm, t.ctx, t.peer, t.tag, t.local, &t.status);
  int take = res == COLL_SUCCESS && !found && (block || (!comm->busy && !comm->qhead));
  if (take && !block) comm->busy = 1; /* Iprobe: one look, never a wait for a collective */
  pthread_mutex_unlock(&comm->mu);
  if (res != COLL_SUCCESS) return res;
  if (take) {
    if (block) res = coll_comm_enter(comm);
    else comm->err_set = 0;
    if (res == COLL_SUCCESS) {
      comm->p2p->probe = &t;
      res = engine(comm, &t, block);
      comm->p2p->probe = NULL;
    }
    coll_comm_leave(comm, res);
    found = res == COLL_SUCCESS && t.state == OP_DONE;
  }
  if (found) {
    *flag = 1;
    *status = t.status;
  }
  return res;
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
  COLL_CHECK(p2p_check_args(comm, send_args, 1));
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
        p2p_op_done(comm, op, res);
        pthread_mutex_unlock(&comm->mu);
      }
    }
  }
}
