"""Completion of the torch.distributed backend's work: torch Works and Futures over core requests.

A collective queued in the core (a ``Request``) is completed in order: by the
thread that waits for its Work when it is the next one (``Completer``), else by
one thread per group (the core runs the group's collectives in order, so
waiting in order costs nothing). That thread never completes a torch Future
itself: ``Future.set_result`` runs the ``.then`` callbacks inline, and a
callback may issue another collective and wait for it (DDP's PowerSGD hook
does), which only this thread could complete. So results go to delivery
threads: one is usually enough; another starts whenever every delivery thread
is still inside a callback, so a nested wait never waits for itself.

Point-to-point requests progress only while someone waits for or tests one
(native/coll.h), in whatever order their peers send, so they are not queued
behind the collectives: their Work waits for its own request in the caller's
thread.
"""
from __future__ import annotations

import collections
import threading
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.futures import Future

from ._errors import worded
from .._context import as_buffer, check_tensor, wire_dtype

# Delivery threads a group may hold: one per callback nested inside another
# that is still running; beyond this, deliveries wait for one to return.
_MAX_DELIVERERS = 32


def _seconds(timeout: Any) -> Optional[float]:
    """A timeout as seconds, None for "no timeout" (None, zero: torch's kNoTimeout)."""
    if timeout is None:
        return None
    secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return secs if secs > 0 else None


def _wait_expired(what: str, secs: float) -> str:
    """Work.wait(timeout)'s message when it expires, with gloo's words ("Operation timed out!")."""
    return (f"collectives backend: {what}: Operation timed out! It did not complete within "
            f"Work.wait's timeout of {secs:g} s (it is still in flight)")


class _Failed:
    """A failed request's error, as the value of its source Future."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _unwrap(source: Future) -> Any:
    """The result, or the request's error raised (torch then fails the Future in C++)."""
    value = source.value()
    if isinstance(value, _Failed):
        raise value.exc
    return value


class _Work(dist._Work):
    """A collective's completion: a torch Future, completed where the result is waited for.

    The request completes a source Future with its result or a ``_Failed``;
    the Future handed out is ``source.then(_unwrap)``. Python's
    ``Future.set_exception`` only stores the exception as the value, which C++
    consumers take for a result: DDP's reducer read tensors out of it and
    crashed the process when a peer died. An error raised in a ``then``
    callback fails the Future for C++ and Python alike; ``wait()`` raises the
    original exception.

    ``claim`` (Completer.claim_for): a blocking ``wait()`` runs the request's
    completion in the waiting thread when it is the group's next one (no hand-off
    to the Completer's threads: the 8-byte allreduce's cost); otherwise, and for
    ``get_future``, ``is_completed`` and a wait with a timeout, it asks the
    Completer's threads to complete it now.
    """

    def __init__(self, source: Future, what: str = "collective",
                 claim: Optional[Callable[[bool], None]] = None) -> None:
        super().__init__()
        self._src = source
        self._fut: Optional[Future] = None
        self._what = what
        self._claim = claim

    @property
    def _future(self) -> Future:
        # made on first use: a `then` costs as much as the rest of a small allreduce
        if self._fut is None:
            self._fut = self._src.then(_unwrap)
        return self._fut

    def _urge(self, inline: bool) -> None:
        if self._claim is not None and not self._src.done():
            self._claim(inline)

    def wait(self, timeout: Any = None) -> bool:
        """Block until the work completes; raise its error if it failed.

        With a timeout (a timedelta or seconds; zero means none, as torch's
        default), raise RuntimeError if it has not completed by then; the work
        stays in flight, as on gloo.
        """
        secs = _seconds(timeout)
        self._urge(secs is None)
        if secs is not None:
            done = threading.Event()
            self._src.add_done_callback(lambda _f: done.set())
            if not done.wait(secs):
                raise RuntimeError(_wait_expired(self._what, secs))
        self._raise_failure()
        if self._fut is not None:
            self._fut.wait()
        return True

    def _raise_failure(self) -> None:
        value = self._src.wait()
        if isinstance(value, _Failed):
            raise value.exc

    def is_completed(self) -> bool:
        """True once the work has completed."""
        self._urge(False)
        return self._src.done()

    def is_success(self) -> bool:
        """True if it completed without error."""
        return self.is_completed() and self.exception() is None

    def exception(self) -> Any:
        """The error, if it failed (None otherwise)."""
        value = self._src.value()
        return value.exc if isinstance(value, _Failed) else None

    def get_future(self) -> Future:
        """The Future that completes with the output tensors."""
        self._urge(False)
        return self._future

    def result(self) -> list:
        """The output tensors."""
        self._urge(True)
        self._raise_failure()
        return self._future.value()


