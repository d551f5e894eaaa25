"""More of mpi4py's Comm: object reduce/scan/exscan, Scan/Exscan, Reduce_scatter with
counts, Sendrecv_replace, names. Composed from the communicator's own collectives and
point-to-point calls (no wire format of their own), so every header check, timeout and
failure rule of those applies. ``collectives.MPI.Comm`` inherits them from CommExtras.
"""
from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import numpy as np

from .. import _core
from .._core import ANY_SOURCE, ANY_TAG, check_root
from ._specs import _buf, _no_none
from ._types import AVG, IN_PLACE, SUM, Datatype, Op, _op

# the buffer forms' reductions, in rank order (Op name -> numpy ufunc)
_UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def _array(spec: Any, name: str, writable: bool = False) -> np.ndarray:
    """A 1-D numpy array over the memory of a buffer spec (buf, [buf, type], [buf, count,
    type]): whatever the buffer is (numpy, array.array, __dlpack__, ...), writes go to the
    caller's memory, never to a copy (_core.host_array). bfloat16, which numpy cannot add,
    is refused here."""
    buf, dtype = _buf(spec, name)
    arr = _core.host_array(buf, name, writable, dtype)
    if arr.dtype == np.uint16:  # host_array's bfloat16 (the core carries no uint16)
        raise TypeError(f"{name} is bfloat16, which this call does not reduce (use Allreduce)")
    return arr


def reduce_local(op: Op, inbuf: Any, inoutbuf: Any) -> None:
    """Op.Reduce_local: inoutbuf = op(inbuf, inoutbuf) element-wise, in this process."""
    out = _array(inoutbuf, "inoutbuf", True)
    src = _array(inbuf, "inbuf")
    if src.size != out.size or src.dtype != out.dtype:
        raise ValueError(f"inbuf ({src.size} x {src.dtype}) and inoutbuf ({out.size} x "
                         f"{out.dtype}) differ")
    if op._user is not None:
        op._user(src, out, None)
        return
    ufunc = _UFUNCS.get(_op(op))
    if ufunc is None:
        raise ValueError(f"{op!r} has no local form")
    ufunc(src, out, out=out)


Op._reduce_local = staticmethod(reduce_local)

# core dtype -> the Datatype a user op's function is given
_DATATYPES = {"int8": "SIGNED_CHAR", "uint8": "BYTE", "int32": "INT", "int64": "LONG",
              "float16": "FLOAT16_T", "float32": "FLOAT", "float64": "DOUBLE"}


def user_allreduce(comm: Any, sendbuf: Any, recvbuf: Any, op: Op,
                   timeout: Optional[float]) -> None:
    """Allreduce with an Op.Create op: every rank gathers every rank's buffer and folds
    them in rank order, x0 op (x1 op (... op x(n-1))), calling function(inbuf, inoutbuf,
    datatype) on byte views, so every rank computes the same result in MPI's order."""
    from . import _types
    _no_none(sendbuf)
    out = _array(recvbuf, "recvbuf", True)
    mine = out.copy() if sendbuf is IN_PLACE else _array(sendbuf, "sendbuf")
    if mine.size != out.size or mine.dtype != out.dtype:
        raise ValueError(f"sendbuf ({mine.size} x {mine.dtype}) and recvbuf ({out.size} x "
                         f"{out.dtype}) differ")
    spec_type = recvbuf[-1] if isinstance(recvbuf, (list, tuple)) and \
        isinstance(recvbuf[-1], Datatype) else None
    datatype = spec_type or getattr(_types, _DATATYPES[str(out.dtype)])
    parts = np.empty((comm.size, mine.size), mine.dtype)
    comm.Allgather(mine, parts.reshape(-1), timeout=timeout)
    acc = parts[-1].copy()
    for k in range(comm.size - 2, -1, -1):
        op._user(memoryview(parts[k]).cast("B"), memoryview(acc).cast("B"), datatype)
    out[...] = acc


