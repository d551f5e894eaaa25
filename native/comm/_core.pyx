# cython: language_level=3
"""The native communicator: buffers in, GIL released for the whole call.

Each method is: resolve and check buffers -> ``with nogil:`` -> one checked C
call. Argument errors raise ValueError/TypeError before any byte is sent;
everything else raises CollectivesError naming the rank and the peer.
"""
from libc.stdint cimport int64_t, uint8_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from libcoll cimport *

import operator

include "errors.pxi"
include "buffer.pxi"
include "p2p.pxi"
include "rooted.pxi"
include "alltoall.pxi"
include "subcomm.pxi"
include "generation.pxi"
include "dgc.pxi"
include "gpu.pxi"
include "topology.pxi"


cdef class Request:
    """A non-blocking collective in flight; keeps its buffers alive until done."""
    cdef coll_request_t *req
    cdef Communicator owner
    cdef object views
    cdef object _result
    cdef public object _status  # point-to-point: (source, tag, count, data) once done

    def Wait(self) -> None:
        """Block until the collective completes; raise if it failed."""
        cdef coll_result_t res
        if self.req == NULL:
            return self._result
        if self.owner.comm == NULL:  # closed: destroy drained the queue
            res = coll_request_wait_closed(self.req)
        else:
            with nogil:
                res = coll_request_wait(self.req)
        self._finish(res)

    def Test(self) -> bool:
        """True if the collective has completed (raising if it failed)."""
        cdef int done = 0
        cdef coll_result_t res
        if self.req == NULL:
            return True
        if self.owner.comm == NULL:
            self._finish(coll_request_wait_closed(self.req))
            return True
        with nogil:  # a point-to-point request moves bytes (and may dial a peer) here
            res = coll_request_test(self.req, &done)
        if done:
            self._finish(res)
        return bool(done)

    @property
    def active(self) -> bool:
        """True until a Wait or a Test has seen it complete."""
        return self.req != NULL

    def wait(self) -> None:
        """Alias of Wait()."""
        self.Wait()

    def test(self) -> bool:
        """Alias of Test()."""
        return self.Test()

    cdef _finish(self, coll_result_t res):
        if res == COLL_SUCCESS:
            self._status = p2p_outcome(self.req)
        else:
            p2p_outcome(self.req)  # frees a buffer allocated for it
        free(self.req)
        self.req = NULL
        self.views = None
        CHKERR(res, self.owner.comm)

    def __dealloc__(self):
        if self.req != NULL:
            if self.owner is not None and self.owner.comm != NULL:
                with nogil:
                    coll_request_free(self.req)
            else:
                free(self.req)
            self.req = NULL


cdef coll_result_t coll_request_wait_closed(coll_request_t *req) noexcept:
    # After coll_comm_destroy every queued request has run; the struct is ours.
    return (<coll_result_t *>(<char *>req + _RESULT_OFFSET))[0]


cdef extern from *:
    """
    #include "base/comm_state.h"
    #include <stddef.h>
    #define _RESULT_OFFSET offsetof(struct coll_request, result)
    """
    size_t _RESULT_OFFSET


