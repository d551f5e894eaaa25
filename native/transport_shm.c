/*
 * transport_shm.c -- links through shared memory between ranks on one host.
 *
 * A link owns one segment in /dev/shm with two rings, one per direction
 * (dir 0: lower rank -> higher rank). Each ring is a single-producer,
 * single-consumer byte stream: the writer copies into it and advances head,
 * the reader consumes and advances tail; the executor reduces straight out of
 * the ring (recv_peek), so a reduced byte is copied once instead of the
 * twice a socket costs (into the kernel, out of it).
 *
 * Sleeping without spinning: a side that finds nothing to do sets its
 * "waiting" flag, re-checks the ring, and sleeps in poll() on the link's TCP
 * socket; the other side, after moving head or tail, swaps the flag to 0 and
 * if it was set sends one doorbell byte on the socket. (Store the index, full
 * fence, load the flag -- against -- store the flag, full fence, load the
 * index: one of the two always sees the other, so no wake-up is lost.) The
 * socket also carries death: EOF on it is the peer closing or dying.
 *
 * Setup, over the TCP link right after its hello: the connecting side creates
 * the segment, writes a random token into it and offers its path; the
 * accepting side maps it, checks the token (so a different /dev/shm, as in
 * another container, is detected), unlinks it and answers yes; on any doubt it
 * answers no and both sides keep plain TCP.
 */
#define _GNU_SOURCE
#include <dirent.h>
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

#include "comm.h"
#include "param.h"
#include "status.h"
#include "transport.h"

typedef struct {
  _Atomic uint64_t head; /* bytes written, by the writer */
  char pad0[56];
  _Atomic uint64_t tail; /* bytes consumed, by the reader */
  char pad1[56];
  _Atomic uint32_t reader_waiting;
  _Atomic uint32_t writer_waiting;
  char pad2[56];
} ring_ctl_t;

#define SEG_MAGIC 0x4d48534cu /* "LSHM" */

typedef struct {
  uint32_t magic;
  uint32_t ring_bytes;
  uint64_t token;
  char pad[48];
  ring_ctl_t ctl[2];
  /* then ring 0 data, ring 1 data */
} seg_t;

typedef struct {
  seg_t *seg;
  size_t map_bytes;
  size_t ring;          /* bytes per ring, a power of two */
  ring_ctl_t *out_ctl, *in_ctl;
  unsigned char *out, *in;
  char path[80];        /* connecting side, until settled */
  int dead;             /* the socket reported EOF */
} shm_t;

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
  s->ring = ring_bytes_param();
  s->map_bytes = sizeof(seg_t) + 2 * s->ring;
  uint64_t token = ((uint64_t)rand() << 32) ^ (uint64_t)rand() ^ ((uint64_t)getpid() << 16) ^
                   (uint64_t)(coll_now() * 1e9);
  snprintf(s->path, sizeof s->path, "/dev/shm/collectives-%d-%d-%d-%llx", (int)getpid(),
           comm->rank, link->peer, (unsigned long long)token);
  int fd = open(s->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)s->map_bytes) != 0) {
    COLL_INFO(COLL_LOG_NET, "rank %d: no shared memory for rank %d (%s): using tcp", comm->rank,
              link->peer, strerror(errno));
    if (fd >= 0) { close(fd); unlink(s->path); }
    free(s);
    return COLL_SUCCESS;
  }
  void *p = mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    unlink(s->path);
    free(s);
    return COLL_SUCCESS;
  }
  s->seg = p;
  s->seg->magic = SEG_MAGIC;
  s->seg->ring_bytes = (uint32_t)s->ring;
  s->seg->token = token;
  map_rings(s, 1);
  link->priv = s;
  uint32_t kind = 1;
  memcpy(offer, &kind, 4);
  memcpy(offer + 8, &token, 8);
  memcpy(offer + 16, s->path, strlen(s->path) + 1);
  return COLL_SUCCESS;
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
  if (kind != 1 || !allowed || strncmp(path, "/dev/shm/collectives-", 21) != 0) return COLL_SUCCESS;
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return COLL_SUCCESS;
  struct stat st;
  void *p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && (size_t)st.st_size > sizeof(seg_t))
    p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
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
  s->ring = ring;
  s->map_bytes = (size_t)st.st_size;
  map_rings(s, 0);
  unlink(path); /* both sides have it mapped; nothing left to clean up on a crash */
  link->priv = s;
  *ok = 1;
  return COLL_SUCCESS;
}

void coll_shm_settle(coll_link_t *link, int ok) {
  shm_t *s = link->priv;
  if (!s) return;
  unlink(s->path); /* the peer unlinked it already on success; this covers refusal */
  if (!ok) {
    munmap(s->seg, s->map_bytes);
    free(s);
    link->priv = NULL;
  }
}

static void ring_doorbell(coll_link_t *link) {
  char b = 1;
  /* A full socket buffer already holds doorbells the peer will read. */
  (void)send(link->fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static coll_result_t shm_dead(coll_link_t *link) {
  return coll_error(link->comm, COLL_REMOTE_ERROR,
                    "rank %d: rank %d closed the connection (it exited or failed)", link->comm->rank,
                    link->peer);
}

static coll_result_t shm_send(coll_link_t *link, const struct iovec *iov, int iovcnt, size_t *n) {
  shm_t *s = link->priv;
  *n = 0;
  if (s->dead) return shm_dead(link);
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
    if (atomic_exchange(&c->reader_waiting, 0)) ring_doorbell(link);
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
  if (avail == 0 && s->dead) return shm_dead(link);
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
  if (atomic_exchange(&c->writer_waiting, 0)) ring_doorbell(link);
}

static coll_result_t shm_recv(coll_link_t *link, const struct iovec *iov, int iovcnt, size_t *n) {
  size_t moved = 0;
  *n = 0;
  for (int i = 0; i < iovcnt; i++) {
    size_t off = 0;
    while (off < iov[i].iov_len) {
      const void *p = NULL;
      size_t avail = 0;
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
    if (atomic_load(&c->head) - atomic_load(&c->tail) < s->ring) {
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
  /* Doorbells (and the peer's death) arrive on the socket either way. */
  return POLLIN;
}

static coll_result_t shm_after_poll(coll_link_t *link, short revents) {
  shm_t *s = link->priv;
  if (!(revents & (POLLIN | POLLHUP | POLLERR))) return COLL_SUCCESS;
  char buf[256];
  for (;;) {
    ssize_t r = recv(link->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0) continue;
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) s->dead = 1;
    break;
  }
  return COLL_SUCCESS;
}

static void shm_close(coll_link_t *link) {
  shm_t *s = link->priv;
  if (s) {
    munmap(s->seg, s->map_bytes);
    free(s);
    link->priv = NULL;
  }
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
};
