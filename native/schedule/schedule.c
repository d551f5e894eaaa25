/*
 * schedule.c -- builds schedules and runs them (vocabulary in schedule.h).
 *
 * The executor keeps, per peer, a FIFO of send steps and a FIFO of receive
 * steps. Each pass over the peers moves every head whose predecessors are
 * done as far as the socket allows (one sendmsg/readv per head per pass, the
 * header and the payload in one call); when a whole pass moves nothing it
 * blocks in poll() on exactly the links whose heads are ready, with the
 * remaining time to the deadline. No thread, no spinning: on a 2-core machine
 * running 4 ranks, a rank that cannot progress gives the core away.
 */
#define _GNU_SOURCE
#include "schedule/schedule.h"

#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/comm_state.h"
#include "base/log.h"
#include "base/status.h"
#include "transport/transport.h"

void coll_sched_init(coll_sched_t *s, coll_comm_t *comm, coll_kind_t kind, const coll_args_t *args,
                     uint32_t aux) {
  memset(s, 0, sizeof *s);
  s->comm = comm;
  int reducing = kind == COLL_KIND_ALLREDUCE || kind == COLL_KIND_REDUCE_SCATTER ||
                 kind == COLL_KIND_REDUCE;
  s->hdr.coll = (uint8_t)kind;
  s->hdr.redop = reducing ? (uint8_t)args->op : 0;
  s->hdr.dtype = (uint8_t)args->dtype;
  s->hdr.seq = comm->seq++;
  s->hdr.ctx = comm->ctx;
  s->hdr.gen = coll_comm_root(comm)->gen;
  s->hdr.aux = aux;
  s->hdr.count = args->count;
  s->elem = coll_dtype_size(args->dtype);
  if (s->elem == 0) s->elem = 1;
  s->reduce = reducing ? coll_reduce_kernel(args->dtype, args->op) : NULL;
  size_t seg = args->segment_bytes ? args->segment_bytes : coll_comm_segment_bytes(comm);
  seg -= seg % s->elem;
  s->segment_bytes = seg ? seg : s->elem;
  /* Reuse the arrays the communicator kept from its last schedule. */
  s->steps = comm->keep.steps;
  s->cap = comm->keep.cap;
  s->edges = comm->keep.edges;
  s->ecap = comm->keep.ecap;
  comm->keep.steps = comm->keep.edges = NULL;
  comm->keep.cap = comm->keep.ecap = 0;
}

/* Arrays up to this size go back to the communicator for the next call. */
#define KEEP_BYTES ((size_t)4 << 20)

void coll_sched_free(coll_sched_t *s) {
  coll_comm_t *comm = s->comm;
  if (comm && !comm->keep.steps && (size_t)s->cap * sizeof *s->steps <= KEEP_BYTES) {
    comm->keep.steps = s->steps;
    comm->keep.cap = s->cap;
  } else {
    free(s->steps);
  }
  if (comm && !comm->keep.edges && (size_t)s->ecap * sizeof *s->edges <= KEEP_BYTES) {
    comm->keep.edges = s->edges;
    comm->keep.ecap = s->ecap;
  } else {
    free(s->edges);
  }
  s->steps = NULL;
  s->edges = NULL;
  s->cap = s->ecap = 0;
}

/* The executor's scratch: the communicator's kept block when large enough.
 * *cap: the block's size, for scratch_give. */
static void *scratch_take(coll_comm_t *comm, size_t bytes, size_t *cap) {
  if (comm->keep.scratch && comm->keep.scratch_bytes >= bytes) {
    void *p = comm->keep.scratch;
    *cap = comm->keep.scratch_bytes;
    comm->keep.scratch = NULL;
    return p;
  }
  *cap = bytes;
  return malloc(bytes);
}

static void scratch_give(coll_comm_t *comm, void *p, size_t bytes) {
  if (!p) return;
  if (bytes > KEEP_BYTES || (comm->keep.scratch && comm->keep.scratch_bytes >= bytes)) {
    free(p);
    return;
  }
  free(comm->keep.scratch);
  comm->keep.scratch = p;
  comm->keep.scratch_bytes = bytes;
}

static int add(coll_sched_t *s, coll_step_kind_t kind, int peer, void *dst, const void *src, size_t n,
               uint64_t off) {
  if (s->nsteps == s->cap) {
    int cap = s->cap ? 2 * s->cap : 64;
    coll_step_t *p = realloc(s->steps, (size_t)cap * sizeof *p);
    if (!p) { s->oom = 1; return -1; }
    s->steps = p;
    s->cap = cap;
  }
  coll_step_t *st = &s->steps[s->nsteps];
  memset(st, 0, sizeof *st);
  st->kind = (uint8_t)kind;
  st->peer = peer;
  st->dst = dst;
  st->src = src;
  st->nbytes = n;
  st->offset = off;
  return s->nsteps++;
}

