"""collectives.MPI's vocabulary: constants, ops, datatypes, Status, IN_PLACE and the
buffer-spec helpers, shared by __init__.py (the Comm), _request.py and _extras.py.
Every public name here is re-exported by ``collectives.MPI``.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Optional

from .. import _core
from .._core import CollectivesError, _mpi_register

ANY_SOURCE = _core.ANY_SOURCE  # a receive's source: any rank
ANY_TAG = _core.ANY_TAG        # a receive's tag: any tag
PROC_NULL = _core.PROC_NULL    # a peer that is not there: sends and receives complete at once
TAG_UB = _core.TAG_MAX         # the largest tag
UNDEFINED = -32766             # mpi4py's value: no index (Waitany), no whole count (Get_count)

# MPI error classes (Exception.Get_error_class()). A failure of the core has its
# coll_result_t code as class (1 invalid argument = ERR_ARG, 2 invalid usage = ERR_OTHER,
# 6 internal = ERR_INTERN; 3 system, 4 remote, 5 timeout, 7 CUDA are classes of our own,
# below ERR_LASTCODE); the others are what the refusing call names.
SUCCESS, ERR_ARG, ERR_OTHER, ERR_INTERN = 0, 1, 2, 6
(ERR_BUFFER, ERR_COUNT, ERR_TYPE, ERR_TAG, ERR_COMM, ERR_RANK, ERR_REQUEST, ERR_ROOT,
 ERR_GROUP, ERR_OP, ERR_TRUNCATE, ERR_UNKNOWN, ERR_PENDING, ERR_IN_STATUS, ERR_INFO,
 ERR_KEYVAL, ERR_ERRHANDLER, ERR_WIN, ERR_SESSION, ERR_UNSUPPORTED_OPERATION,
 ERR_PROC_FAILED, ERR_NOT_SAME, ERR_TOPOLOGY, ERR_DIMS, ERR_NO_MEM,
 ERR_INFO_KEY, ERR_INFO_VALUE, ERR_INFO_NOKEY) = range(10, 38)
assert ERR_TYPE == _core.ERR_TYPE  # the core raises DatatypeError with this class
ERR_LASTCODE = 63


class ArgumentError(CollectivesError, ValueError):
    """An argument the call refused before sending anything (a rank, tag or root out of
    range, counts that do not fit): an ``MPI.Exception``, as mpi4py raises for them, and
    a ``ValueError``, as Python code expects; ``Get_error_code()`` is 1 (invalid argument)."""


class Op:
    """A reduction operation: a core op for buffers, a Python function for objects.

    ``MPI.Op()`` is a null op (false, equal to ``OP_NULL``). ``Op.Create(function,
    commute)`` makes a user op: ``function(inbuf, inoutbuf, datatype)`` combines into
    inoutbuf (datatype None for objects); buffer calls with it run in Python.
    """

    def __init__(self, name: Any = None, func: Optional[Callable[[Any, Any], Any]] = None,
                 commute: bool = True, user: Optional[Callable[..., Any]] = None) -> None:
        if isinstance(name, Op):  # Op(op): a second handle to op, equal to it
            name, func, commute, user = name.name, name._func, name._commute, name._user
        self.name = name
        self._func = func
        self._commute = commute
        self._user = user

    @classmethod
    def Create(cls, function: Callable[..., Any], commute: bool = False) -> "Op":
        """A user op from function(inbuf, inoutbuf, datatype) (mpi4py's Op.Create)."""
        if not callable(function):
            raise TypeError("Op.Create needs a callable function(inbuf, inoutbuf, datatype)")

        def combine(a: Any, b: Any) -> Any:
            out = function(a, b, None)
            return b if out is None else out

        return cls(None, combine, bool(commute), function)

    def Free(self) -> None:
        """Release a user op (predefined ops are refused, as in MPI)."""
        if self.is_predefined:
            raise CollectivesError(1, "Free: a predefined op cannot be freed", ERR_OP)
        self.name, self._func, self._user = None, None, None

    @property
    def is_predefined(self) -> bool:
        """True for SUM, PROD, ... and OP_NULL; False for Op.Create's ops."""
        return self._user is None

    @property
    def is_commutative(self) -> bool:
        """Whether op(a, b) == op(b, a) (every predefined op is)."""
        return self._commute

    def Is_commutative(self) -> bool:
        """Same as the is_commutative property."""
        return self._commute

    # Set by _extras (which works on buffers and imports this module, not the reverse).
    _reduce_local: Callable[..., None]

    def Reduce_local(self, inbuf: Any, inoutbuf: Any) -> None:
        """inoutbuf = op(inbuf, inoutbuf), element-wise, in this process."""
        Op._reduce_local(self, inbuf, inoutbuf)

    def __bool__(self) -> bool:
        return self._func is not None

    def __call__(self, a: Any, b: Any) -> Any:
        """Combine two Python objects (used by the lowercase collectives)."""
        if self._func is None:
            raise CollectivesError(1, "OP_NULL cannot combine objects", ERR_OP)
        return self._func(a, b)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Op):
            return NotImplemented
        return self._func is other._func  # handles of one op share its function

    def __hash__(self) -> int:
        return id(self._func)

    def __reduce__(self) -> Any:
        for name in _OP_NAMES:
            if globals()[name] is self:
                return name  # a predefined op pickles by name
            if globals()[name] == self:
                return (Op, (globals()[name],))  # a second handle to one
        raise ValueError("cannot pickle a user-defined MPI.Op")

    def __repr__(self) -> str:
        return f"<collectives.MPI.Op {(self.name or 'user' if self._func else 'NULL').upper()}>"


