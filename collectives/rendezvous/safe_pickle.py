"""What the object collectives may unpickle: everything from an authenticated job, plain
data from an unauthenticated one.

The lowercase collectives (``bcast``, ``allgather``, ``recv`` ... of
collectives.MPI, and ``hvd.broadcast_object`` over them) move pickles. In a
job with a secret every link proved it, so the bytes come from a rank of the
job and load as pickle loads them (as mpi4py does). Without a secret anyone
who can reach a rank's port can pose as a peer, and ``pickle.loads`` of their
bytes runs their code. There, objects load through :class:`PlainUnpickler`,
which builds only plain data: ``None``, numbers, strings, bytes, lists,
tuples, dicts, sets, the containers of ``collections``, dates, ``Decimal``,
``Fraction``, ``UUID``, numpy arrays and scalars of non-object dtypes, torch
tensors, sizes, dtypes and devices (their storage read back by
``torch.load(weights_only=True)``), and the classes a front end declared
plain with :func:`allow`. Anything else (a function, a class of the user's
own, ``os.system``) is refused with :class:`UnsafePickleError`, which says
how to give the job a secret. ``COLLECTIVES_PICKLE=any`` loads everything
anyway (the user's choice, for a private network), ``plain`` always
restricts.
"""
from __future__ import annotations

import io
import os
import pickle
import sys
from typing import Any

from . import auth as _auth

__all__ = ["loads", "allow", "restricted", "PlainUnpickler", "UnsafePickleError", "PICKLE_VAR"]

PICKLE_VAR = "COLLECTIVES_PICKLE"

# (module, name) pairs that build plain data and call nothing else.
_PLAIN = {
    ("builtins", n) for n in ("int", "float", "complex", "bool", "str", "bytes", "bytearray",
                              "list", "tuple", "dict", "set", "frozenset", "slice", "range",
                              "NoneType", "Ellipsis", "NotImplemented")
} | {
    ("collections", n) for n in ("OrderedDict", "deque", "Counter", "defaultdict")
} | {
    ("datetime", n) for n in ("date", "time", "datetime", "timedelta", "timezone")
} | {("decimal", "Decimal"), ("fractions", "Fraction"), ("uuid", "UUID")}

# numpy's reconstructors: they rebuild an array or scalar from a dtype and raw
# bytes; an object dtype is refused below, so no element is a pickle of its own.
_NUMPY = {"_reconstruct", "scalar", "_frombuffer", "ndarray", "dtype"}
_NUMPY_MODULES = {"numpy", "numpy.core.multiarray", "numpy._core.multiarray",
                  "numpy.core.numeric", "numpy._core.numeric"}

_allowed: set = set()


class UnsafePickleError(pickle.UnpicklingError):
    """An object that an unauthenticated job does not load (it could run code)."""


def allow(cls: type) -> type:
    """Declare cls plain: its instances hold data only (no __reduce__ or __setstate__
    that acts); returns cls, so it serves as a class decorator."""
    _allowed.add((cls.__module__, cls.__qualname__))
    return cls


def restricted() -> bool:
    """Whether this process loads peers' pickles as plain data only: no job secret (or
    COLLECTIVES_PICKLE=plain), unless COLLECTIVES_PICKLE=any."""
    mode = os.environ.get(PICKLE_VAR, "auto").strip().lower()
    if mode == "any":
        return False
    if mode == "plain":
        return True
    return not (os.environ.get(_auth.SECRET_VAR) or os.environ.get(_auth.SECRET_FILE_VAR))


def _refuse(what: str) -> UnsafePickleError:
    return UnsafePickleError(
        f"refused to unpickle {what} from a peer: this job has no secret, so the bytes "
        f"may come from anyone who can reach this rank, and loading them could run their "
        f"code. Plain data (numbers, strings, containers, numpy arrays, torch tensors) "
        f"still loads. Give every rank the same {_auth.SECRET_VAR} (or "
        f"{_auth.SECRET_FILE_VAR}); or, on a network only the job can reach, "
        f"{PICKLE_VAR}=any")


def _torch_load_storage(data: bytes) -> Any:
    """torch.storage._load_from_bytes, through torch's own weights-only unpickler."""
    import torch
    return torch.load(io.BytesIO(data), weights_only=True)


def _torch_global(name: str) -> Any:
    torch = sys.modules.get("torch")  # never imported here: a job that sends tensors has it
    if torch is None:
        raise _refuse(f"torch.{name} (torch is not imported)")
    value = getattr(torch, name, None)
    if isinstance(value, (torch.dtype, torch.device)) or value in (torch.Size, torch.device):
        return value
    raise _refuse(f"torch.{name}")


def _numpy_global(module: str, name: str) -> Any:
    import numpy
    target = numpy if module == "numpy" else sys.modules.get(module) or __import__(
        module, fromlist=[name])
    value = getattr(target, name)
    if name == "dtype":
        def plain_dtype(*args: Any, **kwargs: Any) -> Any:
            dt = numpy.dtype(*args, **kwargs)
            if dt.hasobject:
                raise _refuse("a numpy array of Python objects")
            return dt
        return plain_dtype
    return value


class PlainUnpickler(pickle.Unpickler):
    """An Unpickler that builds plain data only (see the module doc)."""

    def find_class(self, module: str, name: str) -> Any:
        """The global (module, name) if it builds plain data; else UnsafePickleError."""
        if (module, name) in _PLAIN:
            if name == "NoneType":
                return type(None)
            return getattr(sys.modules.get(module) or __import__(module), name)
        if (module, name) in _allowed:
            return getattr(sys.modules[module], name)
        if module in _NUMPY_MODULES and name in _NUMPY:
            return _numpy_global(module, name)
        if module == "torch":
            return _torch_global(name)
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_parameter"):
            return getattr(sys.modules["torch._utils"], name)
        if module == "torch.storage" and name == "_load_from_bytes":
            return _torch_load_storage
        raise _refuse(f"{module}.{name}")


def loads(data: bytes) -> Any:
    """The object pickled in data (bytes from a peer), restricted where restricted() says."""
    if not restricted():
        return pickle.loads(data)
    return PlainUnpickler(io.BytesIO(data)).load()
