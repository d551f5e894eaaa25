# p2p.pxi -- point-to-point messages (coll.h: coll_isend ... coll_request_wait_any):
# module functions over a Communicator, each: check -> nogil -> one checked C call.
from cpython.bytes cimport PyBytes_FromStringAndSize

ANY_SOURCE = COLL_ANY_SOURCE
ANY_TAG = COLL_ANY_TAG
PROC_NULL = COLL_PROC_NULL
TAG_MAX = COLL_TAG_MAX


cdef object p2p_outcome(coll_request_t *req):
    """(source, tag, count, data, nbytes) of a finished point-to-point request (data: the bytes of
    a receive of any size, else None); None for a collective's request."""
    cdef coll_status_t st
    cdef void *buf = NULL
    cdef size_t nbytes = 0
    if req == NULL or coll_request_status(req, &st) != COLL_SUCCESS:
        return None
    data = None
    if coll_request_take_buffer(req, &buf, &nbytes) == COLL_SUCCESS:
        try:
            data = PyBytes_FromStringAndSize(<char *>buf, nbytes)
        finally:
            free(buf)
    return (st.source, st.tag, st.count, data, st.nbytes)


cdef _View p2p_args(Communicator c, coll_args_t *a, buf, bint is_send, int peer, int tag,
                    timeout, dtype):
    """Checks buf (host memory) and fills a; the view keeps buf alive."""
    c._live()
    cdef _View v = as_view(buf, "buf", not is_send, dtype)
    if v.device >= 0:
        raise TypeError("point-to-point takes host buffers, not GPU memory")
    memset(a, 0, sizeof(coll_args_t))
    if is_send:
        a.sendbuf = v.ptr
    else:
        a.recvbuf = v.ptr
    a.count = v.count
    a.dtype = <coll_dtype_t>v.dtype
    a.peer = peer
    a.tag = tag
    a.timeout = as_timeout(timeout)
    return v


def p2p_send(Communicator comm, buf, int dest, int tag=0, timeout=None, dtype=None) -> None:
    """Send buf to rank dest with tag; returns once its bytes are handed to the link."""
    cdef coll_args_t a
    v = p2p_args(comm, &a, buf, True, dest, tag, timeout, dtype)
    cdef coll_result_t res
    with nogil:
        res = coll_send(comm.comm, &a)
    CHKERR(res, comm.comm)


def p2p_ssend(Communicator comm, buf, int dest, int tag=0, timeout=None, dtype=None) -> None:
    """Send buf to rank dest with tag in synchronous mode: returns once a receive on dest
    has matched it."""
    cdef coll_args_t a
    v = p2p_args(comm, &a, buf, True, dest, tag, timeout, dtype)
    cdef coll_result_t res
    with nogil:
        res = coll_ssend(comm.comm, &a)
    CHKERR(res, comm.comm)


def p2p_issend(Communicator comm, buf, int dest, int tag=0, timeout=None, dtype=None) -> Request:
    """Start a synchronous-mode send; its Request completes once a receive matched it."""
    cdef coll_args_t a
    cdef Request r = comm._request(p2p_args(comm, &a, buf, True, dest, tag, timeout, dtype))
    cdef coll_result_t res
    with nogil:
        res = coll_issend(comm.comm, &a, &r.req)
    CHKERR(res, comm.comm)
    return r


def p2p_probe(Communicator comm, int source=COLL_ANY_SOURCE, int tag=COLL_ANY_TAG,
              bint block=True, timeout=None):
    """The envelope (source, tag, count, nbytes, dtype name) of the message a receive with
    (source, tag) would take next, without receiving it; block False: one look, None if
    there is none."""
    comm._live()
    cdef double t = as_timeout(timeout)
    cdef int flag = 0
    cdef coll_status_t st
    cdef coll_result_t res
    with nogil:
        res = coll_probe(comm.comm, source, tag, t, block, &flag, &st)
    CHKERR(res, comm.comm)
    if not flag:
        return None
    return (st.source, st.tag, st.count, st.nbytes,
            coll_dtype_name(st.dtype).decode() if st.count else "uint8")


