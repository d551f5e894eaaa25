/*
 * transport/stripe.c -- a TCP link of several connections (COLLECTIVES_NSOCKS).
 *
 * Real NICs often need several flows to reach line rate (one flow is bound
 * to one queue, one core's softirq work and one congestion window; NCCL
 * opens 2 threads x 8 sockets per peer on AWS). A link with k > 1 sockets
 * is still one ordered byte stream to the executor, whose bytes are dealt
 * to the sockets in fixed units, round robin, by their position in the
 * stream:
 *
 *   stream bytes [u*UNIT, (u+1)*UNIT) go on socket u mod k
 *
 * Both ends count the bytes they have sent and received, so the receiver
 * knows which socket carries which bytes without any header of its own:
 * a segment larger than k units keeps all k flows busy, and messages stay
 * framed by the wire header exactly as on one socket. The sender writes
 * the current unit to its socket and goes on to the next socket as long as
 * each write is taken whole; the receiver reads in stream order. Parallelism
 * across the flows comes from their kernel buffers (COLLECTIVES_SOCKET_BUFFER
 * each): while the sender fills socket i, sockets i+1.. drain on their own.
 * No thread is added: progress is the executor's own poll loop, which
 * sleeps on the socket the next unit goes to (and, when it also receives,
 * the socket the next incoming unit comes from), named by wait_events in
 * link->wake_fd and link->fd (any of the sockets reports the peer's death).
 *
 * The sockets are opened like one (transport/select.c): each with its own
 * authenticated opening whose hello names its index and k (wire.h), so the
 * accepting rank knows which slot each fills and ranks that disagree on k
 * fail naming each other. A link whose first connection offers shared
 * memory keeps that one socket, as its doorbell, and also when the peer
 * declines the offer (both ends know what was offered and answered): same-host
 * peers gain nothing from several loopback flows.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/comm_state.h"
#include "base/param.h"
#include "base/status.h"
#include "transport/crypt.h"
#include "transport/transport.h"

/* iovec pieces one sendmsg/readv takes at most; a caller's longer list is
 * moved in several calls (fewer bytes per call is always allowed). */
#define STRIPE_IOV 16

typedef struct {
  int k;
  int fds[COLL_MAX_NSOCKS];
  uint64_t spos, rpos; /* bytes of the link's stream sent and received so far */
} stripe_t;

int coll_tcp_nsocks(void) {
  long long k = coll_param_int(COLL_PARAM_NSOCKS);
  /* collectives.config checks the value before any rank starts; a C user
   * gets the nearest allowed one. */
  return k < 1 ? 1 : k > COLL_MAX_NSOCKS ? COLL_MAX_NSOCKS : (int)k;
}

coll_result_t coll_stripe_new(coll_link_t *link, int k) {
  stripe_t *s = calloc(1, sizeof *s);
  if (!s)
    return coll_error(link->comm, COLL_SYSTEM_ERROR, "rank %d: out of memory for a link",
                      link->comm->rank);
  s->k = k;
  for (int i = 0; i < COLL_MAX_NSOCKS; i++) s->fds[i] = -1;
  link->tp = &coll_transport_stripe;
  link->priv = s;
  link->fd = -1;
  link->wake_fd = -1;
  return COLL_SUCCESS;
}

int coll_stripe_fill(coll_link_t *link, int i, int fd) {
  stripe_t *s = link->priv;
  if (i < 0 || i >= s->k || s->fds[i] >= 0) return 0;
  s->fds[i] = fd;
  for (int j = 0; j < s->k; j++)
    if (s->fds[j] < 0) return 1;
  link->fd = s->fds[0];
  return 2;
}

int coll_stripe_sockets(const coll_link_t *link) {
  return link->tp == &coll_transport_stripe ? ((const stripe_t *)link->priv)->k : 1;
}

static coll_result_t lost(coll_link_t *link, int sock, const char *what, int err) {
  coll_comm_t *comm = link->comm;
  if (err == 0)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: rank %d closed the connection (it exited or failed)", comm->rank,
                      link->peer);
  /* Worded as on one socket ("connection to rank"), which collectives/rendezvous/world.py
   * knows for an echo of another rank's failure. */
  return coll_error(comm, COLL_REMOTE_ERROR,
                    "rank %d: connection to rank %d lost while %s (socket %d of %d): %s",
                    comm->rank, link->peer, what, sock, ((stripe_t *)link->priv)->k, strerror(err));
}

/* The next piece of iov (from entry *i, byte *off) that stays inside the
 * current unit: at most `room` bytes into sub; returns its entry count. */
static int piece(const struct iovec *iov, int iovcnt, int i, size_t off, size_t room,
                 struct iovec *sub, size_t *want) {
  int m = 0;
  *want = 0;
  for (int j = i; j < iovcnt && m < STRIPE_IOV && *want < room; j++) {
    size_t o = j == i ? off : 0;
    size_t len = iov[j].iov_len - o;
    if (len == 0) continue;
    if (len > room - *want) len = room - *want;
    sub[m].iov_base = (char *)iov[j].iov_base + o;
    sub[m++].iov_len = len;
    *want += len;
  }
  return m;
}

