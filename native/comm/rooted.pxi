# rooted.pxi -- reduce, gatherv, scatterv (coll.h; rooted.c): module functions over a
# Communicator, each: check -> nogil -> one checked C call. Host buffers, or GPU
# buffers (staged whole through pinned memory by the core: comm/gpu_small.c).

cdef _View _host(obj, str name, bint writable, dtype):
    return as_view(obj, name, writable, dtype)


cdef int _host_only(int memory, str what) except -1:
    """The non-blocking rooted forms take host buffers (GPU ones are staged by the blocking
    entry points only)."""
    if memory != COLL_MEMORY_HOST:
        raise TypeError(f"i{what} takes host buffers; use the blocking form for GPU memory")
    return 0


cdef object _blocks(Communicator c, size_t *cc, counts, displs, size_t total, str what):
    """Fills cc (2 * size entries) with counts and displs (packed when None); checks that
    every block lies within total elements."""
    cdef int n = c._size
    counts = [int(k) for k in counts]
    if len(counts) != n or any(k < 0 for k in counts):
        raise ValueError(f"{what}: counts needs {n} non-negative entries")
    if displs is None:
        displs, acc = [], 0
        for k in counts:
            displs.append(acc)
            acc += k
    displs = [int(d) for d in displs]
    if len(displs) != n or any(d < 0 for d in displs):
        raise ValueError(f"{what}: displs needs {n} non-negative entries")
    for i in range(n):
        if <size_t>(displs[i] + counts[i]) > total:
            raise ValueError(f"{what}: the root's buffer has {total} elements; block {i} needs "
                             f"[{displs[i]}, {displs[i] + counts[i]})")
        cc[i] = counts[i]
        cc[n + i] = displs[i]
    return counts


cdef object _reduce(Communicator comm, sendbuf, recvbuf, op, int root, timeout, dtype,
                    Request r=None):
    if not (0 <= root < comm._size):
        raise ValueError(f"root {root} out of range for {comm._size} ranks")
    cdef bint is_root = comm._rank == root
    cdef _View rv = _host(recvbuf, "recvbuf", True, dtype) if is_root else None
    if sendbuf is None and not is_root:
        raise TypeError("sendbuf is None (in place is for the root only)")
    cdef _View sv = rv if sendbuf is None else _host(sendbuf, "sendbuf", False, dtype)
    if rv is not None and sv is not rv:
        if sv.dtype != rv.dtype:
            raise TypeError("sendbuf and recvbuf have different dtypes")
        if sv.count != rv.count:
            raise ValueError(f"mismatch in send count {sv.count} and receive count {rv.count}")
        check_overlap(sv, rv, "reduce")
    cdef coll_args_t a
    memset(&a, 0, sizeof(coll_args_t))
    a.sendbuf = sv.ptr
    a.recvbuf = rv.ptr if rv is not None else NULL
    a.count = sv.count
    a.dtype = <coll_dtype_t>sv.dtype
    a.op = <coll_op_t>code_of(OPS, op, "op")
    a.root = root
    a.timeout = as_timeout(timeout)
    set_memory(&a, None, rv if rv is not None else sv, sv)
    cdef coll_result_t res
    if r is not None:  # non-blocking: the request keeps the buffers alive
        _host_only(a.memory, "reduce")
        r.views = (sv, rv)
        return coll_ireduce(comm.comm, &a, &r.req)
    with nogil:
        res = coll_reduce(comm.comm, &a)
    return res


