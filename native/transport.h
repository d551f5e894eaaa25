/*
 * transport.h -- a link to one peer, and the small vtable behind it.
 *
 * Per peer, the first transport in priority order whose can_connect says yes
 * wins (transport_select.c); today that is tcp for every peer, and the choice
 * is logged at INFO/NET. A link is a reliable, ordered byte stream: the
 * schedule executor (schedule.c) frames messages with the wire header and drives
 * the link with non-blocking partial send/recv, waiting in poll() on the fd
 * the link exposes. A memory-semantics transport (CUDA IPC) will add its own
 * entry points beside these; an algorithm never sees either.
 */
#ifndef COLL_TRANSPORT_H
#define COLL_TRANSPORT_H

#include <stddef.h>
#include <sys/uio.h>

#include "coll.h"

typedef struct coll_transport coll_transport_t;

typedef struct coll_link {
  const coll_transport_t *tp;
  coll_comm_t *comm;
  int peer;
  int fd;           /* pollable descriptor; -1 once closed */
  unsigned char *stage; /* receive staging for fused recv+reduce (COLL_STAGE_BYTES) */
} coll_link_t;

struct coll_transport {
  const char *name;
  /* Nonzero if this transport can reach `peer` from this rank. */
  int (*can_connect)(coll_comm_t *comm, int peer);
  /* Establishes the link (the lower rank connects, the higher accepts) by
   * `deadline` (coll_now() seconds). Never waits on the peer's progress other
   * than its listening socket, so any order of connects is deadlock-free. */
  coll_result_t (*connect)(coll_comm_t *comm, int peer, double deadline, coll_link_t *link);
  /* Non-blocking: moves as many bytes as possible, *n = bytes moved (0 when
   * the call would block). A closed or reset connection is COLL_REMOTE_ERROR
   * naming the peer. */
  coll_result_t (*send)(coll_link_t *link, const struct iovec *iov, int iovcnt, size_t *n);
  coll_result_t (*recv)(coll_link_t *link, const struct iovec *iov, int iovcnt, size_t *n);
  void (*close)(coll_link_t *link);
};

extern const coll_transport_t coll_transport_tcp;

/* Bytes of the staging buffer each link keeps for fused receive+reduce: small
 * enough to stay in L2 while it is reduced, large enough that one recv call
 * moves a useful amount. */
#define COLL_STAGE_BYTES (256 * 1024)

/* The link to `peer`, connecting it first if needed (transport_select.c). */
coll_result_t coll_link_get(coll_comm_t *comm, int peer, double deadline, coll_link_t **out);
/* Closes every link (after an error, so peers fail fast, and at destroy). */
void coll_links_close_all(coll_comm_t *comm);

/* The TCP listener every rank opens at creation (transport_tcp.c). */
coll_result_t coll_tcp_listen(coll_comm_t *comm, const char *bind_host);
/* Closes half-open handshakes and the listener. */
void coll_tcp_shutdown(coll_comm_t *comm);

#endif
