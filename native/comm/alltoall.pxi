# alltoall.pxi -- alltoallv (coll.h; alltoall.c): check -> nogil -> one checked C call.
# GPU buffers are staged whole through pinned memory by the core (comm/gpu_small.c).


cdef object _side(Communicator c, size_t *cnt, size_t *dsp, counts, displs, size_t total,
                  str what):
    """Fills n counts and displs (packed when None) within total elements."""
    cdef int n = c._size
    counts = [int(k) for k in counts]
    if len(counts) != n or any(k < 0 for k in counts):
        raise ValueError(f"alltoallv: {what} counts need {n} non-negative entries")
    if displs is None:
        displs, acc = [], 0
        for k in counts:
            displs.append(acc)
            acc += k
    displs = [int(d) for d in displs]
    if len(displs) != n or any(d < 0 for d in displs):
        raise ValueError(f"alltoallv: {what} displs need {n} non-negative entries")
    for i in range(n):
        if <size_t>(displs[i] + counts[i]) > total:
            raise ValueError(f"alltoallv: the {what} buffer has {total} elements; block {i} "
                             f"needs [{displs[i]}, {displs[i] + counts[i]})")
        cnt[i] = counts[i]
        dsp[i] = displs[i]
    return counts


def alltoallv(Communicator comm, sendbuf, recvbuf, sendcounts, recvcounts, senddispls=None,
              recvdispls=None, timeout=None, dtype=None) -> None:
    """Rank r sends sendbuf block j (sendcounts[j] elements at senddispls[j]) to rank j and
    gets rank j's block for it at recvdispls[j] (recvcounts[j] elements). sendbuf None: in
    place (recvbuf holds the blocks to send, laid out by the send counts and displs)."""
    _alltoallv(comm, sendbuf, recvbuf, sendcounts, recvcounts, senddispls, recvdispls, timeout,
               dtype, None)


def ialltoallv(Communicator comm, sendbuf, recvbuf, sendcounts, recvcounts, senddispls=None,
               recvdispls=None, timeout=None, dtype=None) -> Request:
    """Start an alltoallv (host buffers); returns a Request that keeps the buffers alive."""
    cdef Request r = comm._request(None)
    _alltoallv(comm, sendbuf, recvbuf, sendcounts, recvcounts, senddispls, recvdispls, timeout,
               dtype, r)
    return r


cdef _alltoallv(Communicator comm, sendbuf, recvbuf, sendcounts, recvcounts, senddispls,
                recvdispls, timeout, dtype, Request r):
    comm._live()
    cdef int n = comm._size
    cdef _View rv = as_view(recvbuf, "recvbuf", True, dtype)
    cdef _View sv = rv if sendbuf is None else as_view(sendbuf, "sendbuf", False, dtype)
    if sv.dtype != rv.dtype:
        raise TypeError("sendbuf and recvbuf have different dtypes")
    if sv is not rv:
        check_overlap(sv, rv, "alltoallv")
    cdef size_t *cc = <size_t *>malloc(4 * n * sizeof(size_t) + 1)
    if cc == NULL:
        raise MemoryError()
    cdef coll_args_t a
    cdef coll_result_t res
    try:
        _side(comm, cc, cc + 2 * n, sendcounts, senddispls, sv.count, "send")
        _side(comm, cc + n, cc + 3 * n, recvcounts, recvdispls, rv.count, "receive")
        memset(&a, 0, sizeof(coll_args_t))
        a.sendbuf = sv.ptr
        a.recvbuf = rv.ptr
        a.counts = cc
        a.displs = cc + 2 * n
        a.dtype = <coll_dtype_t>rv.dtype
        a.timeout = as_timeout(timeout)
        set_memory(&a, None, rv, sv)
        if r is not None:  # counts are copied; the request keeps the views
            _host_only(a.memory, "ialltoallv")
            r.views = (sv, rv)
            CHKERR(coll_ialltoallv(comm.comm, &a, &r.req), comm.comm)
            return
        with nogil:
            res = coll_alltoallv(comm.comm, &a)
        CHKERR(res, comm.comm)
    finally:
        free(cc)