cdef object _gatherv(Communicator comm, sendbuf, recvbuf, counts, displs, int root, timeout,
                     dtype, Request r=None):
    if not (0 <= root < comm._size):
        raise ValueError(f"root {root} out of range for {comm._size} ranks")
    cdef int n = comm._size
    cdef bint is_root = comm._rank == root
    cdef size_t *cc = <size_t *>malloc(2 * n * sizeof(size_t) + 1)
    if cc == NULL:
        raise MemoryError()
    cdef _View rv = None, sv = None
    cdef coll_args_t a
    cdef coll_result_t res
    cdef size_t esize
    try:
        memset(&a, 0, sizeof(coll_args_t))
        if is_root:
            rv = _host(recvbuf, "recvbuf", True, dtype)
            if counts is None:
                raise ValueError("gatherv: the root needs counts")
            _blocks(comm, cc, counts, displs, rv.count, "gatherv")
            esize = coll_dtype_size(<coll_dtype_t>rv.dtype)
            if sendbuf is None:
                a.sendbuf = <char *>rv.ptr + cc[n + root] * esize
                a.count = cc[root]
            else:
                sv = _host(sendbuf, "sendbuf", False, dtype)
                if sv.dtype != rv.dtype:
                    raise TypeError("sendbuf and recvbuf have different dtypes")
                if sv.count != cc[root]:
                    raise ValueError(f"mismatch in send count {sv.count} and counts[{root}] = "
                                     f"{cc[root]}")
                check_overlap(sv, rv, "gatherv")
                a.sendbuf = sv.ptr
                a.count = sv.count
            a.recvbuf = rv.ptr
            a.counts = cc
            a.displs = cc + n
            a.dtype = <coll_dtype_t>rv.dtype
        else:
            if sendbuf is None:
                raise TypeError("sendbuf is None (in place is for the root only)")
            sv = _host(sendbuf, "sendbuf", False, dtype)
            a.sendbuf = sv.ptr
            a.count = sv.count
            a.dtype = <coll_dtype_t>sv.dtype
        a.root = root
        a.timeout = as_timeout(timeout)
        set_memory(&a, None, rv if rv is not None else sv, sv)
        if r is not None:  # non-blocking: counts are copied, the request keeps the views
            _host_only(a.memory, "gatherv")
            r.views = (sv, rv)
            return coll_igatherv(comm.comm, &a, &r.req)
        with nogil:
            res = coll_gatherv(comm.comm, &a)
        return res
    finally:
        free(cc)


cdef object _scatterv(Communicator comm, sendbuf, recvbuf, counts, displs, int root, timeout,
                      dtype, Request r=None):
    if not (0 <= root < comm._size):
        raise ValueError(f"root {root} out of range for {comm._size} ranks")
    cdef int n = comm._size
    cdef bint is_root = comm._rank == root
    cdef size_t *cc = <size_t *>malloc(2 * n * sizeof(size_t) + 1)
    if cc == NULL:
        raise MemoryError()
    cdef _View rv = None, sv = None
    cdef coll_args_t a
    cdef coll_result_t res
    cdef size_t esize
    try:
        memset(&a, 0, sizeof(coll_args_t))
        if is_root:
            sv = _host(sendbuf, "sendbuf", False, dtype)
            if counts is None:
                raise ValueError("scatterv: the root needs counts")
            _blocks(comm, cc, counts, displs, sv.count, "scatterv")
            esize = coll_dtype_size(<coll_dtype_t>sv.dtype)
            if recvbuf is None:
                a.recvbuf = <char *>sv.ptr + cc[n + root] * esize
                a.count = cc[root]
            else:
                rv = _host(recvbuf, "recvbuf", True, dtype)
                if sv.dtype != rv.dtype:
                    raise TypeError("sendbuf and recvbuf have different dtypes")
                if rv.count != cc[root]:
                    raise ValueError(f"mismatch in receive count {rv.count} and counts[{root}] = "
                                     f"{cc[root]}")
                check_overlap(sv, rv, "scatterv")
                a.recvbuf = rv.ptr
                a.count = rv.count
            a.sendbuf = sv.ptr
            a.counts = cc
            a.displs = cc + n
            a.dtype = <coll_dtype_t>sv.dtype
        else:
            if recvbuf is None:
                raise TypeError("recvbuf is None (in place is for the root only)")
            rv = _host(recvbuf, "recvbuf", True, dtype)
            a.recvbuf = rv.ptr
            a.count = rv.count
            a.dtype = <coll_dtype_t>rv.dtype
        a.root = root
        a.timeout = as_timeout(timeout)
        set_memory(&a, None, rv if rv is not None else sv, sv)
        if r is not None:  # non-blocking: counts are copied, the request keeps the views
            _host_only(a.memory, "scatterv")
            r.views = (sv, rv)
            return coll_iscatterv(comm.comm, &a, &r.req)
        with nogil:
            res = coll_scatterv(comm.comm, &a)
        return res
    finally:
        free(cc)