def _cuda_devices(value: Any) -> list:
    """The CUDA devices of the tensors in value (nested lists and tuples)."""
    found: list = []
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, torch.Tensor):
            if v.is_cuda and v.device not in found:
                found.append(v.device)
        elif isinstance(v, (list, tuple)):
            todo.extend(v)
        elif isinstance(getattr(v, "tensor", None), torch.Tensor):  # a Staged buffer
            todo.append(v.tensor)
    return found


def new_future(like: Any = None) -> Future:
    """A Future for a value holding the tensors in `like`: one that knows their
    CUDA devices when there are any (torch refuses a CUDA result otherwise, and
    orders its consumers' streams after the producer's with events)."""
    if like is None:
        return Future()
    devices = _cuda_devices(like)
    return Future(devices=devices) if devices else Future()


class _Done(_Work):
    """Work that completed before it was returned (an op that ran in the caller's thread).

    Nothing to wait for, so none of _Work's machinery: its Future is made on first
    use (torch's blocking calls only wait() for the Work, and a Future with its
    set_result costs as much as a small allreduce, bench/README.md "Through the
    frameworks").
    """

    def __init__(self, value: Any, what: str = "collective") -> None:
        dist._Work.__init__(self)
        self._value = value
        self._what = what
        self._claim = None
        self._fut = None

    @property
    def _src(self) -> Future:  # type: ignore[override]
        if self._fut is None:
            fut: Future = new_future(self._value)
            fut.set_result(self._value)
            self._fut = fut
        return self._fut

    @property
    def _future(self) -> Future:  # no failure to unwrap: the source itself
        return self._src

    def wait(self, timeout: Any = None) -> bool:
        """Return True at once: the work has completed (as gloo's, whatever the timeout)."""
        return True

    def is_completed(self) -> bool:
        """True: the work has completed."""
        return True

    def is_success(self) -> bool:
        """True: the work completed without error (a failed op raised instead)."""
        return True

    def exception(self) -> Any:
        """None: the work did not fail."""
        return None

    def get_future(self) -> Future:
        """A completed Future holding the output tensors."""
        return self._src

    def result(self) -> Any:
        """The output tensors."""
        return self._value


def completed(value: Any, what: str = "collective") -> _Work:
    """Work that has already completed with value."""
    return _Done(value, what)


class P2PWork(_Work):
    """A point-to-point request's Work: waiting progresses it in the waiting thread.

    Args:
        request: the core's Request.
        finish: called once the request is done; its value completes the Future.
        what: the op, for messages.
        keep: objects (staged buffers) that must live until the request is done.
        timeout: the request's deadline in seconds (None: the core's), for messages.
        notes: the group's GroupNotes, for its errors (errors.worded).
    """

    def __init__(self, request: Any, finish: Callable[[Any], Any], what: str,
                 keep: Any = None, timeout: Optional[float] = None, notes: Any = None) -> None:
        super().__init__(new_future(keep), what)
        self._notes = notes
        self._request, self._finish, self._keep = request, finish, keep
        self._timeout = timeout
        self._lock = threading.Lock()
        self._source = -1

    def _complete(self, block: bool, secs: Optional[float] = None) -> bool:
        """Wait for (block) or test the request; completes the Future once it is done."""
        with self._lock:
            if self._src.done():
                return True
            try:
                if block:
                    self._request.Wait()
                elif not self._request.Test():
                    return False
                status = self._request._status
                self._source = status[0] if status else -1
                value = self._finish(status)
            except BaseException as exc:  # delivered to whoever waits on the Future
                self._request = self._keep = None
                self._src.set_result(_Failed(worded(exc, self._what, self._timeout,
                                                                  self._notes)))
                return True
            self._request = self._keep = None
        self._src.set_result(value)
        return True

    def wait(self, timeout: Any = None) -> bool:
        """Block until the message has moved (raising its error); see _Work.wait for timeout."""
        secs = _seconds(timeout)
        if secs is None:
            self._complete(True)
        else:
            import time
            deadline = time.monotonic() + secs
            while not self._complete(False):
                if time.monotonic() >= deadline:
                    raise RuntimeError(_wait_expired(self._what, secs))
                time.sleep(0.001)
        self._raise_failure()
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        """True once the message has moved (tests the request: progresses it)."""
        return self._complete(False)

    def get_future(self) -> Future:
        """The Future; a thread waits for the request so that it completes unaided."""
        if not self._src.done():  # not a daemon: see Completer (ends within the timeout)
            threading.Thread(target=self._complete, args=(True,),
                             name="collectives-torch-p2p").start()
        return self._future

    def _source_rank(self) -> int:
        """The rank a receive from any source got its message from (torch's recv_anysource)."""
        self.wait()
        return self._source


