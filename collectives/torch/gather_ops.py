"""Horovod's alltoall, reducescatter and grouped allgather/reducescatter, with autograd,
and their ``*_async`` forms.

Split from ``mpi_ops`` (which keeps allreduce, allgather and broadcast). Every
operation is queued under its name and runs once every rank queued it
(``_negotiate``), starting with the per-call agreement (``_agree``), as in
``mpi_ops``. The ``*_async`` functions check their arguments on the caller's
thread (a bad argument raises there, before anything is queued, and the other
ranks' op fails naming it), then queue the op and return a handle at once:
``poll()`` is False until it has run.

Gradients follow Horovod's autograd functions exactly:

- alltoall: the gradient is the alltoall of the gradient, sent back along the
  received splits;
- reducescatter: the allgather of the gradient, times the rank count for Sum
  (none for Average), times the pre- and postscale factors;
- grouped allgather/reducescatter: each tensor as its single form.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from ._context import as_buffer, check_tensor, current, wire_dtype
from ._lane import Job
from .basics import ReduceOp, Sum, resolve_op
from .compression import Compression
from .process_sets import keeps_process_set
from .mpi_ops import _allgather_now, _check_process_set, _queue, _scale, _symmetric, allgather

__all__ = [
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "allgather_async",
    "grouped_allgather", "grouped_allgather_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "sparse_allreduce_async",
]

Splits = Union[None, Sequence[int], torch.Tensor]


# ------------------------------------------------------------------- alltoall

def _alltoall_args(tensor: torch.Tensor, splits: Splits) -> tuple[torch.Tensor, list]:
    """The rows to send (dim 0) and the row count for each destination; ValueError if bad."""
    n = current().size
    check_tensor(tensor)
    src = tensor.detach().reshape(tuple(tensor.shape) if tensor.dim() else (1,))
    if splits is None:
        if src.shape[0] % n:
            raise ValueError(f"alltoall: dim 0 ({src.shape[0]}) is not divisible by {n} ranks; "
                             "pass splits")
        return src, [src.shape[0] // n] * n
    mine = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(mine) != n or any(s < 0 for s in mine) or sum(mine) != src.shape[0]:
        raise ValueError(f"alltoall: splits {mine} must be {n} non-negative row counts "
                         f"summing to dim 0 ({src.shape[0]})")
    return src, mine


def _alltoall_run(src: torch.Tensor, mine: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Send row block j of src to rank j; the received blocks in rank order and their
    row counts. Built from allgatherv (every rank receives all data and keeps its
    blocks): correct for any splits, not bandwidth-optimal."""
    ctx = current()
    n = ctx.size
    table = np.zeros(n * n, dtype=np.int64)
    if n > 1:
        ctx.check_now(f"alltoall rows of shape {tuple(src.shape[1:])} "
                      f"dtype={str(src.dtype)[6:]}", "alltoall")
        ctx.core.allgatherv(np.array(mine, dtype=np.int64), table, [n] * n)
    else:
        table[:] = mine
    table = table.reshape(n, n)  # table[i][j]: rows rank i sends to rank j
    gathered, dims = _allgather_now(src, "alltoall")
    parts, base = [], 0
    for i in range(n):
        off = base + int(table[i, :ctx.rank].sum())
        parts.append(gathered[off:off + int(table[i, ctx.rank])])
        base += int(dims[i])
    out = torch.cat(parts) if parts else gathered[:0]
    return out, torch.tensor(table[:, ctx.rank].copy(), dtype=torch.int32)


