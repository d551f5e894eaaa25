"""Jobs: one ``collectives.torch`` operation as the negotiation (``_negotiate``) queues it.

A job is the operation's key (process set, kind, name), the description
that every rank must pass alike, and a function that does the operation on
the negotiating thread once every rank has queued the key. It is the
handle ``poll()`` / ``synchronize()`` take. ``queue_call`` and ``run_call``
give the blocking calls the same path: queue, then wait.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from .exceptions import LayoutMismatch

__all__ = ["Job", "op_key", "queue_call", "run_call", "Launched", "CALL", "RUNNING"]

_UNSET = object()


class _Call(threading.local):
    """The public call in progress on this thread: its number (Horovod's handle: every
    public call takes one; 0: none yet), whether it has queued its op, and whether it is
    a blocking call (its thread waits for what it queues, and runs the round itself)."""

    handle = 0
    queued = False
    blocking = False


CALL = _Call()


class _Running(threading.local):
    """What the job running on this thread may assume: ``inline``, that its own caller
    runs it and waits for it right now (a blocking call whose round this thread runs, or
    any call in a 1-rank world), so a collective it starts may as well block here."""

    inline = False


RUNNING = _Running()


def op_key(ctx: Any, kind: str, name: Optional[str], pid: Optional[int] = None) -> str:
    """Horovod's op name, ``<kind>.<name>`` or ``<kind>.noname.<n>`` (n: the number of the
    public call, as Horovod's handle: every call takes one, named or not, so ranks that make
    the same calls agree on the names even where one rank's call failed; a call refused as a
    duplicate name gives its number back), prefixed by the process set's id when not the
    world. An op queued from inside a running op runs at once and takes no number."""
    if pid is None:
        pid = getattr(ctx, "process_set_id", 0)
    if name is not None:
        text = f"{kind}.{name}"
    elif ctx.lane.on_lane():
        text = f"{kind}.nested"
    else:
        text = f"{kind}.noname.{CALL.handle or ctx.lane.next_handle(pid)}"
    CALL.handle = 0
    CALL.queued = True
    return f"ps{pid}:{text}" if pid else text


class _Done:
    """A one-shot completion flag, as threading.Event's set/is_set/wait (without a
    timeout) at a fraction of its cost: a lock held until set(). Every public call makes
    one, so its price is part of a small op's latency."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        """Complete (idempotent); wakes every waiter."""
        if not self._set:
            self._set = True
            try:
                self._lock.release()
            except RuntimeError:  # a racing set() released it first
                pass

    def is_set(self) -> bool:
        """True once set() was called."""
        return self._set

    def wait(self) -> None:
        """Block until set() (each waiter passes the lock on to the next)."""
        if not self._set:
            self._lock.acquire()
            self._lock.release()