int coll_sched_send(coll_sched_t *s, int peer, const void *src, size_t n, uint64_t off) {
  return add(s, COLL_STEP_SEND, peer, NULL, src, n, off);
}
int coll_sched_recv(coll_sched_t *s, int peer, void *dst, size_t n, uint64_t off) {
  return add(s, COLL_STEP_RECV, peer, dst, NULL, n, off);
}
int coll_sched_recv_reduce(coll_sched_t *s, int peer, void *dst, const void *local, size_t n,
                           uint64_t off) {
  return add(s, COLL_STEP_RECV_REDUCE, peer, dst, local, n, off);
}
int coll_sched_copy(coll_sched_t *s, void *dst, const void *src, size_t n) {
  return add(s, COLL_STEP_COPY, -1, dst, src, n, 0);
}

int coll_sched_after(coll_sched_t *s, int step, int pred) {
  if (pred < 0 || step < 0) return step;
  if (s->nedges == s->ecap) {
    int cap = s->ecap ? 2 * s->ecap : 64;
    int(*p)[2] = realloc(s->edges, (size_t)cap * sizeof *p);
    if (!p) { s->oom = 1; return step; }
    s->edges = p;
    s->ecap = cap;
  }
  s->edges[s->nedges][0] = pred;
  s->edges[s->nedges][1] = step;
  s->nedges++;
  return step;
}

int coll_sched_recv_reduce_send(coll_sched_t *s, int from, int to, void *dst, const void *local,
                                size_t n, uint64_t off) {
  int r = coll_sched_recv_reduce(s, from, dst, local, n, off);
  return coll_sched_after(s, coll_sched_send(s, to, dst, n, off), r);
}

int coll_sched_recv_copy_send(coll_sched_t *s, int from, int to, void *dst, size_t n, uint64_t off) {
  int r = coll_sched_recv(s, from, dst, n, off);
  return coll_sched_after(s, coll_sched_send(s, to, dst, n, off), r);
}

int coll_sched_nseg(const coll_sched_t *s, size_t n) {
  size_t k = (n + s->segment_bytes - 1) / s->segment_bytes;
  return k ? (int)k : 1;
}

void coll_sched_seg(const coll_sched_t *s, size_t n, int nseg, int i, size_t *off, size_t *len) {
  size_t elems = n / s->elem, eo, el;
  size_t base = elems / (size_t)nseg, extra = elems % (size_t)nseg, ui = (size_t)i;
  eo = ui * base + (ui < extra ? ui : extra);
  el = base + (ui < extra ? 1 : 0);
  *off = eo * s->elem;
  *len = el * s->elem;
}

/* ---- executor ---- */

coll_wire_hdr_t coll_sched_step_hdr(const coll_sched_t *s, const coll_step_t *st) {
  coll_wire_hdr_t h = s->hdr;
  h.nbytes = (uint32_t)st->nbytes;
  h.offset = st->offset;
  return h;
}

coll_result_t coll_link_send_framed(coll_link_t *link, const uint8_t *hdr, size_t *hdr_done,
                                    const void *payload, size_t len, size_t *sent, int *full) {
  struct iovec iov[2];
  int k = 0;
  *full = 0;
  if (*hdr_done < COLL_WIRE_HDR_BYTES) {
    iov[k].iov_base = (void *)(hdr + *hdr_done);
    iov[k++].iov_len = COLL_WIRE_HDR_BYTES - *hdr_done;
  }
  if (len) {
    iov[k].iov_base = (void *)payload;
    iov[k++].iov_len = len;
  }
  if (k == 0) return COLL_SUCCESS;
  size_t want = 0, n = 0;
  for (int i = 0; i < k; i++) want += iov[i].iov_len;
  COLL_CHECK(link->tp->send(link, iov, k, &n));
  size_t h = COLL_WIRE_HDR_BYTES - *hdr_done;
  if (n < h) h = n;
  *hdr_done += h;
  *sent += n - h;
  *full = n < want;
  return COLL_SUCCESS;
}

void coll_sched_link_edges(coll_sched_t *s, int *succ, int *cnt) {
  int n = s->nsteps;
  for (int i = 0; i < n; i++) { cnt[i] = 0; s->steps[i].npred = 0; }
  for (int e = 0; e < s->nedges; e++) { cnt[s->edges[e][0]]++; s->steps[s->edges[e][1]].npred++; }
  int acc = 0;
  for (int i = 0; i < n; i++) { s->steps[i].succ_begin = acc; acc += cnt[i]; s->steps[i].succ_end = s->steps[i].succ_begin; }
  for (int e = 0; e < s->nedges; e++) { coll_step_t *p = &s->steps[s->edges[e][0]]; succ[p->succ_end++] = s->edges[e][1]; }
}

