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
import operator
import pickle
import socket
import time
from typing import Any, Callable, Optional, Sequence

from . import _missing
from ._core import CollectivesError, CommBase as _CommBase, Request as _CoreRequest, count_of
from ._core import _mpi_register, check_root, not_a_buffer
from . import _world

__all__ = [
    "COMM_WORLD", "Comm", "Request", "Op", "Datatype", "Exception", "IN_PLACE",
    "SUM", "PROD", "MIN", "MAX", "AVG", "Wtime", "Wtick", "Get_processor_name",
    "Init", "Finalize", "Is_initialized", "Is_finalized",
]

Exception = CollectivesError  # noqa: A001 -- mpi4py's name for its error class
Exception.__doc__ = CollectivesError.__doc__


class Op:
    """A reduction operation: a core op for buffers, a Python function for objects."""

    def __init__(self, name: str, func: Callable[[Any, Any], Any]) -> None:
        self.name = name
        self._func = func

    def __call__(self, a: Any, b: Any) -> Any:
        """Combine two Python objects (used by the lowercase collectives)."""
        return self._func(a, b)

    def __repr__(self) -> str:
        return f"<collectives.MPI.Op {self.name.upper()}>"


SUM = Op("sum", operator.add)
PROD = Op("prod", operator.mul)
MIN = Op("min", min)
MAX = Op("max", max)
AVG = Op("avg", lambda a, b: (a + b))  # buffers only: the core divides once at the end


class Datatype:
    """An MPI datatype name mapped to the core's element type."""

    def __init__(self, name: str, dtype: str) -> None:
        self.name = name
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"<collectives.MPI.Datatype {self.name}>"


BYTE = Datatype("BYTE", "uint8")
CHAR = Datatype("CHAR", "int8")
SIGNED_CHAR = Datatype("SIGNED_CHAR", "int8")
UNSIGNED_CHAR = Datatype("UNSIGNED_CHAR", "uint8")
INT8_T = Datatype("INT8_T", "int8")
UINT8_T = Datatype("UINT8_T", "uint8")
INT = Datatype("INT", "int32")
INT32_T = Datatype("INT32_T", "int32")
LONG = Datatype("LONG", "int64")
LONG_LONG = Datatype("LONG_LONG", "int64")
INT64_T = Datatype("INT64_T", "int64")
FLOAT = Datatype("FLOAT", "float32")
DOUBLE = Datatype("DOUBLE", "float64")


class _InPlace:
    """The IN_PLACE marker for send buffers."""

    def __repr__(self) -> str:
        return "<collectives.MPI.IN_PLACE>"


IN_PLACE = _InPlace()
_mpi_register(IN_PLACE, {op: op.name for op in (SUM, PROD, MIN, MAX, AVG)}, SUM)


def _buf(spec: Any, name: str = "buffer") -> tuple[Any, Optional[str]]:
    """Split a buffer spec (buf, [buf, type], [buf, count, type]) into (buf, dtype)."""
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise ValueError("empty buffer specification")
        if isinstance(spec[0], (int, float, complex)):  # [1.0, 2.0]: data, not [buf, type]
            raise not_a_buffer(name, spec)
        dtype = spec[-1].dtype if isinstance(spec[-1], Datatype) else None
        return spec[0], dtype
    return spec, None


def _no_none(sendbuf: Any) -> None:
    """mpi4py takes None nowhere as a send buffer; the core reads None as in place."""
    if sendbuf is None:
        raise TypeError("sendbuf is None: pass MPI.IN_PLACE for the in-place form")


def _pair(sendbuf: Any, recvbuf: Any) -> tuple[Any, Any, Optional[str]]:
    """(sendbuf, or None for IN_PLACE; recvbuf; the datatype both specs agree on, or None)."""
    _no_none(sendbuf)
    if not isinstance(recvbuf, (list, tuple)) and \
            (sendbuf is IN_PLACE or not isinstance(sendbuf, (list, tuple))):
        return (None if sendbuf is IN_PLACE else sendbuf), recvbuf, None  # plain buffers
    rbuf, rtype = _buf(recvbuf, "recvbuf")
    sbuf, stype = (None, None) if sendbuf is IN_PLACE else _buf(sendbuf, "sendbuf")
    return sbuf, rbuf, _dtype_name(stype, rtype)


def _vbuf(spec: Any, size: int) -> tuple[Any, list[int], Optional[list[int]], Optional[str]]:
    """Split a v-spec ([buf, counts], [buf, counts, displs], [buf, (counts, displs)], + type)."""
    if not isinstance(spec, (list, tuple)) or len(spec) < 2:
        raise ValueError("Allgatherv needs recvbuf as [buf, counts] or [buf, counts, displs]")
    items = list(spec)
    dtype = None
    if isinstance(items[-1], Datatype):
        dtype = items.pop().dtype
    buf, rest = items[0], items[1:]
    if len(rest) == 1 and isinstance(rest[0], tuple) and len(rest[0]) == 2 and \
            isinstance(rest[0][0], (list, tuple)):
        rest = list(rest[0])
    counts = [int(c) for c in rest[0]]
    displs = [int(d) for d in rest[1]] if len(rest) > 1 and rest[1] is not None else None
    if len(counts) != size:
        raise ValueError(f"Allgatherv: {len(counts)} counts for {size} ranks")
    return buf, counts, displs, dtype


