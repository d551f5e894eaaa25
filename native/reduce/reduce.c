/*
 * reduce.c -- host reduction kernels, one per (dtype, op), behind one table.
 *
 * How the kernels stay fast without -march:
 *   - every kernel is a plain counted loop that gcc -O3 vectorizes; the
 *     target_clones attribute compiles it once per ISA level and an ifunc picks
 *     the best clone when the library loads, so a portable wheel still runs
 *     AVX-512 or AVX2 code (there is no per-call dispatch);
 *   - out may alias in1 or in2 exactly (the in-place allreduce step), so the
 *     loops carry `GCC ivdep`: element i is read before element i is written
 *     and no other element is touched, which is what ivdep promises, so gcc
 *     can drop the runtime overlap check it would otherwise put on each loop;
 *   - float16/bfloat16 are widened to float32 in registers, combined, and
 *     rounded back, in the same loop. The conversions are integer bit
 *     arithmetic rather than _Float16 casts because gcc 12 does not vectorize
 *     those casts (F16C is used one element at a time, and the default clone
 *     calls libgcc per element); the bit arithmetic vectorizes on every clone.
 */
#include "reduce/reduce.h"

/* x86-64-v4 (AVX-512) doubles the float16 kernel: its conversions need more
 * than the 16 ymm registers AVX2 has, and spill there. */
#define COLL_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#define COLL_INLINE static inline __attribute__((always_inline))

/* ---- float16 / bfloat16 <-> float32, one element, branch free ---------------
 *
 * Written as integer bit arithmetic with mask selects, not ternaries: gcc sinks
 * a float operation whose result only one arm uses into that arm, and then
 * (under the default -ftrapping-math) refuses to if-convert the loop. */

typedef union {
  uint32_t u;
  float f;
} coll_bits_t; /* reading the other member is defined in GNU C */

#define COLL_F32_INF_BITS 0x7f800000u

/* cond ? a : b for cond in {0, 1}. */
COLL_INLINE uint32_t select_u32(uint32_t cond, uint32_t a, uint32_t b) {
  uint32_t mask = 0u - cond;
  return (a & mask) | (b & ~mask);
}

/* Shifting a half's exponent+mantissa into float position gives its value
 * times 2^-112 for every finite half, subnormals included (they land on float
 * subnormals or small normals), so one multiply by 2^112 rescales exactly;
 * Inf/NaN are patched in afterwards. (Under a DAZ FPU mode, half subnormals
 * would read as zero.) */
COLL_INLINE float half_to_float(uint32_t h) {
  coll_bits_t x;
  x.u = (h & 0x7fff) << 13;
  x.f *= 0x1p112f;
  x.u = select_u32((h & 0x7c00) == 0x7c00, COLL_F32_INF_BITS | (h & 0x3ff) << 13, x.u);
  x.u |= (h & 0x8000) << 16;
  return x.f;
}

/* Round to nearest even; overflow gives Inf, NaN stays a quiet NaN with its
 * sign and top payload bits. */
COLL_INLINE uint16_t float_to_half(float f) {
  coll_bits_t x = {.f = f}, sub = {.f = __builtin_fabsf(f) + 0.5f};
  uint32_t a = x.u & 0x7fffffffu;
  /* Normal: rebias the exponent and add 0x0fff plus the lowest kept bit, so a
   * carry out of the 13 dropped bits rounds half to even (a carry into the
   * exponent is right too: next binade, or Inf). */
  uint32_t normal = (a - ((127u - 15u) << 23) + 0x0fffu + ((a >> 13) & 1)) >> 13;
  /* Subnormal (|f| < 2^-14): adding 0.5 made the FPU round |f| to a multiple
   * of 2^-24 in the low mantissa bits, which are the half's bits. */
  uint32_t subnormal = sub.u - (126u << 23);
  uint32_t special = 0x7c00u | select_u32(a > COLL_F32_INF_BITS, 0x200u | (a >> 13 & 0x3ff), 0);
  uint32_t r = select_u32(a >= (143u << 23), special,            /* |f| >= 65536: Inf/NaN */
                          select_u32(a < (113u << 23), subnormal, normal));
  return (uint16_t)(r | (x.u >> 16 & 0x8000));
}