typedef struct {
  int peer;
  coll_link_t *link;
  int *sq, nsq, sh;   /* send steps in order, head */
  int *rq, nrq, rh;   /* receive steps in order, head */
  uint8_t shdr[COLL_WIRE_HDR_BYTES];
  size_t shdr_done, sdone;
  int shdr_ready;
  uint8_t rhdr[COLL_WIRE_HDR_BYTES];
  size_t rhdr_got, rdone, fill;  /* rdone: payload bytes consumed; fill: staged, not yet reduced */
  int rhdr_checked;
  /* Single copy (transport.h sc_*): the send head went as a descriptor (ssc)
   * and waits for its ack; the receive head is one (rsc), desc so far. */
  int ssc, rsc;
  uint8_t sdesc[COLL_SC_DESC_BYTES], rdesc[COLL_SC_DESC_BYTES];
  size_t rdesc_got;
  int hup;            /* the peer hung up: stop polling it, let send/recv report it */
} peer_state_t;

typedef struct {
  coll_sched_t *s;
  int *succ, *succ_idx;
  int *ready, nready;
  int remaining;
  double deadline;
} exec_t;

static void complete(exec_t *x, int id) {
  coll_step_t *st = &x->s->steps[id];
  x->remaining--;
  for (int e = st->succ_begin; e < st->succ_end; e++) {
    coll_step_t *nx = &x->s->steps[x->succ[e]];
    if (--nx->npred == 0 && nx->kind == COLL_STEP_COPY) x->ready[x->nready++] = x->succ[e];
  }
}

static coll_result_t progress_send(exec_t *x, peer_state_t *ps, int *moved) {
  coll_sched_t *s = x->s;
  if (coll_comm_root(s->comm)->p2p) { /* a point-to-point message half sent on this link goes first */
    int clear = 1;
    COLL_CHECK(coll_p2p_drain(s->comm, ps->link, 1, moved, &clear));
    if (!clear) return COLL_SUCCESS;
  }
  while (ps->sh < ps->nsq) {
    int id = ps->sq[ps->sh];
    coll_step_t *st = &s->steps[id];
    if (st->npred > 0) return COLL_SUCCESS;
    const coll_transport_t *tp = ps->link->tp;
    if (!ps->shdr_ready) {
      coll_wire_hdr_t h = coll_sched_step_hdr(s, st);
      /* Not in reducing collectives: their messages are mostly reduced at
       * the peer, which reads the ring once as it reduces (schedule/single_copy.c). */
      ps->ssc = !st->no_sc && !s->reduce && tp->sc_wanted && tp->sc_wanted(ps->link, st->nbytes);
      if (ps->ssc) { /* the peer reads the bytes from src: a descriptor goes instead */
        h.flags = COLL_WIRE_SC_DESC;
        tp->sc_post(ps->link, st->src, st->nbytes, ps->sdesc);
      }
      coll_wire_encode(ps->shdr, &h);
      ps->shdr_ready = 1;
      ps->shdr_done = ps->sdone = 0;
    }
    const char *payload = ps->ssc ? (const char *)ps->sdesc : (const char *)st->src;
    size_t total = ps->ssc ? COLL_SC_DESC_BYTES : st->nbytes;
    if (ps->shdr_done < COLL_WIRE_HDR_BYTES || ps->sdone < total) {
      size_t before = ps->shdr_done + ps->sdone;
      int full = 0;
      COLL_CHECK(coll_link_send_framed(ps->link, ps->shdr, &ps->shdr_done, payload + ps->sdone,
                                       total - ps->sdone, &ps->sdone, &full));
      if (ps->shdr_done + ps->sdone == before) return COLL_SUCCESS;
      *moved = 1;
      if (full) return COLL_SUCCESS; /* socket buffer full */
    }
    if (ps->ssc) { /* src stays untouched until the peer has read it */
      int acked = 0;
      COLL_CHECK(tp->sc_acked(ps->link, &acked));
      if (!acked) return COLL_SUCCESS;
      *moved = 1;
    }
    ps->shdr_ready = 0;
    ps->sh++;
    complete(x, id);
  }
  return COLL_SUCCESS;
}

/* The header of the head receive, when it has not fully arrived: reads only
 * the header, so that the payload can be peeked where it lies. */
static coll_result_t recv_header(exec_t *x, peer_state_t *ps, coll_step_t *st, int *moved) {
  struct iovec iov = {ps->rhdr + ps->rhdr_got, COLL_WIRE_HDR_BYTES - ps->rhdr_got};
  size_t n = 0;
  COLL_CHECK(coll_link_recv(ps->link, &iov, 1, &n));
  if (n) *moved = 1;
  ps->rhdr_got += n;
  if (ps->rhdr_got == COLL_WIRE_HDR_BYTES && ps->rhdr[5] == COLL_KIND_P2P) {
    COLL_CHECK(coll_p2p_divert(x->s->comm, ps->link, ps->rhdr, NULL, 0, x->deadline));
    ps->rhdr_got = 0; /* the caller reads the next header */
    return COLL_SUCCESS;
  }
  if (ps->rhdr_got == COLL_WIRE_HDR_BYTES) {
    coll_wire_hdr_t e = coll_sched_step_hdr(x->s, st);
    const coll_transport_t *tp = ps->link->tp;
    /* A descriptor is fine where this side said it can read the peer (else
     * the check names the mismatch); every other field is checked as usual. */
    if (ps->rhdr[20] == COLL_WIRE_SC_DESC && tp->sc_can_read && tp->sc_can_read(ps->link)) {
      e.flags = COLL_WIRE_SC_DESC;
      ps->rsc = 1;
      ps->rdesc_got = 0;
    }
    COLL_CHECK(coll_wire_check(x->s->comm, ps->peer, ps->rhdr, &e));
    ps->rhdr_checked = 1;
  }
  return COLL_SUCCESS;
}