# A rank that refuses its own arguments to a rooted collective still takes part in the
# call's root agreement as COLL_ROOT_REFUSED (coll.h), so that the other ranks fail at once,
# naming it, instead of waiting out the timeout or running into its next call.
_ROOTED = {"reduce": 0, "gather": 1, "scatter": 2}


def refuse_rooted(Communicator comm, str kind, timeout=None) -> None:
    """Tell the other ranks of a reduce/gather/scatter ("kind", Gatherv/Scatterv included)
    that this rank refused its arguments; they fail with MPI.Exception naming it, nothing is
    sent. Returns normally here (the caller raises its own error). Collective."""
    cdef coll_args_t a
    cdef int which = _ROOTED[kind]
    cdef coll_result_t res
    if comm.comm == NULL:
        return
    memset(&a, 0, sizeof(coll_args_t))
    a.root = COLL_ROOT_REFUSED
    a.dtype = COLL_UINT8
    try:
        a.timeout = as_timeout(timeout)
    except (TypeError, ValueError):
        a.timeout = 0
    with nogil:
        if which == 0:
            res = coll_reduce(comm.comm, &a)
        elif which == 1:
            res = coll_gatherv(comm.comm, &a)
        else:
            res = coll_scatterv(comm.comm, &a)


def refuse_broadcast(Communicator comm, buf, timeout=None, dtype=None) -> None:
    """Tell the other ranks of a broadcast that this rank refused its arguments; they fail
    with MPI.Exception naming it, nothing is sent, the communicator stays usable. The
    agreement's header carries the count and dtype, and a small broadcast's data rides in
    it, so this rank takes part with what it can read of buf (read-only is enough); a buf
    it cannot read at all is taken as empty, and ranks whose count differs then fail with
    a count mismatch instead (no timeout either way). Returns normally; collective."""
    cdef coll_args_t a
    cdef _View v
    cdef coll_result_t res
    if comm.comm == NULL:
        return
    memset(&a, 0, sizeof(coll_args_t))
    a.root = COLL_ROOT_REFUSED
    a.dtype = COLL_UINT8
    try:
        v = as_view(buf, "buf", False, dtype)
        a.count = v.count
        a.dtype = <coll_dtype_t>v.dtype
        if v.device >= 0:
            a.memory = COLL_MEMORY_CUDA
            a.device = v.device
    except Exception:
        pass
    try:
        a.timeout = as_timeout(timeout)
    except (TypeError, ValueError):
        a.timeout = 0
    with nogil:
        res = coll_broadcast(comm.comm, &a)


cdef int _refused_by_core(Communicator comm, buf, timeout, dtype) except -1:
    """The core refused a broadcast's arguments (COLL_INVALID_ARGUMENT, nothing moved): tell
    the other ranks, then raise the core's own message."""
    text = coll_comm_last_error(comm.comm).decode("utf-8", "replace")
    refuse_broadcast(comm, buf, timeout, dtype)
    raise ValueError(text)


cdef int _rooted_call(Communicator comm, str kind, timeout, fn, tuple args) except -1:
    """Run fn(comm, *args) -> coll_result_t; a refusal before anything moved (a Python check,
    or the core's COLL_INVALID_ARGUMENT) is told to the other ranks first, then raised."""
    comm._live()
    try:
        res = fn(comm, *args)
    except Exception:
        refuse_rooted(comm, kind, timeout)
        raise
    if res == COLL_INVALID_ARGUMENT:
        text = coll_comm_last_error(comm.comm).decode("utf-8", "replace")
        refuse_rooted(comm, kind, timeout)
        raise ValueError(text)
    CHKERR(res, comm.comm)
    return 0