COLL_INLINE float bf16_to_float(uint32_t b) {
  coll_bits_t x = {.u = b << 16};
  return x.f;
}

/* Round to nearest even by adding 0x7fff plus the lowest kept bit; a NaN would
 * carry into Inf that way, so it is truncated with the quiet bit set. */
COLL_INLINE uint16_t float_to_bf16(float f) {
  coll_bits_t x = {.f = f};
  uint32_t rounded = (x.u + 0x7fffu + ((x.u >> 16) & 1)) >> 16;
  return (uint16_t)select_u32((x.u & 0x7fffffffu) > COLL_F32_INF_BITS, (x.u >> 16) | 0x40, rounded);
}

/* Float min/max as np.minimum/np.maximum: a NaN in either input wins (a != a
 * catches a NaN in1; a NaN in2 fails the compare and is chosen). */
COLL_INLINE float min_np_f32(float a, float b) { return (a <= b || a != a) ? a : b; }
COLL_INLINE float max_np_f32(float a, float b) { return (a >= b || a != a) ? a : b; }
COLL_INLINE double min_np_f64(double a, double b) { return (a <= b || a != a) ? a : b; }
COLL_INLINE double max_np_f64(double a, double b) { return (a >= b || a != a) ? a : b; }

/* ---- the kernels ---------------------------------------------------------- */

/* Stamps out kernel NAME over element type T: out[i] = EXPR of a = in1[i] and
 * b = in2[i], as a cloned, type-erased function for the table. */
#define COLL_ELEMENTWISE(NAME, T, EXPR)                                                  \
  COLL_CLONES static void NAME(void *out_, const void *in1_, const void *in2_,           \
                               size_t count, const void *ctx) {                          \
    T *out = out_;                                                                       \
    const T *in1 = in1_, *in2 = in2_;                                                    \
    (void)ctx;                                                                           \
    _Pragma("GCC ivdep") for (size_t i = 0; i < count; i++) {                            \
      T a = in1[i], b = in2[i];                                                          \
      out[i] = (T)(EXPR);                                                                \
    }                                                                                    \
  }

/* Integer SUM and PROD run on the unsigned type of the same width: the low
 * bits of a sum or product do not depend on signedness, so int8 and uint8
 * share a kernel, and unsigned arithmetic wraps where signed would be UB.
 * (uint8 operands promote to int; 255 * 255 still fits.) */
COLL_ELEMENTWISE(sum_u8, uint8_t, a + b)
COLL_ELEMENTWISE(prod_u8, uint8_t, a * b)
COLL_ELEMENTWISE(min_i8, int8_t, a < b ? a : b)
COLL_ELEMENTWISE(max_i8, int8_t, a > b ? a : b)
COLL_ELEMENTWISE(min_u8, uint8_t, a < b ? a : b)
COLL_ELEMENTWISE(max_u8, uint8_t, a > b ? a : b)
COLL_ELEMENTWISE(sum_u32, uint32_t, a + b)
COLL_ELEMENTWISE(prod_u32, uint32_t, a * b)
COLL_ELEMENTWISE(min_i32, int32_t, a < b ? a : b)
COLL_ELEMENTWISE(max_i32, int32_t, a > b ? a : b)
COLL_ELEMENTWISE(sum_u64, uint64_t, a + b)
COLL_ELEMENTWISE(prod_u64, uint64_t, a * b)
COLL_ELEMENTWISE(min_i64, int64_t, a < b ? a : b)
COLL_ELEMENTWISE(max_i64, int64_t, a > b ? a : b)
COLL_ELEMENTWISE(sum_f32, float, a + b)
COLL_ELEMENTWISE(prod_f32, float, a * b)
COLL_ELEMENTWISE(min_f32, float, min_np_f32(a, b))
COLL_ELEMENTWISE(max_f32, float, max_np_f32(a, b))
COLL_ELEMENTWISE(sum_f64, double, a + b)
COLL_ELEMENTWISE(prod_f64, double, a * b)
COLL_ELEMENTWISE(min_f64, double, min_np_f64(a, b))
COLL_ELEMENTWISE(max_f64, double, max_np_f64(a, b))
/* Half types widen, combine in float32 and round once, all in registers: no
 * staging buffer, so they stay as memory-bound as the float32 kernel. */
