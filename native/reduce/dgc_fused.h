/*
 * dgc_fused.h -- one pass per tensor for DGC / top-k with error feedback:
 * the momentum-correction (or error-feedback) update of the memory, the
 * threshold counts the selection needs, and the candidate entries it picks
 * from, all while the gradient and memory stream through the cache once.
 *
 * Modes (all float32, element i, s = scale, the local-clipping factor or 1):
 *   COLL_DGC_TOPK      v = v + g*s                      (u unused, may be NULL)
 *   COLL_DGC_MOMENTUM  u = m*u + g*s;  v = v + u
 *   COLL_DGC_NESTEROV  u = (u + g*s)*m;  v = (v + u) + g*s
 * Each operation is rounded to float32 separately (no fused multiply-add),
 * exactly as the same sequence of torch element-wise ops.
 *
 * API
 *   coll_dgc_sample   |v_new| at positions start, start+stride, ... (s of them)
 *                     WITHOUT modifying anything: the values the update will
 *                     produce there, for the threshold estimate.
 *   coll_dgc_update   the update over all n entries; for thresholds
 *                     thr[0] >= thr[1] >= ... >= thr[nthr-1] > 0, hist[j] +=
 *                     the number of new |v| in [thr[j], thr[j-1]) (so the
 *                     count at thr[j] is hist[0] + ... + hist[j]); and the
 *                     first `cap` entries with |v_new| >= thr[nthr-1], in
 *                     index order, into cand_v / cand_i; *ncand = how many
 *                     there were in all (> cap: the candidates overflowed).
 *
 * Contracts: magnitudes compare as in sparse.h (integer compare of the
 * |float| bits: NaN above every threshold); thresholds must be > 0 and
 * non-increasing; g, u, v must not overlap; nothing blocks.
 */
#ifndef COLL_DGC_FUSED_H
#define COLL_DGC_FUSED_H

#include "coll.h"

enum { COLL_DGC_TOPK = 0, COLL_DGC_MOMENTUM = 1, COLL_DGC_NESTEROV = 2 };

coll_result_t coll_dgc_sample(const float *g, const float *u, const float *v, size_t n, int mode,
                              float momentum, float scale, size_t start, size_t stride, size_t s,
                              float *out);

coll_result_t coll_dgc_update(const float *g, float *u, float *v, size_t n, int mode,
                              float momentum, float scale, const float *thr, size_t nthr,
                              uint64_t *hist, size_t cap, float *cand_v, int64_t *cand_i,
                              size_t *ncand);

#endif
