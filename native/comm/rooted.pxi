# rooted.pxi -- reduce, gatherv, scatterv (coll.h; rooted.c): module functions over a
# Communicator, each: check -> nogil -> one checked C call. Host buffers, or GPU
# buffers (staged whole through pinned memory by the core: comm/gpu_small.c).

cdef _View _host(obj, str name, bint writable, dtype):
    return as_view(obj, name, writable, dtype)


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


def reduce(Communicator comm, sendbuf, recvbuf, op="sum", int root=0, timeout=None,
           dtype=None) -> None:
    """recvbuf at root = op over every rank's sendbuf (sendbuf None at the root: in place,
    recvbuf holds its input). recvbuf is ignored (may be None) elsewhere."""
    comm._live()
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
    with nogil:
        res = coll_reduce(comm.comm, &a)
    CHKERR(res, comm.comm)


def gatherv(Communicator comm, sendbuf, recvbuf, counts=None, displs=None, int root=0,
            timeout=None, dtype=None) -> None:
    """The root gets rank i's sendbuf at recvbuf[displs[i]:displs[i] + counts[i]] (counts,
    displs and recvbuf matter at the root only; sendbuf None there: in place)."""
    comm._live()
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
        with nogil:
            res = coll_gatherv(comm.comm, &a)
        CHKERR(res, comm.comm)
    finally:
        free(cc)


def scatterv(Communicator comm, sendbuf, recvbuf, counts=None, displs=None, int root=0,
             timeout=None, dtype=None) -> None:
    """Rank i gets the root's sendbuf[displs[i]:displs[i] + counts[i]] in recvbuf (counts,
    displs and sendbuf matter at the root only; recvbuf None there: in place)."""
    comm._live()
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
        with nogil:
            res = coll_scatterv(comm.comm, &a)
        CHKERR(res, comm.comm)
    finally:
        free(cc)
