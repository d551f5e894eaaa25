"""Horovod's process sets over the core's subcommunicators.

A process set is a subset of the world's ranks that runs collectives of its
own. Registering one (``add_process_set`` after ``init``, or
``init(process_sets=[...])``) is collective over every rank, as in Horovod:
every rank checks that all passed the same ranks (an agreement on the world),
then Horovod's communicator (over the world's ranks, on links of its own:
see _context) is split (``_core.comm_split``), so the set's communicator
reuses those links: no socket is opened. Every rank of the
world numbers sets alike (ids 1, 2, ... in registration order; 0 is the
global set).

Each registered set the rank belongs to gets a ``SetContext``: the same
shape as the world's ``TorchContext`` (core, rank, size, agreement, async
lane), over the set's communicator. An operation called with
``process_set=ps`` runs with that context active (``in_process_set``), so the
whole op, its per-call agreement, its async job on the lane and its backward
pass use the set's communicator and the set's ranks, while ``root_rank``
stays a global rank, as in Horovod (``set_root`` translates it). On a rank
outside the set the call raises ValueError before anything is sent.

Ordering: as for the world, every rank issues the collectives of each
communicator in the same order, and a rank in two sets issues them in one
program order that its peers in each set follow (the communicators share
links, see native/comm/subcomm.c); disjoint sets run concurrently.

Dynamic sets (``add_process_set``/``remove_process_set`` after init) need
``HOROVOD_DYNAMIC_PROCESS_SETS=1`` or ``init(process_sets="dynamic")``, as in
Horovod; otherwise ValueError naming the variable. A set built from an MPI
communicator (``ProcessSet(comm)``) is refused (NotImplementedError): build it
from a list of ranks.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
from typing import Any, Callable, Iterator, Optional

from .._core import check_root
from ._context import ACTIVE, HOLDER, TorchContext, current

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
           "check_process_set", "process_set_by_id", "process_sets", "in_process_set",
           "keeps_process_set", "set_root", "SetContext"]

DYNAMIC_ENV = "HOROVOD_DYNAMIC_PROCESS_SETS"


class ProcessSet:
    """A set of ranks an operation runs over (Horovod's ``hvd.ProcessSet``).

    Args:
        ranks_or_comm: the world ranks (any order; kept sorted), or an MPI communicator
            (refused when registered: build sets from ranks).
    """

    def __init__(self, ranks_or_comm: Any) -> None:
        self.process_set_id: Optional[int] = None
        self.mpi_comm: Any = None
        self.ranks: Optional[list] = None
        if isinstance(ranks_or_comm, (list, tuple, range, set, frozenset)):
            ranks = list(ranks_or_comm)
            if any(isinstance(r, bool) or not isinstance(r, int) for r in ranks):
                raise ValueError("ProcessSet should be initialized with a list of process "
                                 f"ranks or a communicator, got {ranks_or_comm!r}")
            self.ranks = sorted(ranks)
        else:
            self.mpi_comm = ranks_or_comm

    def _is_global(self) -> bool:
        return self.process_set_id == 0

    def _entry(self) -> Optional["_Entry"]:
        ctx = HOLDER.context
        if ctx is None or self.process_set_id is None:
            return None
        return ctx.process_sets.get(self.process_set_id)

    def size(self) -> Optional[int]:
        """Number of ranks in the set; None while it is not registered."""
        if self._is_global():
            return current().size if HOLDER.context is not None else None
        entry = self._entry()
        return None if entry is None else len(entry.ranks)

    def rank(self) -> Optional[int]:
        """This process's rank within the set (-1 if it is not a member); None while the
        set is not registered. Operations still take global ranks (root_rank)."""
        if self._is_global():
            return current().rank if HOLDER.context is not None else None
        entry = self._entry()
        if entry is None:
            return None
        return entry.view.rank if entry.view is not None else -1

    def included(self) -> Optional[bool]:
        """Whether this process belongs to the set; None while it is not registered."""
        if self._is_global():
            return True if HOLDER.context is not None else None
        entry = self._entry()
        return None if entry is None else entry.view is not None

    def __repr__(self) -> str:
        if self._is_global():
            return "ProcessSet(process_set_id=0, global)"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


class SetContext:
    """What an operation on a process set runs with: the set's communicator and ranks, in
    the shape of the world's TorchContext (whose async lane and lock it shares).

    Args:
        parent: the world's TorchContext.
        process_set_id: the set's id.
        ranks: the set's world ranks, sorted.
        core: the set's ``_core.SubCommunicator`` (this rank is a member).
    """

    def __init__(self, parent: TorchContext, process_set_id: int, ranks: list, core: Any
                 ) -> None:
        from ..MPI import _comms as _mpi_comms
        from ._agree import Agreement
        self.parent = parent
        self.process_set_id = process_set_id
        self.ranks = ranks
        self.core = core
        self.rank: int = core.rank
        self.size: int = core.size
        self.world_rank: int = parent.rank
        self.comm = _mpi_comms._wrap(parent.comm, core)
        self.local_rank: int = self.comm.local_rank
        self.local_size: int = self.comm.local_size
        self.fusion_threshold = parent.fusion_threshold
        self.lock = parent.lock
        self.lane = parent.lane  # one negotiation: keys carry the set's id (see _lane.op_key)
        self.agreement = Agreement(core, self.rank, self.size)
        self.agreement.timeline = parent.timeline

    @property
    def timeline(self) -> Any:
        """The world context's timeline (one file per job)."""
        return self.parent.timeline

    def check_now(self, key: Any, what: str) -> None:
        """As TorchContext.check_now, over the set's ranks."""
        TorchContext.check_now(self, key, what)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"<process set {self.process_set_id} ranks={self.ranks}>"


class _Entry:
    """A registered set as every rank knows it: its ranks, the ProcessSet objects naming
    it, and this rank's SetContext (None on a rank outside it)."""

    def __init__(self, ranks: list, view: Optional[SetContext]) -> None:
        self.ranks = ranks
        self.view = view
        self.objects: list = []


# ------------------------------------------------------------ the active set

@contextlib.contextmanager
def _active(view: Optional[SetContext]) -> Iterator[None]:
    before = ACTIVE.view
    ACTIVE.view = view
    try:
        yield
    finally:
        ACTIVE.view = before


def _resolve(process_set: Any) -> Any:
    """The SetContext an operation on `process_set` runs with (None: the world; the
    string "inherit" for None: whatever is active, so the ops an op calls stay in its set).
    TypeError/ValueError for what cannot be used, before anything is sent."""
    if process_set is None:
        return "inherit"
    if process_set is global_process_set:
        return None
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a collectives.torch.ProcessSet, got "
                        f"{type(process_set).__name__}")
    ctx = current_world()
    if process_set.process_set_id == 0:
        return None
    if process_set.process_set_id is None:
        if process_set.ranks == list(range(ctx.size)):
            return None  # a set of every rank is the global set (not registered: Horovod's own)
        raise ValueError(f"{process_set!r} is not registered: pass it to hvd.init(process_sets="
                         "[...]) or hvd.add_process_set() on every rank first")
    entry = ctx.process_sets.get(process_set.process_set_id)
    if entry is None:
        raise ValueError(f"process set {process_set.process_set_id} is not registered "
                         "(it was removed)")
    if entry.view is None:
        raise ValueError(f"rank {ctx.rank} is not in process set {process_set.process_set_id} "
                         f"(ranks {entry.ranks}): only its members may call operations on it")
    return entry.view