class CommExtras:
    """Mixin of collectives.MPI.Comm (see the module docstring)."""

    _name: Optional[str] = None

    # -- names -------------------------------------------------------------
    def Get_name(self) -> str:
        """The communicator's name: MPI_COMM_WORLD, MPI_COMM_SELF, or what Set_name gave
        ("" for one from Split or Dup, which MPI does not name)."""
        return self._name or ""

    def Set_name(self, name: str) -> None:
        """Name the communicator (this rank's handle only, as in MPI)."""
        self._name = str(name)

    @property
    def name(self) -> str:
        """Get_name() / Set_name() as a property (mpi4py)."""
        return self.Get_name()

    @name.setter
    def name(self, value: str) -> None:
        self.Set_name(value)

    def Is_inter(self) -> bool:
        """False: every communicator here is an intracommunicator."""
        return False

    def Is_intra(self) -> bool:
        """True: every communicator here is an intracommunicator."""
        return True

    @property
    def is_inter(self) -> bool:
        """Is_inter() as a property (mpi4py)."""
        return False

    @property
    def is_intra(self) -> bool:
        """Is_intra() as a property (mpi4py)."""
        return True

    # -- object forms ------------------------------------------------------
    def _obj_op(self, op: Any) -> Any:
        if not isinstance(op, Op):
            raise TypeError(f"op must be an Op such as SUM, not {type(op).__name__}")
        if op is AVG:
            raise ValueError("AVG applies to buffers only; use SUM and divide")
        return op

    def reduce(self, sendobj: Any, op: Any = None, root: int = 0) -> Any:
        """op over every rank's object, in rank order, at root (None elsewhere)."""
        op = self._obj_op(SUM if op is None else op)
        root = self._call(check_root, root, self.size)
        objs = self.gather(sendobj, root)
        return functools.reduce(op, objs) if self.rank == root else None

    def scan(self, sendobj: Any, op: Any = None) -> Any:
        """Inclusive prefix: op over the objects of ranks 0..rank, in rank order."""
        op = self._obj_op(SUM if op is None else op)
        return functools.reduce(op, self.allgather(sendobj)[:self.rank + 1])

    def exscan(self, sendobj: Any, op: Any = None) -> Any:
        """Exclusive prefix: op over the objects of ranks 0..rank-1 (None at rank 0)."""
        op = self._obj_op(SUM if op is None else op)
        objs = self.allgather(sendobj)[:self.rank]
        return functools.reduce(op, objs) if objs else None

    # -- buffer forms ------------------------------------------------------
    def _prefix(self, sendbuf: Any, recvbuf: Any, op: Any, timeout: Optional[float],
                exclusive: bool, start: bool = False) -> Any:
        """Scan/Exscan: every rank's sendbuf by Allgather, then the prefix in rank order
        into recvbuf; start=True: an Iallgather whose Request computes the prefix once
        complete (Iscan/Iexscan), returned."""
        _no_none(sendbuf)
        name = _op(op)
        if name not in _UFUNCS:
            raise ValueError(f"{name.upper()} has no prefix form (Scan/Exscan take SUM, PROD, "
                             f"MIN or MAX)")
        out = _array(recvbuf, "recvbuf", True)
        mine = out if sendbuf is IN_PLACE else _array(sendbuf, "sendbuf")
        if mine.size != out.size or mine.dtype != out.dtype:
            raise ValueError(f"sendbuf ({mine.size} x {mine.dtype}) and recvbuf "
                             f"({out.size} x {out.dtype}) differ")
        parts = np.empty((self.size, mine.size), mine.dtype)
        upto = self.rank if exclusive else self.rank + 1

        def fold() -> None:
            if upto == 0:
                return  # Exscan at rank 0: recvbuf is left as it was (undefined in MPI)
            acc = parts[0].copy()
            for k in range(1, upto):
                _UFUNCS[name](acc, parts[k], out=acc)
            out[...] = acc

        send = mine.copy() if sendbuf is IN_PLACE or start else mine
        if start:
            req = self.Iallgather(send, parts.reshape(-1), timeout=timeout)
            req._then = fold
            return req
        self.Allgather(send, parts.reshape(-1), timeout=timeout)
        fold()
        return None

    def Iscan(self, sendbuf: Any, recvbuf: Any, op: Any = None, *,
              timeout: Optional[float] = None) -> Any:
        """Start a Scan; returns a Request (recvbuf is written when it completes)."""
        return self._prefix(sendbuf, recvbuf, SUM if op is None else op, timeout, False, True)

    def Iexscan(self, sendbuf: Any, recvbuf: Any, op: Any = None, *,
                timeout: Optional[float] = None) -> Any:
        """Start an Exscan; returns a Request (recvbuf is written when it completes)."""
        return self._prefix(sendbuf, recvbuf, SUM if op is None else op, timeout, True, True)

    def Scan(self, sendbuf: Any, recvbuf: Any, op: Any = None, *,
             timeout: Optional[float] = None) -> None:
        """recvbuf = op over the sendbufs of ranks 0..rank, element-wise in rank order
        (sendbuf may be IN_PLACE). Built on Allgather: each rank holds every rank's
        sendbuf once, so use it for modest buffers."""
        self._prefix(sendbuf, recvbuf, SUM if op is None else op, timeout, False)

    def Exscan(self, sendbuf: Any, recvbuf: Any, op: Any = None, *,
               timeout: Optional[float] = None) -> None:
        """recvbuf = op over the sendbufs of ranks 0..rank-1 (rank 0's recvbuf is left
        unchanged); as Scan otherwise."""
        self._prefix(sendbuf, recvbuf, SUM if op is None else op, timeout, True)

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any,
                       recvcounts: Optional[Sequence[int]] = None, op: Any = None, *,
                       timeout: Optional[float] = None) -> None:
        """op over every rank's sendbuf (sum(recvcounts) elements); rank i gets the
        recvcounts[i] elements of the result after those of ranks 0..i-1. recvcounts
        None: every rank gets as many as its recvbuf holds. With IN_PLACE the input is
        recvbuf (sum(recvcounts) elements) and the result fills its start. Equal counts
        run Reduce_scatter_block; unequal ones an Allreduce and this rank's part."""
        self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, timeout, False)

    def _reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Optional[Sequence[int]],
                        op: Any, timeout: Optional[float], start: bool) -> Any:
        """Reduce_scatter; start=True: the non-blocking form's Request, returned."""
        _no_none(sendbuf)
        op = SUM if op is None else op
        _op(op)
        out = _array(recvbuf, "recvbuf", True)
        n, r = self.size, self.rank
        if recvcounts is None:
            counts = [int(c) for c in self.allgather(out.size)] if sendbuf is not IN_PLACE \
                else None
            if counts is None:
                raise ValueError("Reduce_scatter with IN_PLACE needs recvcounts")
        else:
            counts = [int(c) for c in recvcounts]
        if len(counts) != n or min(counts) < 0:
            raise ValueError(f"recvcounts must be {n} counts >= 0, got {counts}")
        total = sum(counts)
        src = out if sendbuf is IN_PLACE else _array(sendbuf, "sendbuf")
        if src.size != total:
            raise ValueError(f"the input has {src.size} elements, recvcounts sum to {total}")
        if sendbuf is not IN_PLACE and out.size < counts[r]:
            raise ValueError(f"recvbuf holds {out.size} elements, rank {r} receives {counts[r]}")
        if sendbuf is not IN_PLACE and len(set(counts)) == 1 and out.size == counts[r]:
            if start:
                return self.Ireduce_scatter_block(sendbuf, recvbuf, op, timeout=timeout)
            self.Reduce_scatter_block(sendbuf, recvbuf, op, timeout=timeout)
            return None
        full = np.empty(total, src.dtype)
        first = sum(counts[:r])

        def mine() -> None:
            out[:counts[r]] = full[first:first + counts[r]]

        if start:  # the input is read when the request runs: IN_PLACE's is copied now
            req = self.Iallreduce(src.copy() if sendbuf is IN_PLACE else src, full, op,
                                  timeout=timeout)
            req._then = mine
            return req
        self.Allreduce(src, full, op, timeout=timeout)
        mine()
        return None

    def Sendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0,
                         source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Any = None, *,
                         timeout: Optional[float] = None) -> None:
        """Send buf to dest and receive into the same buf from source (the message sent
        is a copy taken first)."""
        if buf is None:
            buf = np.empty(0, np.uint8)  # mpi4py: no buffer is an empty message
        arr = _array(buf, "buf", True)
        copy = arr.copy()
        spec = [copy, buf[-1]] if isinstance(buf, (list, tuple)) and \
            isinstance(buf[-1], (Datatype, str)) else copy
        self.Sendrecv(spec, dest, sendtag, arr, source, recvtag, status, timeout=timeout)
