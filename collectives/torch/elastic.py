"""Horovod's elastic API (``horovod.torch.elastic``): training that survives lost workers.

    import collectives.torch as hvd

    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch in range(state.batch, batches):
                ...                      # a step: allreduce, optimizer.step()
                if state.batch % 10 == 0:
                    state.commit()       # save; HostsUpdatedInterrupt if hosts changed
            state.batch = 0

    train(state)

Run it with ``collectives-run --elastic -np 4 --min-np 2 --max-np 4 python
train.py``. When a worker dies, the collective in flight on every survivor
raises HorovodInternalError: :func:`run` restores the last committed state,
shuts the world down, joins the next generation the launcher publishes (the
survivors, ranks renumbered, fresh links) and calls ``train(state)`` again
after ``state.sync()`` (a broadcast from the new rank 0). When workers are
added, the running ones raise HostsUpdatedInterrupt at their next
``commit()`` (all at the same commit: rank 0 decides and broadcasts), re-form
with the new ones, and ``sync()`` hands the newcomers the state. As in
Horovod, ``skip_sync`` is true when hosts were only removed.

Outside ``collectives-run --elastic`` there is nothing to re-form with:
:func:`run` calls the function once (after ``sync()``) and errors propagate.
"""
from __future__ import annotations

import copy
import functools
from typing import Any, Callable

import torch

import collectives

from ..elastic import worker as _elastic
from .._core import CollectivesError
from ._context import HOLDER
from .basics import init, rank, shutdown
from .elastic_sampler import ElasticSampler
from .exceptions import HostsUpdatedInterrupt
from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters

__all__ = ["State", "ObjectState", "TorchState", "ElasticSampler", "run"]


class State:
    """Base of the elastic states: commit/restore/sync and the reset callbacks.

    Subclasses implement ``save``, ``restore`` and ``sync``.
    """

    def __init__(self) -> None:
        self._reset_callbacks: list = []

    def register_reset_callbacks(self, callbacks: list) -> None:
        """Call each of `callbacks` (no arguments) after every re-forming of the world
        (e.g. to scale the learning rate with the new ``hvd.size()``)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called by :func:`run` after the world re-formed: ``reset()``, then the callbacks."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def reset(self) -> None:
        """Hook for subclasses, called when the world re-formed (default: nothing)."""

    def commit(self) -> None:
        """Save the state (what a failure rolls back to), then check for host updates."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt on every rank if the launcher announced new or removed
        hosts since this world formed.

        Rank 0 reads the announcements and broadcasts what it found, so every rank raises at
        the same commit (a collective: call it on every rank). Does nothing outside
        ``collectives-run --elastic``.
        """
        gen = _elastic.current()
        if gen is None:
            return
        found = _elastic.host_updates(gen.updates) if rank() == 0 else None
        count, removed_only = broadcast_object(found, root_rank=0, name="elastic.host_updates")
        if count > gen.updates:
            gen.updates = count
            raise HostsUpdatedInterrupt(skip_sync=removed_only)

    def save(self) -> None:
        """Keep a copy of the current state."""
        raise NotImplementedError

    def restore(self) -> None:
        """Go back to the last saved copy."""
        raise NotImplementedError

    def sync(self) -> None:
        """Make every rank's state rank 0's (a broadcast)."""
        raise NotImplementedError


class ObjectState(State):
    """User attributes (``epoch=0, batch=0, ...``) saved, restored and broadcast as objects.

    Each keyword becomes an attribute; ``sync()`` broadcasts the *saved* values from rank 0
    (as Horovod). Values must be picklable.

    Args:
        bcast_object: Horovod's first argument, ``bcast_object(obj) -> obj`` (root 0);
            default ``hvd.broadcast_object``.
        get_rank: Horovod's second argument (accepted; the rank is ``hvd.rank()``).
        **kwargs: the attributes and their first values.
    """

    def __init__(self, bcast_object: Any = None, get_rank: Any = None, **kwargs: Any) -> None:
        self._bcast_object = bcast_object or (
            lambda obj: broadcast_object(obj, root_rank=0, name="elastic.object_state"))
        self._saved_state = dict(kwargs)
        self._set_attrs()
        super().__init__()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))

    def save(self) -> None:
        """Copy the attributes' current values."""
        self._saved_state = {name: copy.deepcopy(getattr(self, name))
                             for name in self._saved_state}

    def restore(self) -> None:
        """Set the attributes back to the saved values."""
        self._set_attrs()

    def sync(self) -> None:
        """Rank 0's saved values on every rank, set as the attributes."""
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()


