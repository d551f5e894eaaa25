/* topology.c -- host groups, local ranks and the host order (see topology.h). */
#include "algorithms/topology.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/comm_state.h"
#include "base/log.h"
#include "base/status.h"

void coll_topo_free(coll_topo_t *t) {
  free(t->host); /* one block: host, local, order, pos, first */
  memset(t, 0, sizeof *t);
}

int coll_topo_build(coll_topo_t *t, int n, const int *labels) {
  memset(t, 0, sizeof *t);
  int *mem = malloc(sizeof(int) * ((size_t)5 * (size_t)n + 1));
  if (!mem) return -1;
  t->n = n;
  t->host = mem;
  t->local = mem + n;
  t->order = mem + 2 * n;
  t->pos = mem + 3 * n;
  t->first = mem + 4 * n; /* at most n + 1 entries */
  /* Hosts by rank count, most first, ties in the order of their lowest
   * rank: so the shape of every schedule (which positions fold, which pair)
   * is the same whichever host rank 0 happens to be on. Labels first become
   * host numbers in lowest-rank order (quadratic, once per communicator). */
  int nh = 0;
  int *cnt = t->pos, *rank_of = t->order; /* scratch until filled below */
  for (int r = 0; r < n; r++) {
    int h = -1;
    for (int q = 0; q < r && h < 0; q++)
      if (labels[q] == labels[r]) h = t->local[q];
    if (h < 0) {
      h = nh++;
      cnt[h] = 0;
    }
    t->local[r] = h; /* lowest-rank host number, for now */
    cnt[h]++;
  }
  /* rank_of[k]: the lowest-rank number of the k-th host in the final order
   * (insertion sort: stable, so ties keep lowest-rank order). */
  for (int h = 0; h < nh; h++) {
    int k = h;
    while (k > 0 && cnt[rank_of[k - 1]] < cnt[h]) {
      rank_of[k] = rank_of[k - 1];
      k--;
    }
    rank_of[k] = h;
  }
  for (int k = 0; k < nh; k++) t->first[rank_of[k]] = k; /* first: scratch, old -> new */
  for (int r = 0; r < n; r++) t->host[r] = t->first[t->local[r]];
  t->nhosts = nh;
  /* Counting sort by host keeps rank order inside each host. */
  for (int h = 0; h <= nh; h++) t->first[h] = 0;
  for (int r = 0; r < n; r++) t->first[t->host[r] + 1]++;
  for (int h = 0; h < nh; h++) t->first[h + 1] += t->first[h];
  t->min_local = n;
  t->max_local = 0;
  for (int h = 0; h < nh; h++) {
    int l = t->first[h + 1] - t->first[h];
    if (l < t->min_local) t->min_local = l;
    if (l > t->max_local) t->max_local = l;
  }
  int *fill = t->pos; /* scratch: next free position of each host, then pos proper */
  for (int h = 0; h < nh; h++) fill[h] = t->first[h];
  for (int r = 0; r < n; r++) {
    int v = fill[t->host[r]]++;
    t->order[v] = r;
    t->local[r] = v - t->first[t->host[r]];
  }
  for (int v = 0; v < n; v++) t->pos[t->order[v]] = v;
  return 0;
}

const coll_topo_t *coll_comm_topo(coll_comm_t *comm) {
  if (comm->topo) return comm->topo;
  int n = comm->size;
  coll_topo_t *t = calloc(1, sizeof *t);
  int *labels = malloc(sizeof(int) * (size_t)n);
  uint64_t *hash = malloc(sizeof(uint64_t) * (size_t)n);
  if (t && labels && hash) {
    /* label = the lowest rank with the same (known) host id; ids are
     * compared by a hash first (FNV-1a), so thousands of ranks cost
     * integer comparisons, not string ones. */
    for (int r = 0; r < n; r++) {
      uint64_t h = 1469598103934665603ull;
      for (const char *c = comm->peers[r].host_id; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
      hash[r] = h;
    }
    for (int r = 0; r < n; r++) {
      const char *id = comm->peers[r].host_id;
      labels[r] = r;
      for (int q = 0; id[0] && q < r; q++)
        if (hash[q] == hash[r] && strcmp(comm->peers[q].host_id, id) == 0) {
          labels[r] = labels[q];
          break;
        }
    }
    free(hash);
    hash = NULL;
    if (coll_topo_build(t, n, labels) == 0) {
      free(labels);
      comm->topo = t;
      COLL_INFO(COLL_LOG_INIT, "rank %d: %d rank%s on %d host%s (%d to %d per host); host %d, local rank %d",
                comm->rank, n, n == 1 ? "" : "s", t->nhosts, t->nhosts == 1 ? "" : "s",
                t->min_local, t->max_local, t->host[comm->rank], t->local[comm->rank]);
      return t;
    }
  }
  free(labels);
  free(hash);
  free(t);
  coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory for the topology", comm->rank);
  return NULL;
}

void coll_comm_topo_forget(coll_comm_t *comm) {
  if (!comm->topo) return;
  coll_topo_free(comm->topo);
  free(comm->topo);
  comm->topo = NULL;
}
