/*
 * stall.h -- the warning of a blocking wait that makes no progress (base/stall.c).
 *
 * A wait (a collective's executor, a link being set up) that has moved
 * nothing for `every` seconds (COLLECTIVES_STALL_WARN) warns, naming the
 * ranks it waits for, then again each `every` seconds until its deadline.
 * quiet_since = 0 whenever something moved.
 */
#ifndef COLL_STALL_H
#define COLL_STALL_H

#include <stddef.h>

#include "coll.h"

typedef struct {
  double every;       /* seconds without progress between warnings; 0: never */
  double quiet_since; /* when nothing started moving (0: it just moved) */
  double next;        /* quiet seconds at which the next warning is due */
} coll_stall_t;

void coll_stall_begin(coll_stall_t *w, double start, double deadline);
/* Called when the waiter is about to sleep: 1 when a warning is due now
 * (the next one is then scheduled). */
int coll_stall_due(coll_stall_t *w, double now);
/* A poll() timeout of ms shortened so that the waiter wakes for the next warning. */
int coll_stall_cap_ms(const coll_stall_t *w, double now, int ms);
/* "rank 3 on hostname" into out (cap bytes); returns the length written. */
size_t coll_stall_name_peer(const coll_comm_t *comm, int peer, char *out, size_t cap);
/* The warning of a link set-up that waits for `peer` (why: what it has not done). */
void coll_stall_warn_link(const coll_comm_t *comm, int peer, double quiet, double left,
                          const char *why);

#endif