def current_world() -> TorchContext:
    """The world's context (ValueError before init), whatever set is active."""
    ctx = HOLDER.context
    if ctx is None:
        current()  # raises Horovod's "not initialized" ValueError
    return ctx  # type: ignore[return-value]


def in_process_set(fn: Callable) -> Callable:
    """Decorator: run `fn` with the context of its `process_set` argument active (checked
    first: ValueError on a rank outside the set, before anything is sent)."""
    params = list(inspect.signature(fn).parameters)
    index = params.index("process_set")

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        ps = kwargs.get("process_set") if len(args) <= index else args[index]
        if ps is None:  # the set active now ("inherit": most calls, so not via _resolve)
            return fn(*args, **kwargs)
        with _active(_resolve(ps)):
            return fn(*args, **kwargs)

    return call


def bind_active(fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn` to run later (on the async lane) with the set active now active then."""
    view = ACTIVE.view
    if view is None:
        return fn

    def run() -> Any:
        with _active(view):
            return fn()

    return run


def keeps_process_set(cls: type) -> type:
    """Class decorator for an autograd Function: its backward runs in the process set
    its forward ran in (the gradient's collectives go over the same ranks)."""
    forward, backward = cls.forward, cls.backward

    @functools.wraps(forward)
    def fwd(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        ctx.process_set_view = ACTIVE.view
        return forward(ctx, *args, **kwargs)

    @functools.wraps(backward)
    def bwd(ctx: Any, *grads: Any) -> Any:
        with _active(getattr(ctx, "process_set_view", None)):
            return backward(ctx, *grads)

    cls.forward = staticmethod(fwd)  # type: ignore[assignment]
    cls.backward = staticmethod(bwd)  # type: ignore[assignment]
    return cls


def set_root(ctx: Any, root_rank: Any) -> int:
    """A global root rank as a rank of ctx's communicator (ValueError if it is not a
    member of the active set); Horovod's ops take global ranks even on a process set."""
    if not isinstance(ctx, SetContext):
        return check_root(root_rank, ctx.size, "root_rank")
    root = check_root(root_rank, ctx.parent.size, "root_rank")
    if root not in ctx.ranks:
        raise ValueError(f"root_rank {root} is not in process set {ctx.process_set_id} "
                         f"(ranks {ctx.ranks})")
    return ctx.ranks.index(root)


def set_context(process_set: Any) -> Any:
    """The context an operation on `process_set` runs in now: the set's SetContext, or the
    world's TorchContext for the global set (ValueError if the set was removed)."""
    view = _resolve(process_set)
    if view == "inherit":
        return current()
    return current_world() if view is None else view


def check_process_set(process_set: Any) -> None:
    """TypeError/ValueError for a process_set an operation cannot use; RuntimeError if the
    operation runs outside that set's context (a call path missing in_process_set)."""
    view = _resolve(process_set)
    if view != "inherit" and view is not ACTIVE.view:
        raise RuntimeError(f"collectives.torch: internal error: an operation on {process_set!r} "
                           "is not running in its process set")


# ------------------------------------------------------------ registration

def _dynamic_allowed() -> bool:
    return os.environ.get(DYNAMIC_ENV, "").strip() not in ("", "0")


def _register(ctx: TorchContext, ranks: list, what: str) -> int:
    """Collective over every rank: agree on `ranks`, split the world, record the set (one
    negotiated op, see _negotiate)."""
    from ._lane import run_call

    return run_call(ctx, "add_process_set", None, lambda: _register_now(ctx, ranks, what))


def _register_now(ctx: TorchContext, ranks: list, what: str) -> int:
    try:
        _check_new_set(ctx, ranks, what)
    except Exception as e:  # every rank hears of it, so none waits in the agreement below
        if ctx.size > 1:
            ctx.agreement.fail(what, e)
        raise
    ctx.check_now(f"{what} ranks={ranks}", what)  # every rank the same set, or all raise
    from .. import _core

    member = ctx.rank in ranks
    sub = _core.comm_split(ctx.core, 0 if member else _core.UNDEFINED, ctx.rank)
    pid = ctx.next_process_set_id
    ctx.next_process_set_id += 1
    view = SetContext(ctx, pid, ranks, sub) if member else None
    ctx.process_sets[pid] = _Entry(ranks, view)
    return pid


def _check_new_set(ctx: TorchContext, ranks: list, what: str) -> None:
    if any(not 0 <= r < ctx.size for r in ranks) or len(set(ranks)) != len(ranks) or not ranks:
        raise ValueError(f"{what}: ranks {ranks} must be distinct ranks in [0, {ctx.size})")
    for pid, entry in ctx.process_sets.items():
        if entry.ranks == ranks:
            raise ValueError(f"{what}: attempted to add a duplicate process set: {ranks} "
                             f"(process set {pid})")


def register_initial(ctx: TorchContext, sets: Any) -> None:
    """init(process_sets=...): "dynamic", or a list of ProcessSets/rank lists registered now
    in list order (every rank passes the same list)."""
    if sets is None:
        return
    if isinstance(sets, str):
        if sets.lower() != "dynamic":
            raise ValueError(f"process_sets must be a list of process sets or 'dynamic', "
                             f"got {sets!r}")
        os.environ[DYNAMIC_ENV] = "1"  # Horovod's own way of saying it
        return
    for ps in sets:
        ps = ps if isinstance(ps, ProcessSet) else ProcessSet(ps)
        if ps is global_process_set:
            continue
        _add(ctx, ps, "init(process_sets=...)")


def _add(ctx: TorchContext, ps: ProcessSet, what: str) -> ProcessSet:
    if ps.ranks is None:
        raise NotImplementedError(
            f"collectives.torch.{what}: a process set built from a communicator is not "
            "supported; build it from a list of ranks (hvd.ProcessSet([0, 2]))")
    if ps.process_set_id is not None:
        raise ValueError(f"{what}: {ps!r} is already registered")
    if ps.ranks == list(range(ctx.size)):
        return global_process_set  # every rank: the global set
    pid = _register(ctx, list(ps.ranks), what)
    ps.process_set_id = pid
    ctx.process_sets[pid].objects.append(ps)
    return ps


def add_process_set(process_set: Any) -> ProcessSet:
    """Register a process set after init (Horovod's); collective over every rank.

    Needs ``HOROVOD_DYNAMIC_PROCESS_SETS=1`` (or ``init(process_sets="dynamic")``).

    Args:
        process_set: a ProcessSet or a list of world ranks; every rank passes the same.

    Returns:
        The registered set (the global set for a set of every rank).
    """
    ctx = current_world()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.ranks is not None and ps.ranks != list(range(ctx.size)) and not _dynamic_allowed():
        raise ValueError(f"Set process sets dynamically only with {DYNAMIC_ENV}=1 (or "
                         "hvd.init(process_sets='dynamic'))")
    return _add(ctx, ps, "add_process_set")


def remove_process_set(process_set: Any) -> bool:
    """Unregister a process set (Horovod's); collective over every rank.

    Args:
        process_set: a registered ProcessSet.

    Returns:
        True once removed (every ProcessSet naming it is invalidated); False for the
        global set, which stays, or a set that is not registered.
    """
    ctx = current_world()
    pid = getattr(process_set, "process_set_id", None)
    if process_set is global_process_set or pid == 0:
        return False
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a collectives.torch.ProcessSet, got "
                        f"{type(process_set).__name__}")
    if not _dynamic_allowed():
        raise ValueError(f"Remove process sets dynamically only with {DYNAMIC_ENV}=1 (or "
                         "hvd.init(process_sets='dynamic'))")
    from ._lane import run_call

    return run_call(ctx, "remove_process_set", None, lambda: _remove_now(ctx, pid))


def _remove_now(ctx: TorchContext, pid: Optional[int]) -> bool:
    """remove_process_set on the negotiating thread (every rank at the same point)."""
    entry = ctx.process_sets.get(pid) if pid is not None else None
    ctx.check_now(f"remove_process_set id={pid if entry is not None else None}",
                  "remove_process_set")
    if entry is None:
        return False
    del ctx.process_sets[pid]
    for ps in entry.objects:
        ps.process_set_id = None
        ps.ranks = None
    if entry.view is not None:
        from .. import _core

        _core.comm_free(entry.view.core)
    return True


def process_set_by_id(process_set_id: int) -> ProcessSet:
    """The registered ProcessSet with this id (ValueError if none)."""
    if process_set_id == 0:
        return global_process_set
    entry = current_world().process_sets.get(process_set_id)
    if entry is None:
        raise ValueError(f"No known process set with id {process_set_id}")
    return entry.objects[0]


def process_sets() -> list:
    """The registered process sets, by id (the global set first)."""
    ctx = current_world()
    return [global_process_set] + [ctx.process_sets[i].objects[0]
                                   for i in sorted(ctx.process_sets)]