cdef class Communicator:
    """One rank's endpoint: listens on creation, connects to peers lazily.

    Args:
        rank: this process's rank, 0 <= rank < size.
        size: number of ranks.
        bind_host: numeric address to listen on ("" for any).
        comm_id: 16 bytes equal on every rank of this communicator.
    """
    cdef coll_comm_t *comm
    cdef int _rank
    cdef int _size

    def __cinit__(self, int rank, int size, str bind_host="", bytes comm_id=bytes(16)):
        if size == 0 and rank == -1 and type(self) is not Communicator:
            return  # a SubCommunicator: comm_split fills it (subcomm.pxi)
        if size < 1 or not (0 <= rank < size):
            raise ValueError(f"rank {rank} out of range for size {size}")
        if len(comm_id) != 16:
            raise ValueError("comm_id must be 16 bytes")
        self._rank = rank
        self._size = size
        cdef bytes host = bind_host.encode()
        cdef const char *chost = host
        cdef const uint8_t *cid = comm_id
        cdef coll_comm_t *c = NULL
        cdef coll_result_t res
        with nogil:
            res = coll_comm_create(rank, size, chost, cid, &c)
        if res != COLL_SUCCESS:
            try:
                CHKERR(res, c)
            finally:
                coll_comm_destroy(c)
        self.comm = c

    def __dealloc__(self):
        if self.comm != NULL:
            with nogil:
                coll_comm_destroy(self.comm)
            self.comm = NULL

    cdef coll_comm_t *_live(self) except NULL:
        if self.comm == NULL:
            raise CollectivesError(<int>COLL_INVALID_USAGE, "the communicator is closed")
        return self.comm

    @property
    def port(self) -> int:
        """The TCP port this rank listens on."""
        return coll_comm_port(self._live())

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._rank

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self._size

    @property
    def handle(self) -> int:
        """The native coll_comm_t* as an integer, for native adapters (JAX FFI) that
        call the C API through api_table(); valid until close()."""
        return <size_t>self._live()

    @property
    def ffi_id(self) -> int:
        """A number for this communicator that native adapters holding it past its life
        (a compiled JAX function) pass to the API table's comm_from_id, which finds
        nothing once it is closed: never reused in the process."""
        cdef int64_t i = coll_comm_id(self._live())
        if i == 0:
            raise MemoryError("no memory to register the communicator")
        return i

    @property
    def closed(self) -> bool:
        """True after close()."""
        return self.comm == NULL

    @property
    def broken(self) -> bool:
        """True once a failure broke the communicator (its links are closed)."""
        return bool(coll_comm_is_broken(self._live()))

    @property
    def segment_bytes(self) -> int:
        """The pipelining segment of host-memory collectives now (COLLECTIVES_SEGMENT_BYTES,
        "auto" resolved by the host policy)."""
        return coll_comm_segment_bytes(self._live())

    @property
    def num_links(self) -> int:
        """Open links to peers (0 after close)."""
        return 0 if self.comm == NULL else coll_comm_num_links(self.comm)

    def set_peer(self, int peer, str host, int port) -> None:
        """Where rank `peer` listens."""
        cdef bytes h = host.encode()
        CHKERR(coll_comm_set_peer(self._live(), peer, h, port), self.comm)

    def set_spin(self, double us) -> None:
        """Microseconds a waiting rank keeps checking before sleeping in poll() (0: never)."""
        coll_comm_set_spin(self._live(), us)

    def set_oversubscribed(self, bint oversubscribed) -> None:
        """Whether this host runs more ranks than cores (before the first collective): a
        waiting rank then yields its core between checks, and with
        COLLECTIVES_SOCKET_BUFFER=auto its TCP links keep the kernel's buffer autotuning."""
        coll_comm_set_oversubscribed(self._live(), oversubscribed)

    def set_job_oversubscribed(self, bint oversubscribed) -> None:
        """Whether some host of the job runs more ranks than cores (the same on every rank,
        before the first collective): the automatic segment size follows it."""
        coll_comm_set_job_oversubscribed(self._live(), oversubscribed)

    def bind_cpu(self, int cpu) -> None:
        """Pin every thread of this process to `cpu` (COLLECTIVES_BIND's policy picks it)."""
        coll_comm_bind_cpu(self._live(), cpu)

    def set_peer_host(self, int peer, str host_id) -> None:
        """Mark which peers share this host (equal ids): they may use shared memory."""
        cdef bytes h = host_id.encode()
        CHKERR(coll_comm_set_peer_host(self._live(), peer, h), self.comm)

    def host_ids(self) -> list:
        """Every rank's host id (hostname/boot id; "" where unknown), as set at rendezvous."""
        cdef coll_comm_t *c = self._live()
        return [coll_comm_peer_host(c, i).decode() for i in range(self.size)]

    def set_link_key(self, bytes key) -> None:
        """The 32-byte key (from the job secret) that links and abort notices must prove."""
        cdef const uint8_t *k = key
        CHKERR(coll_comm_set_link_key(self._live(), k, len(key)), self.comm)

    def close(self) -> None:
        """Finish queued requests, close every link and the listener."""
        if self.comm != NULL:
            with nogil:
                coll_comm_destroy(self.comm)
            self.comm = NULL

    def allreduce(self, sendbuf, recvbuf, op="sum", algorithm="auto", timeout=None, dtype=None,
                  segment_bytes=0, stream=None) -> None:
        """recvbuf = op over all ranks of sendbuf (sendbuf None or recvbuf: in place).

        GPU buffers run after the work queued on `stream` (a CuPy/torch stream
        or a raw cudaStream_t; default: the buffer's own interface stream, else
        the legacy default stream) and are final when the call returns.
        """
        cdef coll_args_t a
        views = self._allreduce_args(&a, sendbuf, recvbuf, code_of(OPS, op, "op"), algorithm,
                                     timeout, dtype, segment_bytes, stream)
        cdef coll_result_t res
        with nogil:
            res = coll_allreduce(self.comm, &a)
        CHKERR(res, self.comm)

    def iallreduce(self, sendbuf, recvbuf, op="sum", algorithm="auto", timeout=None,
                   dtype=None, stream=None) -> Request:
        """Start an allreduce on the progress thread; returns a Request."""
        cdef coll_args_t a
        cdef Request r = self._request(
            self._allreduce_args(&a, sendbuf, recvbuf, code_of(OPS, op, "op"), algorithm, timeout,
                                 dtype, 0, stream))
        CHKERR(coll_iallreduce(self.comm, &a, &r.req), self.comm)
        return r

    def _allreduce_at(self, uintptr_t sendbuf, uintptr_t recvbuf, size_t count, str dtype,
                      str op) -> None:
        """Blocking allreduce of host memory by address (sendbuf 0: in place), unchecked:
        collectives.torch's CPU tensors (numpy views cost more than a small call)."""
        cdef coll_args_t a
        cdef coll_result_t res
        self._live()
        memset(&a, 0, sizeof(coll_args_t))
        a.recvbuf = <void *>recvbuf if recvbuf else <void *>_zero_bytes
        a.sendbuf = <void *>sendbuf if sendbuf else a.recvbuf
        a.count = count
        a.dtype = <coll_dtype_t>code_of(DTYPES, dtype, "dtype")
        a.op = <coll_op_t>code_of(OPS, op, "op")
        a.algo = COLL_ALGO_AUTO
        a.timeout = as_timeout(None)
        with nogil:
            res = coll_allreduce(self.comm, &a)
        CHKERR(res, self.comm)

    cdef object _allreduce_args(self, coll_args_t *a, sendbuf, recvbuf, int op, algorithm,
                                timeout, dtype, segment_bytes, stream):
        self._live()
        cdef _View rv = as_view(recvbuf, "recvbuf", True, dtype)
        cdef _View sv = rv if (sendbuf is None or sendbuf is recvbuf) else as_view(sendbuf, "sendbuf", False, dtype)
        if sv.dtype != rv.dtype:
            raise TypeError(f"sendbuf is {coll_dtype_name(<coll_dtype_t>sv.dtype).decode()} but "
                            f"recvbuf is {coll_dtype_name(<coll_dtype_t>rv.dtype).decode()}")
        if sv.count != rv.count:
            raise ValueError(f"mismatch in send count {sv.count} and receive count {rv.count}")
        check_overlap(sv, rv, "allreduce")
        memset(a, 0, sizeof(coll_args_t))
        a.sendbuf = sv.ptr
        a.recvbuf = rv.ptr
        a.count = rv.count
        a.dtype = <coll_dtype_t>rv.dtype
        a.op = <coll_op_t>op
        a.algo = <coll_algo_t>code_of(ALGORITHMS, algorithm, "algorithm")
        a.timeout = as_timeout(timeout)
        a.segment_bytes = segment_bytes
        set_memory(a, stream, rv, sv)
        return (sv, rv)

    cdef Request _request(self, object views):
        cdef Request r = Request()
        r.owner = self
        r.views = views
        return r

    cdef object _allgatherv_args(self, coll_args_t *a, size_t *cc, sendbuf, recvbuf, counts,
                                 displs, timeout, dtype, stream):
        """Checks and fills a; cc has room for 2 * size entries (counts, displs)."""
        self._live()
        cdef int n = self._size
        counts = [int(c) for c in counts]
        if len(counts) != n:
            raise ValueError(f"counts has {len(counts)} entries for {n} ranks")
        if any(c < 0 for c in counts):
            raise ValueError("counts must be >= 0")
        if displs is None:
            displs, acc = [], 0
            for c in counts:
                displs.append(acc)
                acc += c
        displs = [int(d) for d in displs]
        if len(displs) != n or any(d < 0 for d in displs):
            raise ValueError(f"displs must have {n} non-negative entries")
        cdef _View rv = as_view(recvbuf, "recvbuf", True, dtype)
        cdef _View sv = None
        if sendbuf is not None:
            sv = as_view(sendbuf, "sendbuf", False, dtype)
            if sv.dtype != rv.dtype:
                raise TypeError("sendbuf and recvbuf have different dtypes")
            if sv.count != <size_t>counts[self._rank]:
                raise ValueError(f"mismatch in send count {sv.count} and counts[{self._rank}] = "
                                 f"{counts[self._rank]}")
            check_overlap(sv, rv, "allgatherv")
        for i in range(n):
            if <size_t>(displs[i] + counts[i]) > rv.count:
                raise ValueError(f"recvbuf has {rv.count} elements; block {i} needs "
                                 f"[{displs[i]}, {displs[i] + counts[i]})")
        for i in range(n):
            cc[i] = counts[i]
            cc[n + i] = displs[i]
        cdef size_t esize = coll_dtype_size(<coll_dtype_t>rv.dtype)
        memset(a, 0, sizeof(coll_args_t))
        a.recvbuf = rv.ptr
        a.sendbuf = sv.ptr if sv is not None else <void *>(<char *>rv.ptr + cc[n + self._rank] * esize)
        a.count = cc[self._rank]
        a.counts = cc
        a.displs = cc + n
        a.dtype = <coll_dtype_t>rv.dtype
        a.timeout = as_timeout(timeout)
        set_memory(a, stream, rv, sv)
        return (sv, rv)

    def allgatherv(self, sendbuf, recvbuf, counts, displs=None, timeout=None, dtype=None,
                   stream=None) -> None:
        """Gather every rank's sendbuf into recvbuf: rank i's counts[i] elements at displs[i].

        sendbuf None means in place: this rank's block is already in recvbuf.
        """
        cdef size_t *cc = <size_t *>malloc(2 * self._size * sizeof(size_t) + 1)
        if cc == NULL:
            raise MemoryError()
        cdef coll_args_t a
        cdef coll_result_t res
        try:
            views = self._allgatherv_args(&a, cc, sendbuf, recvbuf, counts, displs, timeout, dtype,
                                          stream)
            with nogil:
                res = coll_allgatherv(self.comm, &a)
            CHKERR(res, self.comm)
        finally:
            free(cc)

    def iallgatherv(self, sendbuf, recvbuf, counts, displs=None, timeout=None,
                    dtype=None, stream=None) -> Request:
        """Start an allgatherv on the progress thread; returns a Request."""
        cdef size_t *cc = <size_t *>malloc(2 * self._size * sizeof(size_t) + 1)
        if cc == NULL:
            raise MemoryError()
        cdef coll_args_t a
        cdef Request r
        try:
            r = self._request(self._allgatherv_args(&a, cc, sendbuf, recvbuf, counts, displs,
                                                    timeout, dtype, stream))
            CHKERR(coll_iallgatherv(self.comm, &a, &r.req), self.comm)  # copies counts
        finally:
            free(cc)
        return r

    cdef object _broadcast_args(self, coll_args_t *a, buf, root_arg, timeout, dtype, stream):
        self._live()
        cdef int root = check_root(root_arg, self._size)
        cdef _View v = as_view(buf, "buf", self._rank != root, dtype)
        memset(a, 0, sizeof(coll_args_t))
        a.sendbuf = v.ptr
        a.recvbuf = v.ptr
        a.count = v.count
        a.dtype = <coll_dtype_t>v.dtype
        a.root = root
        a.timeout = as_timeout(timeout)
        set_memory(a, stream, v)
        return v

    def broadcast(self, buf, root=0, timeout=None, dtype=None, stream=None) -> None:
        """Copy root's buf into buf on every rank. A rank that refuses its arguments tells
        the others (refuse_broadcast) before raising."""
        cdef coll_args_t a
        try:
            v = self._broadcast_args(&a, buf, root, timeout, dtype, stream)
        except Exception:
            refuse_broadcast(self, buf, timeout, dtype)
            raise
        cdef coll_result_t res
        with nogil:
            res = coll_broadcast(self.comm, &a)
        if res == COLL_INVALID_ARGUMENT:  # refused by the core's check: nothing moved
            _refused_by_core(self, buf, timeout, dtype)
        CHKERR(res, self.comm)

    def ibroadcast(self, buf, root=0, timeout=None, dtype=None, stream=None) -> Request:
        """Start a broadcast on the progress thread; returns a Request. A refusal is told
        to the other ranks as broadcast's is."""
        cdef coll_args_t a
        cdef Request r
        try:
            r = self._request(self._broadcast_args(&a, buf, root, timeout, dtype, stream))
        except Exception:
            refuse_broadcast(self, buf, timeout, dtype)
            raise
        cdef coll_result_t res = coll_ibroadcast(self.comm, &a, &r.req)
        if res == COLL_INVALID_ARGUMENT:
            _refused_by_core(self, buf, timeout, dtype)
        CHKERR(res, self.comm)
        return r

    cdef object _reduce_scatter_args(self, coll_args_t *a, sendbuf, recvbuf, op, timeout, dtype,
                                     stream):
        self._live()
        cdef _View rv = as_view(recvbuf, "recvbuf", True, dtype)
        cdef _View sv = rv if sendbuf is None else as_view(sendbuf, "sendbuf", False, dtype)
        cdef size_t count
        if sendbuf is None:
            if rv.count % self._size:
                raise ValueError(f"in-place reduce_scatter_block: {rv.count} elements is not a "
                                 f"multiple of {self._size} ranks")
            count = rv.count // self._size
        else:
            if sv.dtype != rv.dtype:
                raise TypeError("sendbuf and recvbuf have different dtypes")
            if sv.count != rv.count * self._size:
                raise ValueError(f"mismatch in send count {sv.count} and receive count "
                                 f"{rv.count} x {self._size} ranks")
            check_overlap(sv, rv, "reduce_scatter_block")
            count = rv.count
        memset(a, 0, sizeof(coll_args_t))
        a.sendbuf = sv.ptr
        a.recvbuf = rv.ptr
        a.count = count
        a.dtype = <coll_dtype_t>rv.dtype
        a.op = <coll_op_t>code_of(OPS, op, "op")
        a.timeout = as_timeout(timeout)
        set_memory(a, stream, rv, sv)
        return (sv, rv)

    def reduce_scatter_block(self, sendbuf, recvbuf, op="sum", timeout=None, dtype=None,
                             stream=None) -> None:
        """recvbuf = block `rank` of op over all ranks of sendbuf (size * len(recvbuf) elements).

        sendbuf None means in place: recvbuf holds the whole input and gets
        the result in its first len/size elements.
        """
        cdef coll_args_t a
        views = self._reduce_scatter_args(&a, sendbuf, recvbuf, op, timeout, dtype, stream)
        cdef coll_result_t res
        with nogil:
            res = coll_reduce_scatter_block(self.comm, &a)
        CHKERR(res, self.comm)

    def ireduce_scatter_block(self, sendbuf, recvbuf, op="sum", timeout=None,
                              dtype=None, stream=None) -> Request:
        """Start a reduce_scatter_block on the progress thread; returns a Request."""
        cdef coll_args_t a
        cdef Request r = self._request(self._reduce_scatter_args(&a, sendbuf, recvbuf, op,
                                                                 timeout, dtype, stream))
        CHKERR(coll_ireduce_scatter_block(self.comm, &a, &r.req), self.comm)
        return r

    def barrier(self, timeout=None) -> None:
        """Return once every rank has entered the barrier."""
        cdef coll_comm_t *c = self._live()
        cdef double t = as_timeout(timeout)
        cdef coll_result_t res
        with nogil:
            res = coll_barrier(c, t)
        CHKERR(res, c)

    def ibarrier(self, timeout=None) -> Request:
        """Start a barrier on the progress thread; returns a Request."""
        cdef coll_comm_t *c = self._live()
        cdef Request r = self._request(None)
        CHKERR(coll_ibarrier(c, as_timeout(timeout), &r.req), c)
        return r


