/*
 * transport/tcp.c -- links over TCP sockets, for peers on any host.
 *
 * Connection rule: the lower rank connects to the higher rank's listener and
 * opens with a hello (wire.h); the higher rank accepts and reads hellos until
 * the one from the peer it wants arrives, keeping others for later. A
 * connect completes in the kernel's backlog without the peer's help, so the
 * order in which ranks establish links can never deadlock (the connecting
 * side then waits for the accepting side's challenge and answer, which come
 * as soon as the peer serves its listener, as the answer always did).
 * Anything on the listener that is not a hello for this communicator whose
 * MAC proves the job's link key over our fresh challenge, or an abort notice
 * with a valid MAC, is dropped with a warning before it reaches a link:
 * garbage on the port costs a file descriptor for a moment and a fixed
 * buffer, never a crash, and nothing it says sizes an allocation.
 *
 * Sockets are non-blocking with TCP_NODELAY (every message is a header plus
 * payload written in one sendmsg, so Nagle would only add latency) and large
 * buffers (COLLECTIVES_SOCKET_BUFFER) so that a pipelined ring keeps several
 * segments in flight; on a host with more ranks than cores, the kernel's
 * autotuned ones (coll_comm_set_oversubscribed in coll.h says why).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/comm_state.h"
#include "base/stall.h"
#include "base/status.h"
#include "transport/crypt.h"
#include "transport/transport.h"
#include "transport/wire.h"

/* Set on each link's socket, not on the listener: "auto" depends on
 * coll_comm_set_oversubscribed, which comes after the listener exists. An
 * accepted socket's window scale is agreed before this runs, but Linux sizes
 * it for the largest buffer the sysctls allow (tcp_rmem[2], rmem_max), so a
 * buffer set afterwards is still advertised whole. */
int coll_tcp_link_buffer(const coll_comm_t *comm) {
  return comm->sockbuf >= 0 ? comm->sockbuf : comm->oversubscribed ? 0 : 4 << 20;
}

static void set_buffers(coll_comm_t *comm, int fd) {
  int bytes = coll_tcp_link_buffer(comm);
  if (bytes > 0) {
    /* Best effort: the kernel caps these at net.core.[rw]mem_max. */
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
  }
}

static void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int ms_left(double deadline) {
  double left = deadline - coll_now();
  if (left <= 0) return 0;
  return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

coll_result_t coll_tcp_listen(coll_comm_t *comm, const char *bind_host) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int rc = getaddrinfo(bind_host && bind_host[0] ? bind_host : NULL, "0", &hints, &res);
  if (rc != 0)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "rank %d: cannot resolve bind address '%s': %s",
                      comm->rank, bind_host, gai_strerror(rc));
  int fd = -1;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 512) == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0)
    return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: cannot listen on '%s': %s", comm->rank,
                      bind_host, strerror(errno));
  /* Every lower rank may dial all its connections before this rank first
   * serves the listener (a rank that reaches its first collective late):
   * 16 ranks x 16 connections filled a fixed table of 256, and the openings
   * it evicted failed their dialers. */
  comm->max_pending = COLL_MAX_PENDING + comm->rank * coll_tcp_nsocks();
  comm->pending = calloc((size_t)comm->max_pending, sizeof *comm->pending);
  comm->pending_pfs = calloc((size_t)comm->max_pending + 2, sizeof *comm->pending_pfs);
  if (!comm->pending || !comm->pending_pfs) {
    free(comm->pending);
    free(comm->pending_pfs);
    comm->pending = NULL;
    comm->pending_pfs = NULL;
    close(fd);
    return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
  }
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  getsockname(fd, (struct sockaddr *)&ss, &len);
  comm->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
  comm->listen_fd = fd;
  COLL_INFO(COLL_LOG_INIT, "rank %d listening on %s port %d", comm->rank,
            bind_host && bind_host[0] ? bind_host : "*", comm->port);
  return COLL_SUCCESS;
}

