"""Horovod's process sets, as far as collectives has them: the global set only.

``hvd.global_process_set`` (every rank) is accepted wherever Horovod takes
``process_set=``. Other sets need communicators over a subset of ranks
(issue 19 section 1), which the core does not provide yet: building one with
``ProcessSet(ranks)`` works (it is a description), but registering it
(``add_process_set``, ``init(process_sets=...)``) or passing it to an
operation raises ``NotImplementedError`` naming it, before anything is sent.
"""
from __future__ import annotations

from typing import Any, Optional

from ._context import current

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
           "check_process_set"]


class ProcessSet:
    """A set of ranks an operation runs over (Horovod's ``hvd.ProcessSet``).

    Args:
        ranks_or_comm: the ranks (any order; kept sorted), or a communicator object.
    """

    def __init__(self, ranks_or_comm: Any) -> None:
        self.process_set_id: Optional[int] = None
        if isinstance(ranks_or_comm, (list, tuple, range)):
            self.ranks: Optional[list] = sorted(int(r) for r in ranks_or_comm)
            self.mpi_comm = None
        else:
            self.ranks = None
            self.mpi_comm = ranks_or_comm

    def _is_global(self) -> bool:
        return self.process_set_id == 0

    def size(self) -> int:
        """Number of ranks in the set."""
        if self._is_global():
            return current().size
        raise _not_supported(self)

    def rank(self) -> int:
        """This process's rank within the set."""
        if self._is_global():
            return current().rank
        raise _not_supported(self)

    def included(self) -> bool:
        """Whether this process belongs to the set."""
        if self._is_global():
            return True
        raise _not_supported(self)

    def __repr__(self) -> str:
        if self._is_global():
            return "ProcessSet(process_set_id=0, global)"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _not_supported(process_set: Any) -> NotImplementedError:
    return NotImplementedError(
        f"collectives.torch: {process_set!r} is not supported: only hvd.global_process_set "
        "(process sets over a subset of ranks need the core's subcommunicators, which "
        "collectives does not provide yet)")


def check_process_set(process_set: Any) -> None:
    """Accept None and the global set; NotImplementedError naming any other set,
    TypeError for what is not a process set."""
    if process_set is None or process_set is global_process_set:
        return
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a collectives.torch.ProcessSet, got "
                        f"{type(process_set).__name__}")
    if process_set.ranks is not None and process_set.process_set_id is None:
        try:
            if process_set.ranks == list(range(current().size)):
                return  # Horovod treats a set of every rank as the global one
        except ValueError:
            pass
    raise _not_supported(process_set)


def add_process_set(process_set: Any) -> ProcessSet:
    """Register a process set (Horovod's); only the set of every rank is supported.

    Args:
        process_set: a ProcessSet or a list of ranks.

    Returns:
        The registered set (the global set for a set of every rank).
    """
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    check_process_set(ps)
    return global_process_set


def remove_process_set(process_set: Any) -> bool:
    """Unregister a process set; the global set cannot be removed (False, as Horovod).

    Args:
        process_set: a ProcessSet.

    Returns:
        False (only the global set exists, and it stays).
    """
    if process_set is global_process_set or getattr(process_set, "process_set_id", None) == 0:
        return False
    raise _not_supported(process_set)
