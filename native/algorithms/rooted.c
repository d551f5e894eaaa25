/*
 * rooted.c -- the rooted collectives: reduce, gatherv, scatterv (contracts in
 * coll.h). Host memory only.
 *
 * reduce: a binomial tree toward the root (v = (r - root) mod n, r and root
 * being host-order positions (topology.h); the parent of v clears its
 * highest set bit), pipelined in segments. Each rank folds
 * its children into an accumulator, smallest subtree first (it finishes
 * first), then sends the accumulator up:
 *
 *   n = 8, root 0:   7 -> 3 -> 1 -> 0,   5 -> 1,   6 -> 2 -> 0,   4 -> 0
 *   per segment j:   acc[j] = in[j] op child_1[j] op child_2[j] ...; send acc[j]
 *
 *   cost: ceil(log2 n) rounds: log2(n)·alpha + log2(n)·S·beta unpipelined,
 *   about (log2(n) + nseg)·(alpha + S/nseg·beta) with nseg segments.
 *   The accumulator is recvbuf at the root and a scratch copy elsewhere
 *   (recvbuf there is not the caller's to write).
 *
 * All three first agree on the root (broadcast_agree.c: ceil(log2 n)
 * alpha), so ranks that name different roots fail together, naming them.
 *
 * gatherv / scatterv: linear: every rank sends its block to the root (or
 * receives its block from it) in segments, and the root keeps all n - 1
 * transfers in flight at once; (n - 1)·alpha + S·beta at the root, which is
 * the bound for the root's link anyway. Non-root ranks know only their own
 * count, so a block's size is checked per message (bytes and offset in its
 * block) against what the root expects: a rank whose count differs from the
 * root's counts[rank] fails with both values.
 */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "algorithms/algorithms.h"
#include "base/comm_state.h"
#include "algorithms/pattern.h"
#include "algorithms/topology.h"
#include "reduce/reduce.h"
#include "schedule/schedule.h"
#include "base/status.h"

static coll_result_t check_rooted(coll_comm_t *comm, const coll_args_t *a, const char *what,
                                  int needs_op) {
  comm->err_set = 0;
  if (a->root == COLL_ROOT_REFUSED) {
    if (a->count)
      return coll_error(comm, COLL_INVALID_ARGUMENT, "%s: a refusing rank passes count 0", what);
    return COLL_SUCCESS; /* run_refused: the agreement only */
  }
  if ((unsigned)a->dtype >= COLL_NUM_DTYPES)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "%s: invalid dtype %d", what, (int)a->dtype);
  if (needs_op && (unsigned)a->op >= COLL_NUM_OPS)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "%s: invalid op %d", what, (int)a->op);
  if (a->root < 0 || a->root >= comm->size)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "%s: root %d out of range for %d ranks", what,
                      a->root, comm->size);
  if (a->memory != COLL_MEMORY_HOST)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "%s takes host buffers", what);
  if (a->count > ((size_t)1 << 48) / coll_dtype_size(a->dtype))
    return coll_error(comm, COLL_INVALID_ARGUMENT, "%s: count %zu too large", what, a->count);
  return COLL_SUCCESS;
}

/* The root's counts/displs describe its buffer: every block within
 * [0, limit) elements when limit is known. */
static coll_result_t check_blocks(coll_comm_t *comm, const coll_args_t *a, const char *what) {
  if (comm->rank != a->root) return COLL_SUCCESS;
  if (!a->counts || !a->displs)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "%s needs counts and displacements at the root", what);
  if (a->counts[a->root] != a->count)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "%s: root's count %zu differs from counts[%d] = %zu",
                      what, a->count, a->root, a->counts[a->root]);
  return COLL_SUCCESS;
}

static coll_result_t run(coll_comm_t *comm, coll_sched_t *s, const coll_args_t *a) {
  coll_result_t res = s->oom ? coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", comm->rank)
                             : coll_sched_run(s, coll_comm_deadline(comm, a->timeout));
  coll_sched_free(s);
  return res;
}