# collectives.MPI's marker for in-place sends and its Op objects' core codes,
# handed over by that module on import (_mpi_register).
cdef object _mpi_in_place = object()
# mpi4py takes None nowhere as a send buffer; the core reads None as in place,
# so a None from a script would silently turn a call into its in-place form.
_NONE_SENDBUF = "sendbuf is None: pass MPI.IN_PLACE for the in-place form"


def check_root(root, int size, str name="root") -> int:
    """root as a rank of a size-rank communicator, checked before any byte is sent: an
    integer (numpy's too; not a float or a string) in [0, size)."""
    try:
        r = operator.index(root)
    except TypeError:
        raise TypeError(f"{name} must be an integer rank, not {type(root).__name__} "
                        f"({root!r})") from None
    if not 0 <= r < size:
        raise ValueError(f"{name} {r} out of range for {size} ranks")
    return r
cdef dict _mpi_ops = {}
cdef object _mpi_sum = None


cdef class _SumDefault:
    """Allreduce's default op, which is MPI.SUM (defined after this module)."""
    def __repr__(self):
        return "SUM"


cdef object _op_default = _SumDefault()


def _mpi_register(in_place, dict ops, sum_op) -> None:
    """collectives.MPI hands over its IN_PLACE marker, {Op: core op name} and SUM."""
    global _mpi_in_place, _mpi_ops, _mpi_sum
    _mpi_in_place = in_place
    _mpi_ops = {op: OPS[name] for op, name in ops.items()}
    _mpi_sum = sum_op