COLL_ELEMENTWISE(sum_f16, uint16_t, float_to_half(half_to_float(a) + half_to_float(b)))
COLL_ELEMENTWISE(prod_f16, uint16_t, float_to_half(half_to_float(a) * half_to_float(b)))
COLL_ELEMENTWISE(min_f16, uint16_t, float_to_half(min_np_f32(half_to_float(a), half_to_float(b))))
COLL_ELEMENTWISE(max_f16, uint16_t, float_to_half(max_np_f32(half_to_float(a), half_to_float(b))))
COLL_ELEMENTWISE(sum_bf16, uint16_t, float_to_bf16(bf16_to_float(a) + bf16_to_float(b)))
COLL_ELEMENTWISE(prod_bf16, uint16_t, float_to_bf16(bf16_to_float(a) * bf16_to_float(b)))
COLL_ELEMENTWISE(min_bf16, uint16_t, float_to_bf16(min_np_f32(bf16_to_float(a), bf16_to_float(b))))
COLL_ELEMENTWISE(max_bf16, uint16_t, float_to_bf16(max_np_f32(bf16_to_float(a), bf16_to_float(b))))

/* Indexed [dtype][op] for SUM, PROD, MIN, MAX (the enum order). */
static const coll_reduce_fn coll_kernels[COLL_NUM_DTYPES][COLL_AVG] = {
    [COLL_INT8] = {sum_u8, prod_u8, min_i8, max_i8},
    [COLL_UINT8] = {sum_u8, prod_u8, min_u8, max_u8},
    [COLL_INT32] = {sum_u32, prod_u32, min_i32, max_i32},
    [COLL_INT64] = {sum_u64, prod_u64, min_i64, max_i64},
    [COLL_FLOAT16] = {sum_f16, prod_f16, min_f16, max_f16},
    [COLL_BFLOAT16] = {sum_bf16, prod_bf16, min_bf16, max_bf16},
    [COLL_FLOAT32] = {sum_f32, prod_f32, min_f32, max_f32},
    [COLL_FLOAT64] = {sum_f64, prod_f64, min_f64, max_f64},
};

coll_reduce_fn coll_reduce_kernel(coll_dtype_t dtype, coll_op_t op) {
  /* Enums may hold any int: compare as unsigned to reject negatives too. */
  if ((unsigned)dtype >= COLL_NUM_DTYPES || (unsigned)op >= COLL_NUM_OPS) return NULL;
  return coll_kernels[dtype][op == COLL_AVG ? COLL_SUM : op];
}

/* ---- scale (AVG's final division) ---------------------------------------- */

COLL_CLONES static void scale_half(uint16_t *out, const uint16_t *in, size_t count, int bf16,
                                   float divisor) {
  if (bf16) {
#pragma GCC ivdep
    for (size_t i = 0; i < count; i++) out[i] = float_to_bf16(bf16_to_float(in[i]) / divisor);
  } else {
#pragma GCC ivdep
    for (size_t i = 0; i < count; i++) out[i] = float_to_half(half_to_float(in[i]) / divisor);
  }
}

COLL_CLONES static void scale_f32(float *out, const float *in, size_t count, float divisor) {
#pragma GCC ivdep
  for (size_t i = 0; i < count; i++) out[i] = in[i] / divisor;
}

COLL_CLONES static void scale_f64(double *out, const double *in, size_t count, double divisor) {
#pragma GCC ivdep
  for (size_t i = 0; i < count; i++) out[i] = in[i] / divisor;
}

/* Integer division does not vectorize on x86; AVG of integers is rare enough
 * that the scalar loop is fine. Narrow types divide in int64, so INT32_MIN / -1
 * wraps on the cast back instead of trapping; int64 gets that case by hand. */
