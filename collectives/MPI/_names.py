"""Module-level names of mpi4py.MPI that scripts (and mpi4py's own test helpers) read while
loading: the library's identity and version, thread levels, and the constants of calls
collectives.MPI has (COMM_TYPE_SHARED for Split_type, Compare's answers, INFO_NULL).
Re-exported by ``collectives.MPI``.
"""
from __future__ import annotations

import threading

THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
# Compare's answers
IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3
COMM_TYPE_SHARED = 1  # Split_type: the ranks of one host
KEYVAL_INVALID = -1   # no attribute keys here,
APPNUM = KEYVAL_INVALID  # so no MPI_APPNUM either (mpi4py's value where a library has none)
MAX_PROCESSOR_NAME = 256
MAX_OBJECT_NAME = 64
VERSION, SUBVERSION = 3, 1


class _InfoNull:
    """MPI.INFO_NULL: no hints (the only info object here; hints are optional in MPI)."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<collectives.MPI.INFO_NULL>"

    def __reduce__(self) -> str:
        return "INFO_NULL"


INFO_NULL = _InfoNull()


def get_vendor() -> tuple:
    """("collectives", (major, minor, micro)): the library behind this MPI module."""
    from .. import __version__
    return "collectives", tuple(int(x) for x in (__version__.split(".") + ["0"] * 3)[:3])


def Get_version() -> tuple:
    """(3, 1): the MPI standard whose calls the subset follows (point-to-point, collectives
    and communicators of MPI 3.1; none of MPI 4's persistent or partitioned forms)."""
    return VERSION, SUBVERSION


def Get_library_version() -> str:
    """One line naming the library and its version."""
    name, version = get_vendor()
    return f"{name} {'.'.join(map(str, version))} (mpi4py's API over its own native core)"


def Query_thread() -> int:
    """THREAD_SERIALIZED: calls from several threads are safe but run one at a time per
    communicator (a blocking receive in one thread holds up a send in another)."""
    return THREAD_SERIALIZED


def Init_thread(required: int = THREAD_MULTIPLE) -> int:
    """Join the world (as Init) and return the thread level provided (THREAD_SERIALIZED)."""
    from . import Init
    Init()
    return THREAD_SERIALIZED


def Is_thread_main() -> bool:
    """True in the thread that imported collectives.MPI's first caller (the main thread)."""
    return threading.current_thread() is threading.main_thread()