cdef class CommBase:
    """The base of collectives.MPI.Comm: its latency-bound buffer path in C.

    An 8-byte Allreduce is mostly call overhead, so the plain-buffer case
    (no [buf, datatype] spec) runs here without a Python frame; specs go to
    the subclass's _Allreduce_spec. Errors get the subclass's _explained().
    """
    cdef public Communicator _core

    def Allreduce(self, sendbuf, recvbuf, op=_op_default, *, algorithm="auto", timeout=None):
        """recvbuf = op over all ranks of sendbuf (sendbuf may be IN_PLACE)."""
        if op is _op_default:
            op = _mpi_sum
        if isinstance(recvbuf, (list, tuple)) or isinstance(sendbuf, (list, tuple)):
            return self._Allreduce_spec(sendbuf, recvbuf, op, algorithm, timeout)
        code = _mpi_ops.get(op)
        if code is None:  # not an op, one without a kernel, a user op: the subclass says
            return self._Allreduce_spec(sendbuf, recvbuf, op, algorithm, timeout)
        cdef Communicator core = self._core
        if core is None:
            raise ValueError("this communicator has no core (make one with collectives.init())")
        cdef coll_args_t a
        if sendbuf is None:
            raise TypeError(_NONE_SENDBUF)
        views = core._allreduce_args(&a, None if sendbuf is _mpi_in_place else sendbuf, recvbuf,
                                     code, algorithm, timeout, None, 0, None)
        cdef coll_result_t res
        with nogil:
            res = coll_allreduce(core.comm, &a)
        if res != COLL_SUCCESS:
            try:
                CHKERR(res, core.comm)
            except CollectivesError as exc:
                raise self._explained(exc) from None