/* Receive+reduce straight out of the transport's memory (shm). Returns with
 * *done set when the step's payload is complete. */
static coll_result_t reduce_in_place(exec_t *x, peer_state_t *ps, coll_step_t *st, int *moved,
                                     int *done) {
  coll_sched_t *s = x->s;
  coll_link_t *link = ps->link;
  *done = 0;
  while (ps->rdone < st->nbytes) {
    const void *p;
    size_t avail;
    COLL_CHECK(coll_link_peek(link, &p, &avail));
    size_t left = st->nbytes - ps->rdone;
    size_t take = avail < left ? avail : left;
    take -= take % s->elem;
    if (take == 0) {
      if (avail == 0) return COLL_SUCCESS;
      /* An element split by the ring's wrap: copy just that one. */
      struct iovec iov = {link->stage, s->elem};
      size_t n = 0;
      COLL_CHECK(coll_link_recv(link, &iov, 1, &n));
      if (n < s->elem) {
        /* Partial: the bytes are consumed, finish through the copy path. */
        ps->fill = n;
        return COLL_SUCCESS;
      }
      s->reduce((char *)st->dst + ps->rdone, (const char *)st->src + ps->rdone, link->stage, 1, NULL);
      ps->rdone += s->elem;
      *moved = 1;
      continue;
    }
    s->reduce((char *)st->dst + ps->rdone, (const char *)st->src + ps->rdone, p, take / s->elem, NULL);
    coll_link_consume(link, take);
    ps->rdone += take;
    *moved = 1;
  }
  *done = 1;
  return COLL_SUCCESS;
}

static void recv_finish(exec_t *x, peer_state_t *ps, int id) {
  ps->rhdr_got = ps->rdone = ps->fill = 0;
  ps->rhdr_checked = 0;
  ps->rsc = 0;
  ps->rh++;
  complete(x, id);
}

