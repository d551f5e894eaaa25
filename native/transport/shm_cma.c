/*
 * transport/shm_cma.c -- one copy for large shared-memory messages.
 *
 * Through the rings a message is copied twice: into the ring by the sender,
 * out of it (or through the reduction) by the receiver. From
 * COLLECTIVES_SHM_SINGLE_COPY bytes up, the sender instead puts a descriptor
 * (address, length) on its ring behind a header flagged COLL_WIRE_SC_DESC,
 * and the receiver reads the bytes straight from the sender's memory with
 * process_vm_readv (Linux cross-memory attach, as OpenMPI's vader/smsc "cma"
 * does): into the destination for a plain receive, into the link's L2-sized
 * stage and through the reduction for a reducing one. It then counts the
 * descriptor as done in the ring's `acked` word and rings the sender's
 * doorbell if it sleeps; the sender's step completes only then, so its
 * buffer is never touched while the peer may still read it.
 *
 * Permission: process_vm_readv needs the same uid and ptrace access to the
 * peer (Yama's kernel.yama.ptrace_scope >= 1 forbids siblings, a container
 * without CAP_SYS_PTRACE may forbid it). Each side probes once per link as it
 * is set up: it reads the segment's random token at the address where the
 * peer mapped it (both written into the segment) and publishes in
 * seg->can_read whether it could. A sender only sends descriptors to a peer
 * that said yes, so a refusal costs nothing but the ring path, with one
 * warning per process naming the fix. The peer's pid comes from the segment
 * (a peer of this job: the link was authenticated); a pidfd taken before
 * the probe tells a read from a pid reused after the peer died.
 *
 * Hostile or buggy descriptors: the length must equal the bytes the
 * receive posted (the header's nbytes, itself checked against the
 * receive), and nothing beyond it is ever read; an address the peer does
 * not have is an EFAULT, reported naming the peer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/comm_state.h"
#include "base/log.h"
#include "base/param.h"
#include "base/status.h"
#include "transport/shm_priv.h"

/* The default threshold (COLLECTIVES_SHM_SINGLE_COPY=auto), bytes: where one
 * process_vm_readv beats two memcpys on the test VM (bench/README.md:
 * 6.8 GB/s against 12.5/2 at 256K, 3.9 against 14.0/2 at 64K). */
#define SC_AUTO_BYTES ((size_t)256 << 10)

/* The threshold in bytes, 0 for never; the parameter is read once. */
static size_t sc_threshold(void) {
  static _Atomic long long cached = -1;
  long long t = atomic_load_explicit(&cached, memory_order_relaxed);
  if (t >= 0) return (size_t)t;
  const char *v = coll_param_str(COLL_PARAM_SHM_SINGLE_COPY);
  t = strcmp(v, "auto") == 0 ? (long long)SC_AUTO_BYTES : coll_param_int(COLL_PARAM_SHM_SINGLE_COPY);
  if (t < 0) t = 0;
  atomic_store_explicit(&cached, t, memory_order_relaxed);
  return (size_t)t;
}

/* auto leaves single copy off on a host that runs more ranks than cores: a
 * sender then waits, holding its buffer, until the receiver is scheduled to
 * read it, where the ring would have let it go on. Measured on the 2-vCPU VM
 * at 4 ranks, allgather 1-16 MiB took 1.6-1.9x the CPU time with it
 * (bench/README.md). */
static int sc_auto_off(const coll_comm_t *comm) {
  return comm->oversubscribed && strcmp(coll_param_str(COLL_PARAM_SHM_SINGLE_COPY), "auto") == 0;
}

static int fault_is(const char *what) {
  return strcmp(coll_param_str(COLL_PARAM_SHM_CMA_FAULT), what) == 0;
}

void coll_shm_cma_probe(coll_link_t *link) {
  shm_t *s = link->priv;
  seg_t *seg = s->seg;
  int other = 1 - s->side;
  s->cma_read = 0;
  s->peer_pid = (pid_t)seg->pid[other];
  if (sc_threshold() == 0 || s->peer_pid <= 0) return; /* off: the peer never sends descriptors */
  /* The pidfd first: if the probe then reads the token, it is the peer's. */
  s->peer_pidfd = (int)syscall(SYS_pidfd_open, s->peer_pid, 0);
  uint64_t got = 0;
  ssize_t r = -1;
  int err = EPERM;
  if (!fault_is("refuse")) {
    struct iovec mine = {&got, sizeof got};
    struct iovec theirs = {(void *)(uintptr_t)(seg->addr[other] + offsetof(seg_t, token)), sizeof got};
    r = process_vm_readv(s->peer_pid, &mine, 1, &theirs, 1, 0);
    err = errno;
  }
  if (r != (ssize_t)sizeof got || got != seg->token) {
    if (s->peer_pidfd >= 0) close(s->peer_pidfd);
    s->peer_pidfd = -1;
    if (r < 0 && (err == EPERM || err == ENOSYS)) {
      static atomic_int told; /* once per process: every further link would repeat it */
      if (!atomic_exchange(&told, 1))
        COLL_WARN("rank %d: cannot read rank %d's memory with process_vm_readv (%s), so large "
                  "shared-memory messages are copied twice, through the ring. To allow one copy: "
                  "sysctl kernel.yama.ptrace_scope=0, or in a container docker run --cap-add "
                  "SYS_PTRACE; COLLECTIVES_SHM_SINGLE_COPY=0 skips the probe and this warning",
                  link->comm->rank, link->peer, strerror(err));
    }
    COLL_INFO(COLL_LOG_NET, "rank %d: no single copy from rank %d (%s)", link->comm->rank,
              link->peer, r < 0 ? strerror(err) : "another process at its pid");
    return;
  }
  s->cma_read = 1;
  atomic_store(&seg->can_read[s->side], 1);
  COLL_INFO(COLL_LOG_NET, "rank %d: single copy from rank %d (pid %d) from %zu bytes up",
            link->comm->rank, link->peer, (int)s->peer_pid, sc_threshold());
}