static void advance(const struct iovec *iov, int iovcnt, int *i, size_t *off, size_t n) {
  while (*i < iovcnt && n > 0) {
    size_t left = iov[*i].iov_len - *off;
    if (n < left) { *off += n; return; }
    n -= left;
    (*i)++;
    *off = 0;
  }
  while (*i < iovcnt && iov[*i].iov_len == *off) { (*i)++; *off = 0; }
}

static coll_result_t stripe_send(coll_link_t *link, const struct iovec *iov, int iovcnt, size_t *n) {
  stripe_t *s = link->priv;
  struct iovec sub[STRIPE_IOV];
  int i = 0;
  size_t off = 0, moved = 0, want;
  advance(iov, iovcnt, &i, &off, 0);
  while (i < iovcnt) {
    int m = piece(iov, iovcnt, i, off, COLL_STRIPE_UNIT - s->spos % COLL_STRIPE_UNIT, sub, &want);
    int sock = (int)((s->spos / COLL_STRIPE_UNIT) % (uint64_t)s->k);
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = sub;
    msg.msg_iovlen = (size_t)m;
    ssize_t w;
    if (link->crypt) /* each connection seals its own records (transport/crypt.c) */
      COLL_CHECK(coll_crypt_send(link->comm, link->crypt[sock], s->fds[sock], sub, m, &w));
    else
      do { w = sendmsg(s->fds[sock], &msg, MSG_NOSIGNAL | MSG_DONTWAIT); } while (w < 0 && errno == EINTR);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      *n = moved;
      return lost(link, sock, "sending", errno);
    }
    s->spos += (uint64_t)w;
    moved += (size_t)w;
    advance(iov, iovcnt, &i, &off, (size_t)w);
    if ((size_t)w < want) break; /* this socket is full: the next unit waits for it */
  }
  *n = moved;
  return COLL_SUCCESS;
}

static coll_result_t stripe_recv(coll_link_t *link, const struct iovec *iov, int iovcnt, size_t *n) {
  stripe_t *s = link->priv;
  struct iovec sub[STRIPE_IOV];
  int i = 0;
  size_t off = 0, moved = 0, want;
  advance(iov, iovcnt, &i, &off, 0);
  while (i < iovcnt) {
    int m = piece(iov, iovcnt, i, off, COLL_STRIPE_UNIT - s->rpos % COLL_STRIPE_UNIT, sub, &want);
    int sock = (int)((s->rpos / COLL_STRIPE_UNIT) % (uint64_t)s->k);
    ssize_t r;
    if (link->crypt)
      COLL_CHECK(coll_crypt_recv(link->comm, link->crypt[sock], s->fds[sock], sub, m, &r));
    else
      do { r = readv(s->fds[sock], sub, m); } while (r < 0 && errno == EINTR);
    if (r <= 0) {
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      *n = moved;
      return lost(link, sock, "receiving", r == 0 ? 0 : errno);
    }
    s->rpos += (uint64_t)r;
    moved += (size_t)r;
    advance(iov, iovcnt, &i, &off, (size_t)r);
    if ((size_t)r < want) break; /* the rest of this unit has not arrived */
  }
  *n = moved;
  return COLL_SUCCESS;
}

static void stripe_close(coll_link_t *link) {
  stripe_t *s = link->priv;
  if (s) {
    for (int i = 0; i < s->k; i++)
      if (s->fds[i] >= 0) close(s->fds[i]);
    free(s);
  }
  link->priv = NULL;
  link->fd = -1;
  link->wake_fd = -1;
  coll_crypt_drop(link);
}

/* Names the sockets to sleep on (see the top): link->fd is the one the next
 * incoming unit comes from (else the outgoing one), link->wake_fd the
 * outgoing one when the two differ and both directions are wanted. The
 * executor calls coll_link_pollfds right after this, so they cannot change
 * in between. */
static int stripe_wait_events(coll_link_t *link, int sending, int receiving) {
  stripe_t *s = link->priv;
  int out = s->fds[(s->spos / COLL_STRIPE_UNIT) % (uint64_t)s->k];
  int isock = (int)((s->rpos / COLL_STRIPE_UNIT) % (uint64_t)s->k), in = s->fds[isock];
  link->wake_fd = -1;
  if (receiving && link->crypt && coll_crypt_readable(link->crypt[isock])) return -1;
  if (sending && receiving && out != in) {
    link->fd = in;
    link->wake_fd = out;
    return POLLOUT; /* on wake_fd; link->fd is watched for POLLIN */
  }
  link->fd = receiving ? in : out;
  return (sending ? POLLOUT : 0) | (receiving ? POLLIN : 0);
}

const coll_transport_t coll_transport_stripe = {
    .name = "tcp",
    .can_connect = NULL, /* chosen by the opening, never offered on its own */
    .send = stripe_send,
    .recv = stripe_recv,
    .close = stripe_close,
    .wait_events = stripe_wait_events,
};
