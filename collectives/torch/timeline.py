"""Horovod's timeline: a Chrome-trace JSON of every collectives.torch operation.

``hvd.start_timeline(path)`` / ``hvd.stop_timeline()``, or set
``COLLECTIVES_TIMELINE=path`` (``HOROVOD_TIMELINE`` is honoured too; ours wins
when both are set) before ``hvd.init()``. As in Horovod, rank 0 writes the
file (the other ranks record nothing). The file is a JSON object
``{"traceEvents": [...]}`` that chrome://tracing and Perfetto open, written
whole (to a temporary file renamed over `path`) at ``stop_timeline()``,
``shutdown()`` or interpreter exit, so it is always valid JSON.

Events are complete events (``"ph": "X"``, microseconds) on one track per
thread (the caller's thread, the async lane):

- the operation call itself, named by its kind (``allreduce``, ``allgather``,
  ``broadcast``, ``alltoall``, ``reducescatter``, ``barrier``...), with the
  tensor name in ``args``;
- ``NEGOTIATE``: from queueing an op until every rank has queued its name
  (``_negotiate``), and the per-call agreement of arguments (``_agree``);
- ``QUEUE`` (agreed, waiting for the ops agreed before it) and ``RUN`` (the
  negotiating thread running it; ``fused`` in args when run fused);
- ``WAIT``: ``synchronize()`` waiting for an operation to complete.
"""
from __future__ import annotations

import atexit
import json
import os
import threading
import time
from typing import Any, Optional

from ._context import current

__all__ = ["Timeline", "start_timeline", "stop_timeline", "timeline_from_env", "span"]

ENV_NAMES = ("COLLECTIVES_TIMELINE", "HOROVOD_TIMELINE")
MAX_EVENTS = 2_000_000  # a bound on memory: later events are counted, not kept


class Timeline:
    """Events recorded in memory, written as one Chrome-trace JSON file.

    Args:
        path: the file to write.
        rank: this rank (the trace's process id).
    """

    def __init__(self, path: str, rank: int) -> None:
        self.path = path
        self.rank = rank
        self.origin = time.perf_counter_ns()
        self.events: list = []
        self.dropped = 0
        self.threads: dict = {}
        self.lock = threading.Lock()

    def record(self, name: str, cat: str, start_ns: int, end_ns: int,
               args: Optional[dict] = None) -> None:
        """One complete event from start_ns to end_ns (perf_counter_ns) on this thread."""
        thread = threading.current_thread()
        with self.lock:
            if len(self.events) >= MAX_EVENTS:
                self.dropped += 1
                return
            tid = self.threads.setdefault(thread.ident, (len(self.threads), thread.name))[0]
            event = {"name": name, "cat": cat, "ph": "X", "pid": self.rank, "tid": tid,
                     "ts": (start_ns - self.origin) / 1000.0,
                     "dur": max(end_ns - start_ns, 0) / 1000.0}
            if args:
                event["args"] = args
            self.events.append(event)

    def write(self) -> None:
        """Write the file (whole, then renamed over the path)."""
        with self.lock:
            meta = [{"name": "process_name", "ph": "M", "pid": self.rank,
                     "args": {"name": f"rank {self.rank}"}}]
            meta += [{"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                      "args": {"name": tname}} for tid, tname in self.threads.values()]
            doc = {"traceEvents": meta + list(self.events), "displayTimeUnit": "ms",
                   "otherData": {"producer": "collectives.torch", "dropped_events": self.dropped}}
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self.path)


class span:
    """Context manager recording one event on the current timeline, if there is one.

    Args:
        timeline: the Timeline, or None (then nothing is recorded).
        name: the event's name.
        cat: its category.
        args: extra fields shown with it.
    """

    def __init__(self, timeline: Optional[Timeline], name: str, cat: str = "op",
                 args: Optional[dict] = None) -> None:
        self.timeline, self.name, self.cat, self.args = timeline, name, cat, args
        self.start = 0

    def __enter__(self) -> "span":
        self.start = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.timeline is not None:
            self.timeline.record(self.name, self.cat, self.start, time.perf_counter_ns(),
                                 self.args)


def _attach(ctx: Any, timeline: Optional[Timeline]) -> None:
    ctx.timeline = timeline
    ctx.agreement.timeline = timeline
    ctx.lane.timeline = timeline
    for entry in getattr(ctx, "process_sets", {}).values():  # ops on process sets too
        if entry.view is not None:
            entry.view.agreement.timeline = timeline


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording a timeline to `file_path` (written by rank 0; see module doc).

    Args:
        file_path: the JSON file to write; a timeline already running is written first.
        mark_cycles: accepted for Horovod's signature (there are no cycles to mark).
    """
    ctx = current()
    if not isinstance(file_path, str) or not file_path:
        raise ValueError("start_timeline: file_path must be a non-empty path")
    stop_timeline()
    if ctx.rank != 0:
        return
    directory = os.path.dirname(os.path.abspath(file_path))
    if not os.path.isdir(directory):
        raise ValueError(f"start_timeline: directory {directory!r} does not exist")
    timeline = Timeline(file_path, ctx.rank)
    _attach(ctx, timeline)
    atexit.register(_write_at_exit, timeline)


def stop_timeline() -> None:
    """Stop recording and write the timeline file (no-op when none is running)."""
    ctx = current()
    timeline = getattr(ctx, "timeline", None)
    if timeline is None:
        return
    _attach(ctx, None)
    atexit.unregister(_write_at_exit)
    timeline.write()


def _write_at_exit(timeline: Timeline) -> None:
    try:
        timeline.write()
    except OSError:
        pass


def timeline_from_env() -> None:
    """init(): start the timeline COLLECTIVES_TIMELINE (or HOROVOD_TIMELINE) names."""
    for name in ENV_NAMES:
        path = os.environ.get(name, "").strip()
        if path:
            start_timeline(path)
            return
