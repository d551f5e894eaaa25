// jax/ffi.cc -- XLA FFI handlers (CPU, and CUDA for allreduce, allgather,
// broadcast and barrier) that run collectives-core calls inside a JAX program;
// the Python side is collectives/jax/__init__.py.
//
// The CUDA handlers (Collectives*Cuda) take XLA's stream and device ordinal
// from the FFI context and hand both to the core as a device call
// (coll_args_t.memory = COLL_MEMORY_CUDA): the core waits for the work XLA
// queued on that stream before the call, runs on its own streams, and returns
// once its result is final (cuda.h's ordering model), so XLA's later work on
// the stream sees it. They need no CUDA header (the stream is an opaque
// pointer to this file), so the same compile serves CPU-only and GPU jaxlibs;
// collectives.jax registers them for platform "CUDA" only where JAX has a GPU.
//
// Not built by setup.py (it globs native/**/*.c): collectives/jax.py compiles this
// file on first use against the headers of the installed jaxlib
// (jax.ffi.include_dir()) and registers each handler as a custom-call target.
//
// Handlers (custom-call targets; every one takes and returns the ordered-effect
// token last, which is what keeps XLA from reordering or dropping them):
//   collectives_allreduce   (x, token) -> (y, token)   attrs comm, api, op, algo
//                            x and y are aliased by the lowering: when XLA
//                            gives one buffer, this is the core's in-place form
//   collectives_allgather   (x, token) -> (y, token)   attrs comm, api, size
//                            y = every rank's x stacked along a new axis 0
//   collectives_broadcast   (x, token) -> (y, token)   attrs comm, api, root
//                            x and y are aliased by the lowering (in place)
//   collectives_barrier     (token)    -> (token)      attrs comm, api
//   collectives_send        (x, token) -> (token)      attrs comm, api, dest, tag
//   collectives_recv        (t, token) -> (y, token)   attrs comm, api, source, tag
//                            t is the template (y's shape and dtype, aliased to
//                            y); a message of another size fails, naming both
//   collectives_sendrecv    (x, t, token) -> (y, token)
//                            attrs comm, api, source, dest, sendtag, recvtag
//   collectives_gather      (x, token) -> (y, token)   attrs comm, api, root, size,
//                            is_root; y is (size, *x.shape) at the root, empty elsewhere
//   collectives_scatter     (x, token) -> (y, token)   attrs as gather; x is
//                            (size, *y.shape) at the root, a template elsewhere
//   collectives_reduce      (x, token) -> (y, token)   attrs comm, api, op, root,
//                            is_root; y is x's shape at the root, empty elsewhere
//   collectives_alltoall    (x, token) -> (y, token)   attrs comm, api, size;
//                            block i of x (axis 0) goes to rank i, block j of y
//                            came from rank j
//
// `comm` is the communicator's id (coll_comm_id) and `api` the address of the core's
// coll_api_t table (collectives._core.api_table()), both as int64: this library
// links nothing of the core, so it calls exactly the core the Python process
// loaded. A failed call returns ffi::Error carrying the core's message (rank,
// peer, seq, both sides' values); it never aborts the process.

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "coll.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kApiVersion = COLL_API_VERSION;

// XLA element type -> core dtype; false for types the core cannot reduce.
bool to_coll_dtype(ffi::DataType t, coll_dtype_t *out) {
  switch (t) {
    case ffi::DataType::S8: *out = COLL_INT8; return true;
    case ffi::DataType::U8: *out = COLL_UINT8; return true;
    case ffi::DataType::S32: *out = COLL_INT32; return true;
    case ffi::DataType::S64: *out = COLL_INT64; return true;
    case ffi::DataType::F16: *out = COLL_FLOAT16; return true;
    case ffi::DataType::BF16: *out = COLL_BFLOAT16; return true;
    case ffi::DataType::F32: *out = COLL_FLOAT32; return true;
    case ffi::DataType::F64: *out = COLL_FLOAT64; return true;
    default: return false;
  }
}