class _Entry:
    """A queued request: completed by the Completer's thread once urgent, or claimed."""

    __slots__ = ("request", "finish", "keep", "fut", "what", "urgent")

    def __init__(self, request: Any, finish: Callable[[], Any], keep: Any, fut: Future,
                 what: str) -> None:
        self.request, self.finish, self.keep, self.fut, self.what = request, finish, keep, fut, what
        self.urgent = False


class Completer:
    """Completes a group's queued core requests in order, in the thread that waits for one
    or in the Completer's threads.

    The core runs a group's requests in order. A blocking ``Work.wait()`` on the
    request at the head of the queue completes it in the waiting thread: a
    ``dist.all_reduce`` then costs no thread hand-off beyond the core's. The
    Completer's waiter thread takes a request only once it is urgent: someone
    asked for its Future (DDP's hooks), tested it, waited with a timeout, a later
    request was queued behind it, or the group stops. It never completes a torch
    Future itself: results go to delivery threads (see the module's doc).

    The threads are not daemons: completing a torch Future releases and retakes
    the GIL, and a daemon thread doing that while the interpreter finalizes is
    ended by a forced unwind through torch's C++ frames, which aborts the
    process ("terminate called without an active exception"). So stop() joins
    them, and so does an interpreter-exit hook for groups never destroyed.
    """

    def __init__(self, timeout: Optional[float] = None) -> None:
        self._timeout = timeout  # the requests' deadline in seconds, for messages
        self.notes = None  # the group's GroupNotes, for messages (errors.worded)
        self._cv = threading.Condition()
        self._requests: collections.deque = collections.deque()  # of _Entry
        self._ready: collections.deque = collections.deque()  # (future, value, error)
        self._waiter: Optional[threading.Thread] = None
        self._waiting_in_order = False  # the waiter thread runs
        self._busy = False  # the waiter thread is completing a request
        self._deliverers: list = []
        self._parked = 0  # delivery threads inside cv.wait()
        self._stopping = False
        _at_exit(self.stop)

    def idle(self) -> bool:
        """True if no request of this group is queued or being completed here: an op run
        in the caller's thread now finishes after every earlier one has (the core runs
        them in order, and their finish() calls have all returned). A hint without the
        lock, as a concurrent submit from another thread is unordered anyway."""
        return not self._requests and not self._busy

    def submit(self, request: Any, finish: Callable[[], Any], keep: Any,
               what: str = "allreduce", like: Any = None) -> Future:
        """A new Future, completed with finish() (or its error) once request is done;
        `like`: the tensors its value holds (their devices). Urgent at once."""
        entry = self._queue(request, finish, keep, what, like)
        self._mark(entry)
        return entry.fut

    def submit_work(self, request: Any, finish: Callable[[], Any], keep: Any,
                    what: str = "allreduce", like: Any = None) -> _Work:
        """The Work of a queued request, whose wait() may complete it in its own thread."""
        entry = self._queue(request, finish, keep, what, like)

        def claim(inline: bool) -> None:
            if not (inline and self._claim(entry)):
                self._mark(entry)
        return _Work(entry.fut, what, claim)

    def _queue(self, request: Any, finish: Callable[[], Any], keep: Any, what: str,
               like: Any) -> _Entry:
        entry = _Entry(request, finish, keep, new_future(like), what)
        with self._cv:
            if self._waiter is None:
                self._stopping = False
                self._waiting_in_order = True
                self._waiter = threading.Thread(target=self._wait_in_order,
                                                name="collectives-torch-pg")
                self._waiter.start()
            if self._requests and not self._requests[-1].urgent:
                # a request queued behind unclaimed ones: theirs are due (no Work of
                # theirs may ever be waited for)
                for e in self._requests:
                    e.urgent = True
                self._cv.notify_all()
            self._requests.append(entry)
        return entry

    def _mark(self, entry: _Entry) -> None:
        """Make entry (and every request before it) due for the waiter thread."""
        with self._cv:
            if entry.urgent:
                return
            for e in self._requests:
                e.urgent = True
                if e is entry:
                    break
            self._cv.notify_all()

    def _claim(self, entry: _Entry) -> bool:
        """Complete entry in this thread if it is next and the waiter thread is idle."""
        with self._cv:
            if self._busy or not self._requests or self._requests[0] is not entry:
                return False
            self._requests.popleft()
        fut, value, exc = self._complete(entry)
        fut.set_result(_Failed(exc) if exc is not None else value)  # its callbacks run here
        return True

    def _complete(self, entry: _Entry) -> tuple:
        try:
            entry.request.Wait()
            return entry.fut, entry.finish(), None
        except BaseException as exc:
            return entry.fut, None, worded(exc, entry.what, self._timeout, self.notes)
        finally:
            entry.request = entry.finish = entry.keep = None

    def _wait_in_order(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not (self._requests and self._requests[0].urgent):
                    self._cv.wait()
                if not self._requests:
                    self._waiting_in_order = False
                    self._cv.notify_all()
                    return
                entry = self._requests.popleft()
                self._busy = True
            item = self._complete(entry)
            del entry
            self._deliver(item)
            del item
            with self._cv:
                self._busy = False

    def _deliver(self, item: tuple) -> None:
        """Hand a result to a parked delivery thread; start one when every thread that could
        take it is busy (inside a callback, which may be waiting for this very result)."""
        with self._cv:
            self._ready.append(item)
            if len(self._ready) > self._parked and len(self._deliverers) < _MAX_DELIVERERS:
                thread = threading.Thread(target=self._deliver_loop,
                                          name="collectives-torch-pg-deliver")
                self._deliverers.append(thread)
                thread.start()
            else:
                self._cv.notify()

    def _deliver_loop(self) -> None:
        while True:
            with self._cv:
                while not self._ready:
                    if self._stopping and not self._waiting_in_order:
                        return
                    self._parked += 1
                    self._cv.wait()
                    self._parked -= 1
                fut, value, exc = self._ready.popleft()
            # torch runs the callbacks here
            fut.set_result(_Failed(exc) if exc is not None else value)
            del fut, value, exc

    def stop(self) -> None:
        """End the threads after the queued requests (each ends within the core's timeout)."""
        with self._cv:
            waiter, self._waiter = self._waiter, None
            self._stopping = True
            self._cv.notify_all()
        me = threading.current_thread()
        if waiter is not None and waiter is not me:
            waiter.join()
        with self._cv:
            deliverers, self._deliverers = self._deliverers, []
            self._cv.notify_all()
        for thread in deliverers:
            if thread is not me:
                thread.join()


def _at_exit(fn: Callable[[], None]) -> None:
    """Run fn when the interpreter exits, before it joins non-daemon threads."""
    try:
        threading._register_atexit(fn)  # type: ignore[attr-defined]  # as concurrent.futures does
    except RuntimeError:  # already shutting down: stop() runs from shutdown() or not at all
        pass


class Staged:
    """A tensor as the core sees it: itself when contiguous and of a core dtype, else a copy."""

    def __init__(self, tensor: torch.Tensor, what: str, copy_in: bool = True) -> None:
        check_tensor(tensor, what)
        self.tensor = tensor
        wdt = wire_dtype(tensor.dtype)
        self.direct = wdt == tensor.dtype and tensor.is_contiguous()
        if self.direct:
            self.buf = tensor.detach()
        else:
            self.buf = torch.empty(tensor.shape, dtype=wdt, device=tensor.device)
            if copy_in:
                self.buf.copy_(tensor.detach())
        self.view, self.dtype = as_buffer(self.buf)

    def copy_out(self) -> None:
        """Write the staged result back into the caller's tensor."""
        if not self.direct:
            self.tensor.detach().copy_(self.buf)
