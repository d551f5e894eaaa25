/*
 * transport/shm.c -- links through shared memory between ranks on one host.
 *
 * A link owns one segment in /dev/shm with two rings, one per direction
 * (dir 0: lower rank -> higher rank). Each ring is a single-producer,
 * single-consumer byte stream: the writer copies into it and advances head,
 * the reader consumes and advances tail; the executor reduces straight out of
 * the ring (recv_peek), so a reduced byte is copied once instead of the
 * twice a socket costs (into the kernel, out of it).
 *
 * Sleeping without spinning: a side that finds nothing to do sets its
 * "waiting" flag, re-checks the ring, and sleeps in poll() on its doorbell;
 * the other side, after moving head or tail, swaps the flag to 0 and if it
 * was set writes one byte to that doorbell. (Store the index, full fence,
 * load the flag -- against -- store the flag, full fence, load the index: one
 * of the two always sees the other, so no wake-up is lost.) Each side's
 * doorbell is a FIFO created beside the segment (link->wake_fd): waking a
 * process through a pipe costs about a third of a byte through loopback TCP
 * (measured one-way, poll-woken: 17 vs 58 us across cores, 3.4 vs 7.1 us on
 * one core, on the 2-vCPU test VM), and at 4 ranks on 2 cores nearly every
 * small message needs one. Both ends open both FIFOs read-write, so neither
 * ever sees EOF on them: death still comes from the link's TCP socket, which
 * carries nothing after setup and is watched for the hang-up.
 *
 * Setup, over the TCP link right after its hello: the connecting side creates
 * the segment and the two FIFOs (<segment>.w0 wakes the lower rank, .w1 the
 * higher), writes a random token into the segment and offers its path; the
 * accepting side maps it, checks the token (so a different /dev/shm, as in
 * another container, is detected), opens the FIFOs, unlinks all three and
 * answers yes; on any doubt it answers no and both sides keep plain TCP.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/comm_state.h"
#include "base/param.h"
#include "base/status.h"
#include "transport/transport.h"
#include "transport/shm_priv.h"

/* The doorbell FIFO that wakes the lower (side 0) or higher (side 1) rank. */
static void fifo_path(char *out, size_t n, const char *seg_path, int side) {
  snprintf(out, n, "%s.w%d", seg_path, side);
}

/* Opens both FIFOs of a segment read-write and non-blocking (read-write: the
 * open never waits for the other end, and a write never fails for lack of a
 * reader). Returns 0, or -1 with nothing left open. */
static int open_doorbells(shm_t *s, const char *seg_path, int lower) {
  char p[96];
  int fds[2] = {-1, -1};
  struct stat st;
  for (int side = 0; side < 2; side++) {
    fifo_path(p, sizeof p, seg_path, side);
    fds[side] = open(p, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fds[side] < 0 || fstat(fds[side], &st) != 0 || !S_ISFIFO(st.st_mode)) {
      if (fds[0] >= 0) close(fds[0]);
      if (fds[1] >= 0) close(fds[1]);
      return -1;
    }
  }
  s->wake_in = fds[lower ? 0 : 1];
  s->wake_out = fds[lower ? 1 : 0];
  return 0;
}

static void unlink_all(const char *seg_path) {
  char p[96];
  unlink(seg_path);
  for (int side = 0; side < 2; side++) {
    fifo_path(p, sizeof p, seg_path, side);
    unlink(p);
  }
}

static void shm_free(shm_t *s) {
  coll_shm_cma_close(s);
  munmap(s->seg, s->map_bytes);
  if (s->wake_in >= 0) close(s->wake_in);
  if (s->wake_out >= 0) close(s->wake_out);
  free(s);
}

static size_t ring_bytes_param(void) {
  long long v = coll_param_int(COLL_PARAM_SHM_BYTES);
  size_t r = 1 << 16;
  while ((long long)r < v && r < ((size_t)1 << 30)) r <<= 1;
  return r;
}