// For collectives that only move bytes (allgather, broadcast): the element
// type when the core knows it (so its header check compares dtypes), else the
// raw bytes as uint8 (uint32, int16, complex, ...).
void data_view(const ffi::AnyBuffer &b, coll_dtype_t *dtype, size_t *count) {
  if (to_coll_dtype(b.element_type(), dtype)) {
    *count = b.element_count();
  } else {
    *dtype = COLL_UINT8;
    *count = b.size_bytes();
  }
}

// Where a call's buffers live: host memory (CPU handlers), or device memory on
// XLA's device and stream (CUDA handlers).
struct Where {
  coll_memory_t memory;
  int device;
  void *stream;
};
constexpr Where kHost = {COLL_MEMORY_HOST, 0, nullptr};

void place(coll_args_t *a, const Where &w) {
  a->memory = w.memory;
  a->device = w.device;
  a->stream = w.stream;
}

ffi::Error resolve(int64_t comm_attr, int64_t api_attr, const char *what, coll_comm_t **comm,
                   const coll_api_t **api) {
  *api = reinterpret_cast<const coll_api_t *>(static_cast<intptr_t>(api_attr));
  if (*api == nullptr)
    return ffi::Error::InvalidArgument(std::string("collectives ") + what + ": null api table");
  if ((*api)->version != kApiVersion)
    return ffi::Error(
        ffi::ErrorCode::kFailedPrecondition,
        std::string("collectives ") + what + ": core api table version " +
        std::to_string((*api)->version) + ", this handler was built for " +
        std::to_string(kApiVersion) + " (rebuild the JAX FFI cache)");
  // The attribute is the communicator's id (coll_comm_id), looked up per call:
  // a function compiled before the communicator was freed finds nothing here.
  *comm = (*api)->comm_from_id(comm_attr);
  if (*comm == nullptr)
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      std::string("collectives ") + what + ": the communicator this function "
                      "was compiled with is freed (Comm.Free() or finalize); trace it again "
                      "with a live one");
  return ffi::Error::Success();
}

// The core already wrote the full message (rank, peer, seq, values) where the
// error was born; only the collective's name is added here.
ffi::Error core_error(coll_result_t res, const coll_api_t *api, coll_comm_t *comm,
                      const char *what) {
  const char *text = api->last_error(comm);
  std::string msg = std::string("collectives ") + what + " failed (code " +
                    std::to_string(static_cast<int>(res)) + "): " +
                    (text && *text ? text : "no message");
  switch (res) {
    case COLL_INVALID_ARGUMENT: return ffi::Error::InvalidArgument(msg);
    case COLL_INVALID_USAGE: return ffi::Error(ffi::ErrorCode::kFailedPrecondition, msg);
    case COLL_TIMEOUT: return ffi::Error(ffi::ErrorCode::kDeadlineExceeded, msg);
    case COLL_REMOTE_ERROR: return ffi::Error(ffi::ErrorCode::kUnavailable, msg);
    default: return ffi::Error::Internal(msg);
  }
}

// An output XLA allocated fresh for this call (not aliased to the input) is
// usually untouched memory straight from mmap: 64 MiB of it is 16384 page
// faults, which cost more than the reduction itself on a small host. Huge pages
// for its 2 MiB-aligned interior turn them into 32 (a hint: where THP is off,
// or the range was already touched, nothing changes). Only the buffer's own
// interior is advised, never memory outside it.
void prefer_huge_pages(void *p, size_t n) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (n < 4 * kHuge) return;
  uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n) & ~(kHuge - 1);
#ifdef MADV_HUGEPAGE
  if (hi > lo) (void)madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_HUGEPAGE);
#endif
}