def _loc(better: Callable[[Any, Any], bool]) -> Callable[[Any, Any], Any]:
    """MINLOC/MAXLOC on (value, index) pairs: the pair with the better value; on a tie,
    the pair with the lower index (MPI's rule), whole: its value and index objects."""
    def combine(a: Any, b: Any) -> Any:
        (u, i), (v, j) = a, b
        if better(v, u):
            return (v, j)
        if better(u, v):
            return (u, i)
        return (u, i) if i <= j else (v, j)
    return combine


SUM = Op("sum", operator.add)
PROD = Op("prod", operator.mul)
MIN = Op("min", min)
MAX = Op("max", max)
AVG = Op("avg", lambda a, b: (a + b))  # buffers only: the core divides once at the end
# The ops below have no kernel in the core: they combine Python objects (and, through
# Reduce_local, buffers), and a buffer collective refuses them with ERR_OP.
MINLOC = Op(None, _loc(operator.lt))
MAXLOC = Op(None, _loc(operator.gt))
LAND = Op(None, lambda a, b: bool(a) and bool(b))
LOR = Op(None, lambda a, b: bool(a) or bool(b))
LXOR = Op(None, lambda a, b: bool(a) != bool(b))
BAND = Op(None, operator.and_)
BOR = Op(None, operator.or_)
BXOR = Op(None, operator.xor)
REPLACE = Op(None, lambda a, b: b)
NO_OP = Op(None, lambda a, b: a)
OP_NULL = Op()
_OP_NAMES = ("SUM", "PROD", "MIN", "MAX", "AVG", "MINLOC", "MAXLOC", "LAND", "LOR", "LXOR",
             "BAND", "BOR", "BXOR", "REPLACE", "NO_OP", "OP_NULL")


_ITEMSIZE = {"int8": 1, "uint8": 1, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2,
             "float32": 4, "float64": 8}


class Datatype:
    """An MPI datatype name mapped to the core's element type.

    The predefined types whose element the core carries (int8, uint8, int32, int64,
    float16, bfloat16, float32, float64) have their names; every other predefined name
    mpi4py has (SHORT, INT16_T, UNSIGNED_LONG, C_BOOL, LONG_DOUBLE, the complex types...)
    is ``DATATYPE_NULL``, as mpi4py gives for a type its MPI library lacks: a spec that
    names it raises ``MPI.Exception`` with ``ERR_TYPE``.
    """

    def __init__(self, name: str = "DATATYPE_NULL", dtype: Optional[str] = None,
                 typechar: str = "") -> None:
        self.name = name
        self.dtype = dtype
        self.typechar = typechar

    def _null_check(self, what: str) -> None:
        if self.dtype is None:
            raise CollectivesError(1, f"{what}: invalid datatype {self.name} (collectives "
                                      f"carries {', '.join(_ITEMSIZE)})", ERR_TYPE)

    def Get_size(self) -> int:
        """Bytes of one element (ERR_TYPE for DATATYPE_NULL)."""
        self._null_check("Get_size")
        return _ITEMSIZE[self.dtype]

    def Get_extent(self) -> tuple:
        """(lower bound, extent) in bytes: (0, size) for these basic types."""
        return 0, self.Get_size()

    @property
    def size(self) -> int:
        """Get_size() as a property."""
        return self.Get_size()

    @property
    def extent(self) -> int:
        """Get_extent()[1] as a property."""
        return self.Get_extent()[1]

    def Get_name(self) -> str:
        """MPI's name of the type ("MPI_INT")."""
        return "MPI_" + self.name if self.dtype else ""

    def Dup(self) -> "Datatype":
        """The same basic type (a new handle)."""
        self._null_check("Dup")
        return Datatype(self.name, self.dtype, self.typechar)

    def Free(self) -> None:
        """Predefined types cannot be freed (MPI's rule)."""
        raise CollectivesError(1, f"Free: predefined datatype {self.name}", ERR_TYPE)

    def __bool__(self) -> bool:
        return self.dtype is not None

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Datatype):
            return NotImplemented
        return self.dtype == other.dtype and (self.dtype is None or self.name == other.name)

    def __hash__(self) -> int:
        return hash((self.name, self.dtype))

    def __reduce__(self) -> Any:
        return (Datatype, (self.name, self.dtype, self.typechar))

    def __repr__(self) -> str:
        return f"<collectives.MPI.Datatype {self.name}>"


