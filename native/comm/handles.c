/*
 * handles.c -- communicators by number, for callers that outlive them.
 *
 * A compiled JAX function keeps the attributes it was traced with, and may be
 * called after the communicator it names was freed: a raw coll_comm_t* there
 * would be a dangling pointer. Such callers hold an id instead (never reused
 * in the process) and look it up on every call; a freed communicator's id
 * finds nothing, and the caller raises a clear error.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "coll.h"

typedef struct {
  int64_t id;
  coll_comm_t *comm;
} entry_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static entry_t *table;
static size_t used, cap;
static int64_t next_id = 1;

int64_t coll_comm_id(coll_comm_t *comm) {
  if (!comm) return 0;
  int64_t id = 0;
  pthread_mutex_lock(&mu);
  for (size_t i = 0; i < used && !id; i++)
    if (table[i].comm == comm) id = table[i].id;
  if (!id) {
    if (used == cap) {
      size_t ncap = cap ? 2 * cap : 16;
      entry_t *t = realloc(table, ncap * sizeof *t);
      if (t) { table = t; cap = ncap; }
    }
    if (used < cap) {
      id = next_id++;
      table[used++] = (entry_t){id, comm};
    }
  }
  pthread_mutex_unlock(&mu);
  return id;
}

coll_comm_t *coll_comm_from_id(int64_t id) {
  coll_comm_t *comm = NULL;
  pthread_mutex_lock(&mu);
  for (size_t i = 0; i < used && !comm; i++)
    if (table[i].id == id) comm = table[i].comm;
  pthread_mutex_unlock(&mu);
  return comm;
}

void coll_comm_forget_id(coll_comm_t *comm) {
  pthread_mutex_lock(&mu);
  for (size_t i = 0; i < used; i++)
    if (table[i].comm == comm) {
      table[i] = table[--used];
      break;
    }
  pthread_mutex_unlock(&mu);
}
