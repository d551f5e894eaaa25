"""Which rank a failure began at, told to the launcher.

When rank 1 raises, its links close and rank 0's collective fails with "rank 0:
rank 1 closed the connection". Rank 0 may well exit first (rank 1 is still
tearing torch or JAX down), so the order of exits does not say where the
failure began; the ranks' errors do. Under ``collectives-run`` every local rank
gets ``COLLECTIVES_FAILURE_DIR``; at exit a rank whose error was an echo of a
peer's failure (a closed connection, a lost link, an abort notice, a wait that
timed out on a peer) writes that peer's rank to ``<dir>/<its rank>``. A rank
that failed by itself writes nothing. The launcher reads the file of the first
rank to exit with an error and, when it names another rank, waits a moment for
that rank's own exit before it names the rank where the failure began
(collectives/launcher/cli.py).

The error is read from the exception that ended the script (``sys.last_value``,
with its causes) or else from the failures the front ends noted (:func:`note`).
"""
from __future__ import annotations

import atexit
import os
import re
import sys
from typing import Optional

__all__ = ["DIR_VAR", "origin_in", "note", "read_report"]

DIR_VAR = "COLLECTIVES_FAILURE_DIR"

# The core's words for a failure seen at a peer (native/transport, native/schedule):
# each names the peer it echoes. An abort notice carries the sender's own error in
# parentheses, so the last match in a text is the deepest cause.
_ECHO = re.compile(r"rank \d+: (?:rank (\d+) closed the connection"
                   r"|connection to rank (\d+) lost"
                   r"|rank (\d+) failed and broke the communicator"
                   r"|cannot connect to rank (\d+)"
                   r"|.{0,80}? timed out after [0-9.]+ s waiting for rank (\d+))")
# What rendezvous.world.explain_failure appends: a rank whose report is no echo.
_REPORTED = re.compile(r"rank (\d+) reported: ")

_noted: list = []  # failure texts the front ends saw (note), first first


def origin_in(text: str) -> Optional[int]:
    """The rank a failure's text says it began at, or None when the text is no echo."""
    m = _REPORTED.search(text)
    if m:
        return int(m.group(1))
    found = None
    for m in _ECHO.finditer(text):
        found = int(next(g for g in m.groups() if g is not None))
    return found


def _exception_text(exc: BaseException) -> str:
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return "\n".join(parts)


def _origin_at_exit() -> Optional[int]:
    exc = getattr(sys, "last_value", None)
    texts = ([_exception_text(exc)] if exc is not None else []) + _noted
    for text in texts:
        origin = origin_in(text)
        if origin is not None:
            return origin
    return None


def _report() -> None:
    directory = os.environ.get(DIR_VAR)
    rank = os.environ.get("COLLECTIVES_RANK", "").strip()
    if not directory or not rank.isdigit():
        return
    origin = _origin_at_exit()
    if origin is None or origin == int(rank):
        return
    path = os.path.join(directory, rank)
    try:
        with open(path + ".tmp", "w") as fh:
            fh.write(f"{origin}\n")
        os.replace(path + ".tmp", path)  # the launcher never reads half a file
    except OSError:
        pass


def note(text: str) -> None:
    """Remember a failure this process's communicator reported (a script may catch the
    exception and exit with sys.exit(1): its text is still read at exit)."""
    if os.environ.get(DIR_VAR) and len(_noted) < 8:
        _noted.append(text)


def read_report(directory: str, rank: int) -> Optional[int]:
    """The rank that rank `rank` named as where its failure began, or None."""
    try:
        with open(os.path.join(directory, str(rank))) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


if os.environ.get(DIR_VAR):
    atexit.register(_report)
