/*
 * dgc_fused.c -- the fused DGC pass (see dgc_fused.h).
 *
 * The tensor is processed in blocks of BLOCK elements: the element-wise
 * update of the block (vectorized), then a vectorized count of the block's
 * entries at or above the lowest threshold, and only for blocks that have
 * one a scalar loop that bins them (binary search over the thresholds) and
 * records them as candidates. At DGC densities almost every block has none,
 * so the pass costs one streaming read of g, u, v and one write of u, v.
 */
#include "reduce/dgc_fused.h"

#include <stdlib.h>
#include <string.h>

#define COLL_CLONES __attribute__((target_clones("avx2", "default")))
#define COLL_INLINE static inline __attribute__((always_inline))

#define BLOCK 256

COLL_INLINE uint32_t abs_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b & 0x7fffffffu;
}

/* The update of one element; returns the new v. Separate roundings (the
 * build has no -ffast-math and the clones do not enable FMA). */
COLL_INLINE float step(int mode, float m, float s, float g, float *u, float v) {
  float gs = g * s;
  if (mode == COLL_DGC_TOPK) return v + gs;
  if (mode == COLL_DGC_MOMENTUM) {
    float nu = m * *u;
    nu = nu + gs;
    *u = nu;
    return v + nu;
  }
  float nu = (*u + gs) * m;
  *u = nu;
  float nv = v + nu;
  return nv + gs;
}

static int args_ok(const float *g, const float *u, const float *v, size_t n, int mode) {
  if (mode != COLL_DGC_TOPK && mode != COLL_DGC_MOMENTUM && mode != COLL_DGC_NESTEROV) return 0;
  if (n == 0) return 1;
  return g != NULL && v != NULL && (mode == COLL_DGC_TOPK || u != NULL);
}

coll_result_t coll_dgc_sample(const float *g, const float *u, const float *v, size_t n, int mode,
                              float momentum, float scale, size_t start, size_t stride, size_t s,
                              float *out) {
  if (!args_ok(g, u, v, n, mode) || stride == 0 || (s > 0 && out == NULL))
    return COLL_INVALID_ARGUMENT;
  if (s > 0 && (start >= n || (n - 1 - start) / stride + 1 < s)) return COLL_INVALID_ARGUMENT;
  for (size_t j = 0; j < s; j++) {
    size_t i = start + j * stride;
    float uu = mode == COLL_DGC_TOPK ? 0.0f : u[i];
    float nv = step(mode, momentum, scale, g[i], &uu, v[i]);
    uint32_t b = abs_bits(nv);
    memcpy(out + j, &b, sizeof b);
  }
  return COLL_SUCCESS;
}

COLL_CLONES
static void update_block(int mode, float m, float s, const float *restrict g, float *restrict u,
                         float *restrict v, size_t len) {
  if (mode == COLL_DGC_TOPK) {
    for (size_t i = 0; i < len; i++) v[i] = v[i] + g[i] * s;
  } else if (mode == COLL_DGC_MOMENTUM) {
    for (size_t i = 0; i < len; i++) {
      float nu = m * u[i];
      nu = nu + g[i] * s;
      u[i] = nu;
      v[i] = v[i] + nu;
    }
  } else {
    for (size_t i = 0; i < len; i++) {
      float gs = g[i] * s;
      float nu = (u[i] + gs) * m;
      u[i] = nu;
      float nv = v[i] + nu;
      v[i] = nv + gs;
    }
  }
}

COLL_CLONES
static size_t count_at_least(const float *restrict x, size_t len, uint32_t tb) {
  size_t hits = 0;
  for (size_t i = 0; i < len; i++) {
    uint32_t b;
    memcpy(&b, x + i, sizeof b);
    hits += (b & 0x7fffffffu) >= tb;
  }
  return hits;
}

/* First j with tb[j] <= a (thresholds non-increasing; a >= tb[nthr-1]). */
COLL_INLINE size_t bin_of(const uint32_t *tb, size_t nthr, uint32_t a) {
  size_t lo = 0, hi = nthr - 1;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (tb[mid] <= a)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

#define MAX_THRESHOLDS ((size_t)1 << 24)

coll_result_t coll_dgc_update(const float *g, float *u, float *v, size_t n, int mode,
                              float momentum, float scale, const float *thr, size_t nthr,
                              uint64_t *hist, size_t cap, float *cand_v, int64_t *cand_i,
                              size_t *ncand) {
  if (!args_ok(g, u, v, n, mode) || ncand == NULL) return COLL_INVALID_ARGUMENT;
  if (nthr == 0 || nthr > MAX_THRESHOLDS || thr == NULL || hist == NULL)
    return COLL_INVALID_ARGUMENT;
  if (cap > 0 && (cand_v == NULL || cand_i == NULL)) return COLL_INVALID_ARGUMENT;
  uint32_t *tbp = malloc(nthr * sizeof *tbp);
  if (tbp == NULL) return COLL_SYSTEM_ERROR;
  for (size_t j = 0; j < nthr; j++) {
    if (!(thr[j] > 0.0f) || (j > 0 && thr[j] > thr[j - 1])) {
      free(tbp);
      return COLL_INVALID_ARGUMENT;
    }
    tbp[j] = abs_bits(thr[j]);
  }
  const uint32_t low = tbp[nthr - 1];
  size_t c = 0;
  for (size_t b = 0; b < n; b += BLOCK) {
    size_t len = n - b < BLOCK ? n - b : BLOCK;
    update_block(mode, momentum, scale, g + b, mode == COLL_DGC_TOPK ? NULL : u + b, v + b, len);
    if (count_at_least(v + b, len, low) == 0) continue;
    for (size_t i = b; i < b + len; i++) {
      uint32_t a = abs_bits(v[i]);
      if (a < low) continue;
      hist[bin_of(tbp, nthr, a)]++;
      if (c < cap) {
        cand_v[c] = v[i];
        cand_i[c] = (int64_t)i;
      }
      c++;
    }
  }
  free(tbp);
  *ncand = c;
  return COLL_SUCCESS;
}