static coll_result_t progress_recv(exec_t *x, peer_state_t *ps, int *moved) {
  coll_sched_t *s = x->s;
  coll_comm_t *comm = s->comm;
  if (coll_comm_root(comm)->p2p && ps->rhdr_got == 0 && ps->rdone == 0 && ps->fill == 0) {
    /* Between two of our messages on this link: one half received is read
     * to its end first (and others that came, while a send is stuck). */
    int clear = 1;
    COLL_CHECK(coll_p2p_drain(comm, ps->link, 0, moved, &clear));
    if (!clear) return COLL_SUCCESS;
  }
  while (ps->rh < ps->nrq) {
    int id = ps->rq[ps->rh];
    coll_step_t *st = &s->steps[id];
    if (st->npred > 0) return COLL_SUCCESS;
    int reducing = st->kind == COLL_STEP_RECV_REDUCE;
    if (ps->link->tp->sc_read && ps->fill == 0) {
      /* The header alone first: it may announce a single-copy message. */
      if (ps->rhdr_got < COLL_WIRE_HDR_BYTES) {
        COLL_CHECK(recv_header(x, ps, st, moved));
        if (ps->rhdr_got < COLL_WIRE_HDR_BYTES) return COLL_SUCCESS;
      }
      if (ps->rsc) {
        int done = 0;
        COLL_CHECK(coll_sched_sc_recv(s, ps->link, st, ps->rdesc, &ps->rdesc_got, moved, &done));
        if (!done) return COLL_SUCCESS;
        recv_finish(x, ps, id);
        continue;
      }
    }
    if (reducing && ps->link->tp->recv_peek && ps->fill == 0) {
      if (ps->rhdr_got < COLL_WIRE_HDR_BYTES) {
        COLL_CHECK(recv_header(x, ps, st, moved));
        if (ps->rhdr_got < COLL_WIRE_HDR_BYTES) return COLL_SUCCESS;
      }
      int done = 0;
      COLL_CHECK(reduce_in_place(x, ps, st, moved, &done));
      if (done) { recv_finish(x, ps, id); continue; }
      if (ps->fill == 0) return COLL_SUCCESS; /* nothing more has arrived */
    }
    struct iovec iov[2];
    int k = 0;
    if (ps->rhdr_got < COLL_WIRE_HDR_BYTES) {
      iov[k].iov_base = ps->rhdr + ps->rhdr_got;
      iov[k++].iov_len = COLL_WIRE_HDR_BYTES - ps->rhdr_got;
    }
    size_t left = st->nbytes - ps->rdone - ps->fill;
    if (left > 0) {
      if (reducing) {
        size_t room = COLL_STAGE_BYTES - ps->fill;
        iov[k].iov_base = ps->link->stage + ps->fill;
        iov[k++].iov_len = left < room ? left : room;
      } else {
        iov[k].iov_base = (char *)st->dst + ps->rdone;
        iov[k++].iov_len = left;
      }
    }
    size_t want = 0, n = 0;
    for (int i = 0; i < k; i++) want += iov[i].iov_len;
    if (want > 0) COLL_CHECK(coll_link_recv(ps->link, iov, k, &n));
    if (n == 0 && want > 0) return COLL_SUCCESS;
    if (n) *moved = 1;
    size_t h = COLL_WIRE_HDR_BYTES - ps->rhdr_got;
    if (n < h) h = n;
    ps->rhdr_got += h;
    if (ps->rhdr_got == COLL_WIRE_HDR_BYTES && !ps->rhdr_checked && ps->rhdr[5] == COLL_KIND_P2P) {
      /* A point-to-point message sent before this collective's: the bytes
       * read after its header (into this step's destination, which they
       * may scribble on until the step's own bytes arrive) are its payload
       * and what follows it. */
      const void *extra = reducing ? (const void *)(ps->link->stage + ps->fill)
                                   : (const void *)((char *)st->dst + ps->rdone);
      COLL_CHECK(coll_p2p_divert(comm, ps->link, ps->rhdr, extra, n - h, x->deadline));
      ps->rhdr_got = 0;
      return COLL_SUCCESS; /* the next call drains the rest of it first */
    }
    if (ps->rhdr_got == COLL_WIRE_HDR_BYTES && !ps->rhdr_checked) {
      coll_wire_hdr_t e = coll_sched_step_hdr(s, st);
      COLL_CHECK(coll_wire_check(comm, ps->peer, ps->rhdr, &e));
      ps->rhdr_checked = 1;
    }
    if (reducing) {
      ps->fill += n - h;
      /* Reduce every whole element that has arrived; a split element's
       * leading bytes move to the front of the stage. */
      size_t whole = ps->fill - ps->fill % s->elem;
      if (whole) {
        s->reduce((char *)st->dst + ps->rdone, (const char *)st->src + ps->rdone, ps->link->stage,
                  whole / s->elem, NULL);
        ps->rdone += whole;
        ps->fill -= whole;
        if (ps->fill) memmove(ps->link->stage, ps->link->stage + whole, ps->fill);
      }
    } else {
      ps->rdone += n - h;
    }
    if (ps->rhdr_got < COLL_WIRE_HDR_BYTES || ps->rdone < st->nbytes) {
      if (n < want) return COLL_SUCCESS; /* nothing more buffered */
      continue;
    }
    recv_finish(x, ps, id);
  }
  return COLL_SUCCESS;
}

int coll_link_pollfds(const coll_link_t *link, int ev, struct pollfd *pfs) {
  int k = 0;
  if (link->wake_fd >= 0 && ev != POLLRDHUP) {
    /* Woken on its own descriptor; the socket only reports a hang-up. */
    pfs[k].fd = link->wake_fd;
    pfs[k].events = (short)ev;
    pfs[k++].revents = 0;
    ev = POLLIN | POLLRDHUP;
  }
  pfs[k].fd = link->fd;
  pfs[k].events = (short)ev;
  pfs[k++].revents = 0;
  return k;
}

coll_result_t coll_link_polled(coll_link_t *link, const struct pollfd *pfs, int npf, int *hup) {
  for (int j = 0; j < npf; j++) {
    if (!pfs[j].revents || (link->fd != pfs[j].fd && link->wake_fd != pfs[j].fd)) continue;
    if (link->tp->after_poll) COLL_CHECK(link->tp->after_poll(link, pfs[j].fd, pfs[j].revents));
    if (link->fd == pfs[j].fd && (pfs[j].revents & (POLLRDHUP | POLLHUP | POLLERR))) *hup = 1;
  }
  return COLL_SUCCESS;
}

static int head_ready(const coll_sched_t *s, const int *q, int n, int h) {
  return h < n && s->steps[q[h]].npred == 0;
}

static coll_result_t timeout_error(coll_sched_t *s, peer_state_t *ps, int nps, double deadline,
                                   double start) {
  coll_comm_t *comm = s->comm;
  char who[256] = "";
  size_t used = 0;
  for (int i = 0; i < nps && used < sizeof who - 16; i++) {
    if (ps[i].sh < ps[i].nsq || ps[i].rh < ps[i].nrq)
      used += (size_t)snprintf(who + used, sizeof who - used, "%s%d", used ? ", " : "", ps[i].peer);
  }
  (void)deadline;
  return coll_error(comm, COLL_TIMEOUT,
                    "rank %d: %s #%u timed out after %.1f s waiting for rank %s (stopped, stuck or "
                    "not calling the same collective)",
                    comm->rank, coll_kind_name(s->hdr.coll), s->hdr.seq, coll_now() - start, who);
}

