/* generation.c -- the communicator generation in every message header
 * (transport/wire.h): the elastic layer (collectives/elastic/membership.py) numbers the
 * worlds a job forms after shrinking or growing, and a message from an earlier
 * one is refused by the receiver's header check, naming both generations. */
#include "base/comm_state.h"
#include "coll.h"

coll_result_t coll_comm_set_generation(coll_comm_t *comm, uint32_t gen) {
  if (!comm || comm->root) return COLL_INVALID_ARGUMENT; /* a sub follows its root's */
  pthread_mutex_lock(&comm->mu);
  /* Only before traffic: a change mid-stream would make the peers' next headers stale. */
  int idle = comm->seq == 0 && !comm->p2p && !comm->busy && !comm->qhead;
  if (idle) comm->gen = gen;
  pthread_mutex_unlock(&comm->mu);
  return idle ? COLL_SUCCESS : COLL_INVALID_USAGE;
}

uint32_t coll_comm_generation(const coll_comm_t *comm) { return coll_comm_root((coll_comm_t *)comm)->gen; }