DATATYPE_NULL = Datatype()
BYTE = Datatype("BYTE", "uint8", "B")
CHAR = Datatype("CHAR", "int8", "c")
SIGNED_CHAR = Datatype("SIGNED_CHAR", "int8", "b")
UNSIGNED_CHAR = Datatype("UNSIGNED_CHAR", "uint8", "B")
INT8_T = Datatype("INT8_T", "int8", "b")
UINT8_T = Datatype("UINT8_T", "uint8", "B")
INT = Datatype("INT", "int32", "i")
INT32_T = Datatype("INT32_T", "int32", "i")
LONG = Datatype("LONG", "int64", "l")
LONG_LONG = Datatype("LONG_LONG", "int64", "q")
INT64_T = Datatype("INT64_T", "int64", "q")
FLOAT = Datatype("FLOAT", "float32", "f")
DOUBLE = Datatype("DOUBLE", "float64", "d")
FLOAT16_T = Datatype("FLOAT16_T", "float16", "e")
BFLOAT16_T = Datatype("BFLOAT16_T", "bfloat16", "")
FLOAT32_T = Datatype("FLOAT32_T", "float32", "f")
FLOAT64_T = Datatype("FLOAT64_T", "float64", "d")
# mpi4py's predefined names whose element the core does not carry: DATATYPE_NULL.
_NULL_TYPES = """SHORT UNSIGNED_SHORT UNSIGNED UNSIGNED_INT UNSIGNED_LONG UNSIGNED_LONG_LONG
    SIGNED_SHORT SIGNED_INT SIGNED_LONG SIGNED_LONG_LONG INT16_T UINT16_T UINT32_T UINT64_T
    LONG_DOUBLE WCHAR C_BOOL CXX_BOOL C_COMPLEX C_FLOAT_COMPLEX C_DOUBLE_COMPLEX
    C_LONG_DOUBLE_COMPLEX COMPLEX DOUBLE_COMPLEX PACKED AINT OFFSET COUNT SHORT_INT TWOINT
    INT_INT LONG_INT FLOAT_INT DOUBLE_INT LONG_DOUBLE_INT LOGICAL1 LOGICAL2 LOGICAL4 LOGICAL8
    LOGICAL16 INTEGER16 REAL2 COMPLEX4""".split()
# typecode (struct module / numpy char) -> datatype, for specs that name a type by letter
_TYPECHARS = {"b": INT8_T, "B": BYTE, "c": CHAR, "i": INT, "l": LONG, "q": LONG_LONG,
              "e": FLOAT16_T, "f": FLOAT, "d": DOUBLE}


def _datatype(spec: Any) -> Optional[str]:
    """The core dtype a spec's datatype names (a Datatype or a typecode string)."""
    if isinstance(spec, str):
        t = _TYPECHARS.get(spec)
        if t is None:
            raise CollectivesError(1, f"typecode {spec!r} names no element type collectives "
                                      f"carries ({', '.join(_ITEMSIZE)})", ERR_TYPE)
        return t.dtype
    spec._null_check("message")
    return spec.dtype


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


def _op(op: Any) -> str:
    """The core's name of an MPI.Op (TypeError for anything else, as mpi4py; MPI.Exception
    with ERR_OP for an op the core has no kernel for)."""
    if not isinstance(op, Op):
        raise TypeError(f"op must be an MPI.Op such as MPI.SUM, not {type(op).__name__}")
    if op.name is None:
        raise CollectivesError(1, f"{op!r} has no buffer kernel here (buffers take SUM, PROD, "
                                  f"MIN, MAX, AVG)", ERR_OP)
    return op.name
