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

#include "base/comm_state.h"
#include "base/param.h"
#include "base/stall.h"
#include "base/status.h"
#include "transport/crypt.h"
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
  struct pollfd *pfs = comm->pending_pfs; /* max_pending + 2 (tcp.c) */
  coll_stall_t stall;
  coll_stall_begin(&stall, coll_now(), deadline);
  while (done < n) {
    ssize_t r = sending ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(fd, (char *)buf + done, n - done, MSG_DONTWAIT);
    if (r > 0) { done += (size_t)r; stall.quiet_since = 0; continue; }
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      return coll_error(comm, COLL_REMOTE_ERROR,
                        "rank %d: rank %d closed the connection while setting up the link (it "
                        "exited, or does not share this job's secret: a different "
                        "COLLECTIVES_JOB_SECRET?)", comm->rank, peer);
    COLL_CHECK(coll_tcp_aborted(comm));
    pfs[0] = (struct pollfd){fd, sending ? POLLOUT : POLLIN, 0};
    int nl = coll_tcp_listen_pollfds(comm, pfs + 1);
    double now = coll_now(), left = deadline - now;
    if (left > 0 && coll_stall_due(&stall, now))
      coll_stall_warn_link(comm, peer, now - stall.quiet_since, left,
                           "it has not answered (it has not arrived at this collective, or is "
                           "stuck before it)");
    int ready = left > 0 ? poll(pfs, (nfds_t)(1 + nl),
                                coll_stall_cap_ms(&stall, now, (int)(left * 1000) + 1)) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0 && coll_now() < deadline) continue; /* woke for the stall warning */
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
  char buffers[100] = "";
  if (!shm) {
    int bytes = coll_tcp_link_buffer(comm);
    if (bytes > 0) snprintf(buffers, sizeof buffers, ", socket buffers %d B", bytes);
    else snprintf(buffers, sizeof buffers, ", socket buffers autotuned");
  }
  if (coll_stripe_sockets(link) > 1) {
    size_t used = strlen(buffers);
    snprintf(buffers + used, sizeof buffers - used, ", %d connections", coll_stripe_sockets(link));
  }
  if (link->crypt) {
    size_t used = strlen(buffers);
    snprintf(buffers + used, sizeof buffers - used, ", AES-256-GCM");
  }
  COLL_INFO(COLL_LOG_NET, "rank %d <-> rank %d via %s (%s:%d%s)", comm->rank, link->peer,
            link->tp->name, p->host, p->port, buffers);
  p->link = link;
  return COLL_SUCCESS;
}

static void answer_send(coll_comm_t *comm, int fd, const unsigned char *opening,
                        const unsigned char *challenge, uint32_t word, int *sent) {
  unsigned char answer[COLL_ANSWER_BYTES];
  memcpy(answer, &word, 4);
  coll_answer_mac(comm->link_key, challenge, opening, word, answer + 4);
  /* A challenge and an answer on a fresh socket always fit its buffer. */
  *sent = send(fd, answer, sizeof answer, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof answer;
}

/* An opening that proved the key but breaks the link rules: the peer gets
 * a refusal it can trust (and names us in its error), and this rank's waits
 * for links fail at once with `why` (coll_tcp_aborted). */
static void refuse(coll_comm_t *comm, int peer, int fd, const unsigned char *opening,
                   const unsigned char *challenge, uint32_t reason, const char *why) {
  int sent;
  uint32_t word = COLL_ANSWER_REFUSED | reason << 8 | (uint32_t)coll_tcp_nsocks() << 16 |
                  (uint32_t)coll_crypt_wanted() << 24;
  answer_send(comm, fd, opening, challenge, word, &sent);
  close(fd);
  COLL_WARN("rank %d: refused a link opening from rank %d: %s", comm->rank, peer, why);
  if (!comm->link_refused[0])
    snprintf(comm->link_refused, sizeof comm->link_refused, "rank %d: %s", comm->rank, why);
  coll_peer_t *p = &comm->peers[peer];
  if (p->joining) { /* it cannot complete now */
    link_free(p->joining);
    p->joining = NULL;
  }
}

/* The error for a refusal answer (see refuse). */
static coll_result_t refused(coll_comm_t *comm, int peer, uint32_t word) {
  uint32_t reason = (word >> 8) & 0xff, theirs = (word >> 16) & 0xff;
  if (reason == COLL_REFUSED_NSOCKS)
    return coll_error(comm, COLL_INVALID_USAGE,
                      "rank %d: rank %d refused the link: it uses COLLECTIVES_NSOCKS=%u TCP "
                      "connections per link, this rank %d (set the same value on every rank)",
                      comm->rank, peer, theirs, coll_tcp_nsocks());
  if (reason == COLL_REFUSED_ENCRYPT && (word >> 24) == (uint32_t)coll_crypt_wanted())
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: rank %d refused the link: it runs with COLLECTIVES_ENCRYPT=1 "
                      "but cannot load libcrypto (its log says why)", comm->rank, peer);
  if (reason == COLL_REFUSED_ENCRYPT)
    return coll_error(comm, COLL_INVALID_USAGE,
                      "rank %d: rank %d refused the link: it runs with COLLECTIVES_ENCRYPT=%u, "
                      "this rank with %d (set the same value on every rank)",
                      comm->rank, peer, word >> 24, coll_crypt_wanted());
  return coll_error(comm, COLL_REMOTE_ERROR,
                    "rank %d: rank %d refused the link (reason %u: a connection index it "
                    "had already, or an offer it does not take)", comm->rank, peer, reason);
}