cdef extern from *:
    """
    static const coll_api_t coll_api_table = {
      COLL_API_VERSION, coll_allreduce, coll_allgatherv, coll_broadcast,
      coll_reduce_scatter_block, coll_barrier, coll_comm_last_error,
      coll_reduce, coll_gatherv, coll_scatterv, coll_alltoallv,
      coll_send, coll_recv, coll_sendrecv, coll_comm_from_id};
    """
    ctypedef struct coll_api_t:
        int version
    const coll_api_t coll_api_table


cdef _View host_view(obj, str name, bint writable, object dtype):
    """as_view for the host-only helpers below: GPU buffers are a TypeError."""
    cdef _View v = as_view(obj, name, writable, dtype)
    if v.device >= 0:
        raise TypeError(f"{name} is a GPU buffer; this function takes host memory")
    return v


def api_table() -> int:
    """Address of the core's C function table (coll_api_t in coll.h), each entry with
    the coll.h signature. For native adapters that are
    compiled separately (the JAX FFI handler) and must call the same core."""
    return <size_t>&coll_api_table


def reduce_local(out, in1, in2, op="sum", dtype=None) -> None:
    """out = in1 op in2 element-wise with the core's host kernel (for tests and adapters)."""
    cdef _View o = host_view(out, "out", True, dtype)
    cdef _View a = host_view(in1, "in1", False, dtype)
    cdef _View b = host_view(in2, "in2", False, dtype)
    if not (o.dtype == a.dtype == b.dtype):
        raise TypeError("out, in1 and in2 must have the same dtype")
    if not (o.count == a.count == b.count):
        raise ValueError(f"length mismatch: {o.count}, {a.count}, {b.count}")
    cdef int opc = code_of(OPS, op, "op")
    cdef coll_result_t res
    with nogil:
        res = coll_reduce_local(o.ptr, a.ptr, b.ptr, o.count, <coll_dtype_t>o.dtype, <coll_op_t>opc)
    CHKERR(res, NULL)


