"""A minimal mpi4py: the subset of ``mpi4py.MPI`` that data-parallel scripts use.

A script that keeps to this subset runs unchanged after
``from collectives import MPI``::

    comm = MPI.COMM_WORLD
    comm.Allreduce(MPI.IN_PLACE, grads, op=MPI.SUM)

Uppercase methods take buffers (numpy arrays, or ``[buf, MPI.FLOAT]`` specs)
and run in the native core with the GIL released; lowercase methods take
Python objects and pickle them. Extensions beyond mpi4py: ``algorithm=`` on
Allreduce, ``timeout=`` on every collective, ``comm.local_rank`` and
``comm.local_size``. ``COMM_WORLD`` is created on first access (the
rendezvous happens then, not at import).
"""
from __future__ import annotations

import builtins
import functools
import pickle
import socket
import time
from typing import Any, Callable, Optional, Sequence

from .. import _core
from . import _missing
from .._core import CollectivesError, CommBase as _CommBase, count_of
from .._core import check_root
from . import _comms as _mpi_comms, _extras as _mpi_extras, _more as _mpi_more
from ..rendezvous import world as _world
from ._request import Request
from ._comms import COMM_NULL

REQUEST_NULL = Request()

__all__ = [
    "COMM_WORLD", "COMM_SELF", "Comm", "Request", "Op", "Datatype", "Exception", "IN_PLACE",
    "SUM", "PROD", "MIN", "MAX", "AVG", "Wtime", "Wtick", "Get_processor_name",
    "Init", "Finalize", "Is_initialized", "Is_finalized",
    "Status", "ANY_SOURCE", "ANY_TAG", "PROC_NULL", "UNDEFINED", "TAG_UB", "COMM_NULL",
]

from ._types import (  # noqa: F401 -- mpi4py's names, re-exported
    ANY_SOURCE, ANY_TAG, AVG, BAND, BOR, BXOR, BYTE, CHAR, DATATYPE_NULL, DOUBLE, FLOAT,
    IN_PLACE, INT, INT8_T, INT32_T, INT64_T, LAND, LONG, LONG_LONG, LOR, LXOR, MAX, MAXLOC, MIN,
    MINLOC, NO_OP, OP_NULL, PROC_NULL, PROD, REPLACE, SIGNED_CHAR, SUM, TAG_UB, UINT8_T,
    UNDEFINED, UNSIGNED_CHAR, FLOAT16_T, BFLOAT16_T, FLOAT32_T, FLOAT64_T, ArgumentError,
    Datatype, Op, Status, _ITEMSIZE, _NULL_TYPES, _op)
from ._types import (  # noqa: F401
    SUCCESS, ERR_ARG, ERR_OTHER, ERR_INTERN, ERR_BUFFER, ERR_COUNT, ERR_TYPE, ERR_TAG, ERR_COMM,
    ERR_RANK, ERR_REQUEST, ERR_ROOT, ERR_GROUP, ERR_OP, ERR_TRUNCATE, ERR_UNKNOWN, ERR_PENDING,
    ERR_IN_STATUS, ERR_INFO, ERR_KEYVAL, ERR_ERRHANDLER, ERR_WIN, ERR_SESSION,
    ERR_UNSUPPORTED_OPERATION, ERR_PROC_FAILED, ERR_NOT_SAME, ERR_TOPOLOGY, ERR_DIMS,
    ERR_NO_MEM, ERR_INFO_KEY, ERR_INFO_VALUE, ERR_INFO_NOKEY, ERR_LASTCODE)
from ._specs import BOTTOM, _buf, _dtype_name, _no_none, _pair, _vbuf  # noqa: F401
from ._names import (  # noqa: F401
    APPNUM, COMM_TYPE_SHARED, CONGRUENT, IDENT, INFO_NULL, KEYVAL_INVALID, MAX_OBJECT_NAME,
    MAX_PROCESSOR_NAME, SIMILAR, SUBVERSION, THREAD_FUNNELED, THREAD_MULTIPLE, THREAD_SERIALIZED,
    THREAD_SINGLE, UNEQUAL, VERSION, Get_library_version, Get_version, Init_thread,
    Is_thread_main, Query_thread, get_vendor)

from ._group import GROUP_EMPTY, GROUP_NULL, Group  # noqa: F401,E402
from ._message import MESSAGE_NO_PROC, MESSAGE_NULL, Message  # noqa: F401,E402