static void scale_int(void *out_, const void *in_, size_t count, coll_dtype_t dtype,
                      int64_t d) {
  switch (dtype) {
    case COLL_INT8: {
      int8_t *out = out_;
      const int8_t *in = in_;
      for (size_t i = 0; i < count; i++) out[i] = (int8_t)((int64_t)in[i] / d);
      break;
    }
    case COLL_UINT8: {
      uint8_t *out = out_;
      const uint8_t *in = in_;
      for (size_t i = 0; i < count; i++) out[i] = (uint8_t)((int64_t)in[i] / d);
      break;
    }
    case COLL_INT32: {
      int32_t *out = out_;
      const int32_t *in = in_;
      for (size_t i = 0; i < count; i++) out[i] = (int32_t)((int64_t)in[i] / d);
      break;
    }
    default: {
      int64_t *out = out_;
      const int64_t *in = in_;
      for (size_t i = 0; i < count; i++)
        out[i] = d == -1 ? (int64_t)(0u - (uint64_t)in[i]) : in[i] / d;
      break;
    }
  }
}

/* Nearest integer, halves away from zero (llround without libm). The caller
 * has checked that |divisor| < 2^63. */
static int64_t round_divisor(double divisor) {
  return (int64_t)(divisor < 0 ? divisor - 0.5 : divisor + 0.5);
}

void coll_scale(void *out, const void *in, size_t count, coll_dtype_t dtype, double divisor) {
  switch (dtype) {
    case COLL_FLOAT16: scale_half(out, in, count, 0, (float)divisor); break;
    case COLL_BFLOAT16: scale_half(out, in, count, 1, (float)divisor); break;
    /* float32 divides by the float32 divisor, as numpy's float32 / Python float does. */
    case COLL_FLOAT32: scale_f32(out, in, count, (float)divisor); break;
    case COLL_FLOAT64: scale_f64(out, in, count, divisor); break;
    default: scale_int(out, in, count, dtype, round_divisor(divisor)); break;
  }
}

/* ---- scalar conversions (the kernels' own arithmetic) --------------------- */

float coll_half_to_float(uint16_t h) { return half_to_float(h); }
uint16_t coll_float_to_half(float f) { return float_to_half(f); }
float coll_bf16_to_float(uint16_t b) { return bf16_to_float(b); }
uint16_t coll_float_to_bf16(float f) { return float_to_bf16(f); }

/* ---- public wrappers of coll.h ------------------------------------------- */

coll_result_t coll_reduce_local(void *out, const void *in1, const void *in2, size_t count,
                                coll_dtype_t dtype, coll_op_t op) {
  coll_reduce_fn fn = coll_reduce_kernel(dtype, op);
  if (fn == NULL) return COLL_INVALID_ARGUMENT;
  if (count > 0 && (out == NULL || in1 == NULL || in2 == NULL)) return COLL_INVALID_ARGUMENT;
  fn(out, in1, in2, count, NULL);
  return COLL_SUCCESS;
}

coll_result_t coll_scale_local(void *out, const void *in, size_t count, coll_dtype_t dtype,
                               double divisor) {
  if ((unsigned)dtype >= COLL_NUM_DTYPES) return COLL_INVALID_ARGUMENT;
  if (count > 0 && (out == NULL || in == NULL)) return COLL_INVALID_ARGUMENT;
  /* Written so that NaN fails: it compares false both ways. */
  if (!(divisor != 0)) return COLL_INVALID_ARGUMENT;
  int is_int = dtype != COLL_FLOAT16 && dtype != COLL_BFLOAT16 && dtype != COLL_FLOAT32 &&
               dtype != COLL_FLOAT64;
  if (is_int && !(divisor > -0x1p63 && divisor < 0x1p63 && round_divisor(divisor) != 0))
    return COLL_INVALID_ARGUMENT;
  coll_scale(out, in, count, dtype, divisor);
  return COLL_SUCCESS;
}

size_t coll_dtype_size(coll_dtype_t dtype) {
  static const size_t sizes[COLL_NUM_DTYPES] = {1, 1, 4, 8, 2, 2, 4, 8};
  return (unsigned)dtype < COLL_NUM_DTYPES ? sizes[dtype] : 0;
}

const char *coll_dtype_name(coll_dtype_t dtype) {
  static const char *const names[COLL_NUM_DTYPES] = {
      "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"};
  return (unsigned)dtype < COLL_NUM_DTYPES ? names[dtype] : "invalid";
}

const char *coll_op_name(coll_op_t op) {
  static const char *const names[COLL_NUM_OPS] = {"sum", "prod", "min", "max", "avg"};
  return (unsigned)op < COLL_NUM_OPS ? names[op] : "invalid";
}
