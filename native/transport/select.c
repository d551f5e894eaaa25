/* transport/select.c -- per peer: a TCP connection, then the transport both
 * ends agree on over it (see transport.h); the choice is logged at INFO/NET. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
#include <string.h>
#include <strings.h>

#include "base/comm.h"
#include "base/param.h"
#include "base/status.h"
#include "transport/transport.h"

/* Blocking exchange of a few bytes on a fresh link's socket, by deadline.
 * While it waits, our own listener is served too: other ranks' openings are
 * taken, and an abort notice (a rank whose communicator broke, telling the
 * ranks it has no link with) fails this wait at once, naming that rank. A
 * dialer that watched only its socket waited out the whole timeout when the
 * peer it dialed had broken and stopped answering. */
static coll_result_t xfer(coll_comm_t *comm, int fd, int peer, void *buf, size_t n, int sending,
                          double deadline) {
  size_t done = 0;
  struct pollfd pfs[COLL_MAX_PENDING + 2];
  while (done < n) {
    ssize_t r = sending ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(fd, (char *)buf + done, n - done, MSG_DONTWAIT);
    if (r > 0) { done += (size_t)r; continue; }
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      return coll_error(comm, COLL_REMOTE_ERROR,
                        "rank %d: rank %d closed the connection while setting up the link", comm->rank, peer);
    COLL_CHECK(coll_tcp_aborted(comm));
    pfs[0] = (struct pollfd){fd, sending ? POLLOUT : POLLIN, 0};
    int nl = coll_tcp_listen_pollfds(comm, pfs + 1);
    double left = deadline - coll_now();
    int ready = left > 0 ? poll(pfs, (nfds_t)(1 + nl), (int)(left * 1000) + 1) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0)
      return coll_error(comm, COLL_TIMEOUT, "rank %d: timed out setting up the link to rank %d",
                        comm->rank, peer);
    for (int i = 1; i <= nl; i++) {
      if (pfs[i].revents) {
        coll_tcp_serve(comm);
        break;
      }
    }
  }
  return COLL_SUCCESS;
}

static coll_link_t *link_new(coll_comm_t *comm, int peer) {
  coll_link_t *link = calloc(1, sizeof *link);
  if (link) link->stage = malloc(COLL_STAGE_BYTES);
  if (link && !link->stage) { free(link); link = NULL; }
  if (!link) return NULL;
  link->tp = &coll_transport_tcp;
  link->comm = comm;
  link->peer = peer;
  link->fd = -1;
  link->wake_fd = -1;
  return link;
}

static void link_free(coll_link_t *link) {
  link->tp->close(link);
  free(link->dial);
  free(link->stage);
  free(link);
}

static int shm_allowed(coll_comm_t *comm, int peer) {
  return strcasecmp(coll_param_str(COLL_PARAM_TRANSPORT), "tcp") != 0 &&
         coll_transport_shm.can_connect(comm, peer);
}

static coll_result_t link_ready(coll_comm_t *comm, coll_link_t *link, int shm) {
  coll_peer_t *p = &comm->peers[link->peer];
  if (shm) link->tp = &coll_transport_shm;
  if (strcasecmp(coll_param_str(COLL_PARAM_TRANSPORT), "shm") == 0 && !shm)
    return coll_error(comm, COLL_INVALID_USAGE,
                      "rank %d: COLLECTIVES_TRANSPORT=shm but rank %d cannot share memory with it",
                      comm->rank, link->peer);
  char buffers[48] = "";
  if (!shm) {
    int bytes = coll_tcp_link_buffer(comm);
    if (bytes > 0) snprintf(buffers, sizeof buffers, ", socket buffers %d B", bytes);
    else snprintf(buffers, sizeof buffers, ", socket buffers autotuned");
  }
  COLL_INFO(COLL_LOG_NET, "rank %d <-> rank %d via %s (%s:%d%s)", comm->rank, link->peer,
            link->tp->name, p->host, p->port, buffers);
  p->link = link;
  return COLL_SUCCESS;
}