static int shm_can_connect(coll_comm_t *comm, int peer) {
  const char *a = comm->peers[comm->rank].host_id, *b = comm->peers[peer].host_id;
  return a[0] && strcmp(a, b) == 0;
}

static void map_rings(shm_t *s, int lower) {
  unsigned char *data = (unsigned char *)(s->seg + 1);
  s->out_ctl = &s->seg->ctl[lower ? 0 : 1];
  s->in_ctl = &s->seg->ctl[lower ? 1 : 0];
  s->out = data + (lower ? 0 : s->ring);
  s->in = data + (lower ? s->ring : 0);
}

/* Segments are unlinked as soon as both sides have them mapped, so a name is
 * left in /dev/shm only if its creator died while offering it. Remove those
 * of dead creators (the pid is in the name) before making a new one. A live
 * pid, or one reused since, keeps its file: nothing in use is ever removed. */
static void sweep_stale_segments(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    int pid;
    if (sscanf(e->d_name, "collectives-%d-", &pid) != 1 || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    char path[300];
    snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
    unlink(path);
  }
  closedir(d);
}

coll_result_t coll_shm_make_offer(coll_link_t *link, int want_shm, unsigned char *offer) {
  coll_comm_t *comm = link->comm;
  memset(offer, 0, COLL_SHM_OFFER_BYTES);
  if (!want_shm) return COLL_SUCCESS; /* kind 0: tcp */
  sweep_stale_segments();
  shm_t *s = calloc(1, sizeof *s);
  if (!s) return COLL_SUCCESS;
  s->wake_in = s->wake_out = -1;
  s->peer_pidfd = -1;
  s->ring = ring_bytes_param();
  s->map_bytes = sizeof(seg_t) + 2 * s->ring;
  uint64_t token = ((uint64_t)rand() << 32) ^ (uint64_t)rand() ^ ((uint64_t)getpid() << 16) ^
                   (uint64_t)(coll_now() * 1e9);
  snprintf(s->path, sizeof s->path, "/dev/shm/collectives-%d-%d-%d-%llx", (int)getpid(),
           comm->rank, link->peer, (unsigned long long)token);
  char w0[96], w1[96];
  fifo_path(w0, sizeof w0, s->path, 0);
  fifo_path(w1, sizeof w1, s->path, 1);
  int fd = open(s->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  /* posix_fallocate, not just ftruncate: a /dev/shm too small for the rings
   * (a container's default 64 MiB) then fails here, and the link stays on
   * tcp, instead of a SIGBUS at the first touch of a page tmpfs cannot back. */
  int err = fd < 0 ? 0 : posix_fallocate(fd, 0, (off_t)s->map_bytes);
  if (err) errno = err;
  if (fd < 0 || err || mkfifo(w0, 0600) != 0 ||
      mkfifo(w1, 0600) != 0 || open_doorbells(s, s->path, 1) != 0) {
    if (err == ENOSPC || err == EFBIG) {
      /* Said once per process: every further link would repeat it. */
      static atomic_int told;
      if (!atomic_exchange(&told, 1))
        COLL_WARN("rank %d: /dev/shm has no room for the %zu-byte rings of a link to rank %d (%s); "
                  "such links use tcp. Enlarge /dev/shm (docker run --shm-size) or lower "
                  "COLLECTIVES_SHM_BYTES", comm->rank, s->map_bytes, link->peer, strerror(err));
    }
    COLL_INFO(COLL_LOG_NET, "rank %d: no shared memory for rank %d (%s): using tcp", comm->rank,
              link->peer, strerror(errno));
    if (fd >= 0) close(fd);
    unlink_all(s->path);
    free(s);
    return COLL_SUCCESS;
  }
  /* MAP_POPULATE here and on the accepting side: each side's page tables
   * map every ring page now, not on first touch. Otherwise every first pass
   * through a ring faults twice per page (once per side), which made the
   * first ~500 8 KiB allreduces on a new link 3x slower (12 vs 4 us). */
  void *p = mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    unlink_all(s->path);
    close(s->wake_in);
    close(s->wake_out);
    free(s);
    return COLL_SUCCESS;
  }
  s->seg = p;
  s->seg->magic = SEG_MAGIC;
  s->seg->ring_bytes = (uint32_t)s->ring;
  s->seg->token = token;
  s->seg->pid[0] = (int32_t)getpid();
  s->seg->addr[0] = (uint64_t)(uintptr_t)p;
  map_rings(s, 1);
  link->priv = s;
  uint32_t kind = 1;
  memcpy(offer, &kind, 4);
  memcpy(offer + 8, &token, 8);
  memcpy(offer + 16, s->path, strlen(s->path) + 1);
  return COLL_SUCCESS;
}