class _Handler:
    """Save/restore/sync of one torch object with state_dict()/load_state_dict()."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

    def sync(self) -> None:
        if isinstance(self.value, ElasticSampler):  # the union of what every rank processed
            self.value.sync()
        elif isinstance(self.value, torch.nn.Module):
            broadcast_parameters(self.value.state_dict(), root_rank=0)
        elif isinstance(self.value, torch.optim.Optimizer):
            broadcast_optimizer_state(self.value, root_rank=0)
        else:  # an LR scheduler, a sampler with a state_dict: a picklable dict
            self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0,
                                                        name="elastic.handler"))


def _has_state_dict(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and \
        callable(getattr(value, "load_state_dict", None))


class TorchState(ObjectState):
    """The state of a PyTorch training: model, optimizer and user attributes.

    Args:
        model: a ``torch.nn.Module`` (its ``state_dict`` is saved; ``sync`` broadcasts its
            parameters and buffers from rank 0), or None.
        optimizer: a ``torch.optim.Optimizer`` (state and hyperparameters), or None.
        **kwargs: more state: objects with ``state_dict``/``load_state_dict`` (another
            model, an LR scheduler) are handled like the model, an :class:`ElasticSampler`
            too (``sync`` unites what every rank processed; after a re-forming it
            re-shards over the new world); anything else is a plain attribute
            (``epoch=0``, ``batch=0``), saved by deep copy.
    """

    def __init__(self, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers = {k: _Handler(v) for k, v in kwargs.items()
                    if v is not None and _has_state_dict(v)}
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(**{k: v for k, v in kwargs.items() if k not in handlers})

    def __setattr__(self, name: str, value: Any) -> None:
        """Setting a handled attribute (``state.model = m``) makes `value` the one saved."""
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].value = value
        object.__setattr__(self, name, value)

    def reset(self) -> None:
        """After re-forming: a DistributedOptimizer forgets the step the failure cut short,
        an ElasticSampler re-shards."""
        for handler in self._handlers.values():
            if isinstance(handler.value, ElasticSampler):
                handler.value.reset()  # re-shard over the new world
            forget = getattr(handler.value, "_reset_step", None)
            if callable(forget):
                forget()

    def save(self) -> None:
        """Copy the model/optimizer state dicts and the attributes."""
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        """Load the saved state dicts back and reset the attributes."""
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        """Broadcast the model, optimizer and attributes from rank 0."""
        for handler in self._handlers.values():
            handler.sync()
        super().sync()


def _reset() -> None:
    """Leave the broken (or outgrown) world and join the launcher's next generation."""
    try:
        shutdown()
    except Exception:  # the world was broken already: close it all the same
        with HOLDER.lock:
            ctx, HOLDER.context = HOLDER.context, None
        if ctx is not None and ctx.lane.stop(1.0):  # (its thread ended: links unused)
            try:
                ctx.close()  # Horovod's own links; a new world gets new ones at init()
            except Exception:  # noqa: BLE001 -- broken links close all the same
                pass
        collectives.finalize()
    init()


def run(func: Callable) -> Callable:
    """Decorator: run ``func(state, ...)`` until it returns, re-forming the world on failure.

    On HorovodInternalError: ``state.restore()`` (the last commit), re-form, ``state.sync()``,
    call again. On HostsUpdatedInterrupt: re-form keeping the current state (synced unless
    the interrupt's ``skip_sync``). After each re-forming ``state.on_reset()`` runs the reset
    callbacks. Outside ``collectives-run --elastic``, calls ``func`` once after ``sync()``.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if not _elastic.is_elastic():
            state.sync()
            return func(state, *args, **kwargs)
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                    state.save()  # a failure before the first commit rolls back to this
                return func(state, *args, **kwargs)
            except CollectivesError:  # HorovodInternalError is one: any failed collective
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
            _reset()
            state.on_reset()

    return wrapper