/* Connection `sock` of a TCP link that encrypts (COLLECTIVES_ENCRYPT=1): its
 * keys from this connection's opening nonces (transport/crypt.h). */
static coll_result_t encrypt_socket(coll_comm_t *comm, coll_link_t *link, int sock, int k,
                                    int dialer, const unsigned char *opening,
                                    const unsigned char *challenge) {
  COLL_CHECK(coll_crypt_attach(link, k));
  return coll_crypt_new(comm, link->peer, sock, k, dialer, opening + COLL_HELLO_BYTES, challenge,
                        &link->crypt[sock]);
}

void coll_link_adopt(coll_comm_t *comm, int peer, int fd, const unsigned char *opening,
                     const unsigned char *challenge) {
  coll_peer_t *p = &comm->peers[peer];
  int sock = 0, k = 1, nsocks = coll_tcp_nsocks(), sent = 0;
  uint32_t kind;
  char why[200];
  coll_hello_decode(opening, comm->link_key, comm->id, comm->rank, &sock, &k); /* tcp.c checked it */
  memcpy(&kind, opening + COLL_HELLO_PART_BYTES, 4);
  if (sock >= k) {
    snprintf(why, sizeof why, "rank %d named connection %d of a link of %d", peer, sock, k);
    refuse(comm, peer, fd, opening, challenge, COLL_REFUSED_SOCKET, why);
    return;
  }
  if (k != nsocks) {
    snprintf(why, sizeof why,
             "rank %d opens its links with COLLECTIVES_NSOCKS=%d TCP connections, this rank "
             "with %d (set the same value on every rank)", peer, k, nsocks);
    refuse(comm, peer, fd, opening, challenge, COLL_REFUSED_NSOCKS, why);
    return;
  }
  uint32_t flags;
  memcpy(&flags, opening + COLL_HELLO_PART_BYTES + COLL_OFFER_FLAGS_AT, 4);
  int theirs = (flags & COLL_OFFER_ENCRYPT) != 0, mine = coll_crypt_wanted();
  if (theirs != mine) {
    snprintf(why, sizeof why,
             "rank %d runs with COLLECTIVES_ENCRYPT=%d, this rank with %d (set the same value "
             "on every rank)", peer, theirs, mine);
    refuse(comm, peer, fd, opening, challenge, COLL_REFUSED_ENCRYPT, why);
    return;
  }
  if (mine && coll_crypt_lib_error()) {
    snprintf(why, sizeof why, "COLLECTIVES_ENCRYPT=1 but libcrypto cannot be used here: %s",
             coll_crypt_lib_error());
    refuse(comm, peer, fd, opening, challenge, COLL_REFUSED_ENCRYPT, why);
    return;
  }
  if (kind != 0 && (sock > 0 || p->joining)) {
    snprintf(why, sizeof why,
             "rank %d offered shared memory on connection %d of a link of %d (only the "
             "first connection of a link may)", peer, sock, k);
    refuse(comm, peer, fd, opening, challenge, COLL_REFUSED_SOCKET, why);
    return;
  }
  if (nsocks > 1 && kind == 0) { /* one of k connections: a slot of the joining link */
    if (!p->joining) {
      coll_link_t *link = link_new(comm, peer);
      if (!link || coll_stripe_new(link, k) != COLL_SUCCESS) {
        COLL_WARN("rank %d: out of memory accepting rank %d", comm->rank, peer);
        if (link) link_free(link);
        close(fd);
        return;
      }
      p->joining = link;
    }
    int filled = coll_stripe_fill(p->joining, sock, fd);
    if (!filled) {
      snprintf(why, sizeof why, "rank %d opened connection %d of its link twice", peer, sock);
      refuse(comm, peer, fd, opening, challenge, COLL_REFUSED_SOCKET, why);
      return;
    }
    coll_link_t *link = p->joining;
    if (mine && encrypt_socket(comm, link, sock, k, 0, opening, challenge) != COLL_SUCCESS)
      sent = 0; /* no answer: the dialer fails on the closed connection */
    else
      answer_send(comm, fd, opening, challenge, 0, &sent);
    if (!sent) {
      COLL_WARN("rank %d: could not set up the link from rank %d", comm->rank, peer);
      p->joining = NULL;
      link_free(link);
    } else if (filled == 2) {
      p->joining = NULL;
      if (link_ready(comm, link, 0) != COLL_SUCCESS) link_free(link);
    }
    return;
  }
  coll_link_t *link = link_new(comm, peer);
  if (!link) {
    COLL_WARN("rank %d: out of memory accepting rank %d", comm->rank, peer);
    close(fd);
    return;
  }
  link->fd = fd;
  int ok = 0;
  coll_shm_take_offer(link, opening + COLL_HELLO_PART_BYTES, shm_allowed(comm, peer), &ok);
  if (!ok && mine && encrypt_socket(comm, link, 0, 1, 0, opening, challenge) != COLL_SUCCESS)
    sent = 0;
  else
    answer_send(comm, fd, opening, challenge, ok ? 1 : 0, &sent);
  if (!sent || link_ready(comm, link, ok) != COLL_SUCCESS) {
    COLL_WARN("rank %d: could not set up the link from rank %d", comm->rank, peer);
    link_free(link);
  }
}