/* The offered path is exactly the name coll_shm_make_offer builds for a link
 * from `from` to `to` with this token: in /dev/shm, no other directory, no
 * "..", nothing after the token. Checked before the path is opened. */
int coll_shm_path_ok(const char *path, int from, int to, uint64_t token) {
  int pid = 0, a = -1, b = -1, end = 0;
  unsigned long long t = 0;
  if (sscanf(path, "/dev/shm/collectives-%d-%d-%d-%llx%n", &pid, &a, &b, &t, &end) != 4 ||
      path[end] != 0 || pid <= 0 || a != from || b != to || t != (unsigned long long)token)
    return 0;
  char expect[80];
  snprintf(expect, sizeof expect, "/dev/shm/collectives-%d-%d-%d-%llx", pid, a, b, t);
  return strcmp(expect, path) == 0;
}

coll_result_t coll_shm_take_offer(coll_link_t *link, const unsigned char *offer, int allowed, int *ok) {
  *ok = 0;
  uint32_t kind;
  uint64_t token;
  char path[80];
  memcpy(&kind, offer, 4);
  memcpy(&token, offer + 8, 8);
  memcpy(path, offer + 16, sizeof path);
  path[sizeof path - 1] = 0;
  if (kind != 1 || !allowed) return COLL_SUCCESS;
  if (!coll_shm_path_ok(path, link->peer, link->comm->rank, token)) {
    COLL_WARN("rank %d: rank %d offered shared memory at a path that is not one of ours; "
              "using tcp", link->comm->rank, link->peer);
    return COLL_SUCCESS;
  }
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return COLL_SUCCESS;
  struct stat st;
  void *p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
      (size_t)st.st_size > sizeof(seg_t) && (size_t)st.st_size <= sizeof(seg_t) + ((size_t)2 << 30))
    p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return COLL_SUCCESS;
  seg_t *seg = p;
  size_t ring = seg->ring_bytes;
  if (seg->magic != SEG_MAGIC || seg->token != token || (ring & (ring - 1)) != 0 ||
      sizeof(seg_t) + 2 * ring != (size_t)st.st_size) {
    munmap(p, (size_t)st.st_size);
    return COLL_SUCCESS;
  }
  shm_t *s = calloc(1, sizeof *s);
  if (!s) { munmap(p, (size_t)st.st_size); return COLL_SUCCESS; }
  s->seg = seg;
  s->side = 1;
  s->peer_pidfd = -1;
  s->ring = ring;
  s->map_bytes = (size_t)st.st_size;
  if (open_doorbells(s, path, 0) != 0) {
    munmap(p, (size_t)st.st_size);
    free(s);
    return COLL_SUCCESS;
  }
  map_rings(s, 0);
  unlink_all(path); /* both sides have them open; nothing left to clean up on a crash */
  link->priv = s;
  link->wake_fd = s->wake_in;
  /* Before the answer: the connecting side probes us once it has it. */
  seg->pid[1] = (int32_t)getpid();
  seg->addr[1] = (uint64_t)(uintptr_t)p;
  coll_shm_cma_probe(link);
  *ok = 1;
  return COLL_SUCCESS;
}