void coll_tcp_shutdown(coll_comm_t *comm) {
  for (int i = 0; i < comm->npending; i++) close(comm->pending[i].fd);
  comm->npending = 0;
  free(comm->pending);
  comm->pending = NULL;
  free(comm->pending_pfs);
  comm->pending_pfs = NULL;
  if (comm->listen_fd >= 0) close(comm->listen_fd);
  comm->listen_fd = -1;
}

static int tcp_can_connect(coll_comm_t *comm, int peer) {
  return comm->peers[peer].port > 0;
}

/* Writes all of buf on a non-blocking fd by the deadline (link opening only). */
static coll_result_t write_all(coll_comm_t *comm, int fd, int peer, const void *buf, size_t n,
                               double deadline) {
  size_t done = 0;
  while (done < n) {
    ssize_t w = send(fd, (const char *)buf + done, n - done, MSG_NOSIGNAL);
    if (w > 0) { done += (size_t)w; continue; }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return coll_error(comm, COLL_REMOTE_ERROR, "rank %d: connecting to rank %d failed: %s",
                        comm->rank, peer, strerror(errno));
    struct pollfd p = {fd, POLLOUT, 0};
    if (poll(&p, 1, ms_left(deadline)) == 0)
      return coll_error(comm, COLL_TIMEOUT, "rank %d: timed out connecting to rank %d", comm->rank, peer);
  }
  return COLL_SUCCESS;
}

/* Connects to peer's listener and sends `opening` (the first part of a
 * link's opening, or a whole abort notice). */
coll_result_t coll_tcp_dial(coll_comm_t *comm, int peer, double deadline, const void *opening,
                            size_t n, int *out) {
  coll_peer_t *p = &comm->peers[peer];
  char port[16];
  snprintf(port, sizeof port, "%d", p->port);
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  int rc = getaddrinfo(p->host, port, &hints, &res);
  if (rc != 0)
    return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: cannot resolve rank %d's address '%s': %s",
                      comm->rank, peer, p->host, gai_strerror(rc));
  int fd = -1, err = 0;
  for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) { err = errno; continue; }
    set_buffers(comm, fd);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
      err = errno;
      close(fd);
      fd = -1;
      continue;
    }
    struct pollfd pf = {fd, POLLOUT, 0};
    int n;
    do { n = poll(&pf, 1, ms_left(deadline)); } while (n < 0 && errno == EINTR);
    socklen_t len = sizeof err;
    if (n == 0) err = ETIMEDOUT;
    else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err) { close(fd); fd = -1; }
  }
  freeaddrinfo(res);
  if (fd < 0)
    return coll_error(comm, err == ETIMEDOUT ? COLL_TIMEOUT : COLL_REMOTE_ERROR,
                      "rank %d: cannot connect to rank %d at %s:%d: %s (has rank %d exited?)",
                      comm->rank, peer, p->host, p->port, strerror(err), peer);
  set_nodelay(fd);
  coll_result_t res2 = write_all(comm, fd, peer, opening, n, deadline);
  if (res2 != COLL_SUCCESS) { close(fd); return res2; }
  *out = fd;
  return COLL_SUCCESS;
}

static void drop_pending(coll_comm_t *comm, int i) {
  comm->pending[i] = comm->pending[--comm->npending];
}

_Static_assert(COLL_ABORT_BYTES == COLL_OPENING_BYTES,
               "an abort notice is read as a link's opening");

void coll_tcp_send_aborts(coll_comm_t *comm, const unsigned char *unlinked) {
  uint8_t msg[COLL_ABORT_BYTES];
  double end = coll_now() + 1.0;
  int kept = comm->err_set;
  comm->err_set = 1; /* a peer that cannot be reached changes nothing */
  for (int p = 0; p < comm->size; p++) {
    if (!unlinked[p] || p == comm->rank || comm->peers[p].port <= 0) continue;
    double now = coll_now();
    if (now >= end) break;
    int fd;
    coll_abort_encode(msg, comm->link_key, comm->id, comm->rank, p, comm->err);
    if (coll_tcp_dial(comm, p, now + 0.2 < end ? now + 0.2 : end, msg, sizeof msg, &fd) ==
        COLL_SUCCESS)
      close(fd);
  }
  comm->err_set = kept;
}

