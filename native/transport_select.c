/* transport_select.c -- per peer, the first transport in priority order whose
 * can_connect says yes; the choice is logged at INFO/NET. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "comm.h"
#include "param.h"
#include "status.h"
#include "transport.h"

/* Priority order. Same-host transports (cuda_ipc, shm) go before tcp. */
static const coll_transport_t *const transports[] = {&coll_transport_tcp};
#define NTRANSPORTS (int)(sizeof transports / sizeof transports[0])

coll_result_t coll_link_get(coll_comm_t *comm, int peer, double deadline, coll_link_t **out) {
  coll_peer_t *p = &comm->peers[peer];
  if (p->link) { *out = p->link; return COLL_SUCCESS; }
  const char *forced = coll_param_str(COLL_PARAM_TRANSPORT);
  const coll_transport_t *tp = NULL;
  for (int i = 0; i < NTRANSPORTS && !tp; i++) {
    if (forced[0] && strcasecmp(forced, transports[i]->name) != 0) continue;
    if (transports[i]->can_connect(comm, peer)) tp = transports[i];
  }
  if (!tp)
    return coll_error(comm, COLL_INVALID_USAGE,
                      "rank %d: no transport can reach rank %d (address set? COLLECTIVES_TRANSPORT=%s)",
                      comm->rank, peer, forced);
  coll_link_t *link = calloc(1, sizeof *link);
  if (link) link->stage = malloc(COLL_STAGE_BYTES);
  if (!link || !link->stage) {
    if (link) free(link);
    return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory for a link", comm->rank);
  }
  link->tp = tp;
  link->comm = comm;
  link->peer = peer;
  link->fd = -1;
  coll_result_t res = tp->connect(comm, peer, deadline, link);
  if (res != COLL_SUCCESS) {
    free(link->stage);
    free(link);
    return res;
  }
  COLL_INFO(COLL_LOG_NET, "rank %d -> rank %d via %s (%s:%d)", comm->rank, peer, tp->name, p->host,
            p->port);
  p->link = link;
  *out = link;
  return COLL_SUCCESS;
}

void coll_links_close_all(coll_comm_t *comm) {
  for (int i = 0; i < comm->size; i++) {
    coll_peer_t *p = &comm->peers[i];
    if (p->link) {
      p->link->tp->close(p->link);
      free(p->link->stage);
      free(p->link);
      p->link = NULL;
    }
  }
}
