/*
 * base/stall.c -- the warning of a blocking wait that makes no progress.
 *
 * A rank that never calls (or hangs inside) a collective used to mean
 * COLLECTIVES_TIMEOUT (300 s by default) of silence on every other rank, then
 * the timeout error. An executor that has moved nothing for
 * COLLECTIVES_STALL_WARN seconds (auto: a quarter of the call's timeout, at
 * least 5 s, so that tests with short timeouts stay quiet) logs one WARN
 * naming the ranks it waits for and how far each got in this call, then
 * again each as long, until the deadline fails the call (Horovod's stall
 * check, for the core's own calls). The first collective between two ranks
 * waits in setting up their link instead (transport/select.c, tcp.c), which
 * warns the same way. Only the wait is watched: a large call that keeps
 * moving bytes never warns, however long it takes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/stall.h"

#include "base/comm_state.h"
#include "base/log.h"
#include "base/param.h"

void coll_stall_begin(coll_stall_t *w, double start, double deadline) {
  const char *v = coll_param_str(COLL_PARAM_STALL_WARN);
  double every;
  if (strcmp(v, "auto") == 0) {
    every = (deadline - start) / 4;
    if (every < 5) every = 5;
  } else {
    every = strtod(v, NULL); /* checked by collectives.config at init: a number >= 0 */
  }
  w->every = every > 0 ? every : 0;
  w->quiet_since = 0;
  w->next = w->every;
}

int coll_stall_due(coll_stall_t *w, double now) {
  if (w->every == 0) return 0;
  if (w->quiet_since == 0) { /* the first idle moment since the last progress */
    w->quiet_since = now;
    w->next = w->every;
    return 0;
  }
  if (now - w->quiet_since < w->next) return 0;
  w->next += w->every;
  return 1;
}

int coll_stall_cap_ms(const coll_stall_t *w, double now, int ms) {
  if (w->every == 0 || w->quiet_since == 0) return ms;
  double due = w->quiet_since + w->next - now;
  int m = due <= 0 ? 0 : due > 2e6 ? 2000000000 : (int)(due * 1000.0) + 1;
  return m < ms ? m : ms;
}

size_t coll_stall_name_peer(const coll_comm_t *comm, int peer, char *out, size_t cap) {
  const char *host = peer >= 0 && peer < comm->size ? comm->peers[peer].host_id : "";
  size_t hl = strcspn(host, "/"); /* a host id is "hostname/boot id" */
  int n = hl ? snprintf(out, cap, "rank %d on %.*s", peer, (int)hl, host)
             : snprintf(out, cap, "rank %d", peer);
  return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

void coll_stall_warn_link(const coll_comm_t *comm, int peer, double quiet, double left,
                          const char *why) {
  char who[160];
  coll_stall_name_peer(comm, peer, who, sizeof who);
  COLL_WARN("rank %d: setting up the link to %s has waited %.3g s: %s; it fails in %.3g s "
            "(its timeout) unless it comes (COLLECTIVES_STALL_WARN)",
            comm->rank, who, quiet, why, left);
}