/* Segments of a block of n bytes: send (dst NULL) or receive, each after dep. */
static void block_steps(coll_sched_t *s, int peer, char *dst, const char *src, size_t n) {
  int nseg = coll_sched_nseg(s, n);
  for (int j = 0; j < nseg; j++) {
    size_t o, l;
    coll_sched_seg(s, n, nseg, j, &o, &l);
    if (dst) coll_sched_recv(s, peer, dst + o, l, o);
    else coll_sched_send(s, peer, src + o, l, o);
  }
}

/* This rank refused its arguments (COLL_ROOT_REFUSED, coll.h): the root agreement alone,
 * which fails on every rank that did not refuse, naming the ranks that did. */
static coll_result_t run_refused(coll_comm_t *comm, const coll_args_t *a, coll_kind_t kind) {
  int done;
  if (comm->size > 1) {
    coll_result_t res = coll_root_agree(comm, a, kind, &done);
    if (res != COLL_SUCCESS && res != COLL_INVALID_USAGE) return res;
  }
  return coll_error(comm, COLL_INVALID_ARGUMENT,
                    "rank %d: %s: this rank refused its arguments; the other ranks were told "
                    "and nothing was sent", comm->rank, coll_kind_name(kind));
}

/* ---- reduce ---- */

coll_result_t coll_check_reduce(coll_comm_t *comm, const coll_args_t *a) {
  COLL_CHECK(check_rooted(comm, a, "reduce", 1));
  if (a->count && (!a->sendbuf || (comm->rank == a->root && !a->recvbuf)))
    return coll_error(comm, COLL_INVALID_ARGUMENT, "reduce: NULL buffer with count %zu", a->count);
  return COLL_SUCCESS;
}

coll_result_t coll_run_reduce(coll_comm_t *comm, const coll_args_t *a) {
  if (a->root == COLL_ROOT_REFUSED) return run_refused(comm, a, COLL_KIND_REDUCE);
  size_t nbytes = a->count * coll_dtype_size(a->dtype);
  int root = a->root, r = comm->rank, n = comm->size;
  if (n == 1) {
    if (nbytes && a->recvbuf != a->sendbuf) memcpy(a->recvbuf, a->sendbuf, nbytes);
    return COLL_SUCCESS; /* AVG over one rank is the value itself */
  }
  int done;
  COLL_CHECK(coll_root_agree(comm, a, COLL_KIND_REDUCE, &done));
  /* The tree is over host-order positions (topology.h): a subtree's ranks
   * share a host as far as the numbering allows, whatever the placement. */
  const coll_topo_t *t = coll_comm_topo(comm);
  if (!t) return COLL_SYSTEM_ERROR;
  int children[32], v = coll_topo_pos(t, r), vroot = coll_topo_pos(t, root);
  int nchild = coll_binomial_children(v, n, vroot, children);
  for (int k = 0; k < nchild; k++) children[k] = coll_topo_at(t, children[k]);
  int parent = coll_binomial_parent(v, n, vroot);
  if (parent >= 0) parent = coll_topo_at(t, parent);
  char *acc = NULL, *scratch = NULL;
  if (r == root) {
    acc = a->recvbuf;
  } else if (nchild > 0) {
    scratch = malloc(nbytes + 1);
    if (!scratch) return coll_error(comm, COLL_SYSTEM_ERROR, "rank %d: out of memory", r);
    acc = scratch;
  }
  coll_sched_t s;
  coll_sched_init(&s, comm, COLL_KIND_REDUCE, a, (uint32_t)root);
  const char *in = a->sendbuf;
  int nseg = coll_sched_nseg(&s, nbytes);
  for (int j = 0; j < nseg; j++) {
    size_t o, l;
    coll_sched_seg(&s, nbytes, nseg, j, &o, &l);
    int last = -1;
    const char *cur = in + o;
    if (nchild == 0 && r == root) last = coll_sched_copy(&s, acc + o, in + o, l);
    /* Children in reverse send order: the smallest subtree reports first. */
    for (int k = nchild - 1; k >= 0; k--) {
      last = coll_sched_after(&s, coll_sched_recv_reduce(&s, children[k], acc + o, cur, l, o), last);
      cur = acc + o;
    }
    if (parent >= 0) coll_sched_after(&s, coll_sched_send(&s, parent, cur, l, o), last);
  }
  coll_result_t res = run(comm, &s, a);
  free(scratch);
  if (res == COLL_SUCCESS && r == root && a->op == COLL_AVG)
    coll_scale(a->recvbuf, a->recvbuf, a->count, a->dtype, (double)n);
  return res;
}