def _op(op: Any) -> str:
    """The core's name of an MPI.Op (TypeError for anything else, as mpi4py)."""
    if not isinstance(op, Op):
        raise TypeError(f"op must be an MPI.Op such as MPI.SUM, not {type(op).__name__}")
    return op.name


def _dtype_name(a: Optional[str], b: Optional[str]) -> Optional[str]:
    if a and b and a != b:
        raise TypeError(f"send datatype {a} differs from receive datatype {b}")
    return a or b


class Request:
    """A non-blocking operation (mpi4py's Request subset)."""

    def __init__(self, core_request: _CoreRequest, comm: "Comm") -> None:
        self._req = core_request
        self._comm = comm

    def Wait(self, status: Any = None) -> None:
        """Block until done; raise MPI.Exception if the collective failed."""
        self._comm._call(self._req.Wait)

    def Test(self, status: Any = None) -> bool:
        """True once done (raising if it failed)."""
        return self._comm._call(self._req.Test)

    wait = Wait
    test = Test

    @staticmethod
    def Waitall(requests: Sequence["Request"], statuses: Any = None) -> None:
        """Wait for every request in order."""
        for r in requests:
            r.Wait()


class Comm(_CommBase):
    """A communicator: mpi4py's names over the native core.

    Allreduce on plain buffers is inherited from the Cython base, which runs
    it without a Python frame: at 8 bytes the call overhead is the latency.
    """

    def __init__(self) -> None:
        raise TypeError("communicators come from MPI.COMM_WORLD or collectives.init()")

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

    def _explained(self, exc: CollectivesError) -> CollectivesError:
        """exc, or the same error with the cause other ranks reported appended."""
        text = _world.explain_failure(self.rank, str(exc))
        return CollectivesError(exc.error_code, text) if text != str(exc) else exc

    # -- buffer collectives ----------------------------------------------
    # Allreduce(sendbuf, recvbuf, op=SUM, *, algorithm="auto", timeout=None): CommBase.

    def _Allreduce_spec(self, sendbuf: Any, recvbuf: Any, op: Op, algorithm: str,
                        timeout: Optional[float]) -> None:
        """Allreduce with [buf, datatype] specs (the base handles plain buffers)."""
        sbuf, rbuf, dtype = _pair(sendbuf, recvbuf)
        self._call(self._core.allreduce, sbuf, rbuf, _op(op), algorithm, timeout, dtype)

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, *, algorithm: str = "auto",
                   timeout: Optional[float] = None) -> Request:
        """Start an Allreduce; returns a Request (buffers stay in use until Wait)."""
        sbuf, rbuf, dtype = _pair(sendbuf, recvbuf)
        req = self._call(self._core.iallreduce, sbuf, rbuf, _op(op), algorithm, timeout, dtype)
        return Request(req, self)

    def Bcast(self, buf: Any, root: int = 0, *, timeout: Optional[float] = None) -> None:
        """Copy root's buf into buf on every rank."""
        b, dtype = _buf(buf, "buf")
        self._call(self._core.broadcast, b, root, timeout, dtype)

    def Ibcast(self, buf: Any, root: int = 0, *, timeout: Optional[float] = None) -> Request:
        """Start a Bcast; returns a Request."""
        b, dtype = _buf(buf, "buf")
        return Request(self._call(self._core.ibroadcast, b, root, timeout, dtype), self)

    def _allgather_args(self, sendbuf: Any, recvbuf: Any) -> tuple:
        sbuf, rbuf, dtype = _pair(sendbuf, recvbuf)
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
        """The list of every rank's obj at root, None elsewhere."""
        root = check_root(root, self.size)
        objs = self.allgather(obj)
        return objs if self.rank == root else None

    def scatter(self, objs: Optional[Sequence[Any]], root: int = 0) -> Any:
        """Rank i gets objs[i] from root."""
        root = check_root(root, self.size)
        if self.rank == root and (objs is None or len(objs) != self.size):
            raise ValueError(f"scatter needs a sequence of {self.size} objects at the root")
        return self.bcast(list(objs) if self.rank == root else None, root)[self.rank]

    def Abort(self, errorcode: int = 1) -> None:
        """End this process at once; the launcher then stops the job."""
        import os

        os._exit(errorcode)

    def Free(self) -> None:
        """Close this communicator's links (the world one: see collectives.finalize)."""
        self._core.close()

    def __repr__(self) -> str:
        return f"<collectives.MPI.Comm rank {self.rank} of {self.size}>"

    def __getattr__(self, name: str) -> Any:
        """mpi4py names not provided (yet): NotImplementedError naming them (see _missing)."""
        raise _missing.missing("collectives.MPI.Comm", name, _missing.MPI4PY_COMM,
                               "mpi4py's MPI.Comm", instance=True)


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
    return _world.init(timeout, Comm._from_core)


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


def __getattr__(name: str) -> Any:
    if name == "COMM_WORLD":
        return _init_world()
    raise _missing.missing("collectives.MPI", name, _missing.MPI4PY_MODULE, "mpi4py's MPI")