def scale_local(out, inp, double divisor, dtype=None) -> None:
    """out = inp / divisor element-wise (AVG's last step)."""
    cdef _View o = host_view(out, "out", True, dtype)
    cdef _View a = host_view(inp, "inp", False, dtype)
    if o.dtype != a.dtype or o.count != a.count:
        raise ValueError("out and inp must have the same dtype and length")
    cdef coll_result_t res
    with nogil:
        res = coll_scale_local(o.ptr, a.ptr, o.count, <coll_dtype_t>o.dtype, divisor)
    CHKERR(res, NULL)


def dtype_of(buf) -> str:
    """The core's dtype name for a buffer-like object."""
    cdef _View v = as_view(buf, "buf", False, None)
    return coll_dtype_name(<coll_dtype_t>v.dtype).decode()


def count_of(buf, dtype=None) -> int:
    """Number of elements in a buffer-like object (of `dtype` if given)."""
    cdef _View v = as_view(buf, "buf", False, dtype)
    return v.count


def tune_choose(int size, size_t nbytes, labels=None) -> str:
    """The algorithm AUTO picks for an allreduce of nbytes on size ranks.

    Args:
        size: the rank count (one host, over COLLECTIVES_TRANSPORT) when labels is None.
        nbytes: the message size.
        labels: one int per rank, equal for ranks that share a host (size is then
            len(labels)): the choice of a world of that topology, with the tuned
            rows of its shape (HxL) when it goes in two levels.
    """
    if labels is None:
        return coll_algo_name(coll_tune_choose(size, nbytes)).decode()
    cdef int n = len(labels)
    if n < 1:
        raise ValueError("tune_choose needs at least one rank")
    cdef int *lab = <int *>malloc(sizeof(int) * n)
    cdef coll_topo_t t
    cdef coll_algo_t a
    if lab == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            lab[i] = int(labels[i])
        if coll_topo_build(&t, n, lab) != 0:
            raise MemoryError()
    finally:
        free(lab)
    import os
    tcp = os.environ.get("COLLECTIVES_TRANSPORT", "").lower() == "tcp"
    a = coll_tune_choose_topo(&t, n, nbytes, t.nhosts == 1 and not tcp)
    coll_topo_free(&t)
    return coll_algo_name(a).decode()


