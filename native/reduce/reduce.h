/*
 * reduce.h -- host reduction kernels, one per (dtype, op).
 *
 * Every kernel has the same type-erased signature: out[i] = in1[i] op in2[i]
 * for i < count, with out allowed to alias in1 or in2 exactly (never a
 * partial overlap). ctx is unused by the host kernels; it is there so that
 * device kernels and scaled variants share the signature.
 *
 * float16 and bfloat16 are widened to float32, combined, and rounded back to
 * nearest-even once per call: a reduction step loses no more than one float32
 * round trip.  Integer SUM and PROD wrap around (two's complement), as numpy's do.
 * MIN and MAX of floats follow numpy's np.minimum/np.maximum: a NaN in either
 * input gives NaN.
 */
#ifndef COLL_REDUCE_H
#define COLL_REDUCE_H

#include "coll.h"

typedef void (*coll_reduce_fn)(void *out, const void *in1, const void *in2, size_t count,
                               const void *ctx);

/* The kernel for (dtype, op); AVG maps to SUM. NULL for an invalid pair. */
coll_reduce_fn coll_reduce_kernel(coll_dtype_t dtype, coll_op_t op);

/* out[i] = in[i] / divisor, rounded as the dtype does (integers truncate
 * toward zero, as numpy's // does not: C division). */
void coll_scale(void *out, const void *in, size_t count, coll_dtype_t dtype, double divisor);

/* Half-precision conversions shared with the tests of the kernels. */
float coll_half_to_float(uint16_t h);
uint16_t coll_float_to_half(float f);
float coll_bf16_to_float(uint16_t b);
uint16_t coll_float_to_bf16(float f);

#endif
