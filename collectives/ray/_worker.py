"""What runs inside each Ray actor of a RayExecutor: the world's rank, and what a run sees.

The executor makes one actor per rank of this class (``ray.remote(Worker)``),
tells each where it sits (rank, size, local rank, the store's address, the job
secret) and has every one join the world through the project's own rendezvous
(``collectives.init()``: rank 0's actor hosts the store). A function the
executor runs calls ``collectives.init()`` / ``hvd.init()`` /
``MPI.COMM_WORLD`` as it would under ``collectives-run`` and finds that world.

Nothing here imports Ray at module level: the actor process has it, and
``import collectives.ray`` must work without it.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

__all__ = ["RayContext", "context", "Worker", "RemoteError"]

# What the executor sets in an actor before the world forms; cleared between worlds so
# that nothing of the last one (its store, its rank) leaks into the next.
_RENDEZVOUS_VARS = ("COLLECTIVES_RANK", "COLLECTIVES_SIZE", "COLLECTIVES_LOCAL_RANK",
                    "COLLECTIVES_LOCAL_SIZE", "COLLECTIVES_STORE_ADDR")


@dataclass
class RayContext:
    """Where a function run by a RayExecutor stands, read in the worker with ``context()``.

    Attributes:
        rank: this worker's rank in the current world.
        size: the number of workers in the current world.
        world: how many worlds this executor has formed (1, then +1 at every elastic
            re-form); the same on every worker of a world.
        new: True on an actor started for this world (a replacement or an added worker);
            False on one that was in the last world too.
        state: a dict kept by this actor across re-forms (empty on a new actor): what a
            function commits there survives the loss of other workers, and since the
            survivors take the lowest ranks, rank 0 holds it whenever any worker survived.
    """

    rank: int = 0
    size: int = 1
    world: int = 0
    new: bool = True
    state: Dict[str, Any] = field(default_factory=dict)


_context: Optional[RayContext] = None


def context() -> RayContext:
    """This worker's RayContext (only inside a function run by a RayExecutor).

    Raises:
        RuntimeError: called outside a RayExecutor's worker.
    """
    if _context is None:
        raise RuntimeError("collectives.ray.context() is only available inside a function "
                           "run by a collectives.ray.RayExecutor")
    return _context


def _close_world() -> None:
    """Leave the current world: Horovod's state (if collectives.torch was used) and the
    communicator with its store."""
    torch_mod = sys.modules.get("collectives.torch.basics")
    if torch_mod is not None:
        try:
            torch_mod.shutdown()
        except Exception:  # a broken world: its error was reported where it happened
            pass
    import collectives

    try:
        collectives.finalize()
    except Exception:
        pass


class RemoteError(RuntimeError):
    """A worker's exception that cannot travel to the driver as itself (it does not
    pickle, or unpickles as something else): its type's name and its message."""


def _portable(exc: BaseException) -> BaseException:
    """exc if the driver can rebuild it from a pickle, else a RemoteError saying it (the
    core's CollectivesError, among others, carries more than its message)."""
    import pickle

    try:
        back = pickle.loads(pickle.dumps(exc))
        if type(back) is type(exc) and str(back) == str(exc):
            return exc
    except Exception:  # noqa: BLE001 (any failure to round-trip)
        pass
    return RemoteError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")


class Worker:
    """One rank of a RayExecutor (the class behind each Ray actor; not used directly)."""

    def __init__(self) -> None:
        global _context
        _context = RayContext()
        self._executable: Any = None
        self._lock = threading.Lock()

    def describe(self) -> Dict[str, Any]:
        """Where this actor runs: node id and address, host name, pid, actor id."""
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "hostname": socket.gethostname(), "pid": os.getpid(),
                "actor_id": ctx.get_actor_id()}

    def store_port(self) -> int:
        """A port free on this node for the world's store (asked of the rank-0 actor)."""
        from collectives.launcher.cli import free_port

        return free_port()

    def join(self, env: Dict[str, str], rank: int, size: int, world: int,
             timeout: float, executable: Optional[tuple]) -> int:
        """Leave any previous world, take this world's settings and join it (collective:
        every actor of the world calls it at once); then make the executable if given.
        Returns the rank."""
        global _context
        from collectives.rendezvous import world as _world

        _close_world()
        for name in _RENDEZVOUS_VARS:
            os.environ.pop(name, None)
        os.environ.update(env)
        ctx = context()
        new = ctx.world == 0
        _context = RayContext(rank=rank, size=size, world=world, new=new, state=ctx.state)
        with _world._lock:
            # World g's store says "generation/g" and every rank must ask for the same g
            # (collectives/rendezvous/world.py): the executor's count, on new and old actors alike.
            _world._generation = world - 1
        import collectives

        collectives.init(timeout=timeout)
        if executable is not None and (self._executable is None or new):
            cls, args, kwargs = executable
            self._executable = cls(*(args or ()), **(kwargs or {}))
        return rank

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        """fn(executable) (the object start() made from executable_cls, or None)."""
        return self._guard(fn, (self._executable,), {})

    def run(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """fn(*args, **kwargs)."""
        return self._guard(fn, args, kwargs)

    def _guard(self, fn: Callable[..., Any], args: Any, kwargs: dict) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            # Close this rank's links at once: a peer waiting on it in a collective then
            # fails naming it now, not at its timeout (as collectives-run stops a job).
            _close_world()
            out = _portable(exc)
            if out is exc:
                raise
            raise out from None

    def leave(self) -> None:
        """Close the world communicator and its store (before the actor goes)."""
        _close_world()

    def exit_now(self, code: int = 1) -> None:
        """End this actor's process at once (tests: a worker lost without a word)."""
        os._exit(code)