static void drop_warn(coll_comm_t *comm, int i, const char *why) {
  COLL_WARN("rank %d: dropped a connection on port %d: %s", comm->rank, comm->port, why);
  close(comm->pending[i].fd);
  drop_pending(comm, i);
}

/* An opening whose first part is in: an abort notice is read on to its end;
 * a hello for this rank from a lower one gets its challenge. Returns 0 when
 * the connection was dropped. */
static int classify(coll_comm_t *comm, int i) {
  typeof(comm->pending[0]) *pd = &comm->pending[i];
  int kind = coll_opening_kind(pd->buf);
  if (kind == 2) return 1;
  int from = kind == 1 ? coll_hello_decode(pd->buf, comm->link_key, comm->id, comm->rank, NULL, NULL) : -1;
  if (from < 0 || from >= comm->rank) {
    /* The hello names the communicator under the job's key (wire.h): one
     * that does not is another job's, or a rank with another secret's. */
    drop_warn(comm, i, kind == 1 ? "its hello is not for this rank of this job under this "
                                   "job's secret (another job, or one that does not prove this "
                                   "job's secret: a different COLLECTIVES_JOB_SECRET?)"
                                 : "it did not open with a valid hello for this job and rank");
    return 0;
  }
  if (coll_random_bytes(pd->challenge, sizeof pd->challenge) != 0) {
    drop_warn(comm, i, "no random bytes for its challenge");
    return 0;
  }
  /* The nonce and a MAC proving the key over it and the hello: the dialer
   * sends its offer only once this checks out (wire.h). Forty-eight bytes on
   * a fresh socket always fit its buffer. */
  unsigned char msg[COLL_CHALLENGE_BYTES];
  memcpy(msg, pd->challenge, COLL_NONCE_BYTES);
  coll_challenge_mac(comm->link_key, pd->challenge, pd->buf, msg + COLL_NONCE_BYTES);
  if (send(pd->fd, msg, sizeof msg, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof msg) {
    close(pd->fd);
    drop_pending(comm, i);
    return 0;
  }
  pd->challenged = 1;
  return 1;
}

/* A whole opening is in: act on it if its MAC proves the link key. */
static void complete(coll_comm_t *comm, int i) {
  typeof(comm->pending[0]) *pd = &comm->pending[i];
  if (!pd->challenged) {
    char reason[COLL_ABORT_REASON_BYTES];
    int aborter = coll_abort_decode(pd->buf, comm->link_key, comm->id, comm->rank, reason);
    if (aborter < 0) {
      drop_warn(comm, i, aborter == -2 ? "an abort notice that does not prove this job's secret"
                                       : "an abort notice not for this job and rank");
      return;
    }
    if (comm->abort_from < 0) { /* that rank's communicator broke; ours is broken with it */
      comm->abort_from = aborter;
      memcpy(comm->abort_reason, reason, sizeof reason);
    }
    close(pd->fd);
    drop_pending(comm, i);
    return;
  }
  uint8_t mac[COLL_MAC_BYTES];
  coll_opening_mac(comm->link_key, pd->challenge, pd->buf, mac);
  if (!coll_ct_equal(mac, pd->buf + COLL_OPENING_BYTES - COLL_MAC_BYTES, COLL_MAC_BYTES)) {
    drop_warn(comm, i, "its hello does not prove this job's secret");
    return;
  }
  int from = coll_hello_decode(pd->buf, comm->link_key, comm->id, comm->rank, NULL, NULL);
  if (comm->peers[from].link) {
    COLL_WARN("rank %d: rank %d connected twice; keeping the first link", comm->rank, from);
    close(pd->fd);
    drop_pending(comm, i);
    return;
  }
  /* Answer at once, whichever peer we are waiting for: a connecting rank
   * waits for this answer, and answering everyone keeps that wait from ever
   * depending on the order in which ranks accept. */
  unsigned char opening[COLL_OPENING_BYTES], challenge[COLL_NONCE_BYTES];
  memcpy(opening, pd->buf, sizeof opening);
  memcpy(challenge, pd->challenge, sizeof challenge);
  int fd = pd->fd;
  drop_pending(comm, i);
  set_nodelay(fd);
  coll_link_adopt(comm, from, fd, opening, challenge);
}

/* Reads what has arrived of pending openings, in two parts (wire.h), into
 * their fixed buffers; acts on complete ones. Returns nothing: bad
 * connections are dropped with a warning. */
static void service_pending(coll_comm_t *comm, int i) {
  typeof(comm->pending[0]) *pd = &comm->pending[i];
  for (;;) {
    int target = pd->got < COLL_HELLO_PART_BYTES ? COLL_HELLO_PART_BYTES : COLL_OPENING_BYTES;
    ssize_t r = recv(pd->fd, pd->buf + pd->got, (size_t)(target - pd->got), MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (r <= 0) {
      close(pd->fd);
      drop_pending(comm, i);
      return;
    }
    pd->got += (int)r;
    if (pd->got < target) continue;
    if (target == COLL_HELLO_PART_BYTES) {
      if (!classify(comm, i)) return;
      continue;
    }
    complete(comm, i);
    return;
  }
}

/* The table is full: drop the oldest connection that has not shown a hello
 * for this rank (a rank's dialer sends it with the connect, so such a one is
 * a stranger, a probe or an abort notice still arriving), else the oldest.
 * drop_pending moves the last entry into the hole, so "oldest" is only
 * roughly the order of arrival; what matters is that the job's own openings,
 * which classify() challenged at once, are the last to go. */
static void evict(coll_comm_t *comm) {
  int victim = 0;
  for (int i = 0; i < comm->npending; i++)
    if (!comm->pending[i].challenged) { victim = i; break; }
  if (comm->pending[victim].challenged)
    COLL_WARN("rank %d: %d half-open connections on port %d, all with a hello for this rank; "
              "dropped one", comm->rank, comm->npending, comm->port);
  close(comm->pending[victim].fd);
  drop_pending(comm, victim);
}

static void accept_all(coll_comm_t *comm) {
  for (;;) {
    int fd = accept4(comm->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    set_buffers(comm, fd);
    if (comm->npending == comm->max_pending) evict(comm);
    comm->pending[comm->npending].fd = fd;
    comm->pending[comm->npending].got = 0;
    comm->pending[comm->npending].challenged = 0;
    comm->npending++;
    service_pending(comm, comm->npending - 1);
  }
}

int coll_tcp_listen_pollfds(const coll_comm_t *comm, struct pollfd *pfs) {
  if (comm->listen_fd < 0) return 0;
  pfs[0].fd = comm->listen_fd;
  pfs[0].events = POLLIN;
  pfs[0].revents = 0;
  for (int i = 0; i < comm->npending; i++) {
    pfs[i + 1].fd = comm->pending[i].fd;
    pfs[i + 1].events = POLLIN;
    pfs[i + 1].revents = 0;
  }
  return comm->npending + 1;
}

void coll_tcp_serve(coll_comm_t *comm) {
  if (comm->listen_fd < 0) return;
  for (int i = comm->npending - 1; i >= 0; i--) service_pending(comm, i);
  accept_all(comm);
}

coll_result_t coll_tcp_aborted(coll_comm_t *comm) {
  if (comm->link_refused[0])
    return coll_error(comm, COLL_REMOTE_ERROR, "%s", comm->link_refused);
  if (comm->abort_from < 0) return COLL_SUCCESS;
  return coll_error(comm, COLL_REMOTE_ERROR, "rank %d: rank %d failed and broke the communicator (%s)",
                    comm->rank, comm->abort_from, comm->abort_reason);
}

coll_result_t coll_tcp_accept_until(coll_comm_t *comm, int peer, double deadline) {
  struct pollfd *pfs = comm->pending_pfs;
  coll_stall_t stall;
  coll_stall_begin(&stall, coll_now(), deadline);
  while (!comm->peers[peer].link) {
    COLL_CHECK(coll_tcp_aborted(comm));
    pfs[0].fd = comm->listen_fd;
    pfs[0].events = POLLIN;
    for (int i = 0; i < comm->npending; i++) {
      pfs[i + 1].fd = comm->pending[i].fd;
      pfs[i + 1].events = POLLIN;
    }
    int np = comm->npending;
    double now = coll_now();
    if (coll_stall_due(&stall, now))
      coll_stall_warn_link(comm, peer, now - stall.quiet_since, deadline - now,
                           "it has not connected (it has not arrived at this collective, or is "
                           "stuck before it)");
    int n = poll(pfs, (nfds_t)np + 1, coll_stall_cap_ms(&stall, now, ms_left(deadline)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return coll_error(comm, COLL_SYSTEM_ERROR, "poll failed: %s", strerror(errno));
    if (n == 0 && coll_now() < deadline) continue; /* woke for the stall warning */
    if (n == 0)
      return coll_error(comm, COLL_TIMEOUT,
                        "rank %d: timed out waiting for rank %d to connect (has it exited, or is it "
                        "stuck before this collective?)", comm->rank, peer);
    for (int i = np; i >= 1; i--)
      if (pfs[i].revents) service_pending(comm, i - 1);
    if (pfs[0].revents & POLLIN) accept_all(comm);
  }
  return COLL_SUCCESS;
}

static coll_result_t lost(coll_link_t *link, const char *what, int err) {
  coll_comm_t *comm = link->comm;
  if (err == 0)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: rank %d closed the connection (it exited or failed)", comm->rank,
                      link->peer);
  return coll_error(comm, COLL_REMOTE_ERROR, "rank %d: connection to rank %d lost while %s: %s",
                    comm->rank, link->peer, what, strerror(err));
}

static coll_result_t tcp_send(coll_link_t *link, const struct iovec *iov, int iovcnt, size_t *n) {
  struct msghdr msg;
  memset(&msg, 0, sizeof msg);
  msg.msg_iov = (struct iovec *)iov;
  msg.msg_iovlen = (size_t)iovcnt;
  ssize_t w;
  if (link->crypt) /* an encrypted link (transport/crypt.c) */
    COLL_CHECK(coll_crypt_send(link->comm, link->crypt[0], link->fd, iov, iovcnt, &w));
  else
    do { w = sendmsg(link->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT); } while (w < 0 && errno == EINTR);
  if (w >= 0) { *n = (size_t)w; return COLL_SUCCESS; }
  *n = 0;
  if (errno == EAGAIN || errno == EWOULDBLOCK) return COLL_SUCCESS;
  return lost(link, "sending", errno);
}

static coll_result_t tcp_recv(coll_link_t *link, const struct iovec *iov, int iovcnt, size_t *n) {
  ssize_t r;
  if (link->crypt)
    COLL_CHECK(coll_crypt_recv(link->comm, link->crypt[0], link->fd, iov, iovcnt, &r));
  else
    do { r = readv(link->fd, iov, iovcnt); } while (r < 0 && errno == EINTR);
  if (r > 0) { *n = (size_t)r; return COLL_SUCCESS; }
  *n = 0;
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return COLL_SUCCESS;
  return lost(link, "receiving", r == 0 ? 0 : errno);
}

static void tcp_close(coll_link_t *link) {
  if (link->fd >= 0) close(link->fd);
  link->fd = -1;
  coll_crypt_drop(link);
}

static int tcp_wait_events(coll_link_t *link, int sending, int receiving) {
  if (receiving && link->crypt && coll_crypt_readable(link->crypt[0])) return -1; /* decrypted already */
  return (sending ? POLLOUT : 0) | (receiving ? POLLIN : 0);
}

const coll_transport_t coll_transport_tcp = {
    .name = "tcp",
    .can_connect = tcp_can_connect,
    .send = tcp_send,
    .recv = tcp_recv,
    .close = tcp_close,
    .wait_events = tcp_wait_events,
};