globals().update({_n: DATATYPE_NULL for _n in _NULL_TYPES})  # SHORT, INT16_T, ...: see Datatype

Exception = CollectivesError  # noqa: A001 -- mpi4py's name for its error class
Exception.__doc__ = CollectivesError.__doc__


# Whether this process used point-to-point (send or receive) on any communicator: then
# finalization waits (bounded by the timeout) until every rank has finalized too, as
# MPI_Finalize does, so that a message whose send completed here is read there before this
# process closes its links (a send completes once the link took its bytes; closing the link
# right after could lose them: issue 39's send-free-exit pattern).
_p2p_used = [False]


def _drain_at_finalize() -> None:
    if not _p2p_used[0] or not _world.is_initialized():
        return
    core = _init_world()._core
    if core.size > 1 and not core.closed and not core.broken:
        core.barrier()


_world.add_finalize_hook(_drain_at_finalize)


def _msg(spec: Any) -> tuple:
    """A point-to-point message spec: None is an empty message (mpi4py)."""
    _p2p_used[0] = True
    return _buf(BOTTOM if spec is None else spec, "buf")


class Comm(_mpi_more.CommMore, _mpi_extras.CommExtras, _CommBase):
    """A communicator: mpi4py's names over the native core.

    Allreduce on plain buffers is inherited from the Cython base, which runs
    it without a Python frame: at 8 bytes the call overhead is the latency.
    """

    def __new__(cls, comm: Any = None) -> Any:
        """mpi4py's constructor: ``Comm()`` is a null communicator (equal to COMM_NULL),
        ``Comm(comm)`` a new handle to the same communicator (equal to it)."""
        if comm is None or isinstance(comm, _mpi_comms._CommNull):
            return _mpi_comms._CommNull()
        if not isinstance(comm, Comm):
            raise TypeError(f"Comm() takes a communicator, not {type(comm).__name__}")
        other = cls._from_core(comm._core, comm._local_rank, comm._local_size)
        other._name = comm._name
        return other

    def __init__(self, comm: Any = None) -> None:
        pass  # __new__ did it

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, _mpi_comms._CommNull):
            return self._core.closed  # a freed communicator is COMM_NULL, as in MPI
        return isinstance(other, Comm) and other._core is self._core

    def __ne__(self, other: Any) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return id(self._core)

    def __bool__(self) -> bool:
        return not self._core.closed

    def __reduce__(self) -> Any:
        """COMM_WORLD and COMM_SELF pickle by name (as in mpi4py); others cannot."""
        for name in ("COMM_WORLD", "COMM_SELF"):
            if self._name == "MPI_" + name and globals()["__getattr__"](name) == self:
                if globals()["__getattr__"](name) is self:
                    return (_predefined, (name,))
                return (Comm, (_predefined(name),))  # a second handle to it
        raise ValueError(f"cannot pickle {self!r}: only COMM_WORLD and COMM_SELF travel")

    @classmethod
    def _from_core(cls, core: Any, local_rank: int, local_size: int) -> "Comm":
        self = _CommBase.__new__(cls)
        self._core = core
        self._local_rank = local_rank
        self._local_size = local_size
        return self

    # -- identity --------------------------------------------------------
    def Get_rank(self) -> int:
        """This process's rank."""
        return self._core.rank

    def Get_size(self) -> int:
        """Number of ranks."""
        return self._core.size

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._core.rank

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self._core.size

    @property
    def local_rank(self) -> int:
        """Rank among the processes on this host."""
        return self._local_rank

    @property
    def local_size(self) -> int:
        """Number of processes on this host."""
        return self._local_size

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CollectivesError as exc:
            raise self._explained(exc) from None
        except ValueError as exc:  # a bad rank, tag, root, count: mpi4py raises MPI.Exception
            text = str(exc)  # with the error class MPI gives (the core's words name the kind)
            cls = ERR_ROOT if text.startswith("root ") else ERR_RANK if " rank " in \
                f" {text}" and "out of range" in text else ERR_TAG if "tag" in text else ERR_ARG
            raise ArgumentError(1, text, cls) from None

    def _explained(self, exc: CollectivesError) -> CollectivesError:
        """exc, or the same error with the cause other ranks reported appended."""
        rank, members = _mpi_comms.world_ranks(self)
        text = _world.explain_failure(rank, str(exc), members)
        return CollectivesError(exc.error_code, text) if text != str(exc) else exc

    # -- buffer collectives ----------------------------------------------
    # Allreduce(sendbuf, recvbuf, op=SUM, *, algorithm="auto", timeout=None): CommBase.

    def _Allreduce_spec(self, sendbuf: Any, recvbuf: Any, op: Op, algorithm: str,
                        timeout: Optional[float]) -> None:
        """Allreduce with [buf, datatype] specs or a user op (the base handles plain buffers
        with a predefined op)."""
        if isinstance(op, Op) and op._user is not None:
            _mpi_extras.user_allreduce(self, sendbuf, recvbuf, op, timeout)
            return
        sbuf, rbuf, dtype = _pair(sendbuf, recvbuf)
        self._call(self._core.allreduce, sbuf, rbuf, _op(op), algorithm, timeout, dtype)

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, *, algorithm: str = "auto",
                   timeout: Optional[float] = None) -> Request:
        """Start an Allreduce; returns a Request (buffers stay in use until Wait)."""
        sbuf, rbuf, dtype = _pair(sendbuf, recvbuf)
        req = self._call(self._core.iallreduce, sbuf, rbuf, _op(op), algorithm, timeout, dtype)
        return Request(req, self)

    def _bcast_buf(self, buf: Any, timeout: Optional[float]) -> tuple:
        """_buf(buf); a spec this rank refuses is first told to the other ranks, which then
        fail at once naming this one (_core.refuse_broadcast; the core's broadcast does the
        same for what it refuses), and then raised here."""
        try:
            return _buf(buf, "buf")
        except Exception:
            if not self._core.closed:
                _core.refuse_broadcast(self._core, buf[0] if isinstance(buf, (list, tuple))
                                       and buf else buf, timeout)
            raise

    def Bcast(self, buf: Any, root: int = 0, *, timeout: Optional[float] = None) -> None:
        """Copy root's buf into buf on every rank."""
        b, dtype = self._bcast_buf(buf, timeout)
        self._call(self._core.broadcast, b, root, timeout, dtype)

    def Ibcast(self, buf: Any, root: int = 0, *, timeout: Optional[float] = None) -> Request:
        """Start a Bcast; returns a Request."""
        b, dtype = self._bcast_buf(buf, timeout)
        return Request(self._call(self._core.ibroadcast, b, root, timeout, dtype), self)

    def _allgather_args(self, sendbuf: Any, recvbuf: Any) -> tuple:
        # mpi4py: no sendbuf (None) is the in-place form here
        sbuf, rbuf, dtype = _pair(IN_PLACE if sendbuf is None else sendbuf, recvbuf, 0,
                                  self.size)
        n = self.size
        total = count_of(rbuf, dtype)
        if total % n:
            raise ValueError(f"Allgather: recvbuf has {total} elements, not a multiple of {n} ranks")
        return sbuf, rbuf, [total // n] * n, None, dtype

    def Allgather(self, sendbuf: Any, recvbuf: Any, *, timeout: Optional[float] = None) -> None:
        """recvbuf = the ranks' sendbufs, concatenated in rank order (sendbuf may be IN_PLACE)."""
        sbuf, rbuf, counts, displs, dtype = self._allgather_args(sendbuf, recvbuf)
        self._call(self._core.allgatherv, sbuf, rbuf, counts, displs, timeout, dtype)

    def Iallgather(self, sendbuf: Any, recvbuf: Any, *, timeout: Optional[float] = None) -> Request:
        """Start an Allgather; returns a Request."""
        sbuf, rbuf, counts, displs, dtype = self._allgather_args(sendbuf, recvbuf)
        return Request(self._call(self._core.iallgatherv, sbuf, rbuf, counts, displs, timeout,
                                  dtype), self)

    def _allgatherv_args(self, sendbuf: Any, recvbuf: Any) -> tuple:
        _no_none(sendbuf)
        rbuf, counts, displs, rtype = _vbuf(recvbuf, self.size)
        sbuf, stype = (None, None) if sendbuf is IN_PLACE else _buf(sendbuf, "sendbuf")
        return sbuf, rbuf, counts, displs, _dtype_name(stype, rtype)

    def Allgatherv(self, sendbuf: Any, recvbuf: Any, *, timeout: Optional[float] = None) -> None:
        """Gather blocks of different sizes: recvbuf is [buf, counts] or [buf, counts, displs]."""
        sbuf, rbuf, counts, displs, dtype = self._allgatherv_args(sendbuf, recvbuf)
        self._call(self._core.allgatherv, sbuf, rbuf, counts, displs, timeout, dtype)

    def Iallgatherv(self, sendbuf: Any, recvbuf: Any, *,
                    timeout: Optional[float] = None) -> Request:
        """Start an Allgatherv; returns a Request."""
        sbuf, rbuf, counts, displs, dtype = self._allgatherv_args(sendbuf, recvbuf)
        return Request(self._call(self._core.iallgatherv, sbuf, rbuf, counts, displs, timeout,
                                  dtype), self)

    def _reduce_scatter_args(self, sendbuf: Any, recvbuf: Any, op: Op) -> tuple:
        sbuf, rbuf, dtype = _pair(sendbuf, recvbuf)
        return sbuf, rbuf, _op(op), dtype

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, *,
                             timeout: Optional[float] = None) -> None:
        """recvbuf = this rank's block of op over all ranks of sendbuf (size blocks)."""
        sbuf, rbuf, name, dtype = self._reduce_scatter_args(sendbuf, recvbuf, op)
        self._call(self._core.reduce_scatter_block, sbuf, rbuf, name, timeout, dtype)

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, *,
                              timeout: Optional[float] = None) -> Request:
        """Start a Reduce_scatter_block; returns a Request."""
        sbuf, rbuf, name, dtype = self._reduce_scatter_args(sendbuf, recvbuf, op)
        return Request(self._call(self._core.ireduce_scatter_block, sbuf, rbuf, name, timeout,
                                  dtype), self)

    def Barrier(self, *, timeout: Optional[float] = None) -> None:
        """Return once every rank has entered the barrier."""
        self._call(self._core.barrier, timeout)

    def Ibarrier(self, *, timeout: Optional[float] = None) -> Request:
        """Start a barrier; returns a Request."""
        return Request(self._call(self._core.ibarrier, timeout), self)

    barrier = Barrier

    # -- rooted collectives ---------------------------------------------------
    def _rooted(self, kind: str, timeout: Optional[float], parse: Callable[[], tuple],
                fn: Callable[..., Any]) -> None:
        """fn(core, *parse()); an argument this rank refuses (often at the root alone, the
        only rank that reads a v-spec or a recvbuf) is first told to the other ranks, which
        then fail at once naming this one (_core.refuse_rooted), and then raised here."""
        try:
            args = parse()
        except Exception:
            if not self._core.closed:
                _core.refuse_rooted(self._core, kind, timeout)
            raise
        return self._call(fn, self._core, *args)

    def _reduce(self, sendbuf: Any, recvbuf: Any, op: Op, root: int, timeout: Optional[float],
                fn: Callable[..., Any]) -> Any:
        """recvbuf at root = op over every rank's sendbuf (IN_PLACE at the root; recvbuf
        is ignored elsewhere and may be None)."""
        def parse() -> tuple:
            sbuf, stype = (None, None) if sendbuf is IN_PLACE else _buf(sendbuf)
            rbuf, rtype = (None, None) if recvbuf is None or self.rank != root else _buf(recvbuf)
            return sbuf, rbuf, _op(op), root, timeout, _dtype_name(stype, rtype)
        return self._rooted("reduce", timeout, parse, fn)

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, root: int = 0, *,
               timeout: Optional[float] = None) -> None:
        """recvbuf at root = op over every rank's sendbuf (IN_PLACE at the root; recvbuf
        is ignored elsewhere and may be None)."""
        self._reduce(sendbuf, recvbuf, op, root, timeout, _core.reduce)

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, root: int = 0, *,
                timeout: Optional[float] = None) -> Request:
        """Start a Reduce; returns a Request (the buffers stay in use until it completes)."""
        return Request(self._reduce(sendbuf, recvbuf, op, root, timeout, _core.ireduce), self)

    def _even_blocks(self, buf: Any, dtype: Optional[str], what: str) -> list:
        total = count_of(buf, dtype)
        if total % self.size:
            raise ArgumentError(1, f"{what}: the root's buffer has {total} elements, not a "
                                   f"multiple of {self.size} ranks")
        return [total // self.size] * self.size

    def _gather(self, sendbuf: Any, recvbuf: Any, root: int, timeout: Optional[float],
                fn: Callable[..., Any]) -> Any:
        """The root gets every rank's sendbuf in rank order in recvbuf (IN_PLACE at the root)."""
        def parse() -> tuple:
            sbuf, stype = (None, None) if sendbuf is IN_PLACE else _buf(sendbuf)
            rbuf, counts, dtype = None, None, stype
            if self.rank == root:
                rbuf, rtype = _buf(recvbuf, "recvbuf", self.size)
                dtype = _dtype_name(stype, rtype)
                counts = self._even_blocks(rbuf, dtype, "Gather")
            return sbuf, rbuf, counts, None, root, timeout, dtype
        return self._rooted("gather", timeout, parse, fn)

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
               timeout: Optional[float] = None) -> None:
        """The root gets every rank's sendbuf in rank order in recvbuf (IN_PLACE at the root)."""
        self._gather(sendbuf, recvbuf, root, timeout, _core.gatherv)

    def Igather(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                timeout: Optional[float] = None) -> Request:
        """Start a Gather; returns a Request (the buffers stay in use until it completes)."""
        return Request(self._gather(sendbuf, recvbuf, root, timeout, _core.igatherv), self)

    def _gatherv(self, sendbuf: Any, recvbuf: Any, root: int, timeout: Optional[float],
                 fn: Callable[..., Any]) -> Any:
        """Gather blocks of different sizes: recvbuf at the root is [buf, counts(, displs)]."""
        def parse() -> tuple:
            sbuf, stype = (None, None) if sendbuf is IN_PLACE else _buf(sendbuf)
            rbuf = counts = displs = None
            dtype = stype
            if self.rank == root:
                rbuf, counts, displs, rtype = _vbuf(recvbuf, self.size, "recvbuf")
                dtype = _dtype_name(stype, rtype)
            return sbuf, rbuf, counts, displs, root, timeout, dtype
        return self._rooted("gather", timeout, parse, fn)

    def Gatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                timeout: Optional[float] = None) -> None:
        """Gather blocks of different sizes: recvbuf at the root is [buf, counts(, displs)]."""
        self._gatherv(sendbuf, recvbuf, root, timeout, _core.gatherv)

    def Igatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                 timeout: Optional[float] = None) -> Request:
        """Start a Gatherv; returns a Request (the buffers stay in use until it completes)."""
        return Request(self._gatherv(sendbuf, recvbuf, root, timeout, _core.igatherv), self)

    def _scatter(self, sendbuf: Any, recvbuf: Any, root: int, timeout: Optional[float],
                 fn: Callable[..., Any]) -> Any:
        """Rank i gets block i of the root's sendbuf in recvbuf (IN_PLACE recvbuf at the root)."""
        def parse() -> tuple:
            rbuf, rtype = (None, None) if recvbuf is IN_PLACE else _buf(recvbuf)
            sbuf, counts, dtype = None, None, rtype
            if self.rank == root:
                sbuf, stype = _buf(sendbuf, "sendbuf", self.size)
                dtype = _dtype_name(stype, rtype)
                counts = self._even_blocks(sbuf, dtype, "Scatter")
            return sbuf, rbuf, counts, None, root, timeout, dtype
        return self._rooted("scatter", timeout, parse, fn)

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                timeout: Optional[float] = None) -> None:
        """Rank i gets block i of the root's sendbuf in recvbuf (IN_PLACE recvbuf at the root)."""
        self._scatter(sendbuf, recvbuf, root, timeout, _core.scatterv)

    def Iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                 timeout: Optional[float] = None) -> Request:
        """Start a Scatter; returns a Request (the buffers stay in use until it completes)."""
        return Request(self._scatter(sendbuf, recvbuf, root, timeout, _core.iscatterv), self)

    def _scatterv(self, sendbuf: Any, recvbuf: Any, root: int, timeout: Optional[float],
                  fn: Callable[..., Any]) -> Any:
        """Scatter blocks of different sizes: sendbuf at the root is [buf, counts(, displs)]."""
        def parse() -> tuple:
            rbuf, rtype = (None, None) if recvbuf is IN_PLACE else _buf(recvbuf)
            sbuf = counts = displs = None
            dtype = rtype
            if self.rank == root:
                sbuf, counts, displs, stype = _vbuf(sendbuf, self.size, "sendbuf")
                dtype = _dtype_name(stype, rtype)
            return sbuf, rbuf, counts, displs, root, timeout, dtype
        return self._rooted("scatter", timeout, parse, fn)

    def Scatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                 timeout: Optional[float] = None) -> None:
        """Scatter blocks of different sizes: sendbuf at the root is [buf, counts(, displs)]."""
        self._scatterv(sendbuf, recvbuf, root, timeout, _core.scatterv)

    def Iscatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0, *,
                  timeout: Optional[float] = None) -> Request:
        """Start a Scatterv; returns a Request (the buffers stay in use until it completes)."""
        return Request(self._scatterv(sendbuf, recvbuf, root, timeout, _core.iscatterv), self)

    def Alltoall(self, sendbuf: Any, recvbuf: Any, *, timeout: Optional[float] = None) -> None:
        """Block j of sendbuf goes to rank j; block i of recvbuf comes from rank i (sendbuf
        may be IN_PLACE)."""
        sbuf, rbuf, dtype = _pair(sendbuf, recvbuf, self.size, self.size)
        counts = self._even_blocks(rbuf, dtype, "Alltoall")
        if sbuf is not None and count_of(sbuf, dtype) != sum(counts):
            raise ValueError(f"Alltoall: sendbuf has {count_of(sbuf, dtype)} elements, "
                             f"recvbuf {sum(counts)}")
        self._call(_core.alltoallv, self._core, sbuf, rbuf, counts, counts, None, None, timeout,
                   dtype)

    def Alltoallv(self, sendbuf: Any, recvbuf: Any, *, timeout: Optional[float] = None) -> None:
        """Blocks of different sizes: sendbuf and recvbuf are [buf, counts(, displs)]
        (sendbuf may be IN_PLACE: recvbuf's layout is used for both)."""
        rbuf, rcounts, rdispls, rtype = _vbuf(recvbuf, self.size)
        if sendbuf is IN_PLACE:
            sbuf, scounts, sdispls, stype = None, rcounts, rdispls, None
        else:
            sbuf, scounts, sdispls, stype = _vbuf(sendbuf, self.size)
        self._call(_core.alltoallv, self._core, sbuf, rbuf, scounts, rcounts, sdispls, rdispls,
                   timeout, _dtype_name(stype, rtype))

    def alltoall(self, sendobj: Sequence[Any]) -> list:
        """Rank i gets sendobj[i] from every rank, as a list in rank order (pickled)."""
        from . import _objects

        if sendobj is None or len(sendobj) != self.size:
            raise ValueError(f"alltoall needs a sequence of {self.size} objects")
        return self._call(_objects.alltoall, self._core, list(sendobj))

    # -- point-to-point ------------------------------------------------------
    def Send(self, buf: Any, dest: int, tag: int = 0, *, timeout: Optional[float] = None) -> None:
        """Send buf to rank dest; returns once its bytes are handed to the link."""
        b, dtype = _msg(buf)
        self._call(_core.p2p_send, self._core, b, dest, tag, timeout, dtype)

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Optional[Status] = None, *, timeout: Optional[float] = None) -> None:
        """Receive into buf a message from source with tag (ANY_SOURCE/ANY_TAG match any)."""
        b, dtype = _msg(buf)
        src, tg, count = self._call(_core.p2p_recv, self._core, b, source, tag, timeout, dtype)
        if status is not None:
            status._fill((src, tg, count, None, count * _ITEMSIZE[dtype or _core.dtype_of(b)]))

    def Isend(self, buf: Any, dest: int, tag: int = 0, *,
              timeout: Optional[float] = None) -> Request:
        """Start a Send; returns a Request (buf stays in use until it completes)."""
        b, dtype = _msg(buf)
        return Request(self._call(_core.p2p_isend, self._core, b, dest, tag, timeout, dtype), self)

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG, *,
              timeout: Optional[float] = None) -> Request:
        """Start a Recv into buf; returns a Request."""
        b, dtype = _msg(buf)
        return Request(self._call(_core.p2p_irecv, self._core, b, source, tag, timeout, dtype),
                       self)

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                 status: Optional[Status] = None, *, timeout: Optional[float] = None) -> None:
        """Send sendbuf to dest and receive into recvbuf at once (neither waits for the other)."""
        sbuf, stype = _msg(sendbuf)
        rbuf, rtype = _msg(recvbuf)
        dtype = _dtype_name(stype, rtype)
        src, tg, count = self._call(_core.p2p_sendrecv, self._core, sbuf, dest, sendtag, rbuf,
                                    source, recvtag, timeout, dtype)
        if status is not None:
            status._fill((src, tg, count, None, count * _ITEMSIZE[dtype or _core.dtype_of(rbuf)]))

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Send a Python object (pickled) to rank dest."""
        self.Send(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), dest, tag)

    def recv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Optional[Status] = None) -> Any:
        """Receive a Python object sent with send/isend (buf is ignored, with a UserWarning,
        as in mpi4py 4)."""
        if buf is not None:
            import warnings
            warnings.warn("recv: the buf argument is ignored", UserWarning, stacklevel=2)
        return self.irecv(None, source, tag).wait(status)

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        """Start sending a Python object (pickled); returns a Request."""
        return self.Isend(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), dest, tag)

    def irecv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Start receiving a Python object; the Request's wait() returns it."""
        _p2p_used[0] = True
        req = self._call(_core.p2p_irecv, self._core, None, source, tag)
        return Request(req, self, pickled=True)

    def sendrecv(self, sendobj: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG,
                 status: Optional[Status] = None) -> Any:
        """Send sendobj to dest and return the object received from source, at once."""
        rreq = self.irecv(None, source, recvtag)
        sreq = self.isend(sendobj, dest, sendtag)
        sreq.Wait()
        return rreq.wait(status)

    # -- object collectives (pickle) ---------------------------------------
    def bcast(self, obj: Any, root: int = 0) -> Any:
        """Return root's obj on every rank (pickled)."""
        from . import _objects

        return self._call(_objects.bcast, self._core, obj, root)

    def allgather(self, obj: Any) -> list:
        """Return the list of every rank's obj, in rank order."""
        from . import _objects

        return self._call(_objects.allgather, self._core, obj)

    def allreduce(self, obj: Any, op: Op = SUM) -> Any:
        """Combine every rank's obj with op, in rank order (same result on every rank)."""
        if op is AVG:
            raise ValueError("AVG applies to buffers only; use SUM and divide")
        return functools.reduce(op, self.allgather(obj))

    def gather(self, obj: Any, root: int = 0) -> Optional[list]:
        """The list of every rank's obj at root, None elsewhere (pickled; sent to the root only)."""
        from . import _objects

        root = self._call(check_root, root, self.size)
        return self._call(_objects.gather, self._core, obj, root)

    def scatter(self, objs: Optional[Sequence[Any]], root: int = 0) -> Any:
        """Rank i gets objs[i] from root (each rank receives only its own)."""
        from . import _objects

        root = self._call(check_root, root, self.size)
        if self.rank == root and (objs is None or len(objs) != self.size):
            raise ValueError(f"scatter needs a sequence of {self.size} objects at the root")
        return self._call(_objects.scatter, self._core, list(objs) if self.rank == root else None,
                          root)

    def Abort(self, errorcode: int = 1) -> None:
        """End this process at once; the launcher then stops the job."""
        import os

        os._exit(errorcode)

    def Free(self) -> None:
        """Release this communicator: one from Split/Dup frees what it owns, not the links it
        shares (refused while communicators made from it live); the world one closes its
        links (see collectives.finalize)."""
        _mpi_comms.free(self)

    def Split(self, color: int = 0, key: int = 0) -> "Comm":
        """Collective: ranks with the same color form a new communicator, ranked by key then
        by rank here; color UNDEFINED gives COMM_NULL. It shares this one's links."""
        return _mpi_comms.split(self, color, key)

    def Dup(self, info: Any = None) -> "Comm":
        """Collective: a new communicator over the same ranks with its own context (info
        hints are accepted and ignored, which MPI allows)."""
        return _mpi_comms.dup(self)

    def Split_type(self, split_type: int, key: int = 0, info: Any = None) -> Any:
        """Collective: COMM_TYPE_SHARED gives the ranks of this host (same host id: host
        name and boot id), ordered by key then rank; UNDEFINED gives COMM_NULL. Other
        split types (MPI 4's hardware kinds) are not provided."""
        if split_type not in (UNDEFINED, COMM_TYPE_SHARED):
            raise _missing.NotProvidedError(f"Split_type({split_type}): only "
                                            f"COMM_TYPE_SHARED and UNDEFINED are provided")
        hosts = self.allgather(_world.host_id())
        color = UNDEFINED if split_type == UNDEFINED else hosts.index(hosts[self.rank])
        return self.Split(color, key)

    def Clone(self) -> "Comm":
        """Same as Dup() (mpi4py's name)."""
        return _mpi_comms.dup(self)

    def Compare(self, comm: Any) -> int:
        """IDENT (the same communicator), CONGRUENT (same ranks, same order: a Dup),
        SIMILAR (same ranks, another order) or UNEQUAL."""
        if not isinstance(comm, Comm):
            raise TypeError(f"Compare takes a communicator, not {type(comm).__name__}")
        if comm._core is self._core:
            return IDENT
        mine = _mpi_comms.world_ranks(self)[1] or list(range(self.size))
        theirs = _mpi_comms.world_ranks(comm)[1] or list(range(comm.size))
        if mine == theirs:
            return CONGRUENT
        return SIMILAR if sorted(mine) == sorted(theirs) else UNEQUAL

    def Shrink(self) -> "Comm":
        """ULFM's MPIX_Comm_shrink on the world communicator: the live ranks' new world
        (see collectives.shrink)."""
        from ..elastic import reform as _reform
        _reform.check_world(self, "Shrink")
        return _reform.shrink(None, Comm._from_core)

    def Agree(self, flag: int) -> int:
        """ULFM's MPIX_Comm_agree on the world communicator: the bitwise AND of flag over
        the live ranks, the same on every one of them, even if ranks die meanwhile."""
        from ..elastic import reform as _reform
        _reform.check_world(self, "Agree")
        return _reform.agree(flag)

    def __repr__(self) -> str:
        return f"<collectives.MPI.Comm rank {self.rank} of {self.size}>"

    def __getattr__(self, name: str) -> Any:
        """mpi4py names not provided (yet): NotImplementedError naming them (see _missing)."""
        raise _missing.missing("collectives.MPI.Comm", name, _missing.MPI4PY_COMM,
                               "mpi4py's MPI.Comm", instance=True)


