"""mpi4py's message specifications, parsed once for every call of collectives.MPI.

A buffer spec is ``buf``, ``[buf, datatype]``, ``[buf, count]``, ``[buf, count, datatype]``
or ``[buf, (count, displ), datatype]`` (count and displacement in elements of the datatype;
a datatype is an ``MPI.Datatype`` or a typecode such as ``"i"``); ``buf`` None or
``MPI.BOTTOM`` with count 0 (or none) is an empty message. A vector spec (Gatherv,
Scatterv, Allgatherv, Alltoallv) is ``[buf, counts]``, ``[buf, counts, displs]`` or
``[buf, (counts, displs)]``, with or without a datatype, where counts may be one int (the
same count for every rank) and displs one int (rank i's block at i * displs) or None
(packed). A count smaller than the buffer takes its first elements, never the whole
buffer: the part is a view of the caller's memory (``_core.host_array``), not a copy.
Everything here raises before any byte is sent: ``MPI.Exception`` with ``ERR_TYPE`` for a
datatype the core does not carry, ``ArgumentError`` (an ``MPI.Exception`` and a
``ValueError``) for counts that do not fit.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .. import _core
from .._core import count_of, not_a_buffer
from ._types import ArgumentError, Datatype, IN_PLACE, _datatype


class _Bottom:
    """MPI.BOTTOM: the address 0; here only an empty buffer (count 0) may start at it."""

    def __repr__(self) -> str:
        return "<collectives.MPI.BOTTOM>"


BOTTOM = _Bottom()


def _int(x: Any, what: str) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be an int, not {type(x).__name__}") from None


def _empty(dtype: Optional[str]) -> np.ndarray:
    return np.empty(0, np.uint8 if dtype in (None, "bfloat16") else dtype)


def _part(buf: Any, dtype: Optional[str], count: Optional[int], displ: int, name: str) -> Any:
    """buf itself when [displ, displ + count) is all of it, else a view of that part."""
    if buf is None or buf is BOTTOM:
        if count:
            raise ArgumentError(1, f"{name} is None with count {count}")
        return _empty(dtype)
    if count is None and not displ:
        return buf
    total = count_of(buf, dtype)
    count = total - displ if count is None else count
    if count < 0 or displ < 0 or displ + count > total:
        raise ArgumentError(1, f"{name}: count {count} at displacement {displ} does not fit its "
                               f"{total} elements")
    if displ == 0 and count == total:
        return buf
    return _core.host_array(buf, name, False, dtype)[displ:displ + count]


def _buf(spec: Any, name: str = "buffer", blocks: int = 0) -> tuple[Any, Optional[str]]:
    """(buffer, core dtype or None) of a buffer spec (see the module docstring). blocks > 0:
    the buffer holds one block per rank (Allgather's and Gather's recvbuf, Scatter's sendbuf,
    both of Alltoall's), and a count is per block, as mpi4py reads it."""
    if not isinstance(spec, (list, tuple)):
        return (_empty(None) if spec is BOTTOM else spec), None
    if not spec:
        raise ValueError("empty buffer specification")
    if isinstance(spec[0], (int, float, complex)):  # [1.0, 2.0]: data, not [buf, type]
        raise not_a_buffer(name, spec)
    items = list(spec)
    dtype = None
    if len(items) > 1 and isinstance(items[-1], (Datatype, str)):
        dtype = _datatype(items.pop())
    buf, rest = items[0], items[1:]
    if len(rest) == 1 and isinstance(rest[0], (list, tuple)):
        rest = list(rest[0])
    if len(rest) > 2:
        raise TypeError(f"{name}: a message is [buf, count, displ, datatype] at most")
    count = None if not rest or rest[0] is None else _int(rest[0], "count")
    if count is not None and blocks:
        count *= blocks
    displ = _int(rest[1], "displacement") if len(rest) > 1 and rest[1] is not None else 0
    return _part(buf, dtype, count, displ, name), dtype


def _no_none(sendbuf: Any) -> None:
    """mpi4py takes None nowhere as a reduction's send buffer; the core reads None as in
    place."""
    if sendbuf is None:
        raise TypeError("sendbuf is None: pass MPI.IN_PLACE for the in-place form")


def _pair(sendbuf: Any, recvbuf: Any, sblocks: int = 0,
          rblocks: int = 0) -> tuple[Any, Any, Optional[str]]:
    """(sendbuf, or None for IN_PLACE; recvbuf; the datatype both specs agree on, or None);
    sblocks/rblocks: see _buf's blocks."""
    _no_none(sendbuf)
    if not isinstance(recvbuf, (list, tuple)) and \
            (sendbuf is IN_PLACE or not isinstance(sendbuf, (list, tuple))):
        return (None if sendbuf is IN_PLACE else sendbuf), recvbuf, None  # plain buffers
    rbuf, rtype = _buf(recvbuf, "recvbuf", rblocks)
    sbuf, stype = (None, None) if sendbuf is IN_PLACE else _buf(sendbuf, "sendbuf", sblocks)
    return sbuf, rbuf, _dtype_name(stype, rtype)


def _vbuf(spec: Any, size: int, name: str = "buffer") -> tuple[Any, list, Optional[list],
                                                             Optional[str]]:
    """(buffer, counts, displs or None, dtype) of a vector spec (see the module docstring)."""
    if not isinstance(spec, (list, tuple)):
        spec = [spec, None]  # a plain buffer: equal blocks, packed
    if len(spec) < 2:
        raise TypeError(f"{name}: a vector message is [buf, counts] or [buf, counts, displs]")
    items = list(spec)
    dtype = None
    if isinstance(items[-1], (Datatype, str)):
        dtype = _datatype(items.pop())
    buf, rest = items[0], items[1:]
    if len(rest) == 1 and isinstance(rest[0], tuple) and len(rest[0]) == 2:
        rest = list(rest[0])  # [buf, (counts, displs)]
    if len(rest) > 2:
        raise TypeError(f"{name}: a vector message is [buf, counts, displs, datatype] at most")
    counts, displs = rest[0], rest[1] if len(rest) > 1 else None
    if buf is None or buf is BOTTOM:
        buf = _empty(dtype)
    if counts is None:
        total = count_of(buf, dtype)
        if total % size:
            raise ArgumentError(1, f"{name} has {total} elements, not a multiple of {size} ranks")
        counts = total // size
    if isinstance(counts, (list, tuple)) or hasattr(counts, "__len__"):
        counts = [_int(c, "count") for c in counts]
    else:
        counts = [_int(counts, "count")] * size
    if isinstance(displs, (list, tuple)) or hasattr(displs, "__len__"):
        displs = [_int(d, "displacement") for d in displs]
    elif displs is not None:
        stride = _int(displs, "displacement")
        displs = [i * stride for i in range(size)]
    if len(counts) != size or (displs is not None and len(displs) != size):
        raise ArgumentError(1, f"{name}: {len(counts)} counts and "
                               f"{size if displs is None else len(displs)} displacements for "
                               f"{size} ranks")
    return buf, counts, displs, dtype


def _dtype_name(a: Optional[str], b: Optional[str]) -> Optional[str]:
    if a and b and a != b:
        raise TypeError(f"send datatype {a} differs from receive datatype {b}")
    return a or b