ffi::Error Allreduce(const Where &w, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                     int64_t comm_attr, int64_t api_attr, int32_t op, int32_t algo) {
  coll_comm_t *comm;
  const coll_api_t *api;
  if (ffi::Error e = resolve(comm_attr, api_attr, "allreduce", &comm, &api); e.failure()) return e;
  coll_args_t a;
  std::memset(&a, 0, sizeof(a));
  if (!to_coll_dtype(x.element_type(), &a.dtype) || x.element_type() != y->element_type())
    return ffi::Error::InvalidArgument("collectives allreduce: unsupported element type");
  if (op < 0 || op >= COLL_NUM_OPS || algo < 0 || algo >= COLL_NUM_ALGOS)
    return ffi::Error::InvalidArgument("collectives allreduce: bad op or algorithm code");
  a.sendbuf = x.untyped_data();
  a.recvbuf = y->untyped_data();
  // Not aliased (the caller keeps x): the core's out-of-place form reads x
  // once and writes y, with no copy of x first.
  if (a.recvbuf != a.sendbuf && w.memory == COLL_MEMORY_HOST)
    prefer_huge_pages(a.recvbuf, y->size_bytes());
  place(&a, w);
  a.count = x.element_count();
  a.op = static_cast<coll_op_t>(op);
  a.algo = static_cast<coll_algo_t>(algo);
  coll_result_t res = api->allreduce(comm, &a);
  if (res != COLL_SUCCESS) return core_error(res, api, comm, "allreduce");
  return ffi::Error::Success();
}

ffi::Error Allgather(const Where &w, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                     int64_t comm_attr, int64_t api_attr, int64_t size) {
  coll_comm_t *comm;
  const coll_api_t *api;
  if (ffi::Error e = resolve(comm_attr, api_attr, "allgather", &comm, &api); e.failure()) return e;
  if (size <= 0 || y->size_bytes() != x.size_bytes() * static_cast<size_t>(size))
    return ffi::Error::InvalidArgument("collectives allgather: output is not size x input");
  coll_args_t a;
  std::memset(&a, 0, sizeof(a));
  data_view(x, &a.dtype, &a.count);
  // counts then displs, one allocation; equal blocks laid out rank by rank.
  std::vector<size_t> cd(2 * static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    cd[i] = a.count;
    cd[size + i] = static_cast<size_t>(i) * a.count;
  }
  a.sendbuf = x.untyped_data();
  a.recvbuf = y->untyped_data();
  a.counts = cd.data();
  a.displs = cd.data() + size;
  place(&a, w);
  coll_result_t res = api->allgatherv(comm, &a);
  if (res != COLL_SUCCESS) return core_error(res, api, comm, "allgather");
  return ffi::Error::Success();
}

ffi::Error Broadcast(const Where &w, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                     int64_t comm_attr, int64_t api_attr, int32_t root) {
  coll_comm_t *comm;
  const coll_api_t *api;
  if (ffi::Error e = resolve(comm_attr, api_attr, "broadcast", &comm, &api); e.failure()) return e;
  if (y->size_bytes() != x.size_bytes())
    return ffi::Error::InvalidArgument("collectives broadcast: output size differs from input");
  // The lowering aliases y to x, but XLA may still hand us two buffers (when
  // x stays live): the root's data must then be in y before it is sent. On
  // the GPU the lowering always aliases (XLA then copies x itself when it
  // stays live), so two buffers there are an error, never a host memcpy of
  // device memory.
  if (y->untyped_data() != x.untyped_data() && x.size_bytes() > 0) {
    if (w.memory != COLL_MEMORY_HOST)
      return ffi::Error::InvalidArgument(
          "collectives broadcast: XLA gave the GPU call separate input and output buffers "
          "although the lowering aliases them");
    std::memcpy(y->untyped_data(), x.untyped_data(), x.size_bytes());
  }
  coll_args_t a;
  std::memset(&a, 0, sizeof(a));
  data_view(x, &a.dtype, &a.count);
  a.sendbuf = y->untyped_data();
  a.recvbuf = y->untyped_data();
  a.root = root;
  place(&a, w);
  coll_result_t res = api->broadcast(comm, &a);
  if (res != COLL_SUCCESS) return core_error(res, api, comm, "broadcast");
  return ffi::Error::Success();
}

ffi::Error Barrier(int64_t comm_attr, int64_t api_attr) {
  coll_comm_t *comm;
  const coll_api_t *api;
  if (ffi::Error e = resolve(comm_attr, api_attr, "barrier", &comm, &api); e.failure()) return e;
  coll_result_t res = api->barrier(comm, 0.0);
  if (res != COLL_SUCCESS) return core_error(res, api, comm, "barrier");
  return ffi::Error::Success();
}

