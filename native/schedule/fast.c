/*
 * schedule/fast.c -- small allreduce over shared memory without a schedule.
 *
 * An 8-byte allreduce is all overhead: building a butterfly schedule, its
 * edge table and per-peer queues, and the executor's generic passes cost
 * more than moving the bytes. When the call would run butterfly's full
 * exchange anyway (a power-of-two rank count, at most COLL_FAST_MAX_BYTES,
 * host memory) and every partner's link is already shared memory with no
 * point-to-point traffic in the communicator, this runs the same exchange
 * directly: per level, header + vector into the partner's ring, then the
 * partner's header checked and its vector reduced where it lies in the ring
 * (local op incoming, as the schedule does). The bytes on the wire are
 * exactly the schedule's (same header, sequence number, algorithm id), so a
 * rank on this path and one on the general path still agree, and every
 * mismatch the general path names is named here by the same check.
 *
 * Waiting: as the executor, keep checking the ring for comm->spin (yielding
 * the core when the host is oversubscribed), then sleep in poll() on the
 * link's doorbell and socket until the call's deadline.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>

#include "base/comm_state.h"
#include "base/log.h"
#include "base/status.h"
#include "reduce/reduce.h"
#include "schedule/schedule.h"

/* allreduce_butterfly.c's COLL_BFLY_FULL_BYTES: up to this size butterfly
 * exchanges whole vectors, one message per level, which is what runs here. */
#define COLL_FAST_MAX_BYTES (32 * 1024)
#define COLL_FAST_MAX_LEVELS 16

typedef struct {
  coll_comm_t *comm;
  coll_link_t *link;
  int peer;
  uint32_t seq;
  double start, deadline, idle_since;
  coll_stall_t stall; /* quiet_since follows idle_since */
} fast_t;

/* Nothing moved: keep checking for comm->spin, then sleep until the link
 * can move or the deadline passes. */
static coll_result_t fast_wait(fast_t *f, int sending) {
  coll_comm_t *comm = f->comm;
  double now = coll_now();
  if (f->idle_since == 0) f->idle_since = now;
  if (now - f->idle_since < comm->spin) {
    if (comm->oversubscribed) sched_yield();
    return COLL_SUCCESS;
  }
  if (now >= f->deadline)
    return coll_error(comm, COLL_TIMEOUT,
                      "rank %d: allreduce #%u timed out after %.1f s waiting for rank %d (stopped, "
                      "stuck or not calling the same collective)",
                      comm->rank, f->seq, now - f->start, f->peer);
  int ev = coll_link_wait_events(f->link, sending, !sending);
  if (ev < 0) return COLL_SUCCESS;
  struct pollfd pfs[2];
  int npf = coll_link_pollfds(f->link, ev, pfs);
  double left = f->deadline - now;
  if (f->stall.quiet_since != f->idle_since) { /* moved since: the stall clock restarts */
    f->stall.quiet_since = 0;
    coll_stall_due(&f->stall, f->idle_since);
  }
  if (coll_stall_due(&f->stall, now)) {
    char who[160];
    coll_stall_name_peer(comm, f->peer, who, sizeof who);
    COLL_WARN("rank %d: allreduce #%u has moved nothing for %.3g s, waiting for %s (%s); it "
              "fails in %.3g s (its timeout) unless it comes (COLLECTIVES_STALL_WARN)",
              comm->rank, f->seq, now - f->idle_since, who,
              sending ? "not reading what this rank sends" : "nothing from it yet at this level",
              left);
  }
  int ms = coll_stall_cap_ms(&f->stall, now, left > 2e6 ? 2000000000 : (int)(left * 1000.0) + 1);
  if (poll(pfs, (nfds_t)npf, ms) < 0 && errno != EINTR)
    return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: poll failed: %s", comm->rank, strerror(errno));
  int hup = 0;
  return coll_link_polled(f->link, pfs, npf, &hup);
}

static coll_result_t fast_send(fast_t *f, const uint8_t *hdr, const char *src, size_t n) {
  size_t hdone = 0, sent = 0;
  f->idle_since = 0;
  for (;;) {
    int full = 0;
    COLL_CHECK(coll_link_send_framed(f->link, hdr, &hdone, src + sent, n - sent, &sent, &full));
    if (hdone == COLL_WIRE_HDR_BYTES && sent == n) return COLL_SUCCESS;
    COLL_CHECK(fast_wait(f, 1));
  }
}

/* The partner's header, checked against `expect` (encoded: `mine`, which a
 * partner in the same call sends byte for byte, so one memcmp clears it and
 * only a mismatch goes through the field-by-field check that names it);
 * point-to-point messages that come first are set aside as the executor does. */