@keeps_process_set
class _AlltoallFunction(torch.autograd.Function):
    """Differentiable alltoall: the gradient goes back along the received splits."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Splits, name: Optional[str]) -> Any:
        out, received = _alltoall_run(*_alltoall_args(tensor, splits))
        ctx.received, ctx.shape = received, tensor.shape
        if splits is None:
            return out
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *dead: Any) -> tuple:
        g, _ = alltoall(grad.contiguous(), splits=ctx.received)
        return g.reshape(ctx.shape), None, None


@_symmetric("alltoall")
def alltoall(tensor: torch.Tensor, splits: Splits = None, name: Optional[str] = None,
             process_set: Any = None) -> Any:
    """Send row block j of `tensor` to rank j; receive one block from every rank
    (differentiable: the gradient is sent back along the received splits).

    Args:
        tensor: a CPU tensor; dims after the first must match across ranks.
        splits: rows for each destination rank (sum = dim 0); None: dim 0 split evenly.
        name: a name for the operation.
        process_set: the ProcessSet to run over (default: every rank).

    Returns:
        The received blocks concatenated in rank order; with `splits` given, the pair
        (output, received_splits) where received_splits[i] is the rows from rank i.
    """
    _check_process_set(process_set)
    check_tensor(tensor)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _AlltoallFunction.apply(tensor, splits, name)
    out, received = _alltoall_run(*_alltoall_args(tensor, splits))
    return out if splits is None else (out, received)


@_symmetric("alltoall")
def alltoall_async(tensor: torch.Tensor, splits: Splits = None, name: Optional[str] = None,
                   process_set: Any = None) -> Job:
    """Start an alltoall (see alltoall), negotiated by name; returns at once.

    Returns:
        A handle; ``synchronize()`` returns the pair (output, received_splits) as Horovod's.
    """
    _check_process_set(process_set)
    src, mine = _alltoall_args(tensor, splits)
    return _queue("alltoall", name, lambda: _alltoall_run(src, mine), tensor)


# -------------------------------------------------------------- reducescatter

def _check_scatterable(tensor: torch.Tensor, what: str = "reducescatter") -> None:
    """ValueError for a 0-dim tensor (no dimension 0 to scatter), as Horovod's."""
    check_tensor(tensor)
    if tensor.dim() == 0:
        raise ValueError(f"{what} does not support scalar (0-dim) tensors: there is no "
                         "dimension 0 to scatter")