// The handlers' signatures: the token in and out only order the calls.
ffi::Error AllreduceImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::Token>, int64_t comm, int64_t api, int32_t op,
                         int32_t algo) {
  return Allreduce(kHost, x, y, comm, api, op, algo);
}
ffi::Error AllreduceCudaImpl(void *stream, int32_t device, ffi::AnyBuffer x, ffi::Token,
                             ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::Token>, int64_t comm,
                             int64_t api, int32_t op, int32_t algo) {
  return Allreduce(Where{COLL_MEMORY_CUDA, device, stream}, x, y, comm, api, op, algo);
}
ffi::Error AllgatherImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::Token>, int64_t comm, int64_t api, int64_t size) {
  return Allgather(kHost, x, y, comm, api, size);
}
ffi::Error AllgatherCudaImpl(void *stream, int32_t device, ffi::AnyBuffer x, ffi::Token,
                             ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::Token>, int64_t comm,
                             int64_t api, int64_t size) {
  return Allgather(Where{COLL_MEMORY_CUDA, device, stream}, x, y, comm, api, size);
}
ffi::Error BroadcastImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::Token>, int64_t comm, int64_t api, int32_t root) {
  return Broadcast(kHost, x, y, comm, api, root);
}
ffi::Error BroadcastCudaImpl(void *stream, int32_t device, ffi::AnyBuffer x, ffi::Token,
                             ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::Token>, int64_t comm,
                             int64_t api, int32_t root) {
  return Broadcast(Where{COLL_MEMORY_CUDA, device, stream}, x, y, comm, api, root);
}
ffi::Error BarrierImpl(ffi::Token, ffi::Result<ffi::Token>, int64_t comm, int64_t api) {
  return Barrier(comm, api);
}
// A barrier moves no buffer: on the GPU it is the host barrier, ordered with
// the other collectives by the token.
ffi::Error BarrierCudaImpl(ffi::Token, ffi::Result<ffi::Token>, int64_t comm, int64_t api) {
  return Barrier(comm, api);
}

// ---- point-to-point, rooted, alltoall (api version 2) ----

// A receive must fill its template exactly: a shorter message would leave the
// rest of the output undefined (a longer one the core refuses itself).
ffi::Error check_received(const coll_status_t &st, size_t want, const char *what) {
  if (st.count == want) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(
      std::string("collectives ") + what + ": the message from rank " + std::to_string(st.source) +
      " (tag " + std::to_string(st.tag) + ") has " + std::to_string(st.count) +
      " elements, the receive's template " + std::to_string(want) +
      " (sender and receiver disagree on the shape)");
}

ffi::Error SendImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::Token>, int64_t comm_attr,
                    int64_t api_attr, int32_t dest, int32_t tag) {
  coll_comm_t *comm;
  const coll_api_t *api;
  if (ffi::Error e = resolve(comm_attr, api_attr, "send", &comm, &api); e.failure()) return e;
  coll_args_t a;
  std::memset(&a, 0, sizeof(a));
  data_view(x, &a.dtype, &a.count);
  a.sendbuf = x.untyped_data();
  a.peer = dest;
  a.tag = tag;
  coll_result_t res = api->send(comm, &a);
  if (res != COLL_SUCCESS) return core_error(res, api, comm, "send");
  return ffi::Error::Success();
}

ffi::Error RecvImpl(ffi::AnyBuffer, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                    ffi::Result<ffi::Token>, int64_t comm_attr, int64_t api_attr, int32_t source,
                    int32_t tag) {
  coll_comm_t *comm;
  const coll_api_t *api;
  if (ffi::Error e = resolve(comm_attr, api_attr, "recv", &comm, &api); e.failure()) return e;
  coll_args_t a;
  std::memset(&a, 0, sizeof(a));
  data_view(*y, &a.dtype, &a.count);
  a.recvbuf = y->untyped_data();
  a.peer = source;
  a.tag = tag;
  coll_status_t st;
  coll_result_t res = api->recv(comm, &a, &st);
  if (res != COLL_SUCCESS) return core_error(res, api, comm, "recv");
  return check_received(st, a.count, "recv");
}

