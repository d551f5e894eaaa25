/*
 * topology.h -- which ranks share a host, derived alike on every rank.
 *
 * At rendezvous every rank publishes its host id (hostname + boot id,
 * collectives/_world.py) and every rank sets all of them on its communicator
 * (coll_comm_set_peer_host), so every rank holds the same list and derives
 * the same picture from it with the pure arithmetic below:
 *
 *   hosts       numbered by rank count, most first, ties in the order of
 *               their lowest rank (so which host rank 0 is on changes
 *               nothing)
 *   local rank  a rank's index among its host's ranks, in rank order
 *   order       the ranks host by host (host 0's ranks, then host 1's, ...);
 *               pos is its inverse. Rings, chains and butterflies run over
 *               positions, not rank numbers, so that neighbours share a host
 *               whatever the numbering (block, cyclic, random): a cyclic job
 *               costs what a block job costs.
 *
 * A rank with an unknown host id ("") is a host of its own. On one host the
 * order is the identity, so every single-host schedule is unchanged.
 *
 * Hosts may run different numbers of ranks (2 + 3). The two-level
 * collectives cut the buffer into slices and give slice j, on host h, to the
 * local rank j mod L_h (L_h = the host's rank count): a host with fewer ranks
 * gives some of them several slices; no host is refused.
 */
#ifndef COLL_TOPOLOGY_H
#define COLL_TOPOLOGY_H

#include "coll.h"

typedef struct coll_topo {
  int n, nhosts;
  int *host;   /* host index of each rank */
  int *local;  /* local rank of each rank */
  int *order;  /* ranks host by host; host h's are order[first[h] .. first[h+1]) */
  int *first;  /* nhosts + 1 entries */
  int *pos;    /* pos[order[i]] == i */
  int min_local, max_local; /* fewest and most ranks on one host */
} coll_topo_t;

/* Builds t for n ranks where labels[a] == labels[b] iff ranks a and b share a
 * host (any ints). Returns 0, or -1 when out of memory (t is then empty). */
int coll_topo_build(coll_topo_t *t, int n, const int *labels);
void coll_topo_free(coll_topo_t *t);

static inline int coll_topo_lsize(const coll_topo_t *t, int h) { return t->first[h + 1] - t->first[h]; }
/* Rank with local rank l on host h. */
static inline int coll_topo_rank(const coll_topo_t *t, int h, int l) { return t->order[t->first[h] + l]; }
/* The rank that owns slice j on host h (local rank j mod L_h). */
static inline int coll_topo_owner(const coll_topo_t *t, int h, int j) {
  return coll_topo_rank(t, h, j % coll_topo_lsize(t, h));
}
/* Whether collectives go in two levels: two or more hosts, one with two or more ranks. */
static inline int coll_topo_two_level(const coll_topo_t *t) {
  return t && t->nhosts >= 2 && t->max_local >= 2;
}
/* Position of rank r in the host order and the rank at position v; with no
 * topology (t NULL) both are the identity. */
static inline int coll_topo_pos(const coll_topo_t *t, int r) { return t ? t->pos[r] : r; }
static inline int coll_topo_at(const coll_topo_t *t, int v) { return t ? t->order[v] : v; }

/* The communicator's topology, derived from its peers' host ids on first use
 * and kept until a host id changes (comm.c frees it then); NULL only when out
 * of memory, which fails the collective asking (its error text says so). */
const coll_topo_t *coll_comm_topo(coll_comm_t *comm);
/* Frees what coll_comm_topo kept (comm.c: on a host id change and at destroy). */
void coll_comm_topo_forget(coll_comm_t *comm);

#endif
