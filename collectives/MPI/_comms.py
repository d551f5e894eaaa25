"""Communicator construction for collectives.MPI: Comm.Split, Comm.Dup, Comm.Free, COMM_NULL.

A split or dup communicator is a ``_core.SubCommunicator``: it shares the links of the
world communicator (no new sockets), carries its own context id in every message header, and
every method of ``MPI.Comm`` (buffer, pickle, point-to-point, rooted) works on it with its
own rank numbering. Calls on a communicator and on those made from it are serialized, as MPI
programs issue them (the same order on every rank).
"""
from typing import Any, Optional

from .. import _core
from ._types import ERR_COMM as _ERR_COMM


class _CommNull:
    """mpi4py's MPI.COMM_NULL: what Split returns for color UNDEFINED. It is false, equals
    only itself, and every communicator method on it raises MPI.Exception."""

    def __bool__(self) -> bool:
        return False

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, _CommNull):
            return True
        core = getattr(other, "_core", None)  # a freed communicator is COMM_NULL
        return core is not None and core.closed

    def __ne__(self, other: Any) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return 0

    def __reduce__(self) -> Any:
        return "COMM_NULL" if self is COMM_NULL else (_CommNull, ())

    def __repr__(self) -> str:
        return "<collectives.MPI.COMM_NULL>"

    def Get_name(self) -> str:
        """MPI's name for the null communicator."""
        return "MPI_COMM_NULL"

    @property
    def name(self) -> str:
        """Get_name() as a property."""
        return "MPI_COMM_NULL"

    def Free(self) -> None:
        """Freeing COMM_NULL is an error in MPI."""
        raise _core.CollectivesError(2, "Free: invalid communicator MPI.COMM_NULL", _ERR_COMM)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise _core.CollectivesError(2, f"{name}: invalid communicator MPI.COMM_NULL", _ERR_COMM)


COMM_NULL = _CommNull()


def _core_of(comm: Any) -> Any:
    core = getattr(comm, "_core", None)
    if core is None or core.closed:
        raise _core.CollectivesError(2, "the communicator is freed")
    return core


def split(comm: Any, color: int = 0, key: int = 0) -> Any:
    """Comm.Split(color, key): collective over comm; ranks with the same color form a new
    communicator ranked by key, then by rank in comm. Color MPI.UNDEFINED gives COMM_NULL."""
    core = _core_of(comm)
    if key is None:  # the core's default (rank order) is not mpi4py's
        raise TypeError("key must be an int, not NoneType")
    sub = _core.comm_split(core, color, key)
    if sub is None:
        return COMM_NULL
    return _wrap(comm, sub)


def dup(comm: Any) -> Any:
    """Comm.Dup(): the same ranks in the same order, a separate context (collective)."""
    return _wrap(comm, _core.comm_dup(_core_of(comm)))


def _wrap(comm: Any, sub: Any) -> Any:
    # Ranks of the new communicator on this host (Comm.local_rank/local_size): all of them
    # when the parent's are; else from the host names of its members (a collective on sub).
    if comm._local_size == comm.size:
        return type(comm)._from_core(sub, sub.rank, sub.size)
    import socket

    from . import _objects

    hosts = _objects.allgather(sub, socket.gethostname())
    mine = [r for r, h in enumerate(hosts) if h == hosts[sub.rank]]
    return type(comm)._from_core(sub, mine.index(sub.rank), len(mine))


def free(comm: Any) -> None:
    """Comm.Free(): release this communicator. On one made by Split/Dup: what it owns, not the
    links it shares; refused (MPI.Exception) while communicators made from it are alive.
    On the world communicator: closes its links (see collectives.finalize)."""
    core = _core_of(comm)
    if isinstance(core, _core.SubCommunicator):
        try:
            _core.comm_free(core)
        except _core.CollectivesError as exc:
            raise _core.CollectivesError(2, str(exc)) from None
    else:
        core.close()


def world_rank(comm: Any, rank: Optional[int] = None) -> int:
    """The world rank of comm's rank `rank` (default: this process)."""
    core = _core_of(comm)
    return _core.comm_world_rank(core, core.rank if rank is None else rank)


def world_ranks(comm: Any) -> tuple:
    """(this process's world rank, the world ranks of comm's members or None for all)."""
    core = comm._core
    if core.closed or not isinstance(core, _core.SubCommunicator):
        return comm.rank, None
    return (_core.comm_world_rank(core, core.rank),
            [_core.comm_world_rank(core, i) for i in range(core.size)])
