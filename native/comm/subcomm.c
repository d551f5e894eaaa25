/*
 * subcomm.c -- communicators over a subset of ranks (split, dup) that share
 * their root's links.
 *
 * A subcommunicator is a coll_comm_t with its own rank, size, sequence
 * number and context id, whose peers[i].link are the root's links to the
 * world ranks world[i] (base/comm_state.h). Everything that owns a descriptor or a
 * thread stays on the root: the listener, the links, the lock and the
 * request queue with its progress thread, the point-to-point engine. So
 * making a subcommunicator opens no socket; a link the root has not opened
 * yet is opened on the root when the subcommunicator first needs it
 * (transport/select.c), and serves both from then on.
 *
 * Messages of different communicators on one link are kept apart by order
 * and by the context id in every header: collectives on every communicator
 * are called in the same order on every rank (MPI's rule), a link is a FIFO
 * stream, and a collective's receive checks the context id with the rest of
 * the header, so a rank that broke the order gets an error naming both
 * contexts instead of another communicator's bytes. Point-to-point messages
 * carry the context too and are matched only by receives posted on the same
 * communicator.
 *
 * Threads: calls on a root and on every communicator over it are serialized
 * on the root's lock (a blocking call on a subcommunicator waits for the
 * root's queued requests, as one on the root does); using them from several
 * threads is safe, not concurrent.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/comm_state.h"
#include "algorithms/topology.h"
#include "base/param.h"
#include "base/status.h"
#include "cuda/cuda.h"
#include "transport/transport.h"

typedef struct {
  int color, key, rank;
} member_t;

static int member_cmp(const void *pa, const void *pb) {
  const member_t *a = pa, *b = pb;
  if (a->key != b->key) return a->key < b->key ? -1 : 1;
  return a->rank < b->rank ? -1 : a->rank > b->rank;
}

/* The context id all members derive alike: FNV-1a over the parent's
 * context, its split counter and the color; never 0 (a root's). */
static uint32_t derive_ctx(uint32_t parent, uint32_t counter, int color) {
  uint32_t words[3] = {parent, counter, (uint32_t)color}, h = 2166136261u;
  for (int w = 0; w < 3; w++)
    for (int i = 0; i < 4; i++) {
      h ^= (words[w] >> (8 * i)) & 0xffu;
      h *= 16777619u;
    }
  return h ? h : 1;
}

static coll_result_t make_sub(coll_comm_t *parent, const member_t *m, int n, int me, int color,
                              uint32_t counter, coll_comm_t **out) {
  coll_comm_t *root = coll_comm_root(parent);
  coll_comm_t *c = calloc(1, sizeof *c);
  if (c) c->peers = calloc((size_t)n, sizeof *c->peers);
  if (c && c->peers) c->world = malloc((size_t)n * sizeof *c->world);
  if (c && c->world) c->local = malloc((size_t)root->size * sizeof *c->local);
  if (!c || !c->local) {
    if (c) { free(c->peers); free(c->world); free(c); }
    return coll_error(parent, COLL_SYSTEM_ERROR, "rank %d: out of memory for a subcommunicator",
                      parent->rank);
  }
  for (int r = 0; r < root->size; r++) c->local[r] = -1;
  for (int i = 0; i < n; i++) {
    int w = parent->world ? parent->world[m[i].rank] : m[i].rank;
    c->world[i] = w;
    c->local[w] = i;
    coll_peer_t *p = &c->peers[i], *rp = &root->peers[w];
    memcpy(p->host, rp->host, sizeof p->host);
    p->port = rp->port;
    memcpy(p->host_id, rp->host_id, sizeof p->host_id);
    p->link = rp->link; /* NULL until needed: fetched through the root */
  }
  c->rank = me;
  c->size = n;
  memcpy(c->id, root->id, sizeof c->id);
  memcpy(c->link_key, root->link_key, sizeof c->link_key);
  c->listen_fd = -1;
  c->abort_from = -1;
  c->timeout = parent->timeout;
  c->segment_bytes = parent->segment_bytes;
  c->sockbuf = parent->sockbuf;
  c->spin = parent->spin;
  c->oversubscribed = parent->oversubscribed;
  c->job_oversubscribed = parent->job_oversubscribed;
  c->root = root;
  c->parent = parent;
  c->ctx = derive_ctx(parent->ctx, counter, color);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  parent->nchildren++;
  COLL_INFO(COLL_LOG_INIT, "rank %d: subcommunicator context 0x%08x, rank %d of %d", root->rank,
            c->ctx, me, n);
  *out = c;
  return COLL_SUCCESS;
}

