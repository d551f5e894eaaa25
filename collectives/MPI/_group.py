"""collectives.MPI.Group: mpi4py's process groups, and the communicators made from them.

A group is an ordered set of processes, held as their world ranks (a group is local: no
call here sends a message). ``Comm.Get_group`` gives a communicator's; ``Comm.Create``
(every rank of the communicator calls it) and ``Comm.Create_group`` (only the group's
members call it) make a communicator over one, sharing the parent's links.
"""
from __future__ import annotations

import zlib
from typing import Any, Iterable, Optional, Sequence

from ._names import IDENT, SIMILAR, UNEQUAL
from ._types import PROC_NULL, UNDEFINED


class Group:
    """An ordered set of processes (mpi4py's Group), as world ranks."""

    def __init__(self, group: Optional["Group"] = None) -> None:
        # Group() is GROUP_NULL; Group(g) a second handle to g (mpi4py's constructors)
        self._members: Optional[tuple] = None if group is None else group._members
        self._me = -1 if group is None else group._me

    @classmethod
    def _of(cls, members: Iterable[int], me: int) -> "Group":
        g = cls()
        g._members = tuple(int(m) for m in members)
        g._me = me
        return g

    def _live(self) -> tuple:
        if self._members is None:
            from .._core import CollectivesError
            from ._types import ERR_GROUP
            raise CollectivesError(ERR_GROUP, "the group is GROUP_NULL (freed or never made)")
        return self._members

    def Get_size(self) -> int:
        """Number of processes in the group."""
        return len(self._live())

    def Get_rank(self) -> int:
        """This process's rank in the group (UNDEFINED if it is not a member)."""
        members = self._live()
        return members.index(self._me) if self._me in members else UNDEFINED

    @property
    def size(self) -> int:
        """Get_size() as a property."""
        return self.Get_size()

    @property
    def rank(self) -> int:
        """Get_rank() as a property."""
        return self.Get_rank()

    def Translate_ranks(self, ranks: Optional[Sequence[int]] = None,
                        group: Optional["Group"] = None) -> list:
        """The ranks in `group` of this group's `ranks` (default: all of them); UNDEFINED
        for a process not in `group`, PROC_NULL stays PROC_NULL. group None: the ranks
        of the group's processes in the world."""
        members = self._live()
        ranks = range(len(members)) if ranks is None else [int(r) for r in ranks]
        other = group._live() if group is not None else None
        out = []
        for r in ranks:
            if r == PROC_NULL:
                out.append(PROC_NULL)
                continue
            if not 0 <= r < len(members):
                raise ValueError(f"rank {r} out of range for a group of {len(members)}")
            w = members[r]
            out.append(w if other is None else other.index(w) if w in other else UNDEFINED)
        return out

    def Compare(self, group: "Group") -> int:
        """IDENT (same processes, same order), SIMILAR (same processes) or UNEQUAL."""
        a, b = self._live(), group._live()
        return IDENT if a == b else SIMILAR if sorted(a) == sorted(b) else UNEQUAL

    def Dup(self) -> "Group":
        """A new handle to the same group."""
        return Group._of(self._live(), self._me)

    def Incl(self, ranks: Sequence[int]) -> "Group":
        """The group of this group's `ranks`, in that order."""
        members = self._live()
        return Group._of((members[r] for r in self._checked(ranks)), self._me)

    def Excl(self, ranks: Sequence[int]) -> "Group":
        """This group without `ranks`, in the order left."""
        members, drop = self._live(), set(self._checked(ranks))
        return Group._of((m for i, m in enumerate(members) if i not in drop), self._me)

    def Range_incl(self, ranges: Sequence[tuple]) -> "Group":
        """Incl of the ranks of (first, last, stride) triplets."""
        return self.Incl(self._ranges(ranges))

    def Range_excl(self, ranges: Sequence[tuple]) -> "Group":
        """Excl of the ranks of (first, last, stride) triplets."""
        return self.Excl(self._ranges(ranges))

    def _checked(self, ranks: Sequence[int]) -> list:
        n, out = len(self._live()), [int(r) for r in ranks]
        if any(not 0 <= r < n for r in out) or len(set(out)) != len(out):
            raise ValueError(f"ranks {out} are out of range for a group of {n} or repeated")
        return out

    @staticmethod
    def _ranges(ranges: Sequence[tuple]) -> list:
        out = []
        for first, last, stride in ranges:
            if stride == 0:
                raise ValueError("a range's stride is 0")
            out.extend(range(first, last + (1 if stride > 0 else -1), stride))
        return out

    @staticmethod
    def Union(group1: "Group", group2: "Group") -> "Group":
        """group1's processes, then group2's that group1 lacks."""
        a, b = group1._live(), group2._live()
        return Group._of(a + tuple(m for m in b if m not in a), group1._me)

    @staticmethod
    def Intersection(group1: "Group", group2: "Group") -> "Group":
        """group1's processes that group2 has, in group1's order."""
        b = group2._live()
        return Group._of((m for m in group1._live() if m in b), group1._me)

    @staticmethod
    def Difference(group1: "Group", group2: "Group") -> "Group":
        """group1's processes that group2 lacks, in group1's order."""
        b = group2._live()
        return Group._of((m for m in group1._live() if m not in b), group1._me)

    def Free(self) -> None:
        """Release this handle: it becomes GROUP_NULL."""
        self._live()
        self._members = None

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Group):
            return NotImplemented
        return self._members == other._members

    def __ne__(self, other: Any) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self._members)

    def __bool__(self) -> bool:
        return self._members is not None

    def __repr__(self) -> str:
        return "<collectives.MPI.GROUP_NULL>" if self._members is None else \
            f"<collectives.MPI.Group of world ranks {list(self._members)}>"