def p2p_recv(Communicator comm, buf, int source=COLL_ANY_SOURCE, int tag=COLL_ANY_TAG,
             timeout=None, dtype=None) -> tuple:
    """Receive into buf a message from source with tag (ANY_SOURCE/ANY_TAG match any);
    returns (source, tag, count) of the message."""
    cdef coll_args_t a
    v = p2p_args(comm, &a, buf, False, source, tag, timeout, dtype)
    cdef coll_status_t st
    cdef coll_result_t res
    with nogil:
        res = coll_recv(comm.comm, &a, &st)
    CHKERR(res, comm.comm)
    return (st.source, st.tag, st.count)


def p2p_isend(Communicator comm, buf, int dest, int tag=0, timeout=None, dtype=None) -> Request:
    """Start a send; returns a Request (buf stays in use until it completes)."""
    cdef coll_args_t a
    cdef Request r = comm._request(p2p_args(comm, &a, buf, True, dest, tag, timeout, dtype))
    cdef coll_result_t res
    with nogil:  # the message starts moving at once
        res = coll_isend(comm.comm, &a, &r.req)
    CHKERR(res, comm.comm)
    return r


def p2p_irecv(Communicator comm, buf, int source=COLL_ANY_SOURCE, int tag=COLL_ANY_TAG,
              timeout=None, dtype=None) -> Request:
    """Start a receive into buf; returns a Request (buf None: a message of any size and
    of element type dtype, uint8 by default, whose bytes the finished request's status
    holds)."""
    cdef coll_args_t a
    cdef Request r
    if buf is None:
        comm._live()
        memset(&a, 0, sizeof(coll_args_t))
        a.count = COLL_COUNT_ANY
        a.dtype = COLL_UINT8 if dtype is None else DTYPES[dtype]
        a.peer = source
        a.tag = tag
        a.timeout = as_timeout(timeout)
        r = comm._request(None)
    else:
        r = comm._request(p2p_args(comm, &a, buf, False, source, tag, timeout, dtype))
    CHKERR(coll_irecv(comm.comm, &a, &r.req), comm.comm)
    return r


def p2p_sendrecv(Communicator comm, sendbuf, int dest, int sendtag, recvbuf,
                 int source=COLL_ANY_SOURCE, int recvtag=COLL_ANY_TAG, timeout=None,
                 dtype=None) -> tuple:
    """Send sendbuf to dest and receive into recvbuf at once; returns (source, tag, count)."""
    cdef coll_args_t sa, ra
    sv = p2p_args(comm, &sa, sendbuf, True, dest, sendtag, timeout, dtype)
    rv = p2p_args(comm, &ra, recvbuf, False, source, recvtag, timeout, dtype)
    check_overlap(sv, rv, "sendrecv")
    cdef coll_status_t st
    cdef coll_result_t res
    with nogil:
        res = coll_sendrecv(comm.comm, &sa, &ra, &st)
    CHKERR(res, comm.comm)
    return (st.source, st.tag, st.count)


def request_wait_any(list requests) -> int:
    """Block until one of the unfinished requests (all of one communicator) completes;
    finish it (raising if it failed) and return its index, or -1 if none was left."""
    cdef int n = len(requests), idx = -1
    cdef coll_request_t **reqs = <coll_request_t **>malloc((n + 1) * sizeof(coll_request_t *))
    cdef Request r
    cdef coll_result_t res
    cdef Communicator owner = None
    if reqs == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            r = <Request?>requests[i]
            reqs[i] = r.req
            if r.req != NULL:
                if owner is not None and r.owner is not owner:
                    raise ValueError("requests of different communicators")
                owner = r.owner
        if owner is None:
            return -1
        owner._live()
        with nogil:
            res = coll_request_wait_any(reqs, n, &idx)
        if idx < 0:
            CHKERR(res, owner.comm)
            return -1
        (<Request>requests[idx])._finish(res)
        return idx
    finally:
        free(reqs)