coll_result_t coll_comm_split(coll_comm_t *comm, int color, int key, double timeout,
                              coll_comm_t **out) {
  *out = NULL;
  comm->err_set = 0;
  if (color < 0 && color != COLL_UNDEFINED)
    return coll_error(comm, COLL_INVALID_ARGUMENT,
                      "split: color %d must be >= 0 or UNDEFINED", color);
  int n = comm->size;
  int *all = malloc((size_t)n * 2 * sizeof *all);
  size_t *cd = malloc((size_t)n * 2 * sizeof *cd);
  member_t *m = malloc((size_t)n * sizeof *m);
  coll_result_t res = COLL_SUCCESS;
  if (!all || !cd || !m) {
    res = coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
    goto out;
  }
  int mine[2] = {color, key};
  for (int i = 0; i < n; i++) {
    cd[i] = 2;
    cd[n + i] = (size_t)(2 * i);
  }
  coll_args_t a;
  memset(&a, 0, sizeof a);
  a.sendbuf = mine;
  a.recvbuf = all;
  a.count = 2;
  a.counts = cd;
  a.displs = cd + n;
  a.dtype = COLL_INT32;
  a.timeout = timeout;
  if (n == 1) memcpy(all, mine, sizeof mine);
  else if ((res = coll_allgatherv(comm, &a)) != COLL_SUCCESS) goto out;
  /* Every rank counts the split, members or not, so the next one's context
   * ids agree. */
  uint32_t counter = comm->nsplits++;
  int k = 0, me = -1;
  for (int i = 0; i < n; i++) {
    int c = all[2 * i];
    if (c < 0 && c != COLL_UNDEFINED) { /* from a peer: checked, not trusted */
      res = coll_error(comm, COLL_REMOTE_ERROR, "rank %d: split: rank %d sent color %d",
                       comm->rank, i, c);
      goto out;
    }
    if (color == COLL_UNDEFINED || c != color) continue;
    m[k] = (member_t){c, all[2 * i + 1], i};
    k++;
  }
  if (color == COLL_UNDEFINED) goto out;
  qsort(m, (size_t)k, sizeof *m, member_cmp);
  for (int i = 0; i < k; i++)
    if (m[i].rank == comm->rank) me = i;
  if (me < 0) {
    res = coll_error(comm, COLL_INTERNAL_ERROR, "rank %d: split lost this rank", comm->rank);
    goto out;
  }
  pthread_mutex_lock(&coll_comm_root(comm)->mu); /* nchildren: freed from any thread */
  res = make_sub(comm, m, k, me, color, counter, out);
  pthread_mutex_unlock(&coll_comm_root(comm)->mu);
out:
  free(all);
  free(cd);
  free(m);
  return res;
}

coll_result_t coll_comm_dup(coll_comm_t *comm, double timeout, coll_comm_t **out) {
  return coll_comm_split(comm, 0, comm->rank, timeout, out);
}

/* Not a collective: every member passes the same ranks and tag, non-members
 * call nothing (torch's new_group creates a backend only on its members).
 * The context mixes the tag with a color no split uses, so it differs from
 * the contexts of comm's splits (up to a 32-bit hash collision). */
#define GROUP_COLOR (-3)
coll_result_t coll_comm_create_group(coll_comm_t *comm, const int *ranks, int n, uint32_t tag,
                                     coll_comm_t **out) {
  *out = NULL;
  comm->err_set = 0;
  if (n < 1 || n > comm->size)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "create_group: %d ranks, expected 1..%d", n,
                      comm->size);
  member_t *m = malloc((size_t)n * sizeof *m);
  char *seen = calloc((size_t)comm->size, 1);
  coll_result_t res = COLL_SUCCESS;
  int me = -1;
  if (!m || !seen) {
    res = coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= comm->size || seen[ranks[i]]) {
      res = coll_error(comm, COLL_INVALID_ARGUMENT,
                       "create_group: rank %d at position %d is out of [0, %d) or repeated",
                       ranks[i], i, comm->size);
      goto out;
    }
    seen[ranks[i]] = 1;
    m[i] = (member_t){GROUP_COLOR, i, ranks[i]};
    if (ranks[i] == comm->rank) me = i;
  }
  if (me < 0) {
    res = coll_error(comm, COLL_INVALID_ARGUMENT, "create_group: rank %d is not in the group",
                     comm->rank);
    goto out;
  }
  pthread_mutex_lock(&coll_comm_root(comm)->mu); /* nchildren: freed from any thread */
  res = make_sub(comm, m, n, me, GROUP_COLOR, tag, out);
  pthread_mutex_unlock(&coll_comm_root(comm)->mu);
out:
  free(m);
  free(seen);
  return res;
}

