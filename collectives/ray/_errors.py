"""A worker's failure, named: which rank, on which node, in which actor, and why.

Ray reports a failed call as a ``RayTaskError`` (the function raised) or a
``RayActorError`` (the actor's process died: killed, out of memory, its node
lost). When one rank of a world fails, the others fail too, with an echo of
it ("rank 2 closed the connection"): the executor names the rank that failed
first by its own doing, not an echo.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

__all__ = ["WorkerError", "describe_failure", "is_death", "is_echo"]

# Texts of a rank's error that only repeat another's failure (as collectives/rendezvous/world.py
# tells them apart when it explains a failure).
_ECHOES = ("closed the connection", "connection to rank", "timed out", "is broken",
           "failed and broke the communicator", "cannot connect to rank",
           "did not answer within", "reported nothing")


class WorkerError(RuntimeError):
    """A worker of a RayExecutor failed: the rank, node and actor that did, and why.

    Attributes:
        rank: the rank that failed (first by its own doing, not as an echo of another).
        node_ip: the address of its Ray node.
        node_id: its Ray node id.
        actor_id: its Ray actor id.
        pid: its process id.
        died: True when the actor's process died (killed, crashed, node lost), False
            when the function raised.
        cause: the worker's error as text.
        errors: every rank that failed in the same run -> its error as text.
        dead: the ranks whose actors are lost (died, or still running after the grace).
    """

    def __init__(self, rank: int, where: Dict[str, Any], died: bool, cause: str,
                 errors: Optional[Dict[int, str]] = None) -> None:
        self.rank = rank
        self.node_ip = where.get("node_ip", "?")
        self.node_id = where.get("node_id", "?")
        self.actor_id = where.get("actor_id", "?")
        self.pid = where.get("pid", "?")
        self.died = died
        self.cause = cause
        self.errors = dict(errors or {})
        self.dead: list = []  # ranks whose actors are lost (died, or stuck and killed)
        others = sorted(r for r in self.errors if r != rank)
        what = "died" if died else "raised"
        text = (f"rank {rank} (Ray actor {self.actor_id}, node {self.node_ip} "
                f"[{str(self.node_id)[:12]}], pid {self.pid}) {what}: {cause}")
        if others:
            text += f" (ranks {', '.join(map(str, others))} failed after it)"
        super().__init__(text)


def is_death(exc: BaseException) -> bool:
    """True when exc says the actor's process is gone (not that its function raised)."""
    import ray.exceptions as rex

    return isinstance(exc, (rex.RayActorError, rex.WorkerCrashedError)) and \
        not isinstance(exc, rex.RayTaskError)


def describe_failure(exc: BaseException, limit: int = 2000) -> str:
    """The worker's own error as one text: the function's exception (type: message) for
    a RayTaskError, Ray's account of the death otherwise; at most `limit` characters."""
    import ray.exceptions as rex

    if isinstance(exc, rex.RayTaskError) and getattr(exc, "cause", None) is not None:
        cause = exc.cause
        text = f"{type(cause).__name__}: {cause}"
    else:
        text = f"{type(exc).__name__}: {exc}"
        limit = min(limit, 600)  # Ray's account of a death runs long; its start says it
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def is_echo(text: str) -> bool:
    """True when an error text only repeats another rank's failure."""
    return any(echo in text for echo in _ECHOES)
