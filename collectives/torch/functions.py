"""Helpers built on the tensor operations: parameters, optimizer state, Python objects.

``broadcast_parameters`` and ``broadcast_optimizer_state`` pack tensors of one
dtype into one buffer and broadcast it once (fusion), so a model with hundreds
of parameters costs a few round trips, not hundreds. Before the data, one
small allgather compares every rank's (name, shape, dtype) list (see _agree),
so a rank with a different model gets a clear error instead of garbage, and a
rank whose arguments are invalid raises while the others get a LayoutMismatch
naming it, instead of waiting for it.
"""
from __future__ import annotations

import collections.abc
from typing import Any, Optional, Sequence

import torch

from ..rendezvous.safe_pickle import allow as _plain
from ._route import symmetric
from ._context import as_buffer, check_tensor, current, wire_dtype
from .process_sets import check_process_set, current_world, in_process_set, set_root

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "allgather_object"]


def _broadcast_fused_(named: Sequence[tuple[str, torch.Tensor]], root_rank: int, what: str) -> None:
    """Overwrite every tensor with root's value: one broadcast per wire dtype."""
    ctx = current()
    root_rank = set_root(ctx, root_rank)  # a global rank: its rank in the active set
    for name, t in named:
        check_tensor(t, f"{what} {name!r}")
    ctx.check_now((what, root_rank, tuple((n, tuple(t.shape), str(t.dtype)) for n, t in named)),
                  what)
    if ctx.size == 1 or not named:
        return
    groups: dict = {}
    for _, t in named:
        groups.setdefault(wire_dtype(t.dtype), []).append(t)
    with torch.no_grad():
        for wdt, tensors in groups.items():
            # One host tensor: no packing copy. GPU tensors go through the host
            # pack, as every rank does the same then (a rank restoring optimizer
            # state holds host placeholders where the root holds GPU tensors).
            if len(tensors) == 1 and tensors[0].dtype == wdt and tensors[0].is_contiguous() \
                    and tensors[0].device.type == "cpu":
                buf, dt = as_buffer(tensors[0])
                ctx.core.broadcast(buf, root_rank, None, dt)
                continue
            flat = torch.empty(sum(t.numel() for t in tensors), dtype=wdt)
            pos = 0
            for t in tensors:
                flat[pos:pos + t.numel()].copy_(t.reshape(-1))
                pos += t.numel()
            buf, dt = as_buffer(flat)
            ctx.core.broadcast(buf, root_rank, None, dt)
            if ctx.rank != root_rank:
                pos = 0
                for t in tensors:
                    t.copy_(flat[pos:pos + t.numel()].view(t.shape))
                    pos += t.numel()


@in_process_set
@symmetric("broadcast_parameters", lambda: current().agreement)
def broadcast_parameters(params: Any, root_rank: int, process_set: Any = None) -> None:
    """Overwrite every rank's parameters (or any named tensors) with root's, in place.

    Args:
        params: ``model.state_dict()``, ``model.named_parameters()``, or a list of
            (name, tensor) pairs; dicts are broadcast in sorted-name order.
        root_rank: the (global) rank whose values are sent.
        process_set: the ProcessSet to run over (default: every rank).
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, collections.abc.Iterable):
        items = list(params)
    else:
        raise ValueError(f"invalid params of type {type(params).__name__}")
    named = []
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise ValueError("params must be a dict or a list of (name, tensor) pairs")
        name, p = item
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"params entry {name!r} is {type(p).__name__}, not a tensor")
        named.append((str(name), p))
    _broadcast_fused_(named, root_rank, "broadcast_parameters")


def _split_state(obj: Any, tensors: list) -> Any:
    """Replace every tensor in a nested structure by a placeholder; collect the tensors."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TensorSlot(len(tensors) - 1, tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return {k: _split_state(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_split_state(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_split_state(v, tensors) for v in obj)
    return obj


def _fill_state(obj: Any, tensors: Sequence[torch.Tensor]) -> Any:
    """Inverse of _split_state."""
    if isinstance(obj, _TensorSlot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _fill_state(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill_state(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_fill_state(v, tensors) for v in obj)
    return obj


@_plain  # travels in broadcast_optimizer_state's skeleton, also without a job secret
class _TensorSlot:
    """Where a tensor sat in an optimizer state (index, shape, dtype)."""

    def __init__(self, index: int, shape: tuple, dtype: torch.dtype) -> None:
        self.index = index
        self.shape = shape
        self.dtype = dtype


@in_process_set
@symmetric("broadcast_optimizer_state", lambda: current().agreement)
def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: Any = None, process_set: Any = None) -> None:
    """Make every rank's optimizer state and hyperparameters equal to root's.

    Works whether or not the state is populated yet (e.g. Adam before its
    first step, or when only root loaded a checkpoint): root's state
    structure travels as a pickled skeleton, its tensors in fused broadcasts,
    and every rank loads the result with ``load_state_dict``. Unlike Horovod,
    no dummy step is taken, so an empty state stays empty and training
    matches a single process exactly.

    Args:
        optimizer: a torch optimizer or a DistributedOptimizer.
        root_rank: the (global) rank whose state is sent.
        model: unused (Horovod's signature).
        process_set: the ProcessSet to run over (default: every rank).
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    me = current_world().rank  # root_rank is a global rank, on a process set too
    tensors: list = []
    skeleton = _split_state(optimizer.state_dict(), tensors) if me == root_rank else None
    skeleton = broadcast_object(skeleton, root_rank, name="broadcast_optimizer_state")
    if me != root_rank:
        slots: list = []
        _collect_slots(skeleton, slots)
        slots.sort(key=lambda s: s.index)
        tensors = [torch.empty(s.shape, dtype=s.dtype) for s in slots]
    named = [(f"state.{i}", t if t.is_contiguous() else t.contiguous()) for i, t in
             enumerate(tensors)]
    _broadcast_fused_(named, root_rank, "broadcast_optimizer_state")
    if me != root_rank:
        optimizer.load_state_dict(_fill_state(skeleton, [t for _, t in named]))


def _collect_slots(obj: Any, out: list) -> None:
    if isinstance(obj, _TensorSlot):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect_slots(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect_slots(v, out)


@in_process_set
@symmetric("broadcast_object", lambda: current().agreement)
def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: Any = None) -> Any:
    """Root's Python object on every rank (pickled; tensors included).

    Args:
        obj: any picklable object (ignored on ranks other than root).
        root_rank: the rank whose object is sent.
        name: a name for the operation (unused).
        process_set: the ProcessSet to run over (default: every rank).

    Returns:
        Root's object (on root: `obj` itself).
    """
    ctx = current()
    check_process_set(process_set)
    root_rank = set_root(ctx, root_rank)
    ctx.check_now(f"broadcast_object root={root_rank}", "broadcast_object")
    return ctx.comm.bcast(obj, root_rank)


@in_process_set
@symmetric("allgather_object", lambda: current().agreement)
def allgather_object(obj: Any, name: Optional[str] = None, process_set: Any = None) -> list:
    """Every rank's Python object, in rank order (pickled).

    Args:
        obj: any picklable object.
        name: a name for the operation (unused).
        process_set: the ProcessSet to run over (default: every rank).

    Returns:
        A list with one object per rank.
    """
    check_process_set(process_set)
    return current().comm.allgather(obj)