def _reducescatter_run(tensor: torch.Tensor, op: ReduceOp, prescale: float, postscale: float,
                       name: Optional[str], compression: type = Compression.none
                       ) -> torch.Tensor:
    """Reduce over ranks; rank i gets the i-th block of rows (the first dim0 % size
    ranks get one row more)."""
    ctx = current()
    check_tensor(tensor)
    ctx.check_now(("reducescatter", name, tuple(tensor.shape), str(tensor.dtype), op.name),
                  "reducescatter")
    compressed, cctx = compression.compress(tensor.detach())
    src = compressed.reshape(tuple(compressed.shape) if compressed.dim() else (1,))
    n, d0 = ctx.size, src.shape[0]
    rows = [d0 // n + (1 if i < d0 % n else 0) for i in range(n)]
    block = rows[0]
    wdt = wire_dtype(src.dtype)
    if rows.count(block) == n and wdt == src.dtype and src.is_contiguous() and prescale == 1:
        send = src
    else:
        send = torch.zeros((n * block,) + tuple(src.shape[1:]), dtype=wdt, device=src.device)
        off = 0
        for i in range(n):
            send[i * block:i * block + rows[i]].copy_(src[off:off + rows[i]])
            off += rows[i]
        _scale(send, prescale)
    recv = torch.empty((block,) + tuple(src.shape[1:]), dtype=wdt, device=src.device)
    rbuf, dt = as_buffer(recv)
    if n > 1:
        ctx.core.reduce_scatter_block(as_buffer(send)[0], rbuf, op.core, None, dt)
    else:
        recv.copy_(send)
    out = recv[:rows[ctx.rank]]
    _scale(out, postscale)
    if wdt != src.dtype:
        out = out.to(src.dtype)
    return compression.decompress(out, cctx)


@keeps_process_set
class _ReducescatterFunction(torch.autograd.Function):
    """Differentiable reducescatter: the gradient is the allgather of the gradient,
    scaled as Horovod's (times the rank count for Sum, times both scale factors)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: ReduceOp, prescale: float, postscale: float,
                name: Optional[str], compression: type) -> torch.Tensor:
        ctx.op, ctx.factor, ctx.shape = op, prescale * postscale, tensor.shape
        return _reducescatter_run(tensor, op, prescale, postscale, name, compression)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        if ctx.op.name not in ("Sum", "Average"):
            raise NotImplementedError(f"reducescatter: no gradient for op={ctx.op.name} "
                                      "(Horovod differentiates Sum and Average)")
        g = grad.detach().clone(memory_format=torch.contiguous_format)
        _scale(g, ctx.factor * (current().size if ctx.op is Sum else 1))
        return allgather(g).reshape(ctx.shape), None, None, None, None, None


@_symmetric("reducescatter")
def reducescatter(tensor: torch.Tensor, name: Optional[str] = None,
                  compression: type = Compression.none, op: Optional[ReduceOp] = None,
                  process_set: Any = None, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce `tensor` over ranks and give rank i the i-th block of rows of the result
    (differentiable: the gradient is the allgather of the gradient, as Horovod's).

    Dimension 0 is split as evenly as possible; the first (dim0 % size) ranks
    get one row more.

    Args:
        tensor: a CPU tensor, same shape and dtype on every rank.
        name: a name for the operation.
        compression: Compression.none or Compression.fp16.
        op: Average (default) or Sum (Min, Max, Product also work, without gradient).
        process_set: the ProcessSet to run over (default: every rank).
        prescale_factor: multiply the input by this before reducing.
        postscale_factor: multiply the result by this after reducing.

    Returns:
        This rank's block of the reduced tensor.
    """
    _check_process_set(process_set)
    op = resolve_op(None, op)
    _check_scatterable(tensor)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _ReducescatterFunction.apply(tensor, op, prescale_factor, postscale_factor, name,
                                            compression)
    return _reducescatter_run(tensor, op, prescale_factor, postscale_factor, name, compression)


@_symmetric("reducescatter")
def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None,
                        op: Optional[ReduceOp] = None, process_set: Any = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Job:
    """Start a reducescatter (see reducescatter) on the async lane; returns at once.

    Returns:
        A handle; ``synchronize()`` returns this rank's block.
    """
    _check_process_set(process_set)
    op = resolve_op(None, op)
    _check_scatterable(tensor)
    return _queue("reducescatter", name,
                  lambda: _reducescatter_run(tensor, op, prescale_factor, postscale_factor, name),
                  tensor)


# ------------------------------------------------------------------ allgather

@_symmetric("allgather")
def allgather_async(tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = None
                    ) -> Job:
    """Start an allgather (see allgather) on the async lane; returns at once.

    Returns:
        A handle; ``synchronize()`` returns the gathered tensor.
    """
    _check_process_set(process_set)
    check_tensor(tensor)
    wire_dtype(tensor.dtype)
    return _queue("allgather", name, lambda: _allgather_now(tensor)[0], tensor)


def _check_list(tensors: Any, what: str) -> list:
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{what} takes a list of tensors, got {type(tensors).__name__}")
    for i, t in enumerate(tensors):
        check_tensor(t, f"{what} tensor {i}")
        wire_dtype(t.dtype)
    return list(tensors)


@_symmetric("grouped_allgather")
def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: Any = None) -> list:
    """Allgather each tensor of a list (differentiable, each as allgather).

    Args:
        tensors: CPU tensors; the list must match across ranks except each dim 0.
        name: a name for the group.
        process_set: the ProcessSet to run over (default: every rank).

    Returns:
        A list: each tensor concatenated over ranks along dimension 0.
    """
    _check_process_set(process_set)
    return [allgather(t) for t in _check_list(tensors, "grouped_allgather")]


