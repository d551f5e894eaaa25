/*
 * transport/unread.c -- bytes handed back to a link, and the reads that return
 * them first.
 *
 * A link is one ordered byte stream shared by collectives and point-to-point
 * messages. A collective's executor reads a header together with the
 * payload it expects (one readv), so when the header turns out to be a
 * point-to-point message's, the bytes read with it may run past that
 * message: they are handed back here. And the point-to-point engine, which
 * reads headers alone, hands back a collective's header it must not consume.
 * Every reader of a link goes through these calls, so no byte is lost or
 * read twice; the common case (nothing handed back) costs one test.
 */
#include <stdlib.h>
#include <string.h>

#include "base/comm_state.h"
#include "base/status.h"
#include "transport/transport.h"

static size_t held(const coll_link_t *link) { return link->unread_len - link->unread_off; }

coll_result_t coll_link_recv(coll_link_t *link, const struct iovec *iov, int iovcnt, size_t *n) {
  if (!held(link)) return link->tp->recv(link, iov, iovcnt, n);
  size_t got = 0;
  for (int i = 0; i < iovcnt && held(link); i++) {
    size_t take = iov[i].iov_len < held(link) ? iov[i].iov_len : held(link);
    memcpy(iov[i].iov_base, link->unread + link->unread_off, take);
    link->unread_off += take;
    got += take;
    if (take < iov[i].iov_len) break;
  }
  if (!held(link)) { free(link->unread); link->unread = NULL; link->unread_len = link->unread_off = 0; }
  *n = got;
  return COLL_SUCCESS;
}

coll_result_t coll_link_peek(coll_link_t *link, const void **p, size_t *n) {
  if (!held(link)) return link->tp->recv_peek(link, p, n);
  *p = link->unread + link->unread_off;
  *n = held(link);
  return COLL_SUCCESS;
}

void coll_link_consume(coll_link_t *link, size_t n) {
  if (!held(link)) { link->tp->recv_consume(link, n); return; }
  link->unread_off += n;
  if (!held(link)) { free(link->unread); link->unread = NULL; link->unread_len = link->unread_off = 0; }
}

int coll_link_wait_events(coll_link_t *link, int sending, int receiving) {
  if (receiving && held(link)) return -1; /* readable now */
  return link->tp->wait_events(link, sending, receiving);
}

coll_result_t coll_link_unread(coll_link_t *link, const void *p, size_t n) {
  if (n == 0) return COLL_SUCCESS;
  size_t rest = held(link);
  unsigned char *buf = malloc(n + rest);
  if (!buf)
    return coll_error(link->comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", link->comm->rank);
  memcpy(buf, p, n);
  if (rest) memcpy(buf + n, link->unread + link->unread_off, rest);
  free(link->unread);
  link->unread = buf;
  link->unread_len = n + rest;
  link->unread_off = 0;
  return COLL_SUCCESS;
}
