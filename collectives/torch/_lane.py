"""The async lane: Horovod's ``*_async`` operations run here, in program order.

Horovod's ``allgather_async`` (and reducescatter, alltoall, broadcast and the
grouped forms) returns a handle at once while the operation is in flight. The
core's collectives here start with the per-call agreement (``_agree``), a
blocking exchange, so an operation that must not block the caller runs, whole
(agreement and data), on one worker thread per context: the lane. Jobs run
one at a time in the order they were queued; every exchange made on another
thread first waits for the lane to drain (``Agreement.before_exchange``), so
every rank still issues its collectives in its program order and the ranks
stay matched, whatever mixes sync and async calls.

The in-flight names (Horovod rejects a second in-flight op with a name already
in flight, with ValueError) are tracked here too, per kind of operation.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Optional

__all__ = ["Lane", "Job", "Names"]


class Job:
    """One operation queued on the lane; a handle for ``poll()``/``synchronize()``.

    Args:
        fn: runs on the lane; its return value is the handle's output.
        keep: objects (input tensors) kept alive until the job ran.
        chained: fn returns a handle of its own (an allreduce queued on the core's
            progress thread): this one completes when that one does, with its output.
    """

    def __init__(self, fn: Callable[[], Any], keep: Any = None, chained: bool = False) -> None:
        self.label = ""  # the operation, for the timeline
        self.timeline: Any = None
        self.queued = 0
        self._fn = fn
        self._keep = keep
        self._chained = chained
        self._event = threading.Event()
        self._output: Any = None
        self._error: Optional[BaseException] = None

    def run(self) -> None:
        """Run on the lane (never raises: the error is kept for wait())."""
        start = time.perf_counter_ns()
        try:
            self._output = self._fn()
        except BaseException as e:  # noqa: BLE001 -- re-raised by wait() on the caller
            self._error = e
        finally:
            self._fn = None
            self._keep = None
            if self.timeline is not None:
                args = {"op": self.label}
                self.timeline.record("QUEUE", "async", self.queued, start, args)
                self.timeline.record("RUN", "async", start, time.perf_counter_ns(), args)
            self._event.set()

    def poll(self) -> bool:
        """True once the operation has completed (wait() then returns at once)."""
        if not self._event.is_set():
            return False
        return not (self._chained and self._error is None) or self._output.poll()

    def wait(self) -> Any:
        """Wait for completion; return the output or raise the operation's error
        (a failed collective as ``HorovodInternalError``)."""
        self._event.wait()
        if self._error is not None:
            from .exceptions import internal_error

            err = internal_error(self._error)
            if err is self._error:
                raise err
            raise err from self._error
        if self._chained:
            return self._output.wait()
        return self._output

    def __call__(self) -> Any:
        """Same as wait(): Horovod's ``sparse_allreduce_async`` returns a function that
        waits and returns the result, and scripts call the handle."""
        return self.wait()


class Lane:
    """One worker thread running Jobs in order (started on first use, a daemon)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self._busy = False
        self._thread: Optional[threading.Thread] = None
        self.timeline: Any = None  # a timeline.Timeline while one records

    def on_lane(self) -> bool:
        """True on the lane's own thread."""
        return threading.current_thread() is self._thread

    def submit(self, job: Job) -> Job:
        """Queue `job` after every job queued before it; return it."""
        job.timeline, job.queued = self.timeline, time.perf_counter_ns()
        with self._cv:
            self._queue.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="collectives-torch-lane",
                                                daemon=True)
                self._thread.start()
            self._cv.notify_all()
        return job

    def drain(self) -> None:
        """Wait until every queued job has run (no-op on the lane itself)."""
        if self._thread is None or self.on_lane():
            return
        with self._cv:
            while self._queue or self._busy:
                self._cv.wait()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                job = self._queue.popleft()
                self._busy = True
            try:
                job.run()
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()


class Names:
    """The names of async operations in flight, per kind ("allreduce", "allgather", ...)."""

    def __init__(self) -> None:
        self._held: dict = {}
        self._lock = threading.Lock()

    def check(self, kind: str, name: Optional[str]) -> None:
        """ValueError (as Horovod) if an operation of this kind named `name` is in flight."""
        if name is None:
            return
        with self._lock:
            holder = self._held.get((kind, name))
            if holder is not None and not holder.poll():
                raise ValueError(
                    f"{kind}: an operation named {name!r} is already in flight; Horovod "
                    "rejects a second one with the same name (synchronize the first, or use "
                    "another name)")
            self._held.pop((kind, name), None)

    def hold(self, kind: str, name: Optional[str], handle: Any) -> Any:
        """Record `handle` as the in-flight operation `name`; return it."""
        if name is not None:
            with self._lock:
                self._held[(kind, name)] = handle
                if len(self._held) > 4096:  # forget finished ones (bounded)
                    for key in [k for k, h in self._held.items() if h.poll()]:
                        del self._held[key]
        return handle