class Job:
    """One queued operation; a handle for ``poll()``/``synchronize()``.

    Args:
        fn: runs on the negotiating thread; its return value is the handle's output.
        keep: objects (input tensors) kept alive until the job ran.
        chained: fn returns a handle of its own (an allreduce queued on the core's
            progress thread): this one completes when that one does, with its output.
        key: the op's key (see op_key); desc: what every rank must pass alike;
        plan: an allreduce plan a joined rank can serve (see _join), or 0;
        members: the world ranks of the op's process set (None: every rank).
    """

    # (every public call makes one: slots make that a third cheaper)
    __slots__ = ("label", "timeline", "queued", "fn", "_keep", "_chained", "key", "desc", "plan",
                 "members", "slot", "announced", "evicting", "since", "agreed", "fuse",
                 "blocking", "caller", "lane", "_event", "_output", "_error", "__weakref__")

    def __init__(self, fn: Optional[Callable[[], Any]], keep: Any = None, chained: bool = False,
                 key: str = "", desc: str = "", plan: int = 0,
                 members: Optional[tuple] = None) -> None:
        self.label = key  # the operation, for the timeline
        self.timeline: Any = None
        self.queued = 0
        self.fn = fn
        self._keep = keep
        self._chained = chained
        self.key, self.desc, self.plan, self.members = key, desc, plan, members
        self.slot: Optional[int] = None  # its response-cache slot while queued as a hit
        self.announced = False
        self.evicting = False
        self.since = 0.0
        self.agreed = 0  # perf_counter_ns when every rank had queued it (timeline)
        self.fuse: Any = None  # (input, output) of an allreduce that may run fused
        self.blocking = CALL.blocking  # queued by a blocking call: its caller waits at once
        self.caller = threading.get_ident() if self.blocking else 0  # (see RUNNING)
        self.lane: Any = None  # the Negotiator it is queued on (told when someone waits)
        self._event = _Done()
        self._output: Any = None
        self._error: Optional[BaseException] = None

    def run(self) -> None:
        """Run on the negotiating thread (never raises: the error is kept for wait())."""
        start = time.perf_counter_ns()
        inline = self.caller != 0 and self.caller == threading.get_ident()
        if inline:
            RUNNING.inline = True
        try:
            if self.fn is not None:
                self._output = self.fn()
        except BaseException as e:  # noqa: BLE001 -- re-raised by wait() on the caller
            self._error = e
            if isinstance(e, LayoutMismatch) and self.key and self.key not in str(e):
                self._error = LayoutMismatch(f"{self.key!r}: {e}")  # which op, on every rank
                self._error.__cause__ = e
        finally:
            if inline:
                RUNNING.inline = False
            self.fn = None
            self._keep = None
            if self.timeline is not None:
                args = {"op": self.label}
                agreed = self.agreed or start
                self.timeline.record("NEGOTIATE", "async", self.queued, agreed, args)
                self.timeline.record("QUEUE", "async", agreed, start, args)
                self.timeline.record("RUN", "async", start, time.perf_counter_ns(), args)
            self._event.set()

    def fail(self, error: BaseException) -> None:
        """Complete with `error` without running (the ranks disagreed, or it stalled)."""
        self.fn, self._keep, self._chained = None, None, False
        self._error = error
        self._event.set()

    def attach(self, handle: Any) -> None:
        """Complete as started with `handle` (poll/wait go to it) without running fn: the
        negotiation ran this op fused with others (see _fusion)."""
        self.fn, self._keep, self._chained, self.fuse = None, None, True, None
        self._output = handle
        if self.timeline is not None:
            now = time.perf_counter_ns()
            args = {"op": self.label, "fused": True}
            self.timeline.record("NEGOTIATE", "async", self.queued, self.agreed or now, args)
            self.timeline.record("RUN", "async", self.agreed or now, now, args)
        self._event.set()

    def result(self, value: Any) -> None:
        """Complete with `value` without running (join)."""
        self.fn, self._keep, self._chained = None, None, False
        self._output = value
        self._event.set()

    def poll(self) -> bool:
        """True once the operation has completed (wait() then returns at once)."""
        if not self._event.is_set():
            return False
        return not (self._chained and self._error is None) or self._output.poll()

    def wait(self) -> Any:
        """Wait for completion; return the output or raise the operation's error
        (a failed collective as ``HorovodInternalError``)."""
        if not self._event.is_set():
            if self.lane is not None:
                self.lane.waiting(self._event)  # runs rounds here meanwhile
            else:
                self._event.wait()
        if self._error is not None:
            from .exceptions import internal_error

            err = internal_error(self._error, self.members)
            if err is self._error:
                raise err
            raise err from self._error
        if self._chained:
            return self._output.wait()
        return self._output

    Wait = wait  # as a core request (DistributedOptimizer waits on its buckets' jobs)

    def __call__(self) -> Any:
        """Same as wait(): Horovod's ``sparse_allreduce_async`` returns a function that
        waits and returns the result, and scripts call the handle."""
        return self.wait()


class Launched:
    """A core request as a chained job's output (poll/wait)."""

    def __init__(self, request: Any) -> None:
        self.request = request

    def poll(self) -> bool:
        """True once the request has completed."""
        return self.request is None or self.request.Test()

    def wait(self) -> None:
        """Wait for the request."""
        if self.request is not None:
            self.request.Wait()


def queue_call(ctx: Any, kind: str, name: Optional[str], fn: Callable[[], Any],
               desc: Optional[str] = None, keep: Any = None, chained: bool = False,
               plan: int = 0, fuse: Any = None) -> Job:
    """Queue fn as the op `kind`/`name` of ctx (a world or process-set context)."""
    pid = getattr(ctx, "process_set_id", 0)
    members = tuple(ctx.ranks) if pid else None
    key = op_key(ctx, kind, name, pid)
    job = Job(fn, keep, chained, key, desc if desc is not None else kind, plan, members)
    job.label = kind if name is None else f"{kind} {name}"
    job.fuse = fuse if not pid else None
    return ctx.lane.submit(job)


def run_call(ctx: Any, kind: str, name: Optional[str], fn: Callable[[], Any],
             desc: Optional[str] = None) -> Any:
    """queue_call, then wait for it and return its output (the blocking calls)."""
    return queue_call(ctx, kind, name, fn, desc).wait()
