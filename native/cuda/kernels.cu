/*
 * cuda/kernels.cu -- device reduction kernels, one per (dtype, op), and the
 * AVG scaling kernel; compiled by nvcc only when the CUDA build is on.
 *
 * Semantics are the host kernels' (reduce.h), element for element, so a
 * collective gives the same bits on either side of a staged link:
 *   - out[i] = in1[i] op in2[i]; out may alias in1 or in2 exactly;
 *   - float16/bfloat16 widen to float32, combine, round to nearest even;
 *   - integer SUM and PROD wrap (computed on the unsigned type);
 *   - float MIN/MAX follow np.minimum/np.maximum: a NaN in either input wins.
 *
 * Loads are 16 bytes wide when all three pointers are 16-byte aligned (the
 * usual case: allocators align to 256 bytes and pipelining segments are cut
 * on large boundaries), with a scalar tail; the grid is a few waves of the
 * device's multiprocessors and each thread strides over the vector.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "coll.h"

namespace {

/* The arithmetic type of each storage type: halves compute in float,
 * integers in their unsigned twin (wrap-around without UB). */
template <typename T> struct Arith { typedef T type; };
template <> struct Arith<int8_t> { typedef uint8_t type; };
template <> struct Arith<int32_t> { typedef uint32_t type; };
template <> struct Arith<int64_t> { typedef uint64_t type; };
template <> struct Arith<__half> { typedef float type; };
template <> struct Arith<__nv_bfloat16> { typedef float type; };

template <typename A, typename T> __device__ __forceinline__ A to_arith(T x) { return (A)x; }
template <> __device__ __forceinline__ float to_arith<float, __half>(__half x) {
  return __half2float(x);
}
template <> __device__ __forceinline__ float to_arith<float, __nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <typename T, typename A> __device__ __forceinline__ T narrow(A x) { return (T)x; }
template <> __device__ __forceinline__ __half narrow<__half, float>(float x) {
  return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16, float>(float x) {
  return __float2bfloat16_rn(x);
}

struct OpSum {
  template <typename A> __device__ static A apply(A a, A b) { return a + b; }
};
struct OpProd {
  template <typename A> __device__ static A apply(A a, A b) { return a * b; }
};
/* For integers a != a is false, so these are the plain min/max there. MIN
 * and MAX compare in the storage type's signedness (see Cmp below). */
struct OpMin {
  template <typename A> __device__ static A apply(A a, A b) { return (a <= b || a != a) ? a : b; }
};
struct OpMax {
  template <typename A> __device__ static A apply(A a, A b) { return (a >= b || a != a) ? a : b; }
};

/* MIN/MAX must compare signed integers as signed: they use the storage type
 * (halves still in float). SUM/PROD use the wrapping arithmetic type. */
template <typename T, typename Op> struct Cmp { typedef typename Arith<T>::type type; };
template <typename T> struct Cmp<T, OpMin> { typedef T type; };
template <typename T> struct Cmp<T, OpMax> { typedef T type; };
template <> struct Cmp<__half, OpMin> { typedef float type; };
template <> struct Cmp<__half, OpMax> { typedef float type; };
template <> struct Cmp<__nv_bfloat16, OpMin> { typedef float type; };
template <> struct Cmp<__nv_bfloat16, OpMax> { typedef float type; };

template <typename T, typename Op> __device__ __forceinline__ T combine(T a, T b) {
  typedef typename Cmp<T, Op>::type A;
  return narrow<T, A>(Op::apply(to_arith<A>(a), to_arith<A>(b)));
}

template <typename T> struct alignas(16) Vec16 {
  T v[16 / sizeof(T)];
};

template <typename T, typename Op>
__global__ void reduce_kernel(T *out, const T *in1, const T *in2, size_t n, int vectorized) {
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  constexpr int V = 16 / sizeof(T);
  size_t tail = 0;
  if (vectorized) {
    const size_t nv = n / V;
    const Vec16<T> *a = reinterpret_cast<const Vec16<T> *>(in1);
    const Vec16<T> *b = reinterpret_cast<const Vec16<T> *>(in2);
    Vec16<T> *o = reinterpret_cast<Vec16<T> *>(out);
    for (size_t i = tid; i < nv; i += stride) {
      Vec16<T> x = a[i], y = b[i], r;
#pragma unroll
      for (int k = 0; k < V; k++) r.v[k] = combine<T, Op>(x.v[k], y.v[k]);
      o[i] = r;
    }
    tail = nv * V;
  }
  for (size_t i = tail + tid; i < n; i += stride) out[i] = combine<T, Op>(in1[i], in2[i]);
}

template <typename T> __global__ void scale_float_kernel(T *out, const T *in, size_t n, float d) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = narrow<T, float>(to_arith<float>(in[i]) / d);
}

__global__ void scale_f64_kernel(double *out, const double *in, size_t n, double d) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = in[i] / d;
}

