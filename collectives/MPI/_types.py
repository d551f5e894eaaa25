"""collectives.MPI's vocabulary: constants, ops, datatypes, Status, IN_PLACE and the
buffer-spec helpers, shared by __init__.py (the Comm), _request.py and _extras.py.
Every public name here is re-exported by ``collectives.MPI``.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Optional

from .. import _core
from .._core import CollectivesError, _mpi_register, not_a_buffer

ANY_SOURCE = _core.ANY_SOURCE  # a receive's source: any rank
ANY_TAG = _core.ANY_TAG        # a receive's tag: any tag
PROC_NULL = _core.PROC_NULL    # a peer that is not there: sends and receives complete at once
TAG_UB = _core.TAG_MAX         # the largest tag
UNDEFINED = -32766             # mpi4py's value: no index (Waitany), no whole count (Get_count)

class ArgumentError(CollectivesError, ValueError):
    """An argument the call refused before sending anything (a rank, tag or root out of
    range, counts that do not fit): an ``MPI.Exception``, as mpi4py raises for them, and
    a ``ValueError``, as Python code expects; ``Get_error_code()`` is 1 (invalid argument)."""


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


_ITEMSIZE = {"int8": 1, "uint8": 1, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2,
             "float32": 4, "float64": 8}


class Status:
    """What a receive got (mpi4py's Status): its source, tag and size."""

    def __init__(self) -> None:
        self.source = ANY_SOURCE
        self.tag = ANY_TAG
        self.error = 0
        self._nbytes = 0

    def Get_source(self) -> int:
        """The rank the message came from."""
        return self.source

    def Get_tag(self) -> int:
        """The message's tag."""
        return self.tag

    def Get_error(self) -> int:
        """0: the receive succeeded (a failed one raises instead)."""
        return self.error

    def Get_count(self, datatype: "Datatype" = None) -> int:
        """Elements of `datatype` (default BYTE) received; UNDEFINED if not a whole number."""
        size = _ITEMSIZE[(datatype or BYTE).dtype]
        return self._nbytes // size if self._nbytes % size == 0 else UNDEFINED

    def Get_elements(self, datatype: "Datatype") -> int:
        """Same as Get_count(datatype) (no derived datatypes here)."""
        return self.Get_count(datatype)

    def Set_source(self, source: int) -> None:
        """Set the source (mpi4py name)."""
        self.source = source

    def Set_tag(self, tag: int) -> None:
        """Set the tag (mpi4py name)."""
        self.tag = tag

    @property
    def count(self) -> int:
        """Bytes received."""
        return self._nbytes

    def _fill(self, outcome: Optional[tuple]) -> None:
        if outcome is not None:
            self.source, self.tag, self._nbytes = outcome[0], outcome[1], outcome[4]

    def __repr__(self) -> str:
        return f"<collectives.MPI.Status source={self.source} tag={self.tag} bytes={self._nbytes}>"


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
        raise ValueError("a v-buffer is [buf, counts] or [buf, counts, displs]")
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
        raise ValueError(f"{len(counts)} counts for {size} ranks")
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