GROUP_NULL = Group()
GROUP_EMPTY = Group._of((), -1)


def get_group(comm: Any) -> Group:
    """Comm.Get_group(): the communicator's processes in its rank order."""
    from . import _comms
    me, members = _comms.world_ranks(comm)
    return Group._of(range(comm.size) if members is None else members, me)


def _comm_ranks(comm: Any, group: Group) -> list:
    """The ranks in comm of group's processes (all must be in comm)."""
    mine = get_group(comm)._live()
    ranks = []
    for w in group._live():
        if w not in mine:
            raise ValueError(f"world rank {w} of the group is not in the communicator")
        ranks.append(mine.index(w))
    return ranks


def create(comm: Any, group: Group) -> Any:
    """Comm.Create(group): collective over comm; a communicator over group's processes in
    group's order on its members, COMM_NULL elsewhere (a Split)."""
    from ._comms import split
    ranks = _comm_ranks(comm, group)
    me = ranks.index(comm.rank) if comm.rank in ranks else -1
    return split(comm, 0 if me >= 0 else UNDEFINED, max(me, 0))


def create_group(comm: Any, group: Group, tag: int, made: dict) -> Any:
    """Comm.Create_group(group, tag): made by group's members alone, no message
    (_core.comm_create_group); COMM_NULL for a caller outside it. Members call it in the
    same order (MPI's rule), so the k-th call with the same ranks and tag is counted
    alike on each and goes into the core's context tag: live groups stay apart even
    with the default tag."""
    from .. import _core
    from ._comms import COMM_NULL, _core_of, _wrap
    ranks = _comm_ranks(comm, group)
    if comm.rank not in ranks:
        return COMM_NULL
    key = (tuple(ranks), int(tag))
    k = made[key] = made.get(key, -1) + 1
    sub = _core.comm_create_group(_core_of(comm), ranks,
                                  zlib.crc32(f"{tag}/{k}".encode()) & 0xffffffff)
    return _wrap(comm, sub)