def hmac_sha256(bytes key, bytes msg) -> bytes:
    """HMAC-SHA256 as the core computes it (native/auth.c), for tests against hashlib."""
    cdef uint8_t out[32]
    coll_hmac_sha256(key, len(key), msg, len(msg), out)
    return bytes(out[:32])


def crypt_lib_error():
    """Why COLLECTIVES_ENCRYPT=1 cannot work here (libcrypto not loadable), or None."""
    cdef const char *why = coll_crypt_lib_error()
    return None if why == NULL else why.decode(errors="replace")


def crypt_hkdf(bytes ikm, bytes salt, bytes info, int n) -> bytes:
    """HKDF-SHA256 through the libcrypto that encrypted links use (for tests, RFC 5869)."""
    out = bytearray(n)
    cdef unsigned char[::1] o = out
    if n <= 0 or coll_crypt_hkdf(ikm, len(ikm), salt, len(salt), info, len(info), &o[0], n) != 0:
        raise RuntimeError(f"HKDF failed: {crypt_lib_error()}")
    return bytes(out)


def crypt_seal(bytes key, bytes iv, bytes aad, bytes pt) -> bytes:
    """AES-256-GCM ciphertext + 16-byte tag as encrypted links seal records (for tests)."""
    if len(key) != 32 or len(iv) != 12:
        raise ValueError("AES-256-GCM takes a 32-byte key and a 12-byte IV")
    out = bytearray(len(pt) + 16)
    cdef unsigned char[::1] o = out
    if coll_crypt_seal(key, iv, aad, len(aad), pt, len(pt), &o[0]) != 0:
        raise RuntimeError(f"AES-256-GCM failed: {crypt_lib_error()}")
    return bytes(out)


def shm_path_ok(str path, int frm, int to, unsigned long long token) -> bool:
    """Whether the core accepts path as a shared-memory segment offered by frm to to."""
    return coll_shm_path_ok(path.encode(), frm, to, token) != 0


def params() -> list:
    """The declared tunables: (name, default, description, allowed values) for each."""
    out = []
    for i in range(coll_param_count()):
        out.append((coll_param_name(i).decode(), coll_param_default(i).decode(),
                    coll_param_description(i).decode(), coll_param_allowed(i).decode()))
    return out


