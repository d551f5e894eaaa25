/* pattern.c -- rank arithmetic (see pattern.h). */
#include "algorithms/pattern.h"

void coll_split(size_t count, int parts, int i, size_t *off, size_t *len) {
  size_t base = count / (size_t)parts, extra = count % (size_t)parts;
  size_t ui = (size_t)i;
  *off = ui * base + (ui < extra ? ui : extra);
  *len = base + (ui < extra ? 1 : 0);
}

int coll_tree_parent(int r, int n, int root) {
  int v = coll_mod(r - root, n);
  if (v == 0) return -1;
  return coll_mod((v - 1) / 2 + root, n);
}

int coll_tree_child(int r, int n, int root, int which) {
  int v = coll_mod(r - root, n);
  int c = 2 * v + 1 + which;
  return c < n ? coll_mod(c + root, n) : -1;
}

int coll_binomial_parent(int r, int n, int root) {
  int v = coll_mod(r - root, n);
  if (v == 0) return -1;
  /* The parent clears the highest set bit of v. */
  int mask = 1;
  while (mask <= v) mask <<= 1;
  return coll_mod((v & ~(mask >> 1)) + root, n);
}

int coll_binomial_children(int r, int n, int root, int *out) {
  int v = coll_mod(r - root, n);
  int mask = 1, k = 0;
  while (mask <= v) mask <<= 1; /* children set bits above v's highest bit */
  /* Largest subtree first, so the deepest path starts earliest. */
  int top = 1;
  while (top < n) top <<= 1;
  for (int m = top >> 1; m >= mask; m >>= 1)
    if (v + m < n) out[k++] = coll_mod(v + m + root, n);
  return k;
}

int coll_pow2_floor(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

int coll_bfly_vrank(int r, int n) {
  int rem = n - coll_pow2_floor(n);
  if (r < 2 * rem) return (r % 2 == 0) ? -1 : r / 2;
  return r - rem;
}

int coll_bfly_real(int v, int n) {
  int rem = n - coll_pow2_floor(n);
  return v < rem ? 2 * v + 1 : v + rem;
}