def _predefined(name: str) -> "Comm":
    """COMM_WORLD or COMM_SELF by name (what their pickles hold)."""
    return globals()["__getattr__"](name)


Intracomm = Comm  # every communicator here is an intracommunicator


def Wtime() -> float:
    """Seconds on a monotonic clock."""
    return time.perf_counter()


def Wtick() -> float:
    """Resolution of Wtime."""
    return time.get_clock_info("perf_counter").resolution


def Get_processor_name() -> str:
    """This host's name."""
    return socket.gethostname()


def _init_world(timeout: Optional[float] = None) -> "Comm":
    """The world communicator as a Comm, made on first call (collectives.init)."""
    from ..elastic import worker as _elastic

    elastic = _elastic.rendezvous if _elastic.is_elastic() else None
    comm = _world.init(timeout, Comm._from_core, elastic)
    if comm._name is None:
        comm._name = "MPI_COMM_WORLD"
    return comm


def Init() -> None:
    """Join the world now (otherwise done on first use of COMM_WORLD)."""
    _init_world()


def Finalize() -> None:
    """Close the world communicator."""
    _world.finalize()


def Is_initialized() -> bool:
    """True while the world communicator exists."""
    return _world.is_initialized()


def Is_finalized() -> bool:
    """True when the world communicator does not exist (never made, or closed)."""
    return not Is_initialized()


_self_comm: Optional["Comm"] = None


def _comm_self() -> "Comm":
    """This process alone: a one-rank communicator (no listener, no links)."""
    global _self_comm
    if _self_comm is None or _self_comm._core.closed:
        from .._core import Communicator

        _self_comm = Comm._from_core(Communicator(0, 1), 0, 1)
        _self_comm._name = "MPI_COMM_SELF"
    return _self_comm


def __getattr__(name: str) -> Any:
    if name == "COMM_WORLD":
        return _init_world()
    if name == "COMM_SELF":
        return _comm_self()
    raise _missing.missing("collectives.MPI", name, _missing.MPI4PY_MODULE, "mpi4py's MPI")
