# subcomm.pxi -- communicators over a subset of ranks (coll.h: coll_comm_split ...
# coll_comm_ctx) that share their root's links: module functions over a Communicator.

UNDEFINED = COLL_UNDEFINED


cdef class SubCommunicator(Communicator):
    """A communicator made by comm_split or comm_dup from another one.

    It has its own ranks (0..size-1, ordered by the split's key), sequence numbers and
    context id, and every Communicator method and module function works on it; it uses the
    links of the communicator it descends from (no new sockets) and keeps that one alive.
    Calls on it and on its parent are serialized (safe from several threads, not concurrent).
    """
    cdef Communicator _parent

    def __cinit__(self, int rank, int size, *args, **kwargs):
        pass

    def __dealloc__(self):
        # Before _parent is released: the native parent must outlive this one.
        if self.comm != NULL:
            with nogil:
                coll_comm_destroy(self.comm)
            self.comm = NULL

    @property
    def parent(self) -> Communicator:
        """The communicator this one was split from."""
        return self._parent


def _check_int(value, str name) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not (-2**31 <= value < 2**31):
        raise OverflowError(f"{name} {value} does not fit in 32 bits")
    return value


def comm_split(Communicator comm, color, key=None, timeout=None):
    """MPI_Comm_split on comm (collective: every rank of comm calls it, in the same order as
    its other collectives): ranks with the same color >= 0 form a new communicator ranked by
    key (default: their rank in comm), ties by rank in comm. Returns it, or None for color
    UNDEFINED. No socket is opened; the new one shares comm's links."""
    cdef int c = _check_int(color, "color")
    cdef int k = _check_int(comm.rank if key is None else key, "key")
    if c < 0 and c != COLL_UNDEFINED:
        raise ValueError(f"color {c} must be >= 0 or UNDEFINED")
    cdef coll_comm_t *parent = comm._live()
    cdef double t = as_timeout(timeout)
    cdef coll_comm_t *out = NULL
    cdef coll_result_t res
    with nogil:
        res = coll_comm_split(parent, c, k, t, &out)
    CHKERR(res, parent)
    if out == NULL:
        return None
    return _adopt(comm, out)


def comm_dup(Communicator comm, timeout=None):
    """MPI_Comm_dup: a new communicator over the same ranks, same order, its own context
    (collective on comm)."""
    cdef coll_comm_t *parent = comm._live()
    cdef double t = as_timeout(timeout)
    cdef coll_comm_t *out = NULL
    cdef coll_result_t res
    with nogil:
        res = coll_comm_dup(parent, t, &out)
    CHKERR(res, parent)
    return _adopt(comm, out)


def comm_create_group(Communicator comm, ranks, tag) -> SubCommunicator:
    """A communicator over comm's ranks `ranks` (its rank i is ranks[i]) made by those ranks
    alone, without a message (MPI_Comm_create_group): every member passes the same ranks and
    tag (an int below 2**32, different for every live group over comm); the others call
    nothing. It shares comm's links, as comm_split's."""
    cdef list rs = [_check_int(r, "rank") for r in ranks]
    cdef unsigned int t = 0
    if not 0 <= int(tag) < 2**32:
        raise OverflowError(f"tag {tag} does not fit in 32 bits")
    t = int(tag)
    cdef coll_comm_t *parent = comm._live()
    cdef int n = len(rs)
    cdef int *buf = <int *>malloc(max(n, 1) * sizeof(int))
    if buf == NULL:
        raise MemoryError()
    for i in range(n):
        buf[i] = rs[i]
    cdef coll_comm_t *out = NULL
    cdef coll_result_t res
    with nogil:
        res = coll_comm_create_group(parent, buf, n, t, &out)
    free(buf)
    CHKERR(res, parent)
    return _adopt(comm, out)


cdef SubCommunicator _adopt(Communicator parent, coll_comm_t *c):
    cdef SubCommunicator s = SubCommunicator(-1, 0)
    s.comm = c
    s._rank = coll_comm_rank(c)
    s._size = coll_comm_size(c)
    s._parent = parent
    return s


def comm_free(Communicator comm) -> None:
    """MPI_Comm_free: releases what comm owns (never links another communicator uses).
    Refused with CollectivesError while subcommunicators made from comm are alive."""
    cdef coll_comm_t *c = comm._live()
    cdef coll_result_t res
    with nogil:
        res = coll_comm_free(c)
    CHKERR(res, c)
    comm.comm = NULL


def comm_world_rank(Communicator comm, int rank) -> int:
    """comm's rank `rank` as a rank of the communicator it descends from by splits (the
    world); -1 if out of range."""
    return coll_comm_world_rank(comm._live(), rank)


def comm_local_rank(Communicator comm, int world_rank) -> int:
    """The world rank `world_rank` as a rank of comm, or -1 if it is not a member."""
    return coll_comm_local_rank(comm._live(), world_rank)


def comm_context(Communicator comm) -> int:
    """The context id in comm's message headers (0 for a communicator made directly)."""
    return coll_comm_ctx(comm._live())