void coll_shm_cma_close(shm_t *s) {
  if (s->peer_pidfd >= 0) close(s->peer_pidfd);
  s->peer_pidfd = -1;
}

int coll_shm_sc_wanted(coll_link_t *link, size_t n) {
  shm_t *s = link->priv;
  size_t t = sc_threshold();
  return t && n >= t && atomic_load_explicit(&s->seg->can_read[1 - s->side], memory_order_relaxed) &&
         !sc_auto_off(link->comm);
}

void coll_shm_sc_post(coll_link_t *link, const void *src, size_t n, uint8_t *desc) {
  shm_t *s = link->priv;
  uint64_t addr = (uint64_t)(uintptr_t)src, len = (uint64_t)n;
  if (fault_is("overlong")) len += 4096;
  memcpy(desc, &addr, 8);
  memcpy(desc + 8, &len, 8);
  s->posted++;
}

int coll_shm_sc_waiting(coll_link_t *link) {
  shm_t *s = link->priv;
  return atomic_load_explicit(&s->out_ctl->acked, memory_order_acquire) != s->posted;
}

coll_result_t coll_shm_sc_acked(coll_link_t *link, int *acked) {
  shm_t *s = link->priv;
  *acked = !coll_shm_sc_waiting(link);
  if (!*acked && s->dead)
    return coll_error(link->comm, COLL_REMOTE_ERROR,
                      "rank %d: rank %d closed the connection (it exited or failed) before "
                      "reading a single-copy message from this rank", link->comm->rank, link->peer);
  return COLL_SUCCESS;
}

int coll_shm_sc_can_read(coll_link_t *link) {
  shm_t *s = link->priv;
  return s->cma_read;
}

coll_result_t coll_shm_sc_read(coll_link_t *link, const uint8_t *desc, size_t expect, size_t off,
                               void *dst, size_t len) {
  shm_t *s = link->priv;
  coll_comm_t *comm = link->comm;
  uint64_t addr, dlen;
  memcpy(&addr, desc, 8);
  memcpy(&dlen, desc + 8, 8);
  if (!s->cma_read)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: rank %d sent a single-copy descriptor, but this rank cannot read "
                      "its memory and never said it could", comm->rank, link->peer);
  if (dlen != (uint64_t)expect)
    return coll_error(comm, COLL_REMOTE_ERROR,
                      "rank %d: rank %d's single-copy descriptor names %llu bytes, the receive "
                      "posted for it expects %zu", comm->rank, link->peer,
                      (unsigned long long)dlen, expect);
  if (off > expect || len > expect - off)
    return coll_error(comm, COLL_INTERNAL_ERROR,
                      "rank %d: single-copy read of %zu bytes at %zu past a %zu-byte message",
                      comm->rank, len, off, expect);
  size_t done = 0;
  while (done < len) {
    struct iovec mine = {(char *)dst + done, len - done};
    struct iovec theirs = {(void *)(uintptr_t)(addr + off + done), len - done};
    ssize_t r = process_vm_readv(s->peer_pid, &mine, 1, &theirs, 1, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int err = r < 0 ? errno : EFAULT;
      if (err == ESRCH || s->dead)
        return coll_error(comm, COLL_REMOTE_ERROR,
                          "rank %d: rank %d closed the connection (it exited or failed) during a "
                          "single-copy transfer", comm->rank,
                          link->peer);
      return coll_error(comm, COLL_REMOTE_ERROR,
                        "rank %d: reading a single-copy message from rank %d failed at %zu of "
                        "%zu bytes: %s", comm->rank, link->peer, off + done, expect, strerror(err));
    }
    done += (size_t)r;
  }
  if (off + len == expect && s->peer_pidfd >= 0) {
    /* The peer still runs, so the bytes were its own and not a reused pid's. */
    struct pollfd p = {s->peer_pidfd, POLLIN, 0};
    if (poll(&p, 1, 0) > 0)
      return coll_error(comm, COLL_REMOTE_ERROR,
                        "rank %d: rank %d closed the connection (it exited or failed) during a "
                          "single-copy transfer", comm->rank,
                        link->peer);
  }
  return COLL_SUCCESS;
}

void coll_shm_sc_done(coll_link_t *link) {
  shm_t *s = link->priv;
  ring_ctl_t *c = s->in_ctl;
  atomic_fetch_add_explicit(&c->acked, 1, memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  coll_shm_wake_if_waiting(link, &c->writer_waiting);
}