/* Connecting (lower) side, in two round trips per connection (wire.h):
 * send the hello part, take the acceptor's challenge and send offer + MAC
 * (sock_step, stage 0), then read the answer and check its MAC (stage 1).
 * A link of COLLECTIVES_NSOCKS = k > 1 connections dials all k at once, each
 * naming its index; only the first carries a transport offer, and a link
 * that offers shared memory keeps that one connection whatever the answer
 * (both ends know what was offered). The state between steps lives on the
 * link (link->dial), so that point-to-point waits can dial without blocking
 * (coll_link_dial_poll); link_dial runs the steps in one go. The accepting
 * side answers each part as soon as it reads it, so these waits only depend
 * on the peer reaching any accept loop. */
typedef struct {
  int fd;
  int stage; /* 0: waiting for the challenge; 1: waiting for the answer; 2: done */
  uint32_t word; /* the answer */
  unsigned char opening[COLL_OPENING_BYTES];
  unsigned char challenge[COLL_NONCE_BYTES];
} dial_sock_t;

typedef struct {
  int k; /* connections this link gets */
  dial_sock_t s[COLL_MAX_NSOCKS];
} dial_state_t;

static void dial_abandon(coll_link_t *link) {
  dial_state_t *d = link->dial;
  for (int i = 0; d && i < d->k; i++)
    if (d->s[i].fd >= 0) close(d->s[i].fd);
  link->fd = -1; /* it was one of those */
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
  int nsocks = coll_tcp_nsocks();
  for (int i = 0; i < COLL_MAX_NSOCKS; i++) d->s[i].fd = -1;
  uint32_t flags = coll_crypt_wanted() ? COLL_OFFER_ENCRYPT : 0;
  if (flags && coll_crypt_load(comm) != COLL_SUCCESS) {
    link_free(link);
    return COLL_SYSTEM_ERROR;
  }
  d->k = 1;
  coll_hello_encode(d->s[0].opening, comm->link_key, comm->id, comm->rank, peer, 0, nsocks);
  coll_result_t res = coll_shm_make_offer(link, shm_allowed(comm, peer),
                                          d->s[0].opening + COLL_HELLO_PART_BYTES);
  uint32_t kind = 0;
  memcpy(&kind, d->s[0].opening + COLL_HELLO_PART_BYTES, 4);
  if (res == COLL_SUCCESS && kind == 0) d->k = nsocks;
  for (int i = 0; res == COLL_SUCCESS && i < d->k; i++) {
    if (i > 0)
      coll_hello_encode(d->s[i].opening, comm->link_key, comm->id, comm->rank, peer, i, nsocks);
    memcpy(d->s[i].opening + COLL_HELLO_PART_BYTES + COLL_OFFER_FLAGS_AT, &flags, 4);
    res = coll_tcp_dial(comm, peer, deadline, d->s[i].opening, COLL_HELLO_PART_BYTES, &d->s[i].fd);
  }
  if (res != COLL_SUCCESS) {
    dial_abandon(link);
    return res;
  }
  link->fd = d->s[0].fd;
  *out = link;
  return COLL_SUCCESS;
}