ffi::Error SendrecvImpl(ffi::AnyBuffer x, ffi::AnyBuffer, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                        ffi::Result<ffi::Token>, int64_t comm_attr, int64_t api_attr,
                        int32_t source, int32_t dest, int32_t sendtag, int32_t recvtag) {
  coll_comm_t *comm;
  const coll_api_t *api;
  if (ffi::Error e = resolve(comm_attr, api_attr, "sendrecv", &comm, &api); e.failure()) return e;
  coll_args_t s, r;
  std::memset(&s, 0, sizeof(s));
  std::memset(&r, 0, sizeof(r));
  data_view(x, &s.dtype, &s.count);
  s.sendbuf = x.untyped_data();
  s.peer = dest;
  s.tag = sendtag;
  data_view(*y, &r.dtype, &r.count);
  r.recvbuf = y->untyped_data();
  r.peer = source;
  r.tag = recvtag;
  coll_status_t st;
  coll_result_t res = api->sendrecv(comm, &s, &r, &st);
  if (res != COLL_SUCCESS) return core_error(res, api, comm, "sendrecv");
  return check_received(st, r.count, "sendrecv");
}

// Equal blocks of `block` elements, rank by rank: counts then displs (n each).
std::vector<size_t> equal_blocks(int64_t n, size_t block) {
  std::vector<size_t> cd(2 * static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    cd[i] = block;
    cd[n + i] = static_cast<size_t>(i) * block;
  }
  return cd;
}

ffi::Error GatherImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                      ffi::Result<ffi::Token>, int64_t comm_attr, int64_t api_attr, int32_t root,
                      int64_t size, int32_t is_root) {
  coll_comm_t *comm;
  const coll_api_t *api;
  if (ffi::Error e = resolve(comm_attr, api_attr, "gather", &comm, &api); e.failure()) return e;
  if (size <= 0 || (is_root && y->size_bytes() != x.size_bytes() * static_cast<size_t>(size)))
    return ffi::Error::InvalidArgument("collectives gather: the root's output is not size x input");
  coll_args_t a;
  std::memset(&a, 0, sizeof(a));
  data_view(x, &a.dtype, &a.count);
  std::vector<size_t> cd = equal_blocks(size, a.count);
  a.sendbuf = x.untyped_data();
  a.root = root;
  if (is_root) {
    a.recvbuf = y->untyped_data();
    a.counts = cd.data();
    a.displs = cd.data() + size;
  }
  coll_result_t res = api->gatherv(comm, &a);
  if (res != COLL_SUCCESS) return core_error(res, api, comm, "gather");
  return ffi::Error::Success();
}

ffi::Error ScatterImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                       ffi::Result<ffi::Token>, int64_t comm_attr, int64_t api_attr, int32_t root,
                       int64_t size, int32_t is_root) {
  coll_comm_t *comm;
  const coll_api_t *api;
  if (ffi::Error e = resolve(comm_attr, api_attr, "scatter", &comm, &api); e.failure()) return e;
  if (size <= 0 || (is_root && x.size_bytes() != y->size_bytes() * static_cast<size_t>(size)))
    return ffi::Error::InvalidArgument("collectives scatter: the root's input is not size x output");
  coll_args_t a;
  std::memset(&a, 0, sizeof(a));
  data_view(*y, &a.dtype, &a.count);
  std::vector<size_t> cd = equal_blocks(size, a.count);
  a.recvbuf = y->untyped_data();
  a.root = root;
  if (is_root) {
    a.sendbuf = x.untyped_data();
    a.counts = cd.data();
    a.displs = cd.data() + size;
  }
  coll_result_t res = api->scatterv(comm, &a);
  if (res != COLL_SUCCESS) return core_error(res, api, comm, "scatter");
  return ffi::Error::Success();
}