def _reduce_py(Communicator comm, sendbuf, recvbuf, op, int root, timeout, dtype, r=None):
    return _reduce(comm, sendbuf, recvbuf, op, root, timeout, dtype, r)


def _gatherv_py(Communicator comm, sendbuf, recvbuf, counts, displs, int root, timeout, dtype,
                r=None):
    return _gatherv(comm, sendbuf, recvbuf, counts, displs, root, timeout, dtype, r)


def _scatterv_py(Communicator comm, sendbuf, recvbuf, counts, displs, int root, timeout, dtype,
                 r=None):
    return _scatterv(comm, sendbuf, recvbuf, counts, displs, root, timeout, dtype, r)


def reduce(Communicator comm, sendbuf, recvbuf, op="sum", root=0, timeout=None,
           dtype=None) -> None:
    """recvbuf at root = op over every rank's sendbuf (sendbuf None at the root: in place,
    recvbuf holds its input). recvbuf is ignored (may be None) elsewhere. A rank that
    refuses its arguments tells the others (refuse_rooted) before raising."""
    _rooted_call(comm, "reduce", timeout, _reduce_py,
                 (sendbuf, recvbuf, op, root, timeout, dtype))


def gatherv(Communicator comm, sendbuf, recvbuf, counts=None, displs=None, root=0,
            timeout=None, dtype=None) -> None:
    """The root gets rank i's sendbuf at recvbuf[displs[i]:displs[i] + counts[i]] (counts,
    displs and recvbuf matter at the root only; sendbuf None there: in place). A rank that
    refuses its arguments tells the others (refuse_rooted) before raising."""
    _rooted_call(comm, "gather", timeout, _gatherv_py,
                 (sendbuf, recvbuf, counts, displs, root, timeout, dtype))


def scatterv(Communicator comm, sendbuf, recvbuf, counts=None, displs=None, root=0,
             timeout=None, dtype=None) -> None:
    """Rank i gets the root's sendbuf[displs[i]:displs[i] + counts[i]] in recvbuf (counts,
    displs and sendbuf matter at the root only; recvbuf None there: in place). A rank that
    refuses its arguments tells the others (refuse_rooted) before raising."""
    _rooted_call(comm, "scatter", timeout, _scatterv_py,
                 (sendbuf, recvbuf, counts, displs, root, timeout, dtype))


def ireduce(Communicator comm, sendbuf, recvbuf, op="sum", root=0, timeout=None,
            dtype=None) -> Request:
    """Start a reduce (see reduce) on the progress thread; returns a Request."""
    cdef Request r = comm._request(None)
    _rooted_call(comm, "reduce", timeout, _reduce_py,
                 (sendbuf, recvbuf, op, root, timeout, dtype, r))
    return r


def igatherv(Communicator comm, sendbuf, recvbuf, counts=None, displs=None, root=0,
             timeout=None, dtype=None) -> Request:
    """Start a gatherv (see gatherv) on the progress thread; returns a Request."""
    cdef Request r = comm._request(None)
    _rooted_call(comm, "gather", timeout, _gatherv_py,
                 (sendbuf, recvbuf, counts, displs, root, timeout, dtype, r))
    return r


def iscatterv(Communicator comm, sendbuf, recvbuf, counts=None, displs=None, root=0,
              timeout=None, dtype=None) -> Request:
    """Start a scatterv (see scatterv) on the progress thread; returns a Request."""
    cdef Request r = comm._request(None)
    _rooted_call(comm, "scatter", timeout, _scatterv_py,
                 (sendbuf, recvbuf, counts, displs, root, timeout, dtype, r))
    return r