/* One step of connection i of a dial (see above); the caller abandons the
 * dial on failure. */
static coll_result_t sock_step(coll_comm_t *comm, coll_link_t *link, int i, double deadline) {
  dial_sock_t *ds = &((dial_state_t *)link->dial)->s[i];
  int peer = link->peer;
  if (ds->stage == 0) {
    unsigned char got[COLL_CHALLENGE_BYTES], want[COLL_MAC_BYTES];
    COLL_CHECK(xfer(comm, ds->fd, peer, got, sizeof got, 0, deadline));
    coll_challenge_mac(comm->link_key, got, ds->opening, want);
    if (!coll_ct_equal(want, got + COLL_NONCE_BYTES, COLL_MAC_BYTES))
      return coll_error(comm, COLL_REMOTE_ERROR,
                        "rank %d: the process at rank %d's address %s:%d does not prove this "
                        "job's secret (another job, or a different COLLECTIVES_JOB_SECRET?); "
                        "nothing more was sent to it",
                        comm->rank, peer, comm->peers[peer].host, comm->peers[peer].port);
    memcpy(ds->challenge, got, COLL_NONCE_BYTES);
    coll_opening_mac(comm->link_key, ds->challenge, ds->opening,
                     ds->opening + COLL_OPENING_BYTES - COLL_MAC_BYTES);
    COLL_CHECK(xfer(comm, ds->fd, peer, ds->opening + COLL_HELLO_PART_BYTES,
                    COLL_OPENING_BYTES - COLL_HELLO_PART_BYTES, 1, deadline));
    ds->stage = 1;
    return COLL_SUCCESS;
  }
  unsigned char answer[COLL_ANSWER_BYTES], mac[COLL_MAC_BYTES];
  COLL_CHECK(xfer(comm, ds->fd, peer, answer, sizeof answer, 0, deadline));
  memcpy(&ds->word, answer, 4);
  coll_answer_mac(comm->link_key, ds->challenge, ds->opening, ds->word, mac);
  if (!coll_ct_equal(mac, answer + 4, COLL_MAC_BYTES))
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: the process at rank %d's address %s:%d does not prove this "
                      "job's secret (another job, or a different COLLECTIVES_JOB_SECRET?)",
                      comm->rank, peer, comm->peers[peer].host, comm->peers[peer].port);
  if ((ds->word & 0xff) == COLL_ANSWER_REFUSED) return refused(comm, peer, ds->word);
  if (ds->word > 1 || (ds->word == 1 && (i > 0 || !link->priv)))
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: rank %d answered connection %d of its link with 0x%x, an answer "
                      "to an offer this rank did not make", comm->rank, peer, i, ds->word);
  ds->stage = 2;
  return COLL_SUCCESS;
}