@_symmetric("grouped_allgather")
def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                            process_set: Any = None) -> Job:
    """Start a grouped allgather on the async lane; returns at once.

    Returns:
        A handle; ``synchronize()`` returns the list of gathered tensors.
    """
    _check_process_set(process_set)
    tensors = _check_list(tensors, "grouped_allgather")
    return _queue("grouped_allgather", name,
                  lambda: [_allgather_now(t)[0] for t in tensors], tensors)


@_symmetric("grouped_reducescatter")
def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                          compression: type = Compression.none, op: Optional[ReduceOp] = None,
                          process_set: Any = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list:
    """Reducescatter each tensor of a list (differentiable, each as reducescatter).

    Args:
        tensors: CPU tensors; the list must match across ranks.
        name: a name for the group.
        compression: Compression.none or Compression.fp16.
        op: Average (default) or Sum.
        process_set: the ProcessSet to run over (default: every rank).
        prescale_factor: multiply the inputs by this before reducing.
        postscale_factor: multiply the results by this after reducing.

    Returns:
        A list: this rank's block of each reduced tensor.
    """
    _check_process_set(process_set)
    op = resolve_op(None, op)
    tensors = _check_list(tensors, "grouped_reducescatter")
    for i, t in enumerate(tensors):  # all of them before the first is sent
        _check_scatterable(t, f"grouped_reducescatter tensor {i}")
    return [reducescatter(t, None, compression, op, None, prescale_factor, postscale_factor)
            for t in tensors]


@_symmetric("grouped_reducescatter")
def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                                op: Optional[ReduceOp] = None, process_set: Any = None,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0
                                ) -> Job:
    """Start a grouped reducescatter on the async lane; returns at once.

    Returns:
        A handle; ``synchronize()`` returns the list of this rank's blocks.
    """
    _check_process_set(process_set)
    op = resolve_op(None, op)
    tensors = _check_list(tensors, "grouped_reducescatter")
    for i, t in enumerate(tensors):
        _check_scatterable(t, f"grouped_reducescatter tensor {i}")
    return _queue("grouped_reducescatter", name,
                  lambda: [_reducescatter_run(t, op, prescale_factor, postscale_factor, None)
                           for t in tensors], tensors)


@_symmetric("sparse_allreduce")
def sparse_allreduce_async(tensor: torch.Tensor, name: Optional[str] = None,
                           op: Optional[ReduceOp] = None, process_set: Any = None) -> Job:
    """Start the allreduce of a sparse COO tensor on the async lane (Horovod's: the
    indices and the values of every rank are allgathered; entries at the same index
    are not merged, as torch's sparse sum does not merge them either).

    Args:
        tensor: a sparse COO CPU tensor of the same dense shape on every rank.
        name: a name for the operation.
        op: Average (default: the values divided by the rank count) or Sum.
        process_set: the ProcessSet to run over (default: every rank).

    Returns:
        A handle; ``synchronize()`` returns the sparse result (uncoalesced).
    """
    _check_process_set(process_set)
    op = resolve_op(None, op)
    if op.name not in ("Sum", "Average"):
        raise ValueError(f"sparse_allreduce_async: op must be Sum or Average, got {op.name}")
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        raise TypeError("sparse_allreduce_async takes a sparse COO tensor")
    indices = tensor._indices().t().contiguous()  # one row per entry, so dim 0 concatenates
    values = tensor._values().contiguous()
    check_tensor(values, "values")
    wire_dtype(values.dtype)
    shape = tensor.shape

    def run() -> torch.Tensor:
        ctx = current()
        ctx.check_now(f"sparse_allreduce shape={tuple(shape)} dtype={str(values.dtype)[6:]} "
                      f"op={op.name} name={name!r}", "sparse_allreduce")
        idx = _allgather_now(indices, "sparse_allreduce")[0]
        vals = _allgather_now(values, "sparse_allreduce")[0]
        if op.name == "Average":
            vals = vals / ctx.size
        return torch.sparse_coo_tensor(idx.t(), vals, shape)

    return _queue("sparse_allreduce", name, run, tensor)
