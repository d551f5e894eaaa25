"""The torch.distributed backend's errors, worded as torch's own backends word them.

A timed-out op raises the core's ``CollectivesError`` whose text starts
"rank 0: timed out ...". Scripts and PyTorch's own tests match gloo's text
instead (gloo: "... Timed out waiting 1000ms for recv operation to complete";
distributed_test.py: ``" (Timed out|closed|timeout) "``), so the backend
raises the same error (same class, same ``error_code``) with gloo's words in
front: "collectives backend: barrier: Timed out waiting 1000ms: rank 0: timed
out ...". Every other error passes through unchanged, except that errors which broke a
group's own communicator (backend.py: every group has one) are explained as
collectives.MPI explains its own (rendezvous/world.explain_failure): the rank
reports its error in the group's torch store and, when its own is only an echo
(a neighbour closed the connection, a wait timed out), puts in front what a
member reported that is no echo, or which members reported nothing (the one
that never called the op, or died); and a sub-group's errors (whose ranks are
the group's) end with the group's label naming their global ranks.
"""
from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, Optional

__all__ = ["worded", "wording_timeouts", "GroupNotes"]

# Seconds an echo's explanation waits for the members' reports (the store is rank 0's
# torch store; as rendezvous/world.py's REPORT_S and its one-second look).
_LOOK_S = 1.0


class GroupNotes:
    """What a group adds to the errors that broke its communicator.

    Args:
        core: the group's communicator (its ``broken`` says whether an error broke it).
        label: text after every error ("[torch group 3: ... global ranks 0,1,3]"), or "".
        store: the group's torch store (None: no reports), ns: its keys' prefix.
        rank, size: this rank in the group and the group's size.
        ranks: the global rank of each of the group's ranks, named in the causes (None:
            the same numbers).
    """

    def __init__(self, core: Any, label: str = "", store: Any = None, ns: str = "",
                 rank: int = 0, size: int = 1, ranks: Optional[list] = None) -> None:
        self.core, self.label, self.store, self.ns = core, label, store, ns
        self.rank, self.size, self.ranks = rank, size, ranks
        self._lock = threading.Lock()
        self._explained = False
        self._cause = ""

    def explain(self, text: str) -> str:
        """text, with the cause the other members reported in front when text is an echo
        (the first failure only: later ones repeat the cause found then). Bounded by
        about _LOOK_S; a store that fails to answer leaves text as it is."""
        from collectives.rendezvous.world import _ECHOES
        if self.store is None or not getattr(self.core, "broken", False):
            return text
        with self._lock:
            if not self._explained:
                self._explained = True
                try:
                    self._cause = self._look(text, _ECHOES)
                except Exception:  # the store is gone or slow: the text as it is
                    self._cause = ""
            cause = self._cause
        if not cause or cause in text:
            return text
        own = f"rank {self.rank}: "
        return own + cause + "; " + (text[len(own):] if text.startswith(own) else text)

    def _look(self, text: str, echoes: tuple) -> str:
        self.store.set(f"{self.ns}failed/{self.rank}", text.encode())
        if not any(echo in text for echo in echoes):
            return ""
        deadline = time.monotonic() + _LOOK_S
        while True:
            silent = []
            for peer in range(self.size):
                if peer == self.rank:
                    continue
                key = f"{self.ns}failed/{peer}"
                if not self.store.check([key]):
                    silent.append(peer)
                    continue
                theirs = bytes(self.store.get(key)).decode("utf-8", "replace")
                if not any(echo in theirs for echo in echoes):
                    return f"rank {self._named(peer)} reported: {theirs}"
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if not silent:
            return ""
        return (f"rank {', '.join(map(self._named, silent))} reported no error: it did not "
                f"call this op, or exited, was killed or is stuck")

    def _named(self, peer: int) -> str:
        """'2 (global rank 3)' for a sub-group's rank 2, '2' where the numbers agree."""
        if self.ranks is None or self.ranks[peer] == peer:
            return str(peer)
        return f"{peer} (global rank {self.ranks[peer]})"


def _timeout_code() -> int:
    from collectives import _core
    return {name: code for code, name in _core.ERR_NAMES.items()}["TIMEOUT"]


def worded(exc: BaseException, what: str, secs: Optional[float],
           notes: Optional[GroupNotes] = None) -> BaseException:
    """exc, or for a core timeout the same error with gloo's wording in front of its text,
    and for a core error of a group with notes the same error explained and labelled
    (GroupNotes).

    Args:
        exc: the error an op raised.
        what: the op ("barrier", "recv from rank 1").
        secs: the deadline the op had in seconds (None: the core's default).
        notes: the group's GroupNotes, or None.
    """
    from collectives._core import CollectivesError
    if not isinstance(exc, CollectivesError):
        return exc
    text = str(exc)
    label = ""
    if notes is not None:
        text = notes.explain(text)
        label = notes.label
    timed_out = exc.error_code == _timeout_code() and " Timed out " not in text
    labelled = bool(label) and label not in text
    if not timed_out and not labelled and text == str(exc):
        return exc
    if timed_out:
        waited = f"waiting {secs * 1000:.0f}ms" if secs is not None else \
            "waiting the core's timeout (COLLECTIVES_TIMEOUT)"
        text = f"collectives backend: {what}: Timed out {waited}: {text}"
    if labelled:
        text = f"{text} {label}"
    new = CollectivesError(exc.error_code, text)
    new.__cause__ = exc
    return new


def wording_timeouts(method: Callable, what: str) -> Callable:
    """method (of a ProcessGroupCollectives) raising its timeouts worded as gloo's."""
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            new = worded(exc, what, getattr(self, "_timeout", None), getattr(self, "_notes", None))
            if new is exc:
                raise
            raise new from exc
    return call