void coll_shm_settle(coll_link_t *link, int ok) {
  shm_t *s = link->priv;
  if (!s) return;
  unlink_all(s->path); /* the peer unlinked them already on success; this covers refusal */
  if (!ok) {
    shm_free(s);
    link->priv = NULL;
  } else {
    link->wake_fd = s->wake_in;
    coll_shm_cma_probe(link);
  }
}

static void ring_doorbell(coll_link_t *link) {
  shm_t *s = link->priv;
  char b = 1;
  /* A full FIFO already holds doorbells the peer will read. */
  ssize_t r = write(s->wake_out, &b, 1);
  (void)r;
}

/* After moving head or tail (and the full fence): wake the peer if it said
 * it sleeps. A plain load first: the locked exchange only when it does. */
void coll_shm_wake_if_waiting(coll_link_t *link, _Atomic uint32_t *waiting) {
  if (atomic_load_explicit(waiting, memory_order_relaxed) && atomic_exchange(waiting, 0))
    ring_doorbell(link);
}

coll_result_t coll_shm_dead(coll_link_t *link) {
  return coll_error(link->comm, COLL_REMOTE_ERROR,
                    "rank %d: rank %d closed the connection (it exited or failed)", link->comm->rank,
                    link->peer);
}

static coll_result_t shm_send(coll_link_t *link, const struct iovec *iov, int iovcnt, size_t *n) {
  shm_t *s = link->priv;
  *n = 0;
  if (s->dead) return coll_shm_dead(link);
  ring_ctl_t *c = s->out_ctl;
  uint64_t head = atomic_load_explicit(&c->head, memory_order_relaxed);
  uint64_t tail = atomic_load_explicit(&c->tail, memory_order_acquire);
  size_t space = s->ring - (size_t)(head - tail), moved = 0;
  for (int i = 0; i < iovcnt && space > 0; i++) {
    size_t len = iov[i].iov_len < space ? iov[i].iov_len : space;
    const unsigned char *src = iov[i].iov_base;
    size_t pos = (size_t)(head + moved) & (s->ring - 1), first = s->ring - pos;
    if (first > len) first = len;
    memcpy(s->out + pos, src, first);
    if (len > first) memcpy(s->out, src + first, len - first);
    moved += len;
    space -= len;
    if (len < iov[i].iov_len) break;
  }
  if (moved) {
    atomic_store_explicit(&c->head, head + moved, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    coll_shm_wake_if_waiting(link, &c->reader_waiting);
  }
  *n = moved;
  return COLL_SUCCESS;
}

static coll_result_t shm_recv_peek(coll_link_t *link, const void **p, size_t *n) {
  shm_t *s = link->priv;
  ring_ctl_t *c = s->in_ctl;
  uint64_t tail = atomic_load_explicit(&c->tail, memory_order_relaxed);
  uint64_t head = atomic_load_explicit(&c->head, memory_order_acquire);
  size_t avail = (size_t)(head - tail), pos = (size_t)tail & (s->ring - 1);
  if (avail == 0 && s->dead) return coll_shm_dead(link);
  *p = s->in + pos;
  *n = avail < s->ring - pos ? avail : s->ring - pos;
  return COLL_SUCCESS;
}

static void shm_recv_consume(coll_link_t *link, size_t n) {
  shm_t *s = link->priv;
  ring_ctl_t *c = s->in_ctl;
  uint64_t tail = atomic_load_explicit(&c->tail, memory_order_relaxed);
  atomic_store_explicit(&c->tail, tail + n, memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  coll_shm_wake_if_waiting(link, &c->writer_waiting);
}

static int shm_in_empty(coll_link_t *link) {
  shm_t *s = link->priv;
  ring_ctl_t *c = s->in_ctl;
  return atomic_load_explicit(&c->head, memory_order_acquire) ==
         atomic_load_explicit(&c->tail, memory_order_relaxed);
}

static coll_result_t shm_recv(coll_link_t *link, const struct iovec *iov, int iovcnt, size_t *n) {
  size_t moved = 0;
  *n = 0;
  for (int i = 0; i < iovcnt; i++) {
    size_t off = 0;
    while (off < iov[i].iov_len) {
      const void *p = NULL;
      size_t avail = 0;
      /* A peer that exited after its last bytes: hand those over first (the
       * caller checks them, e.g. a header that says why more never came);
       * the next call reports the death. */
      if (moved && shm_in_empty(link)) goto done;
      COLL_CHECK(shm_recv_peek(link, &p, &avail));
      if (avail == 0) goto done;
      size_t len = iov[i].iov_len - off < avail ? iov[i].iov_len - off : avail;
      memcpy((char *)iov[i].iov_base + off, p, len);
      shm_recv_consume(link, len);
      off += len;
      moved += len;
    }
  }
done:
  *n = moved;
  return COLL_SUCCESS;
}

static int shm_wait_events(coll_link_t *link, int sending, int receiving) {
  shm_t *s = link->priv;
  if (s->dead) return -1; /* let send/recv report it */
  if (sending) {
    ring_ctl_t *c = s->out_ctl;
    atomic_store(&c->writer_waiting, 1);
    atomic_thread_fence(memory_order_seq_cst);
    /* A single-copy send waits for the ack, which the reader signals on
     * this same flag, rather than for room. */
    if (coll_shm_sc_waiting(link) ? atomic_load(&c->acked) == s->posted
                                  : atomic_load(&c->head) - atomic_load(&c->tail) < s->ring) {
      atomic_store(&c->writer_waiting, 0);
      return -1;
    }
  }
  if (receiving) {
    ring_ctl_t *c = s->in_ctl;
    atomic_store(&c->reader_waiting, 1);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&c->head) != atomic_load(&c->tail)) {
      atomic_store(&c->reader_waiting, 0);
      return -1;
    }
  }
  /* On the doorbell (link->wake_fd); the executor watches the socket for death. */
  return POLLIN;
}