static coll_result_t fast_recv_header(fast_t *f, const coll_wire_hdr_t *expect, const uint8_t *mine) {
  uint8_t hdr[COLL_WIRE_HDR_BYTES];
  size_t got = 0;
  f->idle_since = 0;
  while (got < COLL_WIRE_HDR_BYTES) {
    struct iovec iov = {hdr + got, COLL_WIRE_HDR_BYTES - got};
    size_t m = 0;
    COLL_CHECK(coll_link_recv(f->link, &iov, 1, &m));
    got += m;
    if (got == COLL_WIRE_HDR_BYTES && hdr[5] == COLL_KIND_P2P) {
      COLL_CHECK(coll_p2p_divert(f->comm, f->link, hdr, NULL, 0, f->deadline));
      got = 0;
      continue;
    }
    if (m == 0) COLL_CHECK(fast_wait(f, 0));
  }
  if (memcmp(hdr, mine, COLL_WIRE_HDR_BYTES) == 0) return COLL_SUCCESS;
  return coll_wire_check(f->comm, f->peer, hdr, expect);
}

/* out = local op (the partner's n bytes), read where they lie in the ring
 * when they are contiguous there, else gathered in the link's stage. */
static coll_result_t fast_recv_reduce(fast_t *f, coll_reduce_fn reduce, char *out, const char *local,
                                      size_t n, size_t count) {
  coll_link_t *link = f->link;
  size_t got = 0;
  f->idle_since = 0;
  for (;;) {
    const void *p = NULL;
    size_t avail = 0;
    if (got == 0) {
      COLL_CHECK(coll_link_peek(link, &p, &avail));
      if (avail >= n) {
        reduce(out, local, p, count, NULL);
        coll_link_consume(link, n);
        return COLL_SUCCESS;
      }
    }
    struct iovec iov = {link->stage + got, n - got};
    size_t m = 0;
    COLL_CHECK(coll_link_recv(link, &iov, 1, &m));
    got += m;
    if (got == n) {
      reduce(out, local, link->stage, count, NULL);
      return COLL_SUCCESS;
    }
    if (m == 0) COLL_CHECK(fast_wait(f, 0));
  }
}

coll_result_t coll_fast_allreduce(coll_comm_t *comm, const coll_args_t *a, coll_algo_t algo,
                                  int *handled) {
  *handled = 0;
  int n = comm->size, r = comm->rank;
  size_t elem = coll_dtype_size(a->dtype), nbytes = a->count * elem;
  if (algo != COLL_ALGO_BUTTERFLY || n < 2 || (n & (n - 1)) != 0 || nbytes == 0 ||
      nbytes > COLL_FAST_MAX_BYTES || a->memory == COLL_MEMORY_CUDA || coll_comm_root(comm)->p2p)
    return COLL_SUCCESS;
  coll_link_t *links[COLL_FAST_MAX_LEVELS];
  int levels = 0;
  for (int mask = 1; mask < n; mask <<= 1) {
    coll_link_t *l = comm->peers[r ^ mask].link;
    if (levels == COLL_FAST_MAX_LEVELS || !l || l->tp != &coll_transport_shm || l->fd < 0)
      return COLL_SUCCESS; /* the general path connects it first */
    links[levels++] = l;
  }
  *handled = 1;
  /* What coll_sched_init and butterfly's full exchange put in each header. */
  coll_wire_hdr_t h;
  memset(&h, 0, sizeof h);
  h.coll = COLL_KIND_ALLREDUCE;
  h.redop = (uint8_t)a->op;
  h.dtype = (uint8_t)a->dtype;
  h.seq = comm->seq++;
  h.ctx = comm->ctx;
  h.aux = (uint32_t)algo;
  h.count = a->count;
  h.nbytes = (uint32_t)nbytes;
  uint8_t hdr[COLL_WIRE_HDR_BYTES];
  coll_wire_encode(hdr, &h);
  COLL_INFO(COLL_LOG_TUNE, "allreduce #%u %zu bytes on %d ranks: butterfly, fast path", h.seq,
            nbytes, n);
  coll_reduce_fn reduce = coll_reduce_kernel(a->dtype, a->op);
  fast_t f = {comm, NULL, -1, h.seq, coll_now(), 0, 0, {0, 0, 0}};
  f.deadline = coll_comm_deadline(comm, a->timeout);
  coll_stall_begin(&f.stall, f.start, f.deadline);
  const char *cur = a->sendbuf ? (const char *)a->sendbuf : (const char *)a->recvbuf;
  char *out = a->recvbuf;
  for (int k = 0, mask = 1; k < levels; k++, mask <<= 1) {
    f.link = links[k];
    f.peer = r ^ mask;
    /* My whole vector leaves before I reduce into out, which it may be. */
    COLL_CHECK(fast_send(&f, hdr, cur, nbytes));
    COLL_CHECK(fast_recv_header(&f, &h, hdr));
    COLL_CHECK(fast_recv_reduce(&f, reduce, out, cur, nbytes, a->count));
    cur = out;
  }
  return COLL_SUCCESS;
}