def pattern(str name, *args):
    """Rank arithmetic of pattern.h, for tests: pattern("tree_parent", r, n, root), ..."""
    cdef int buf[64]
    cdef size_t off = 0, ln = 0
    if name == "split":
        coll_split(args[0], args[1], args[2], &off, &ln)
        return (off, ln)
    if name == "binomial_children":
        k = coll_binomial_children(args[0], args[1], args[2], buf)
        return [buf[i] for i in range(k)]
    funcs = {
        "ring_rs_send": lambda r, n, s: coll_ring_rs_send_chunk(r, n, s),
        "ring_rs_recv": lambda r, n, s: coll_ring_rs_recv_chunk(r, n, s),
        "ring_ag_send": lambda r, n, s: coll_ring_ag_send_chunk(r, n, s),
        "ring_ag_recv": lambda r, n, s: coll_ring_ag_recv_chunk(r, n, s),
        "tree_parent": lambda r, n, root: coll_tree_parent(r, n, root),
        "tree_child": lambda r, n, root, w: coll_tree_child(r, n, root, w),
        "binomial_parent": lambda r, n, root: coll_binomial_parent(r, n, root),
        "pow2_floor": lambda n: coll_pow2_floor(n),
        "bfly_vrank": lambda r, n: coll_bfly_vrank(r, n),
        "bfly_real": lambda v, n: coll_bfly_real(v, n),
    }
    if name not in funcs:
        raise ValueError(f"unknown pattern {name!r}")
    return funcs[name](*args)


# ---- sparse gradient kernels (sparse.h), used by collectives.torch.dgc ----------------

cdef int _sparse_threshold_ok(double threshold) except -1:
    if not threshold > 0:
        raise ValueError(f"threshold must be > 0, got {threshold!r}")
    return 0


def sparse_count_above(x, double threshold) -> int:
    """Number of entries of float32 `x` with |x[i]| >= threshold (> 0)."""
    cdef _View xv = host_view(x, "x", False, None)
    if xv.dtype != COLL_FLOAT32:
        raise TypeError("x must be float32")
    _sparse_threshold_ok(threshold)
    cdef size_t count = 0
    cdef coll_result_t res
    with nogil:
        res = coll_sparse_count_above(<const float *>xv.ptr, xv.count, <float>threshold, &count)
    CHKERR(res, NULL)
    return count


cdef int _sparse_types_ok(_View vv, _View iv) except -1:
    if vv.dtype not in (COLL_FLOAT32, COLL_FLOAT16):
        raise TypeError("values must be float32 or float16")
    if iv.dtype not in (COLL_INT32, COLL_INT64):
        raise TypeError("indices must be int32 or int64")
    return 0


def sparse_pack(x, double threshold, values, indices) -> int:
    """Write the first min(len(values), len(indices)) entries of float32 `x` with
    |x[i]| >= threshold, in index order, into values (float32/float16) and indices
    (int32/int64); return how many were written. `x` is not modified."""
    cdef _View xv = host_view(x, "x", False, None)
    cdef _View vv = host_view(values, "values", True, None)
    cdef _View iv = host_view(indices, "indices", True, None)
    if xv.dtype != COLL_FLOAT32:
        raise TypeError("x must be float32")
    _sparse_types_ok(vv, iv)
    if iv.dtype == COLL_INT32 and xv.count > 2147483648:
        raise ValueError(f"x has {xv.count} elements: int32 indices cannot name them all")
    _sparse_threshold_ok(threshold)
    cdef size_t cap = min(vv.count, iv.count)
    cdef size_t count = 0
    cdef coll_result_t res
    with nogil:
        res = coll_sparse_pack(<const float *>xv.ptr, xv.count, <float>threshold, cap, vv.ptr,
                               <coll_dtype_t>vv.dtype, iv.ptr, <coll_dtype_t>iv.dtype, &count)
    CHKERR(res, NULL)
    return count


def sparse_scatter_add(out, values, indices) -> None:
    """out[indices[j]] += values[j] (float32 out; float32/float16 values widened; int32/int64
    indices); ValueError, with out untouched, if an index is outside [0, len(out))."""
    cdef _View ov = host_view(out, "out", True, None)
    cdef _View vv = host_view(values, "values", False, None)
    cdef _View iv = host_view(indices, "indices", False, None)
    if ov.dtype != COLL_FLOAT32:
        raise TypeError("out must be float32")
    _sparse_types_ok(vv, iv)
    if vv.count != iv.count:
        raise ValueError(f"mismatch in values count {vv.count} and indices count {iv.count}")
    check_overlap(ov, vv, "sparse_scatter_add")
    cdef coll_result_t res
    with nogil:
        res = coll_sparse_scatter_add(<float *>ov.ptr, ov.count, vv.ptr, <coll_dtype_t>vv.dtype,
                                      iv.ptr, <coll_dtype_t>iv.dtype, iv.count)
    if res == COLL_INVALID_ARGUMENT:
        raise ValueError(f"sparse_scatter_add: an index is outside [0, {ov.count})")
    CHKERR(res, NULL)
