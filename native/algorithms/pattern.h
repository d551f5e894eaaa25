/*
 * pattern.h -- rank arithmetic with no I/O: ring order and chunk ownership,
 * binary trees, butterfly partners and the non-power-of-two fold. Pure
 * functions, tested for n = 1..64 without sockets (tests/test_pattern.py).
 */
#ifndef COLL_PATTERN_H
#define COLL_PATTERN_H

#include <stddef.h>

/* Balanced split of `count` elements into `parts`: part i starts at *off and
 * has *len elements; the first count % parts parts get one more. */
void coll_split(size_t count, int parts, int i, size_t *off, size_t *len);

static inline int coll_mod(int a, int n) { return ((a % n) + n) % n; }

/* Ring: next/prev of rank r. In reduce-scatter step s (0..n-2) rank r sends
 * chunk (r - s) mod n and receives chunk (r - s - 1) mod n; afterwards it owns
 * chunk (r + 1) mod n. In allgather step s it sends (r + 1 - s) and receives
 * (r - s). */
static inline int coll_ring_next(int r, int n) { return (r + 1) % n; }
static inline int coll_ring_prev(int r, int n) { return (r + n - 1) % n; }
static inline int coll_ring_rs_send_chunk(int r, int n, int s) { return coll_mod(r - s, n); }
static inline int coll_ring_rs_recv_chunk(int r, int n, int s) { return coll_mod(r - s - 1, n); }
static inline int coll_ring_ag_send_chunk(int r, int n, int s) { return coll_mod(r + 1 - s, n); }
static inline int coll_ring_ag_recv_chunk(int r, int n, int s) { return coll_mod(r - s, n); }

/* Binary tree over ranks relative to root (v = (r - root) mod n): parent of v
 * is (v-1)/2, children 2v+1 and 2v+2. Returns -1 where there is none. Ranks
 * returned are absolute. */
int coll_tree_parent(int r, int n, int root);
int coll_tree_child(int r, int n, int root, int which /* 0 or 1 */);

/* Binomial tree rooted at root (for latency-bound broadcast): the parent of r
 * and, via coll_binomial_children, its children in the order it sends. */
int coll_binomial_parent(int r, int n, int root);
int coll_binomial_children(int r, int n, int root, int *out /* >= 32 entries */);

/* Butterfly over n ranks: p = largest power of two <= n, rem = n - p.
 * The first 2*rem ranks pair up (even r folds into r+1): even ranks of that
 * range sit out the butterfly ("extra"), odd ones take part with virtual rank
 * r/2; ranks >= 2*rem take part with virtual rank r - rem. */
int coll_pow2_floor(int n);
/* Virtual rank of r in the butterfly, or -1 if r is an extra rank. */
int coll_bfly_vrank(int r, int n);
/* Real rank of virtual rank v. */
int coll_bfly_real(int v, int n);

#endif