ffi::Error ReduceImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                      ffi::Result<ffi::Token>, int64_t comm_attr, int64_t api_attr, int32_t op,
                      int32_t root, int32_t is_root) {
  coll_comm_t *comm;
  const coll_api_t *api;
  if (ffi::Error e = resolve(comm_attr, api_attr, "reduce", &comm, &api); e.failure()) return e;
  coll_args_t a;
  std::memset(&a, 0, sizeof(a));
  if (!to_coll_dtype(x.element_type(), &a.dtype))
    return ffi::Error::InvalidArgument("collectives reduce: unsupported element type");
  if (op < 0 || op >= COLL_NUM_OPS)
    return ffi::Error::InvalidArgument("collectives reduce: bad op code");
  if (is_root && y->size_bytes() != x.size_bytes())
    return ffi::Error::InvalidArgument("collectives reduce: the root's output differs from input");
  a.sendbuf = x.untyped_data();
  a.recvbuf = is_root ? y->untyped_data() : nullptr;
  a.count = x.element_count();
  a.op = static_cast<coll_op_t>(op);
  a.root = root;
  coll_result_t res = api->reduce(comm, &a);
  if (res != COLL_SUCCESS) return core_error(res, api, comm, "reduce");
  return ffi::Error::Success();
}

ffi::Error AlltoallImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> y,
                        ffi::Result<ffi::Token>, int64_t comm_attr, int64_t api_attr,
                        int64_t size) {
  coll_comm_t *comm;
  const coll_api_t *api;
  if (ffi::Error e = resolve(comm_attr, api_attr, "alltoall", &comm, &api); e.failure()) return e;
  coll_args_t a;
  std::memset(&a, 0, sizeof(a));
  data_view(x, &a.dtype, &a.count);
  if (size <= 0 || a.count % static_cast<size_t>(size) != 0 || y->size_bytes() != x.size_bytes())
    return ffi::Error::InvalidArgument("collectives alltoall: input is not size equal blocks");
  size_t block = a.count / static_cast<size_t>(size);
  // send side then receive side: counts (2 size), displs (2 size)
  std::vector<size_t> send = equal_blocks(size, block), cd(4 * static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    cd[i] = cd[size + i] = block;
    cd[2 * size + i] = cd[3 * size + i] = send[size + i];
  }
  a.sendbuf = x.untyped_data();
  a.recvbuf = y->untyped_data();
  a.counts = cd.data();
  a.displs = cd.data() + 2 * size;
  coll_result_t res = api->alltoallv(comm, &a);
  if (res != COLL_SUCCESS) return core_error(res, api, comm, "alltoall");
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesSend, SendImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api")
                                  .Attr<int32_t>("dest")
                                  .Attr<int32_t>("tag"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesRecv, RecvImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api")
                                  .Attr<int32_t>("source")
                                  .Attr<int32_t>("tag"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesSendrecv, SendrecvImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api")
                                  .Attr<int32_t>("source")
                                  .Attr<int32_t>("dest")
                                  .Attr<int32_t>("sendtag")
                                  .Attr<int32_t>("recvtag"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesGather, GatherImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api")
                                  .Attr<int32_t>("root")
                                  .Attr<int64_t>("size")
                                  .Attr<int32_t>("is_root"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesScatter, ScatterImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api")
                                  .Attr<int32_t>("root")
                                  .Attr<int64_t>("size")
                                  .Attr<int32_t>("is_root"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesReduce, ReduceImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api")
                                  .Attr<int32_t>("op")
                                  .Attr<int32_t>("root")
                                  .Attr<int32_t>("is_root"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesAlltoall, AlltoallImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api")
                                  .Attr<int64_t>("size"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesAllreduce, AllreduceImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api")
                                  .Attr<int32_t>("op")
                                  .Attr<int32_t>("algo"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesAllgather, AllgatherImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api")
                                  .Attr<int64_t>("size"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesBroadcast, BroadcastImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api")
                                  .Attr<int32_t>("root"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesBarrier, BarrierImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api"));

// ---- CUDA handlers: XLA's stream and device first (FFI context), then as on the CPU ----

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesAllreduceCuda, AllreduceCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api")
                                  .Attr<int32_t>("op")
                                  .Attr<int32_t>("algo"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesAllgatherCuda, AllgatherCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api")
                                  .Attr<int64_t>("size"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesBroadcastCuda, BroadcastCudaImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api")
                                  .Attr<int32_t>("root"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CollectivesBarrierCuda, BarrierCudaImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::Token>()
                                  .Attr<int64_t>("comm")
                                  .Attr<int64_t>("api"));