/* Integers divide by the divisor rounded to an integer, truncating toward
 * zero (C division), as the host's coll_scale does. */
template <typename T> __global__ void scale_int_kernel(T *out, const T *in, size_t n, long long d) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = (T)((long long)in[i] / d);
}

const int kThreads = 512;

unsigned grid_for(size_t work, int sm_count) {
  size_t blocks = (work + kThreads - 1) / kThreads;
  size_t cap = (size_t)(sm_count > 0 ? sm_count : 16) * 4; /* a few waves, then stride */
  if (blocks > cap) blocks = cap;
  return blocks ? (unsigned)blocks : 1u;
}

template <typename T, typename Op>
cudaError_t launch_reduce(void *out, const void *in1, const void *in2, size_t n, int sm,
                          cudaStream_t stream) {
  int vec = ((uintptr_t)out | (uintptr_t)in1 | (uintptr_t)in2) % 16 == 0;
  size_t work = vec ? n / (16 / sizeof(T)) + 1 : n;
  reduce_kernel<T, Op><<<grid_for(work, sm), kThreads, 0, stream>>>(
      (T *)out, (const T *)in1, (const T *)in2, n, vec);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_op(coll_op_t op, void *out, const void *in1, const void *in2, size_t n, int sm,
                      cudaStream_t st) {
  switch (op) {
    case COLL_SUM:
    case COLL_AVG: return launch_reduce<T, OpSum>(out, in1, in2, n, sm, st);
    case COLL_PROD: return launch_reduce<T, OpProd>(out, in1, in2, n, sm, st);
    case COLL_MIN: return launch_reduce<T, OpMin>(out, in1, in2, n, sm, st);
    case COLL_MAX: return launch_reduce<T, OpMax>(out, in1, in2, n, sm, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

/* out = in1 op in2 on `stream` (asynchronous). */
extern "C" cudaError_t coll_cuda_launch_reduce(void *out, const void *in1, const void *in2,
                                               size_t count, coll_dtype_t dtype, coll_op_t op,
                                               int sm_count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  switch (dtype) {
    case COLL_INT8: return launch_op<int8_t>(op, out, in1, in2, count, sm_count, stream);
    case COLL_UINT8: return launch_op<uint8_t>(op, out, in1, in2, count, sm_count, stream);
    case COLL_INT32: return launch_op<int32_t>(op, out, in1, in2, count, sm_count, stream);
    case COLL_INT64: return launch_op<int64_t>(op, out, in1, in2, count, sm_count, stream);
    case COLL_FLOAT16: return launch_op<__half>(op, out, in1, in2, count, sm_count, stream);
    case COLL_BFLOAT16: return launch_op<__nv_bfloat16>(op, out, in1, in2, count, sm_count, stream);
    case COLL_FLOAT32: return launch_op<float>(op, out, in1, in2, count, sm_count, stream);
    case COLL_FLOAT64: return launch_op<double>(op, out, in1, in2, count, sm_count, stream);
    default: return cudaErrorInvalidValue;
  }
}

/* out = in / divisor on `stream` (AVG's last step); divisor as coll_scale. */
extern "C" cudaError_t coll_cuda_launch_scale(void *out, const void *in, size_t count,
                                              coll_dtype_t dtype, double divisor, int sm_count,
                                              cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  unsigned grid = grid_for(count, sm_count);
  long long idiv = (long long)(divisor < 0 ? divisor - 0.5 : divisor + 0.5);
  switch (dtype) {
    case COLL_FLOAT16:
      scale_float_kernel<__half><<<grid, kThreads, 0, stream>>>((__half *)out, (const __half *)in,
                                                                count, (float)divisor);
      break;
    case COLL_BFLOAT16:
      scale_float_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
          (__nv_bfloat16 *)out, (const __nv_bfloat16 *)in, count, (float)divisor);
      break;
    case COLL_FLOAT32:
      scale_float_kernel<float><<<grid, kThreads, 0, stream>>>((float *)out, (const float *)in,
                                                               count, (float)divisor);
      break;
    case COLL_FLOAT64:
      scale_f64_kernel<<<grid, kThreads, 0, stream>>>((double *)out, (const double *)in, count,
                                                      divisor);
      break;
    case COLL_INT8:
      scale_int_kernel<int8_t><<<grid, kThreads, 0, stream>>>((int8_t *)out, (const int8_t *)in,
                                                              count, idiv);
      break;
    case COLL_UINT8:
      scale_int_kernel<uint8_t><<<grid, kThreads, 0, stream>>>((uint8_t *)out, (const uint8_t *)in,
                                                               count, idiv);
      break;
    case COLL_INT32:
      scale_int_kernel<int32_t><<<grid, kThreads, 0, stream>>>((int32_t *)out, (const int32_t *)in,
                                                               count, idiv);
      break;
    case COLL_INT64:
      scale_int_kernel<int64_t><<<grid, kThreads, 0, stream>>>((int64_t *)out, (const int64_t *)in,
                                                               count, idiv);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