/* ---- gatherv ---- */

coll_result_t coll_check_gatherv(coll_comm_t *comm, const coll_args_t *a) {
  COLL_CHECK(check_rooted(comm, a, "gatherv", 0));
  COLL_CHECK(check_blocks(comm, a, "gatherv"));
  if (a->count && !a->sendbuf)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "gatherv: NULL sendbuf with count %zu", a->count);
  return COLL_SUCCESS;
}

coll_result_t coll_run_gatherv(coll_comm_t *comm, const coll_args_t *a) {
  if (a->root == COLL_ROOT_REFUSED) return run_refused(comm, a, COLL_KIND_GATHER);
  size_t elem = coll_dtype_size(a->dtype);
  int root = a->root, r = comm->rank, done;
  if (comm->size > 1) COLL_CHECK(coll_root_agree(comm, a, COLL_KIND_GATHER, &done));
  coll_sched_t s;
  coll_sched_init(&s, comm, COLL_KIND_GATHER, a, (uint32_t)root);
  s.hdr.count = 0; /* each rank's own block: checked per message instead */
  if (r != root) {
    block_steps(&s, root, NULL, a->sendbuf, a->count * elem);
  } else {
    char *out = a->recvbuf;
    for (int i = 0; i < comm->size; i++) {
      char *dst = out + a->displs[i] * elem;
      size_t len = a->counts[i] * elem;
      if (i != r) block_steps(&s, i, dst, NULL, len);
      else if (len && dst != (const char *)a->sendbuf) coll_sched_copy(&s, dst, a->sendbuf, len);
    }
  }
  return run(comm, &s, a);
}

/* ---- scatterv ---- */

coll_result_t coll_check_scatterv(coll_comm_t *comm, const coll_args_t *a) {
  COLL_CHECK(check_rooted(comm, a, "scatterv", 0));
  COLL_CHECK(check_blocks(comm, a, "scatterv"));
  if (a->count && !a->recvbuf)
    return coll_error(comm, COLL_INVALID_ARGUMENT, "scatterv: NULL recvbuf with count %zu", a->count);
  return COLL_SUCCESS;
}

coll_result_t coll_run_scatterv(coll_comm_t *comm, const coll_args_t *a) {
  if (a->root == COLL_ROOT_REFUSED) return run_refused(comm, a, COLL_KIND_SCATTER);
  size_t elem = coll_dtype_size(a->dtype);
  int root = a->root, r = comm->rank, done;
  if (comm->size > 1) COLL_CHECK(coll_root_agree(comm, a, COLL_KIND_SCATTER, &done));
  coll_sched_t s;
  coll_sched_init(&s, comm, COLL_KIND_SCATTER, a, (uint32_t)root);
  s.hdr.count = 0;
  if (r != root) {
    block_steps(&s, root, a->recvbuf, NULL, a->count * elem);
  } else {
    const char *in = a->sendbuf;
    for (int i = 0; i < comm->size; i++) {
      const char *src = in + a->displs[i] * elem;
      size_t len = a->counts[i] * elem;
      if (i != r) block_steps(&s, i, NULL, src, len);
      else if (len && src != (const char *)a->recvbuf) coll_sched_copy(&s, a->recvbuf, src, len);
    }
  }
  return run(comm, &s, a);
}