/* The stall warning (base/stall.c): every peer this rank still waits for
 * in this call, and how far it got: a peer from which nothing of the call has
 * come "has not arrived" (it is not in this collective yet, or stuck before
 * it); one that sent part of it stopped inside; one that only has to read
 * what this rank sends is not reading. */
static void stall_warn(coll_sched_t *s, peer_state_t *ps, int nps, double quiet, double left) {
  coll_comm_t *comm = s->comm;
  char who[512] = "";
  size_t used = 0;
  int listed = 0, more = 0;
  for (int i = 0; i < nps; i++) {
    peer_state_t *p = &ps[i];
    if (p->sh >= p->nsq && p->rh >= p->nrq) continue;
    if (used > sizeof who - 120) { more++; continue; }
    used += (size_t)snprintf(who + used, sizeof who - used, "%s", listed++ ? "; " : "");
    used += coll_stall_name_peer(comm, p->peer, who + used, sizeof who - used);
    if (p->rh < p->nrq && p->rh == 0 && p->rhdr_got == 0)
      used += (size_t)snprintf(who + used, sizeof who - used, " (has not arrived: nothing of "
                               "this call from it yet)");
    else if (p->rh < p->nrq)
      used += (size_t)snprintf(who + used, sizeof who - used, " (stopped inside it: %d of %d "
                               "messages from it)", p->rh, p->nrq);
    else
      used += (size_t)snprintf(who + used, sizeof who - used, " (not reading: %d of %d messages "
                               "to it sent)", p->sh, p->nsq);
  }
  if (more) snprintf(who + used, sizeof who - used, "; %d more", more);
  COLL_WARN("rank %d: %s #%u has moved nothing for %.3g s, waiting for %s; it fails in %.3g s "
            "(its timeout) unless they come (COLLECTIVES_STALL_WARN)",
            comm->rank, coll_kind_name(s->hdr.coll), s->hdr.seq, quiet, who, left);
}

/* A waiting rank checks for comm->spin, then on for up to COLL_SPIN_IDLE_FACTOR
 * times as long while the host's cores are not wanted elsewhere: when its spin
 * runs out, no more threads are runnable on the host than it has CPUs
 * (/proc/loadavg), and from then on the scheduler has not taken its core for
 * another thread (an involuntary context switch); else it sleeps in poll() as
 * before. A rank that sleeps pays a wake-up when the data comes: on a 2-vCPU VM
 * about 200 us, more than a 256 KiB call takes, and back-to-back calls at
 * 256 KiB-1 MiB over TCP slept about once a call (a rank that slept woke late,
 * so its peer out-waited its spin in the next call, and so on), where OpenMPI,
 * which never sleeps, did not. Spinning on longer while other processes queue
 * for the cores took their time and the peer's: 1 MiB calls 4x slower at a
 * load of 12 on 2 CPUs, hence the load check. */
#define COLL_SPIN_IDLE_FACTOR 10

/* Whether no more threads are runnable on the host than it has CPUs online
 * (the 4th field of /proc/loadavg, "runnable/total", counts this one). */
static int cores_idle(void) {
  static long ncpu = 0;
  if (ncpu == 0) ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[128];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  double a, b, c;
  long running = 0;
  if (sscanf(buf, "%lf %lf %lf %ld/", &a, &b, &c, &running) != 4) return 0;
  return running > 0 && running <= ncpu;
}

/* Involuntary context switches of the calling thread so far (-1: unknown). */
static long preemptions(void) {
#ifdef RUSAGE_THREAD
  struct rusage ru;
  if (getrusage(RUSAGE_THREAD, &ru) == 0) return ru.ru_nivcsw;
#endif
  return -1;
}

/* Whether a rank idle since idle_since (now: coll_now()) keeps checking rather
 * than sleeping; *preempted0 holds the thread's preemptions when the wait
 * outlasted comm->spin (-2: not yet; read then, so a short wait costs no
 * system call; -1: sleep, the cores are busy or the count is unknown). */
static int keep_spinning(const coll_comm_t *comm, double idle_since, double now, long *preempted0) {
  double idle = now - idle_since;
  if (idle < comm->spin) return 1;
  if (comm->oversubscribed || idle >= comm->spin * COLL_SPIN_IDLE_FACTOR) return 0;
  if (*preempted0 == -2) { /* the spin just ran out: look at the host once */
    *preempted0 = cores_idle() ? preemptions() : -1;
    return *preempted0 >= 0;
  }
  return *preempted0 >= 0 && preemptions() == *preempted0;
}

