/*
 * sparse.h -- host kernels for sparse gradient exchange (DGC, top-k with
 * error feedback): select the large entries of a float32 tensor as
 * (values, indices), and scatter-add what every rank sent into a dense
 * float32 tensor.
 *
 * API
 *   coll_sparse_count_above   how many entries have |x[i]| >= threshold
 *   coll_sparse_pack          the first `cap` of those entries, in index order,
 *                             as values (float32 or float16) and indices
 *                             (int32 or int64)
 *   coll_sparse_scatter_add   out[indices[j]] += values[j] for j < count;
 *                             every index is checked against n first
 *
 * Contracts:
 *   - threshold > 0 (so exact zeros are never selected); a NaN entry compares
 *     above every threshold and is selected, as a dense exchange would carry it;
 *   - pack never writes more than cap entries and never reads past n; it does
 *     not modify x (the caller zeroes what was sent in its own memory);
 *   - float16 values are rounded to nearest even on pack and widened exactly
 *     on scatter_add;
 *   - scatter_add returns COLL_INVALID_ARGUMENT and leaves out untouched if an
 *     index is negative or >= n (bytes from a peer are checked, never trusted);
 *     repeated indices add up;
 *   - none of them block or touch a communicator.
 */
#ifndef COLL_SPARSE_H
#define COLL_SPARSE_H

#include "coll.h"

coll_result_t coll_sparse_count_above(const float *x, size_t n, float threshold, size_t *count);

coll_result_t coll_sparse_pack(const float *x, size_t n, float threshold, size_t cap,
                               void *values, coll_dtype_t value_dtype, void *indices,
                               coll_dtype_t index_dtype, size_t *count);

coll_result_t coll_sparse_scatter_add(float *out, size_t n, const void *values,
                                      coll_dtype_t value_dtype, const void *indices,
                                      coll_dtype_t index_dtype, size_t count);

#endif
