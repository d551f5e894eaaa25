"""Every public operation's path: Horovod's negotiation, and an error on every rank.

``symmetric`` wraps each public ``collectives.torch`` operation. A blocking
call is queued whole as one op under its name (``_negotiate``) and runs on
the negotiating thread once every rank queued it, while the caller waits;
an ``*_async`` call queues its own job and returns. Either way an argument
error on one rank reaches the others: inside a queued op through a FAILED
agreement slot (``_agree``), before queueing through a FAILED description
under the op's key.
"""
from __future__ import annotations

import functools
import inspect
import threading
import time
from typing import Any, Callable, Optional

from ._agree import _usable
from ._context import ACTIVE, HOLDER, current
from ._lane import CALL, queue_call, run_call
from ._negotiate import FAILED
from .exceptions import internal_error

__all__ = ["symmetric"]

_depth = threading.local()
FIXED_KEYS = {"barrier": "barrier"}  # Horovod's fixed names (every barrier matches every other)


def _name_index(fn: Callable) -> Optional[int]:
    """The position of fn's `name` parameter (None: it has none), read once per function:
    inspect.signature costs more than a whole small call."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return params.index("name") if "name" in params else None


def _name_of(index: Optional[int], args: tuple, kwargs: dict) -> Optional[str]:
    """The `name` argument of a call (index: see _name_index), if it was given."""
    if "name" in kwargs:
        return kwargs["name"]
    if index is not None and index < len(args):
        return args[index]
    return None


def symmetric(what: str, get: Callable[[], Any], route: Optional[bool] = None) -> Callable:
    """Decorator for a public operation: Horovod's negotiation, and an error on every rank.

    A routed operation (the blocking calls: the default unless the function's name ends in
    ``_async``/``_async_``) is queued whole as one op under its name (see _negotiate) and
    runs on the negotiating thread once every rank queued it; the caller waits. There, an
    exception raised before the call's agreement (a bad argument on this rank) is first
    announced to every rank through a FAILED slot, so they raise too instead of waiting in
    a collective this rank never joins. An unrouted operation (``*_async``) queues its own
    job; if it raises before queueing, it announces ``FAILED`` under its key instead, so the
    ranks that did queue it fail too. `get()` returns the context's Agreement, or raises if
    there is none (then nothing is exchanged)."""

    def wrap(fn: Callable) -> Callable:
        blocking = not fn.__name__.endswith(("_async", "_async_"))  # the caller waits for it
        routed = route if route is not None else blocking
        name_at = _name_index(fn)

        def name_of(args: tuple, kwargs: dict) -> Optional[str]:
            return FIXED_KEYS.get(what) or _name_of(name_at, args, kwargs)

        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                agreement = get()
            except Exception:
                agreement = None
            # (only a routed op announces a failure: see below)
            before = agreement.calls if routed and agreement is not None else 0
            timeline = agreement.timeline if agreement is not None else None
            start = time.perf_counter_ns() if timeline is not None else 0
            _depth.n = 1
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                if routed and agreement is not None and agreement.size > 1 and \
                        agreement.calls == before and _usable(agreement.core):
                    agreement.fail(what, e)
                translated = internal_error(e)  # a failed collective: Horovod's class
                if translated is e:
                    raise
                raise translated from e
            finally:
                _depth.n = 0
                if timeline is not None:
                    name = kwargs.get("name")
                    timeline.record(fn.__name__, "op", start, time.perf_counter_ns(),
                                    {"name": name} if isinstance(name, str) else None)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if getattr(_depth, "n", 0):
                return fn(*args, **kwargs)
            world = HOLDER.context
            if world is None or world.lane.on_lane():
                return inner(*args, **kwargs)
            try:
                ctx = current()
            except Exception:
                return inner(*args, **kwargs)
            CALL.queued = False
            CALL.blocking = routed or blocking
            pid = getattr(ctx, "process_set_id", 0)
            CALL.handle = handle = world.lane.next_handle(pid)
            try:
                if routed:
                    name = name_of(args, kwargs)
                    view = ACTIVE.view

                    def job() -> Any:
                        before = ACTIVE.view
                        ACTIVE.view = view
                        try:
                            return inner(*args, **kwargs)
                        finally:
                            ACTIVE.view = before

                    return run_call(ctx, what, name if isinstance(name, str) else None, job)
                try:
                    return inner(*args, **kwargs)
                except Exception as e:
                    if getattr(e, "duplicate_name", False):
                        world.lane.release_handle(handle, pid)  # as if never called
                    elif not CALL.queued and world.size > 1:
                        name = name_of(args, kwargs)
                        queue_call(ctx, what, name if isinstance(name, str) else None, None,
                                   desc=f"{FAILED}{what}: {type(e).__name__}: {e}"[:2000])
                    raise
            finally:
                CALL.queued = False
                CALL.blocking = False
                CALL.handle = 0

        return call

    return wrap