coll_result_t coll_sched_run(coll_sched_t *s, double deadline) {
  coll_comm_t *comm = s->comm;
  coll_result_t res = COLL_SUCCESS;
  if (s->oom) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory building a schedule", comm->rank);
  int n = s->nsteps;
  if (n == 0) return COLL_SUCCESS;
  double start = coll_now();

  /* One block for the per-peer state, the poll set (two descriptors per
   * link at most: socket and doorbell), the peer slots, the edge table and
   * the queues. */
  size_t npeers = (size_t)(comm->size < n ? comm->size : n) + 1;
  size_t ps_bytes = npeers * sizeof(peer_state_t), pfs_bytes = 2 * npeers * sizeof(struct pollfd);
  size_t scratch_bytes = ps_bytes + pfs_bytes +
                         ((size_t)comm->size + (size_t)(3 * n + s->nedges + 1)) * sizeof(int);
  size_t scratch_cap = 0;
  char *scratch = scratch_take(comm, scratch_bytes, &scratch_cap);
  if (!scratch) {
    return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory running a schedule", comm->rank);
  }
  peer_state_t *ps = (peer_state_t *)scratch;
  memset(ps, 0, ps_bytes);
  struct pollfd *pfs = (struct pollfd *)(scratch + ps_bytes);
  int *peer_slot = (int *)(scratch + ps_bytes + pfs_bytes);
  int *ints = peer_slot + comm->size;
  exec_t x = {s, ints, NULL, ints + s->nedges, 0, n, deadline};
  int *queues = ints + s->nedges + n;  /* n slots for send/recv queues, n for succ counting */
  int *cnt = queues + n;

  coll_sched_link_edges(s, x.succ, cnt);
  for (int i = 0; i < n; i++) {
    coll_step_t *st = &s->steps[i];
    if (st->kind != COLL_STEP_SEND) continue;
    for (int e = st->succ_begin; e < st->succ_end && !st->no_sc; e++) {
      const coll_step_t *nx = &s->steps[x.succ[e]];
      st->no_sc = nx->peer == st->peer && (nx->kind == COLL_STEP_RECV || nx->kind == COLL_STEP_RECV_REDUCE);
    }
  }

  /* Per-peer FIFOs, in the order steps were added. */
  int nps = 0;
  for (int i = 0; i < comm->size; i++) peer_slot[i] = -1;
  for (int i = 0; i < n; i++) {
    coll_step_t *st = &s->steps[i];
    if (st->kind == COLL_STEP_COPY) continue;
    if (st->peer < 0 || st->peer >= comm->size || st->peer == comm->rank) {
      res = coll_error(comm, COLL_INTERNAL_ERROR, "rank %d: schedule step to invalid peer %d", comm->rank, st->peer);
      goto out;
    }
    if (peer_slot[st->peer] < 0) { peer_slot[st->peer] = nps; ps[nps].peer = st->peer; nps++; }
    peer_state_t *p = &ps[peer_slot[st->peer]];
    if (st->kind == COLL_STEP_SEND) p->nsq++; else p->nrq++;
  }
  int *q = queues;
  for (int i = 0; i < nps; i++) {
    ps[i].sq = q; q += ps[i].nsq;
    ps[i].rq = q; q += ps[i].nrq;
    ps[i].nsq = ps[i].nrq = 0;
  }
  for (int i = 0; i < n; i++) {
    coll_step_t *st = &s->steps[i];
    if (st->kind == COLL_STEP_COPY) continue;
    peer_state_t *p = &ps[peer_slot[st->peer]];
    if (st->kind == COLL_STEP_SEND) p->sq[p->nsq++] = i; else p->rq[p->nrq++] = i;
  }
  /* The ready stack reuses the counting array: at most n entries. */
  x.ready = cnt;
  for (int i = 0; i < n; i++)
    if (s->steps[i].kind == COLL_STEP_COPY && s->steps[i].npred == 0) x.ready[x.nready++] = i;

  /* Connect: higher peers first (connecting never waits on the peer), then
   * accept from lower ones. */
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < nps; i++)
      if ((ps[i].peer > comm->rank) == (pass == 0))
        COLL_CHECK_GOTO(coll_link_get(comm, ps[i].peer, deadline, &ps[i].link), res, out);
  COLL_INFO(COLL_LOG_COLL, "rank %d: %s #%u, %d steps over %d links", comm->rank,
            coll_kind_name(s->hdr.coll), s->hdr.seq, n, nps);

  coll_stall_t stall;
  coll_stall_begin(&stall, start, deadline);
  double idle_since = 0;
  long preempted0 = -2; /* the thread's preemptions when this wait began (keep_spinning) */
  int sockets_idle = 0; /* the last zero-timeout poll found no socket ready */
  while (x.remaining > 0) {
    int moved = 0;
    while (x.nready > 0) {
      int id = x.ready[--x.nready];
      coll_step_t *st = &s->steps[id];
      if (st->nbytes && st->dst != st->src) memcpy(st->dst, st->src, st->nbytes);
      complete(&x, id);
      moved = 1;
    }
    for (int i = 0; i < nps; i++) {
      /* A spinning pass right after poll() said no socket is ready skips
       * the sockets: a send or read there would only return EAGAIN, and
       * halving the system calls per spin halves the time to notice data.
       * Heads made ready by this pass's other progress set `moved`, so the
       * next pass tries every link again. */
      if (sockets_idle && !ps[i].link->tp->recv_peek) continue;
      COLL_CHECK_GOTO(progress_send(&x, &ps[i], &moved), res, out);
      COLL_CHECK_GOTO(progress_recv(&x, &ps[i], &moved), res, out);
    }
    sockets_idle = 0;
    if (moved || x.remaining == 0) {
      idle_since = 0;
      preempted0 = -2;
      stall.quiet_since = 0;
      continue;
    }
    /* A short bounded spin before sleeping, longer while the core is not
     * contended (keep_spinning): a wake-up from poll() costs more than a
     * small message takes to arrive. The spin polls readiness with a
     * zero timeout rather than retrying reads: a reader hammering a socket
     * with readv() holds its lock against the kernel delivering into it,
     * which stalled large loopback transfers by tens of milliseconds. */
    int spinning = 0;
    if (comm->spin > 0) {
      double now = coll_now();
      if (idle_since == 0) idle_since = now;
      spinning = keep_spinning(comm, idle_since, now, &preempted0);
    }
    if (spinning) {
      /* Links in shared memory are watched by rereading the ring (cheap, and
       * arms no doorbell); only socket links need poll(). */
      int sockets = 0;
      for (int i = 0; i < nps && !sockets; i++)
        sockets = !ps[i].link->tp->recv_peek && (head_ready(s, ps[i].sq, ps[i].nsq, ps[i].sh) ||
                                                 head_ready(s, ps[i].rq, ps[i].nrq, ps[i].rh));
      if (!sockets) {
        if (comm->oversubscribed) sched_yield();
        continue;
      }
    }

    int npf = 0, retry = 0;
    for (int i = 0; i < nps; i++) {
      peer_state_t *p = &ps[i];
      int sending = head_ready(s, p->sq, p->nsq, p->sh);
      int receiving = head_ready(s, p->rq, p->nrq, p->rh);
      if (coll_comm_root(comm)->p2p) { /* a point-to-point message half done on this link moves on */
        int pend = coll_p2p_pending(comm, p->peer);
        sending |= pend & 1;
        receiving |= pend >> 1;
      }
      int ev = 0;
      if (sending || receiving) {
        ev = coll_link_wait_events(p->link, sending, receiving);
        if (ev < 0) { retry = 1; break; } /* the transport can move now */
      } else if (!p->hup && (p->sh < p->nsq || p->rh < p->nrq)) {
        ev = POLLRDHUP; /* watch for a hang-up on a link we still need, once */
      }
      if (ev) npf += coll_link_pollfds(p->link, ev, pfs + npf);
    }
    if (retry) continue;
    if (npf == 0 && x.nready == 0) {
      res = coll_error(comm, COLL_INTERNAL_ERROR, "rank %d: %s #%u schedule stalled with %d steps left",
                       comm->rank, coll_kind_name(s->hdr.coll), s->hdr.seq, x.remaining);
      goto out;
    }
    double now = coll_now(), left = deadline - now;
    if (left <= 0) { res = timeout_error(s, ps, nps, deadline, start); goto out; }
    if (coll_stall_due(&stall, now)) stall_warn(s, ps, nps, now - stall.quiet_since, left);
    int ms = spinning ? 0 : left > 2e6 ? 2000000000 : (int)(left * 1000.0) + 1;
    ms = coll_stall_cap_ms(&stall, now, ms);
    int r = poll(pfs, (nfds_t)npf, ms);
    if (r == 0 && spinning) {
      if (comm->oversubscribed) sched_yield();
      sockets_idle = 1;
      continue;
    }
    if (r < 0 && errno != EINTR) {
      res = coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: poll failed: %s", comm->rank, strerror(errno));
      goto out;
    }
    if (r == 0 && coll_now() >= deadline) { res = timeout_error(s, ps, nps, deadline, start); goto out; }
    for (int i = 0; i < nps; i++)
      COLL_CHECK_GOTO(coll_link_polled(ps[i].link, pfs, npf, &ps[i].hup), res, out);
  }
out:
  scratch_give(comm, scratch, scratch_cap);
  return res;
}

/* The segment of host-memory schedules (coll.h says why 1 MiB when oversubscribed
 * over TCP). */
size_t coll_comm_segment_bytes(coll_comm_t *comm) {
  if (comm->segment_bytes) return comm->segment_bytes;
  /* Only facts every rank sees alike: a segment size of the rank's own host
   * would cut one message differently on a busy host and an idle one. */
  return comm->job_oversubscribed && !coll_links_all_shm(comm) ? (size_t)1 << 20
                                                               : (size_t)512 << 10;
}