static coll_result_t shm_after_poll(coll_link_t *link, int fd, short revents) {
  shm_t *s = link->priv;
  char buf[256];
  if (fd == s->wake_in) {
    while (read(fd, buf, sizeof buf) > 0) {}
    return COLL_SUCCESS;
  }
  if (!(revents & (POLLIN | POLLHUP | POLLERR | POLLRDHUP))) return COLL_SUCCESS;
  /* Nothing is sent on the socket after setup: readable means EOF or reset. */
  ssize_t r;
  do { r = recv(link->fd, buf, sizeof buf, MSG_DONTWAIT); } while (r > 0 || (r < 0 && errno == EINTR));
  if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) s->dead = 1;
  return COLL_SUCCESS;
}

static void shm_close(coll_link_t *link) {
  shm_t *s = link->priv;
  if (s) {
    shm_free(s);
    link->priv = NULL;
  }
  link->wake_fd = -1;
  coll_transport_tcp.close(link);
}

const coll_transport_t coll_transport_shm = {
    .name = "shm",
    .can_connect = shm_can_connect,
    .send = shm_send,
    .recv = shm_recv,
    .close = shm_close,
    .wait_events = shm_wait_events,
    .after_poll = shm_after_poll,
    .recv_peek = shm_recv_peek,
    .recv_consume = shm_recv_consume,
    .sc_wanted = coll_shm_sc_wanted,
    .sc_post = coll_shm_sc_post,
    .sc_acked = coll_shm_sc_acked,
    .sc_can_read = coll_shm_sc_can_read,
    .sc_read = coll_shm_sc_read,
    .sc_done = coll_shm_sc_done,
};