void coll_subcomm_explain(coll_comm_t *comm) {
  if (!comm->root) return;
  if (!comm->err[0]) memcpy(comm->err, comm->root->err, sizeof comm->err);
  if (strstr(comm->err, "[on subcommunicator")) return;
  char ranks[200];
  size_t used = 0;
  ranks[0] = 0;
  for (int i = 0; i < comm->size && used + 16 < sizeof ranks; i++)
    used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", i ? "," : "", comm->world[i]);
  if (used + 16 >= sizeof ranks) snprintf(ranks + used, sizeof ranks - used, ",...");
  size_t len = strlen(comm->err);
  snprintf(comm->err + len, sizeof comm->err - len,
           " [on subcommunicator 0x%08x: this is its rank %d of %d (world rank %d); its ranks "
           "0..%d are world ranks %s]",
           comm->ctx, comm->rank, comm->size, comm->world[comm->rank], comm->size - 1, ranks);
  comm->err_set = 1;
}

/* Frees a subcommunicator (or a zombie whose last subcommunicator went) and
 * counts it out of its parent, freeing that too if it is a zombie left alone. */
static void free_zombie(coll_comm_t *comm) {
  coll_comm_t *parent = comm->parent, *root = comm->root;
  int last = 0;
  if (parent) {
    pthread_mutex_lock(&root->mu);
    last = --parent->nchildren == 0 && parent->zombie;
    pthread_mutex_unlock(&root->mu);
  }
  pthread_mutex_destroy(&comm->mu);
  pthread_cond_destroy(&comm->cv);
  free(comm->world);
  free(comm->local);
  free(comm->peers);
  free(comm);
  if (last) free_zombie(parent);
}

void coll_subcomm_destroy(coll_comm_t *comm) {
  coll_comm_t *root = comm->root;
  /* Wait until no call runs over the shared links and none of comm's
   * requests is queued (the caller waited for its own). */
  pthread_mutex_lock(&root->mu);
  while (root->busy) pthread_cond_wait(&root->cv, &root->mu);
  for (int again = 1; again;) {
    again = 0;
    for (coll_request_t *r = root->qhead; r; r = r->next)
      if (r->comm == comm) again = 1;
    if (again) pthread_cond_wait(&root->cv, &root->mu);
  }
  pthread_mutex_unlock(&root->mu);
  coll_comm_topo_forget(comm);
  free(comm->keep.steps);
  free(comm->keep.edges);
  free(comm->keep.scratch);
  comm->keep.steps = comm->keep.edges = comm->keep.scratch = NULL;
  coll_cuda_destroy(comm); /* its own stream and pools, if it ran on a GPU */
  coll_p2p_unmatched(root, comm->local, 1); /* their status must not read freed memory */
  if (!coll_subcomm_keep(comm)) free_zombie(comm);
}

int coll_subcomm_keep(coll_comm_t *comm) {
  coll_comm_t *L = coll_comm_root(comm);
  if (L != comm) pthread_mutex_lock(&L->mu);
  int keep = comm->nchildren > 0;
  if (keep) {
    comm->zombie = 1;
    comm->broken = 1;
    if (!comm->broken_code) comm->broken_code = COLL_INVALID_USAGE;
  }
  if (L != comm) pthread_mutex_unlock(&L->mu);
  return keep;
}

coll_result_t coll_comm_free(coll_comm_t *comm) {
  comm->err_set = 0;
  if (comm->nchildren > 0)
    return coll_error(comm, COLL_INVALID_USAGE,
                      "rank %d: cannot free a communicator while %d subcommunicator%s made from "
                      "it %s alive: free them first",
                      comm->rank, comm->nchildren, comm->nchildren == 1 ? "" : "s",
                      comm->nchildren == 1 ? "is" : "are");
  int pending = comm->root ? coll_p2p_unmatched(comm->root, comm->local, 0) : 0;
  if (pending > 0)
    return coll_error(comm, COLL_INVALID_USAGE,
                      "rank %d: cannot free a communicator with %d receive%s still posted on it: "
                      "wait for or cancel them first", comm->rank, pending, pending == 1 ? "" : "s");
  coll_comm_destroy(comm);
  return COLL_SUCCESS;
}

int coll_comm_world_rank(const coll_comm_t *comm, int rank) {
  if (rank < 0 || rank >= comm->size) return -1;
  return comm->world ? comm->world[rank] : rank;
}

int coll_comm_local_rank(const coll_comm_t *comm, int world_rank) {
  const coll_comm_t *root = comm->root ? comm->root : comm;
  if (world_rank < 0 || world_rank >= root->size) return -1;
  return comm->local ? comm->local[world_rank] : world_rank;
}

uint32_t coll_comm_ctx(const coll_comm_t *comm) { return comm->ctx; }
int coll_comm_rank(const coll_comm_t *comm) { return comm->rank; }
int coll_comm_size(const coll_comm_t *comm) { return comm->size; }
