/*
 * sparse.c -- selection and scatter-add kernels for sparse gradient exchange.
 *
 * Selection compares magnitudes as integers: for a float, (bits & 0x7fffffff)
 * orders exactly as |x| does (NaN above Inf), so "|x| >= t" is one integer
 * compare that gcc vectorizes on every ISA level, with no -ffast-math.
 *
 * pack scans in blocks: a vectorized count of the block's hits first, and the
 * scalar compaction loop only over blocks that have one. At the densities DGC
 * uses (0.1 % .. 1 %) most blocks have none, so the scan runs at memory speed.
 *
 * scatter_add validates all indices in one vectorized pass before it writes,
 * then adds element by element (a scatter with possible repeats: no SIMD).
 */
#include "reduce/sparse.h"

#include <string.h>

#include "reduce/reduce.h"

#define COLL_CLONES __attribute__((target_clones("avx2", "default")))
#define COLL_INLINE static inline __attribute__((always_inline))

/* Elements per pack block: large enough that the vectorized hit count
 * amortizes the branch, small enough that a hit block's scalar rescan is short. */
#define PACK_BLOCK 256

COLL_INLINE uint32_t abs_bits(const float *x, size_t i) {
  uint32_t u;
  memcpy(&u, x + i, sizeof u); /* type pun without breaking strict aliasing */
  return u & 0x7fffffffu;
}

COLL_INLINE uint32_t threshold_bits(float t) {
  uint32_t u;
  memcpy(&u, &t, sizeof u);
  return u & 0x7fffffffu;
}

static int threshold_ok(float t) { return t > 0.0f; /* false for NaN too */ }

COLL_CLONES
static size_t count_hits(const float *x, size_t n, uint32_t tb) {
  size_t hits = 0;
  for (size_t i = 0; i < n; i++) hits += abs_bits(x, i) >= tb;
  return hits;
}

coll_result_t coll_sparse_count_above(const float *x, size_t n, float threshold, size_t *count) {
  if (count == NULL || (n > 0 && x == NULL) || !threshold_ok(threshold))
    return COLL_INVALID_ARGUMENT;
  *count = count_hits(x, n, threshold_bits(threshold));
  return COLL_SUCCESS;
}

COLL_INLINE void store_value(void *values, int half, size_t j, float v) {
  if (half)
    ((uint16_t *)values)[j] = coll_float_to_half(v);
  else
    ((float *)values)[j] = v;
}

COLL_INLINE void store_index(void *indices, int wide, size_t j, size_t i) {
  if (wide)
    ((int64_t *)indices)[j] = (int64_t)i;
  else
    ((int32_t *)indices)[j] = (int32_t)i;
}

coll_result_t coll_sparse_pack(const float *x, size_t n, float threshold, size_t cap,
                               void *values, coll_dtype_t value_dtype, void *indices,
                               coll_dtype_t index_dtype, size_t *count) {
  if (count == NULL || (n > 0 && x == NULL) || !threshold_ok(threshold))
    return COLL_INVALID_ARGUMENT;
  if (value_dtype != COLL_FLOAT32 && value_dtype != COLL_FLOAT16) return COLL_INVALID_ARGUMENT;
  if (index_dtype != COLL_INT32 && index_dtype != COLL_INT64) return COLL_INVALID_ARGUMENT;
  if (cap > 0 && (values == NULL || indices == NULL)) return COLL_INVALID_ARGUMENT;
  /* int32 indices must be able to name every element. */
  if (index_dtype == COLL_INT32 && n > (size_t)INT32_MAX + 1) return COLL_INVALID_ARGUMENT;
  const int half = value_dtype == COLL_FLOAT16, wide = index_dtype == COLL_INT64;
  const uint32_t tb = threshold_bits(threshold);
  size_t c = 0;
  for (size_t b = 0; b < n && c < cap; b += PACK_BLOCK) {
    size_t len = n - b < PACK_BLOCK ? n - b : PACK_BLOCK;
    if (count_hits(x + b, len, tb) == 0) continue;
    for (size_t i = b; i < b + len && c < cap; i++) {
      if (abs_bits(x, i) >= tb) {
        store_value(values, half, c, x[i]);
        store_index(indices, wide, c, i);
        c++;
      }
    }
  }
  *count = c;
  return COLL_SUCCESS;
}

/* Number of indices outside [0, n): the cast to unsigned sends negatives above n. */
COLL_CLONES
static size_t bad_indices32(const int32_t *idx, size_t count, size_t n) {
  size_t bad = 0;
  for (size_t j = 0; j < count; j++) bad += (uint64_t)(uint32_t)idx[j] >= n || idx[j] < 0;
  return bad;
}

COLL_CLONES
static size_t bad_indices64(const int64_t *idx, size_t count, size_t n) {
  size_t bad = 0;
  for (size_t j = 0; j < count; j++) bad += (uint64_t)idx[j] >= n;
  return bad;
}

coll_result_t coll_sparse_scatter_add(float *out, size_t n, const void *values,
                                      coll_dtype_t value_dtype, const void *indices,
                                      coll_dtype_t index_dtype, size_t count) {
  if (count == 0) return COLL_SUCCESS;
  if (out == NULL || values == NULL || indices == NULL) return COLL_INVALID_ARGUMENT;
  if (value_dtype != COLL_FLOAT32 && value_dtype != COLL_FLOAT16) return COLL_INVALID_ARGUMENT;
  if (index_dtype != COLL_INT32 && index_dtype != COLL_INT64) return COLL_INVALID_ARGUMENT;
  const int wide = index_dtype == COLL_INT64;
  if ((wide ? bad_indices64(indices, count, n) : bad_indices32(indices, count, n)) != 0)
    return COLL_INVALID_ARGUMENT;
  const int32_t *i32 = indices;
  const int64_t *i64 = indices;
  if (value_dtype == COLL_FLOAT32) {
    const float *v = values;
    if (wide)
      for (size_t j = 0; j < count; j++) out[i64[j]] += v[j];
    else
      for (size_t j = 0; j < count; j++) out[i32[j]] += v[j];
  } else {
    const uint16_t *h = values;
    if (wide)
      for (size_t j = 0; j < count; j++) out[i64[j]] += coll_half_to_float(h[j]);
    else
      for (size_t j = 0; j < count; j++) out[i32[j]] += coll_half_to_float(h[j]);
  }
  return COLL_SUCCESS;
}