/* Every connection answered: the link is ready (freed on failure). */
static coll_result_t dial_finish(coll_comm_t *comm, coll_link_t *link) {
  dial_state_t *d = link->dial;
  int k = d->k, shm = d->s[0].word == 1, fds[COLL_MAX_NSOCKS];
  coll_result_t res = COLL_SUCCESS;
  for (int i = 0; i < k; i++) fds[i] = d->s[i].fd;
  for (int i = 0; i < k && !shm && coll_crypt_wanted() && res == COLL_SUCCESS; i++)
    res = encrypt_socket(comm, link, i, k, 1, d->s[i].opening, d->s[i].challenge);
  free(link->dial);
  link->dial = NULL;
  coll_shm_settle(link, shm);
  if (k > 1) {
    link->fd = -1;
    res = res == COLL_SUCCESS ? coll_stripe_new(link, k) : res;
    for (int i = 0; i < k; i++)
      if (res != COLL_SUCCESS) close(fds[i]);
      else coll_stripe_fill(link, i, fds[i]);
  }
  if (res == COLL_SUCCESS) res = link_ready(comm, link, shm);
  if (res != COLL_SUCCESS) link_free(link);
  return res;
}

static coll_result_t link_dial(coll_comm_t *comm, int peer, double deadline) {
  coll_link_t *link = comm->peers[peer].dialing;
  comm->peers[peer].dialing = NULL;
  if (!link) COLL_CHECK(dial_begin(comm, peer, deadline, &link));
  dial_state_t *d = link->dial;
  coll_result_t res = COLL_SUCCESS;
  /* All challenges first, then all answers: one round trip for k connections. */
  for (int stage = 0; stage < 2 && res == COLL_SUCCESS; stage++)
    for (int i = 0; i < d->k && res == COLL_SUCCESS; i++)
      if (d->s[i].stage == stage) res = sock_step(comm, link, i, deadline);
  if (res != COLL_SUCCESS) {
    dial_abandon(link);
    return res;
  }
  return dial_finish(comm, link);
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
  if (*done || !p->dialing) return COLL_SUCCESS;
  coll_link_t *link = p->dialing;
  dial_state_t *d = link->dial;
  int waiting = 0;
  for (int i = 0; i < d->k; i++) {
    dial_sock_t *ds = &d->s[i];
    while (ds->stage < 2) {
      unsigned char peek[COLL_ANSWER_BYTES > COLL_CHALLENGE_BYTES ? COLL_ANSWER_BYTES
                                                                   : COLL_CHALLENGE_BYTES];
      size_t want = ds->stage == 0 ? COLL_CHALLENGE_BYTES : COLL_ANSWER_BYTES;
      ssize_t r = recv(ds->fd, peek, want, MSG_PEEK | MSG_DONTWAIT);
      if (!(r == (ssize_t)want || r == 0 ||
            (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)))
        break; /* not there yet */
      /* What this step waits for (or the peer's end) is there: its blocking
       * reads return at once, and the bytes it sends fit a fresh socket. */
      coll_result_t res = sock_step(comm, link, i, coll_now() + 1.0);
      if (res != COLL_SUCCESS) {
        p->dialing = NULL;
        dial_abandon(link);
        return res;
      }
    }
    /* The waits in p2p_wait.c poll dialing->fd: the first connection still due. */
    if (ds->stage < 2 && !waiting++) link->fd = ds->fd;
  }
  if (waiting) return COLL_SUCCESS;
  p->dialing = NULL;
  COLL_CHECK(dial_finish(comm, link));
  *done = 1;
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
      dial_abandon(p->dialing);
      p->dialing = NULL;
    }
    if (p->joining) {
      link_free(p->joining);
      p->joining = NULL;
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