void coll_link_adopt(coll_comm_t *comm, int peer, int fd, const unsigned char *opening,
                     const unsigned char *challenge) {
  coll_link_t *link = link_new(comm, peer);
  if (!link) {
    COLL_WARN("rank %d: out of memory accepting rank %d", comm->rank, peer);
    close(fd);
    return;
  }
  link->fd = fd;
  int ok = 0;
  coll_shm_take_offer(link, opening + COLL_HELLO_PART_BYTES, shm_allowed(comm, peer), &ok);
  unsigned char answer[COLL_ANSWER_BYTES];
  uint32_t word = ok ? 1 : 0;
  memcpy(answer, &word, 4);
  coll_answer_mac(comm->link_key, challenge, opening, word, answer + 4);
  /* A challenge and an answer on a fresh socket always fit its buffer. */
  if (send(fd, answer, sizeof answer, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof answer ||
      link_ready(comm, link, ok) != COLL_SUCCESS) {
    COLL_WARN("rank %d: could not set up the link from rank %d", comm->rank, peer);
    link_free(link);
  }
}

/* Connecting (lower) side, in two round trips (wire.h): send the hello part,
 * take the acceptor's challenge and send offer + MAC (dial_step, stage 0),
 * then read the answer and check its MAC (stage 1). The state between steps
 * lives on the link (link->dial), so that point-to-point waits can dial
 * without blocking (coll_link_dial_poll); link_dial runs the steps in one go.
 * The accepting side answers each part as soon as it reads it, so these waits
 * only depend on the peer reaching any accept loop. */
typedef struct {
  unsigned char opening[COLL_OPENING_BYTES];
  unsigned char challenge[COLL_NONCE_BYTES];
  int stage; /* 0: waiting for the challenge; 1: waiting for the answer */
} dial_state_t;

static void dial_abandon(coll_link_t *link) {
  free(link->dial);
  link->dial = NULL;
  coll_shm_settle(link, 0);
  link_free(link);
}

static coll_result_t dial_begin(coll_comm_t *comm, int peer, double deadline, coll_link_t **out) {
  coll_link_t *link = link_new(comm, peer);
  dial_state_t *d = link ? calloc(1, sizeof *d) : NULL;
  if (!d) {
    if (link) link_free(link);
    return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory for a link", comm->rank);
  }
  link->dial = d;
  coll_hello_encode(d->opening, comm->id, comm->rank, peer);
  coll_result_t res = coll_shm_make_offer(link, shm_allowed(comm, peer),
                                          d->opening + COLL_HELLO_PART_BYTES);
  if (res == COLL_SUCCESS)
    res = coll_tcp_dial(comm, peer, deadline, d->opening, COLL_HELLO_PART_BYTES, &link->fd);
  if (res != COLL_SUCCESS) {
    dial_abandon(link);
    return res;
  }
  *out = link;
  return COLL_SUCCESS;
}

/* One step of a dial (see above); *done = 1 once the link is ready. On
 * failure the link is freed. */
static coll_result_t dial_step(coll_comm_t *comm, coll_link_t *link, double deadline, int *done) {
  dial_state_t *d = link->dial;
  int peer = link->peer;
  coll_result_t res = COLL_SUCCESS;
  *done = 0;
  if (d->stage == 0) {
    res = xfer(comm, link->fd, peer, d->challenge, sizeof d->challenge, 0, deadline);
    if (res == COLL_SUCCESS) {
      coll_opening_mac(comm->link_key, d->challenge, d->opening,
                       d->opening + COLL_OPENING_BYTES - COLL_MAC_BYTES);
      res = xfer(comm, link->fd, peer, d->opening + COLL_HELLO_PART_BYTES,
                 COLL_OPENING_BYTES - COLL_HELLO_PART_BYTES, 1, deadline);
    }
    if (res == COLL_SUCCESS) d->stage = 1;
  } else {
    unsigned char answer[COLL_ANSWER_BYTES], mac[COLL_MAC_BYTES];
    uint32_t word = 0;
    res = xfer(comm, link->fd, peer, answer, sizeof answer, 0, deadline);
    if (res == COLL_SUCCESS) {
      memcpy(&word, answer, 4);
      coll_answer_mac(comm->link_key, d->challenge, d->opening, word, mac);
      if (!coll_ct_equal(mac, answer + 4, COLL_MAC_BYTES))
        res = coll_error(comm, COLL_REMOTE_ERROR,
                         "rank %d: the process at rank %d's address %s:%d does not prove this "
                         "job's secret (another job, or a different COLLECTIVES_JOB_SECRET?)",
                         comm->rank, peer, comm->peers[peer].host, comm->peers[peer].port);
    }
    if (res == COLL_SUCCESS) {
      free(link->dial);
      link->dial = NULL;
      coll_shm_settle(link, word == 1);
      res = link_ready(comm, link, word == 1);
      if (res != COLL_SUCCESS) link_free(link);
      *done = res == COLL_SUCCESS;
      return res;
    }
  }
  if (res != COLL_SUCCESS) dial_abandon(link);
  return res;
}

static coll_result_t link_dial(coll_comm_t *comm, int peer, double deadline) {
  coll_link_t *link = comm->peers[peer].dialing;
  comm->peers[peer].dialing = NULL;
  if (!link) COLL_CHECK(dial_begin(comm, peer, deadline, &link));
  int done = 0;
  while (!done) COLL_CHECK(dial_step(comm, link, deadline, &done));
  return COLL_SUCCESS;
}


coll_result_t coll_link_dial_start(coll_comm_t *comm, int peer, double deadline) {
  coll_peer_t *p = &comm->peers[peer];
  if (p->link || p->dialing) return COLL_SUCCESS;
  if (!coll_transport_tcp.can_connect(comm, peer))
    return coll_error(comm, COLL_INVALID_USAGE, "rank %d: no address for rank %d", comm->rank, peer);
  return dial_begin(comm, peer, deadline, &p->dialing);
}

coll_result_t coll_link_dial_poll(coll_comm_t *comm, int peer, int *done) {
  coll_peer_t *p = &comm->peers[peer];
  *done = p->link != NULL;
  while (!*done && p->dialing) {
    dial_state_t *d = p->dialing->dial;
    unsigned char peek[COLL_ANSWER_BYTES > COLL_NONCE_BYTES ? COLL_ANSWER_BYTES : COLL_NONCE_BYTES];
    size_t want = d->stage == 0 ? COLL_NONCE_BYTES : COLL_ANSWER_BYTES;
    ssize_t r = recv(p->dialing->fd, peek, want, MSG_PEEK | MSG_DONTWAIT);
    if (!(r == (ssize_t)want || r == 0 ||
          (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)))
      return COLL_SUCCESS;  /* not there yet */
    /* What this step waits for (or the peer's end) is there: its blocking
     * reads return at once, and the bytes it sends fit a fresh socket. */
    coll_link_t *link = p->dialing;
    int ready = 0;
    coll_result_t res = dial_step(comm, link, coll_now() + 1.0, &ready);
    if (res != COLL_SUCCESS || ready) p->dialing = NULL;
    COLL_CHECK(res);
    *done = ready;
  }
  return COLL_SUCCESS;
}

int coll_links_all_shm(coll_comm_t *comm) {
  /* Asked on every AUTO allreduce; answered once per set of host ids (the
   * parameter, then one host-id comparison per peer: what shm_can_connect
   * checks, no link touched) and kept until a peer's host id changes. */
  if (comm->all_shm) return comm->all_shm == 1;
  int all = strcasecmp(coll_param_str(COLL_PARAM_TRANSPORT), "tcp") != 0;
  for (int i = 0; i < comm->size && all; i++)
    if (i != comm->rank && !coll_transport_shm.can_connect(comm, i)) all = 0;
  comm->all_shm = all ? 1 : 2;
  return all;
}

coll_result_t coll_link_get(coll_comm_t *comm, int peer, double deadline, coll_link_t **out) {
  coll_peer_t *p = &comm->peers[peer];
  if (comm->root) { /* a subcommunicator's links are its root's (comm/subcomm.c) */
    if (!p->link) COLL_CHECK(coll_link_get(comm->root, comm->world[peer], deadline, &p->link));
    *out = p->link;
    return COLL_SUCCESS;
  }
  if (!p->link) {
    if (!coll_transport_tcp.can_connect(comm, peer))
      return coll_error(comm, COLL_INVALID_USAGE, "rank %d: no address for rank %d", comm->rank, peer);
    if (comm->rank < peer) COLL_CHECK(link_dial(comm, peer, deadline));
    else COLL_CHECK(coll_tcp_accept_until(comm, peer, deadline));
  }
  *out = p->link;
  return COLL_SUCCESS;
}

void coll_links_close_all(coll_comm_t *comm) {
  if (comm->root) return; /* not its own: the root closes them */
  for (int i = 0; i < comm->size; i++) {
    coll_peer_t *p = &comm->peers[i];
    if (p->dialing) {
      coll_shm_settle(p->dialing, 0);
      link_free(p->dialing);
      p->dialing = NULL;
    }
    if (p->link) {
      p->link->tp->close(p->link);
      free(p->link->stage);
      free(p->link->unread);
      free(p->link);
      p->link = NULL;
    }
  }
}
