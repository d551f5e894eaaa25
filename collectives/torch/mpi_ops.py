"""Horovod's tensor operations (``horovod.torch.mpi_ops``) over the collectives core.

Each operation is: check and coerce the tensor -> (autograd Function) ->
a job queued under the op's name (``_lane``) -> the negotiation
(``_negotiate``), which runs it on its thread once every rank has queued
that name, in one order on every rank -> a ``Handle`` that owns the core
request and every buffer it uses. ``*_async`` functions return the job at
once; the blocking ones wait for it. An allreduce's description (shape,
dtype, op, scale factors) is compared in the negotiation itself, so it runs
with no per-call agreement and may be fused with others agreed alongside
(``_fusion``); the other ops run their per-call agreement (``_agree``) on
the negotiating thread: one small allgather in which every rank sees every
rank's arguments, raising ``LayoutMismatch`` on every rank if they differ
(tensors of up to ``INLINE`` bytes travel inside it). A second op under a
name still in flight on this rank raises ValueError (Horovod's).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from .._core import check_root
from ._agree import LayoutMismatch, inline_bytes, reduce_inline
from ._context import CORE_DTYPES, HOLDER, as_buffer, check_tensor, current, wire_dtype
from ._join import encode_plan, join
from ._lane import RUNNING, Job, queue_call
from ._route import symmetric
from .basics import (Adasum, Average, Max, Min, Product, ReduceOp, Sum, ccl_built, cross_rank,
                     cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, init,
                     is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
                     mpi_threads_supported, nccl_built, rank, resolve_op, rocm_built, shutdown,
                     size, sycl_built)
from .compression import Compression
from .exceptions import internal_error
from .process_sets import bind_active, in_process_set, keeps_process_set, set_root
from .timeline import span

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "mpi_threads_supported", "mpi_enabled", "mpi_built",
    "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "sycl_built", "ReduceOp", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "Handle",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "barrier", "join",
    "poll", "synchronize", "LayoutMismatch",
]


def _symmetric(what: str, route: Optional[bool] = None) -> Callable:
    """Negotiated by name, and an argument error raised on one rank reaches every rank
    (see _agree.symmetric); the op runs in its process_set (see process_sets)."""
    inner = symmetric(what, lambda: current().agreement, route)
    return lambda fn: in_process_set(inner(fn))


def _check_process_set(process_set: Any) -> None:
    if process_set is None:  # the set active now: nothing to check
        return
    from .process_sets import check_process_set

    check_process_set(process_set)


# ------------------------------------------------------------------ handles

class Handle:
    """An operation in flight: owns its core requests and every buffer they use.

    ``poll(handle)`` tests it, ``synchronize(handle)`` waits and returns the
    output. The inputs stay referenced here until the operation completes.
    """

    __slots__ = ("_requests", "_output", "_finish", "_keep", "_done")

    def __init__(self, requests: Sequence[Any], output: Any,
                 finish: Optional[Callable[[], Any]] = None, keep: Any = None) -> None:
        self._requests = list(requests)
        self._output = output
        self._finish = finish
        self._keep = keep
        self._done = False

    def poll(self) -> bool:
        """True once every part has completed (synchronize then returns at once)."""
        if self._done:
            return True
        return all(r.Test() for r in self._requests)

    def wait(self) -> Any:
        """Wait for completion, run the finishing step once, return the output."""
        if self._done:
            return self._output
        try:
            for r in self._requests:
                r.Wait()
        except BaseException as exc:
            for r in self._requests:  # keep the buffers until the core is done with them
                try:
                    r.Wait()
                except Exception:
                    pass
            self._done = True
            self._keep = None
            err = internal_error(exc)  # a failed collective: Horovod's class
            if err is exc:
                raise
            raise err from exc
        self._done = True
        if self._finish is not None:
            out = self._finish()
            if out is not None:
                self._output = out
        self._keep = None
        self._requests = []
        return self._output


def poll(handle: Handle) -> bool:
    """Whether an asynchronous operation has completed.

    Args:
        handle: returned by an ``*_async`` function.

    Returns:
        True if ``synchronize(handle)`` will not block.
    """
    return handle.poll()


def synchronize(handle: Handle) -> Any:
    """Wait for an asynchronous operation and return its output.

    Args:
        handle: returned by an ``*_async`` function.

    Returns:
        The output tensor (a list for grouped operations, a pair for alltoall with splits).
    """
    if handle is None:
        return None
    ctx = HOLDER.context
    timeline = ctx.timeline if ctx is not None else None
    if timeline is None:
        return handle.wait()
    with span(timeline, "WAIT", "wait"):
        return handle.wait()


def _on_callers_stream(fn: Callable[[], Any]) -> Callable[[], Any]:
    """fn, to run on the lane with the CUDA stream current here and now: its copies,
    and the collective's wait for the caller's queued work, then follow what the
    caller queued on that stream before the call (a GPU tensor's producer)."""
    if not torch.cuda.is_initialized() or not torch.cuda.is_available():  # the cheap one first
        return fn
    stream = torch.cuda.current_stream()

    def run() -> Any:
        with torch.cuda.stream(stream):
            return fn()

    return run


def _queue(kind: str, name: Optional[str], fn: Callable[[], Any], keep: Any,
           chained: bool = False, desc: Optional[str] = None, plan: int = 0,
           fuse: Any = None, host_only: bool = False) -> Job:
    """Queue fn as the op `name` of this kind (see _negotiate; ValueError if one is in
    flight); it runs once every rank queued it. chained: fn returns a Handle, the job
    completes with it. desc: what every rank must pass alike (default: the kind alone).
    host_only: fn touches no GPU memory (no CUDA stream to carry over)."""
    return queue_call(current(), kind, name,
                      bind_active(fn if host_only else _on_callers_stream(fn)), desc, keep,
                      chained, plan, fuse)


def _check_group(tensors: Any) -> list:
    """The list of tensors of a grouped call, checked (TypeError if not)."""
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"takes a list of tensors, got {type(tensors).__name__}")
    for i, t in enumerate(tensors):
        check_tensor(t, f"tensors[{i}]")
        wire_dtype(t.dtype)
    return list(tensors)


# ----------------------------------------------------------------- allreduce

def _scale(t: torch.Tensor, factor: float) -> None:
    """t *= factor in place (integers: computed in float64, truncated back)."""
    if factor == 1.0:
        return
    if t.is_floating_point():
        t.mul_(factor)
    else:
        t.copy_(t.to(torch.float64).mul_(factor))


def _empty_like(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor of t's shape, dtype and device (empty_like: a third of the cost
    of torch.empty with the same arguments, which a small call pays)."""
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _describe(what: str, name: Optional[str], tensor: torch.Tensor, **more: Any) -> str:
    """What every rank must pass alike to one call, as text (compared across ranks)."""
    text = f"{what} shape={tuple(tensor.shape)} dtype={str(tensor.dtype)[6:]}"
    for key, value in more.items():
        text += f" {key}={value}"
    return text + (f" name={name!r}" if name is not None else "")


def _allreduce_start(tensor: torch.Tensor, output: torch.Tensor, op: ReduceOp, prescale: float,
                     postscale: float, name: Optional[str], what: str, agree: bool = True
                     ) -> Handle:
    """Queue out = op over ranks of tensor (output may be tensor itself: in place);
    agree=False: the negotiation already compared every rank's arguments (see
    _allreduce_job), so no per-call agreement. (tensor was checked when the call queued.)"""
    ctx = current()
    if op is Adasum:  # not a core op: see adasum
        from .adasum import adasum_into

        return Handle([], adasum_into(tensor, output, prescale, postscale, name,
                                      _allgather_now))
    wdt = wire_dtype(tensor.dtype)
    in_place = output is tensor
    src = tensor.detach() if tensor.requires_grad else tensor
    direct = wdt == tensor.dtype and output.is_contiguous()
    # recv: the contiguous wire-dtype buffer the core writes; send: what it reads (None: recv)
    recv = (output.detach() if output.requires_grad else output) if direct else \
        torch.empty(tensor.shape, dtype=wdt, device=tensor.device)
    if direct and not in_place and prescale == 1.0 and src.is_contiguous():
        send = src  # the zero-copy path
    else:
        if not (direct and in_place):
            recv.copy_(src)
        _scale(recv, prescale)
        send = None

    def finish() -> torch.Tensor:
        _scale(recv, postscale)
        if not direct:
            output.detach().copy_(recv)
        return output

    if RUNNING.inline and tensor.is_cpu and not (agree and ctx.size > 1):
        # its caller waits for it now, on this thread: the blocking call, rather than a
        # request the progress thread may take (two hand-offs between threads for nothing),
        # on the tensors' memory by address (numpy views cost more than the call)
        ctx.core._allreduce_at(0 if send is None else send.data_ptr(), recv.data_ptr(),
                               recv.numel(), CORE_DTYPES[recv.dtype], op.core)
        return Handle([], output, finish)
    rbuf, dt = as_buffer(recv)
    sbuf = None if send is None else as_buffer(send)[0]
    if ctx.size > 1 and agree:
        plan = encode_plan(rbuf.size, dt or rbuf.dtype.name, op.core) \
            if isinstance(rbuf, np.ndarray) else 0
        agreed = ctx.agreement.agree(what, _describe(what, name, tensor, op=op.name),
                                     inline_bytes(rbuf if sbuf is None else sbuf), extra=plan)
        if agreed.inline:
            reduce_inline(agreed, rbuf, op.core, dt)
            return Handle([], output, finish)
    req = ctx.core.iallreduce(sbuf, rbuf, op=op.core, dtype=dt)
    return Handle([req], output, finish, keep=(tensor, send, recv))


_ALLREDUCE_DESCS: dict = {}  # (shape, dtype, op, prescale, postscale, device) -> (desc, plan)


def _allreduce_job(tensor: torch.Tensor, output: torch.Tensor, op: ReduceOp, prescale: float,
                   postscale: float, name: Optional[str]) -> Job:
    """Queue an allreduce under its name with everything that must match in its description,
    and its plan (a joined rank serves it with zeros; see _join)."""
    cpu = tensor.is_cpu
    # the description and plan of every shape seen, as formatting them costs more than the
    # rest of a small call (a training step repeats the same few shapes)
    key = (tensor.shape, tensor.dtype, op.name, prescale, postscale, cpu or tensor.device.type)
    known = _ALLREDUCE_DESCS.get(key)
    if known is None:
        desc = _describe("allreduce", None, tensor, op=op.name, prescale=prescale,
                         postscale=postscale, device=tensor.device.type)
        plan = 0
        if op is not Adasum and cpu:
            wdt = wire_dtype(tensor.dtype)
            core_dt = {torch.bfloat16: "bfloat16"}.get(wdt, str(wdt)[6:])
            plan = encode_plan(tensor.numel(), core_dt, op.core)
        if len(_ALLREDUCE_DESCS) >= 4096:
            _ALLREDUCE_DESCS.clear()
        known = _ALLREDUCE_DESCS[key] = (desc, plan)
    desc, plan = known
    agree = op is Adasum
    # fuse: the negotiation may run it fused with others agreed alongside (see _fusion)
    return _queue("allreduce", name, lambda: _allreduce_start(
        tensor, output, op, prescale, postscale, name, "allreduce", agree), tensor, True,
        desc=desc, plan=plan, fuse=(tensor, output) if plan else None, host_only=cpu)


def _resolve_allreduce_op(average: Optional[bool], op: Optional[ReduceOp],
                          tensor: torch.Tensor) -> ReduceOp:
    """resolve_op, with Adasum too (checked here, before anything is sent)."""
    check_tensor(tensor)
    if op is Adasum and average is None:
        from .adasum import check

        check(tensor, current().size)
        return op
    return resolve_op(average, op)


@_symmetric("allreduce")
def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[ReduceOp] = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set: Any = None) -> Job:
    """Start an allreduce of `tensor` into a new tensor; the input is not modified.

    Args:
        tensor: a CPU tensor, same shape and dtype on every rank.
        average: deprecated; use op.
        name: a name; ranks must use the same name for the same tensor.
        op: Average (default), Sum, Min, Max, Product or Adasum (see collectives.torch.adasum).
        prescale_factor: multiply the input by this before reducing.
        postscale_factor: multiply the result by this after reducing.
        process_set: the ProcessSet to run over (default: every rank).

    Returns:
        A Handle for ``poll()`` / ``synchronize()``.
    """
    _check_process_set(process_set)
    op = _resolve_allreduce_op(average, op, tensor)
    return _allreduce_job(tensor, _empty_like(tensor), op, prescale_factor, postscale_factor,
                          name)


@_symmetric("allreduce")
def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None,
                     name: Optional[str] = None, op: Optional[ReduceOp] = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: Any = None) -> Job:
    """Start an in-place allreduce of `tensor` (arguments as allreduce_async).

    Returns:
        A Handle; ``synchronize()`` returns `tensor` holding the result.
    """
    return _allreduce_in_place(tensor, average, name, op, prescale_factor, postscale_factor,
                               process_set)


def _allreduce_in_place(tensor: torch.Tensor, average: Optional[bool], name: Optional[str],
                        op: Optional[ReduceOp], prescale: float, postscale: float,
                        process_set: Any) -> Job:
    """allreduce_async_'s body, which allreduce_ calls too (its decorators ran already)."""
    _check_process_set(process_set)
    op = _resolve_allreduce_op(average, op, tensor)
    return _allreduce_job(tensor, tensor, op, prescale, postscale, name)


@keeps_process_set
class _AllreduceFunction(torch.autograd.Function):
    """Differentiable allreduce: the gradient is the allreduce of the gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: ReduceOp, prescale: float, postscale: float,
                name: Optional[str]) -> torch.Tensor:
        ctx.op, ctx.prescale, ctx.postscale = op, prescale, postscale
        return synchronize(_allreduce_job(tensor, _empty_like(tensor), op, prescale, postscale,
                                          name))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        g = allreduce(grad.contiguous(), op=ctx.op, prescale_factor=ctx.prescale,
                      postscale_factor=ctx.postscale)
        return g, None, None, None, None


@_symmetric("allreduce", route=False)
def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression: type = Compression.none, op: Optional[ReduceOp] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Any = None) -> torch.Tensor:
    """Allreduce `tensor` into a new tensor (differentiable); the input is not modified.

    Args:
        tensor: a CPU tensor, same shape and dtype on every rank.
        average: deprecated; use op.
        name: a name; ranks must use the same name for the same tensor.
        compression: Compression.none or Compression.fp16 (applied around the wire).
        op: Average (default), Sum, Min, Max, Product or Adasum (see collectives.torch.adasum).
        prescale_factor: multiply the input by this before reducing.
        postscale_factor: multiply the result by this after reducing.
        process_set: the ProcessSet to run over (default: every rank).

    Returns:
        A tensor of the same shape and dtype as `tensor` holding the result.
    """
    _check_process_set(process_set)
    op = _resolve_allreduce_op(average, op, tensor)
    plain = compression is Compression.none  # (its compress and decompress do nothing)
    compressed, cctx = (tensor, None) if plain else compression.compress(tensor)
    if compressed.requires_grad and torch.is_grad_enabled():
        out = _AllreduceFunction.apply(compressed, op, prescale_factor, postscale_factor, name)
    else:
        out = synchronize(_allreduce_job(compressed, _empty_like(compressed), op,
                                         prescale_factor, postscale_factor, name))
    return out if plain else compression.decompress(out, cctx)


@_symmetric("allreduce", route=False)
def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[ReduceOp] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, process_set: Any = None) -> torch.Tensor:
    """Allreduce `tensor` in place (arguments as allreduce).

    Returns:
        `tensor`, holding the result.
    """
    return synchronize(_allreduce_in_place(tensor, average, name, op, prescale_factor,
                                           postscale_factor, process_set))


# ------------------------------------------------------------ grouped allreduce

def _grouped_start(tensors: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], op: ReduceOp,
                   prescale: float, postscale: float, name: Optional[str]) -> Handle:
    """One fused allreduce per wire dtype over all tensors; results land in outputs."""
    ctx = current()
    tensors = list(tensors)
    for i, t in enumerate(tensors):
        check_tensor(t, f"tensors[{i}]")
    by_dtype: dict = {}
    for t in tensors:
        wire_dtype(t.dtype)
    ctx.check_now(f"grouped_allreduce op={op.name} tensors={len(tensors)} "
                  f"{[(tuple(t.shape), str(t.dtype)[6:]) for t in tensors]} name={name!r}",
                  "grouped_allreduce")
    for i, t in enumerate(tensors):
        by_dtype.setdefault(wire_dtype(t.dtype), []).append(i)
    requests, fused = [], []
    for wdt, idx in by_dtype.items():
        flat = torch.empty(sum(tensors[i].numel() for i in idx), dtype=wdt, device=tensors[idx[0]].device)
        pos = 0
        for i in idx:
            n = tensors[i].numel()
            flat[pos:pos + n].copy_(tensors[i].detach().reshape(-1))
            pos += n
        _scale(flat, prescale)
        buf, dt = as_buffer(flat)
        requests.append(ctx.core.iallreduce(None, buf, op=op.core, dtype=dt))
        fused.append((flat, idx))

    def finish() -> list:
        for flat, idx in fused:
            _scale(flat, postscale)
            pos = 0
            for i in idx:
                n = tensors[i].numel()
                outputs[i].detach().copy_(flat[pos:pos + n].view(tensors[i].shape))
                pos += n
        return list(outputs)

    return Handle(requests, list(outputs), finish, keep=(tensors, fused))


@_symmetric("grouped_allreduce")
def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[ReduceOp] = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: Any = None) -> Job:
    """Start one fused allreduce of a list of tensors into new tensors.

    Args:
        tensors: CPU tensors; the list must match on every rank.
        average: deprecated; use op.
        name: a name for the group.
        op: Average (default), Sum, Min, Max or Product.
        prescale_factor: multiply the inputs by this before reducing.
        postscale_factor: multiply the results by this after reducing.
        process_set: the ProcessSet to run over (default: every rank).

    Returns:
        A Handle; ``synchronize()`` returns the list of results.
    """
    _check_process_set(process_set)
    op = resolve_op(average, op)
    tensors = _check_group(tensors)
    outputs = [_empty_like(t) for t in tensors]
    return _queue("grouped_allreduce", name, lambda: _grouped_start(
        tensors, outputs, op, prescale_factor, postscale_factor, name), tensors, True)


@_symmetric("grouped_allreduce")
def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[ReduceOp] = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: Any = None) -> Job:
    """Start one fused in-place allreduce of a list of tensors (arguments as grouped_allreduce_async).

    Returns:
        A Handle; ``synchronize()`` returns the same tensors, holding the results.
    """
    _check_process_set(process_set)
    op = resolve_op(average, op)
    tensors = _check_group(tensors)
    return _queue("grouped_allreduce", name, lambda: _grouped_start(
        tensors, list(tensors), op, prescale_factor, postscale_factor, name), tensors, True)


@keeps_process_set
class _GroupedAllreduceFunction(torch.autograd.Function):
    """Differentiable grouped allreduce: the gradients' grouped allreduce (as allreduce)."""

    @staticmethod
    def forward(ctx: Any, op: ReduceOp, prescale: float, postscale: float, name: Optional[str],
                *tensors: torch.Tensor) -> tuple:
        ctx.op, ctx.prescale, ctx.postscale = op, prescale, postscale
        outputs = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]
        return tuple(synchronize(_grouped_start(list(tensors), outputs, op, prescale, postscale,
                                                name)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        g = grouped_allreduce([x.contiguous() for x in grads], op=ctx.op,
                              prescale_factor=ctx.prescale, postscale_factor=ctx.postscale)
        return (None, None, None, None) + tuple(g)


def _grouped_allreduce_autograd(tensors: list, op: ReduceOp, prescale: float, postscale: float,
                               name: Optional[str]) -> list:
    """grouped_allreduce through autograd (grouped_allreduce calls this when a tensor
    requires grad)."""
    return list(_GroupedAllreduceFunction.apply(op, prescale, postscale, name, *tensors))


@_symmetric("grouped_allreduce")
def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                      name: Optional[str] = None, compression: type = Compression.none,
                      op: Optional[ReduceOp] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: Any = None) -> list:
    """Allreduce a list of tensors in one fused operation; inputs are not modified.

    Args:
        tensors: CPU tensors; the list must match on every rank.
        average: deprecated; use op.
        name: a name for the group.
        compression: Compression.none or Compression.fp16.
        op: Average (default), Sum, Min, Max or Product.
        prescale_factor: multiply the inputs by this before reducing.
        postscale_factor: multiply the results by this after reducing.
        process_set: the ProcessSet to run over (default: every rank).

    Returns:
        A list of result tensors, one per input.
    """
    pairs = [compression.compress(t) for t in tensors]
    if torch.is_grad_enabled() and any(p[0].requires_grad for p in pairs):
        _check_process_set(process_set)
        outs = _grouped_allreduce_autograd([p[0] for p in pairs], resolve_op(average, op),
                                          prescale_factor, postscale_factor, name)
        return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]
    _check_process_set(process_set)
    compressed = [p[0] for p in pairs]
    outs = synchronize(_grouped_start(compressed, [_empty_like(t) for t in compressed],
                                      resolve_op(average, op), prescale_factor,
                                      postscale_factor, name))
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


@_symmetric("grouped_allreduce")
def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                       name: Optional[str] = None, op: Optional[ReduceOp] = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = None) -> list:
    """Allreduce a list of tensors in place in one fused operation.

    Returns:
        The same tensors, holding the results.
    """
    _check_process_set(process_set)
    return synchronize(_grouped_start(tensors, list(tensors), resolve_op(average, op),
                                      prescale_factor, postscale_factor, name))


# ----------------------------------------------------------------- allgather

def _allgather_now(tensor: torch.Tensor, what: str = "allgather") -> tuple[torch.Tensor, np.ndarray]:
    """Concatenate every rank's tensor along dim 0 (different dim 0 allowed); also the dim-0 sizes."""
    ctx = current()
    check_tensor(tensor)
    src = tensor.detach().reshape(tuple(tensor.shape) if tensor.dim() else (1,))
    wdt = wire_dtype(src.dtype)
    if ctx.size == 1:
        return src.clone(), np.array([src.shape[0]])
    send = src if (wdt == src.dtype and src.is_contiguous()) else src.to(wdt).contiguous()
    sbuf = as_buffer(send)[0]
    # dimension 0 may differ between ranks: it travels as the slot's extra number
    agreed = ctx.agreement.agree(
        what, f"{what} rows of shape {tuple(src.shape[1:])} dtype={str(src.dtype)[6:]}",
        inline_bytes(sbuf), extra=src.shape[0])
    dims = [int(d) for d in agreed.extra]
    row = int(np.prod(src.shape[1:], dtype=np.int64))
    sizes = [d * row * send.element_size() for d in dims]
    if min(dims) < 0 or (agreed.inline and list(agreed.nbytes) != sizes):
        raise LayoutMismatch(f"{what}: ranks sent inconsistent row counts {dims} "
                             f"({list(agreed.nbytes)} bytes)")
    out = torch.empty((sum(dims),) + tuple(src.shape[1:]), dtype=wdt, device=src.device)
    rbuf, dt = as_buffer(out)
    if agreed.inline:
        flat = rbuf.reshape(-1).view(np.uint8)
        pos = 0
        for r in range(ctx.size):
            part = agreed.payload(r)
            flat[pos:pos + part.size] = part
            pos += part.size
    else:
        ctx.core.allgatherv(sbuf, rbuf, [d * row for d in dims], None, None, dt)
    if wdt != src.dtype:
        out = out.to(src.dtype)
    return out, np.array(dims)


@keeps_process_set
class _AllgatherFunction(torch.autograd.Function):
    """Differentiable allgather: the gradient is this rank's slice of the gradient averaged
    over ranks (Horovod's HorovodAllgather.backward)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: Optional[str]) -> torch.Tensor:
        out, dims = _allgather_now(tensor)
        r = current().rank
        ctx.offset, ctx.dim = int(dims[:r].sum()), int(dims[r])
        ctx.shape = tensor.shape
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        g = allreduce(grad.contiguous(), op=Average)
        return g.narrow(0, ctx.offset, ctx.dim).reshape(ctx.shape), None


@_symmetric("allgather")
def allgather(tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = None
              ) -> torch.Tensor:
    """Concatenate every rank's tensor along dimension 0 (differentiable).

    Args:
        tensor: a CPU tensor; dtype and all dimensions but the first must match across ranks.
        name: a name for the operation.
        process_set: the ProcessSet to run over (default: every rank).

    Returns:
        A tensor whose dimension 0 is the sum of every rank's dimension 0, in rank order.
    """
    _check_process_set(process_set)
    check_tensor(tensor)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _AllgatherFunction.apply(tensor, name)
    return _allgather_now(tensor)[0]


# ----------------------------------------------------------------- broadcast

def _broadcast_into(tensor: torch.Tensor, output: torch.Tensor, root_rank: int,
                    name: Optional[str]) -> torch.Tensor:
    """output = root's tensor on every rank (output may be tensor itself)."""
    ctx = current()
    check_tensor(tensor)
    root_rank = set_root(ctx, root_rank)  # a global rank: its rank in the active set
    wdt = wire_dtype(tensor.dtype)
    direct = wdt == tensor.dtype and output.is_contiguous()
    buf = output if direct else tensor.detach().to(wdt).contiguous()
    if direct and output is not tensor:
        output.detach().copy_(tensor.detach())
    b, dt = as_buffer(buf)
    if ctx.size > 1:
        agreed = ctx.agreement.agree("broadcast", _describe("broadcast", name, tensor,
                                                            root=root_rank), inline_bytes(b))
        if agreed.inline:
            b.reshape(-1).view(np.uint8)[:] = agreed.payload(root_rank)
        else:
            ctx.core.broadcast(b, root_rank, None, dt)
    if buf is not output:
        output.detach().copy_(buf)
    return output


@keeps_process_set
class _BroadcastFunction(torch.autograd.Function):
    """Differentiable broadcast: the root gets the gradient averaged over ranks, the
    others zeros (Horovod's HorovodBroadcast.backward)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: Optional[str]
                ) -> torch.Tensor:
        ctx.is_root = HOLDER.context is not None and HOLDER.context.rank == root_rank
        return _broadcast_into(tensor, _empty_like(tensor), root_rank,
                               name)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        g = allreduce(grad.contiguous(), op=Average)
        if not ctx.is_root:
            g = g * 0
        return g, None, None


@_symmetric("broadcast")
def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: Any = None) -> torch.Tensor:
    """Root's tensor on every rank, in a new tensor (differentiable); the input is not modified.

    Args:
        tensor: a CPU tensor, same shape and dtype on every rank.
        root_rank: the rank whose value is sent.
        name: a name for the operation.
        process_set: the ProcessSet to run over (default: every rank).

    Returns:
        A tensor holding root's value.
    """
    _check_process_set(process_set)
    check_tensor(tensor)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _BroadcastFunction.apply(tensor, root_rank, name)
    return _broadcast_into(tensor, _empty_like(tensor), root_rank, name)


@_symmetric("broadcast")
def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: Any = None) -> torch.Tensor:
    """Overwrite `tensor` with root's value on every rank.

    Args:
        tensor: a CPU tensor, same shape and dtype on every rank.
        root_rank: the rank whose value is sent.
        name: a name for the operation.
        process_set: the ProcessSet to run over (default: every rank).

    Returns:
        `tensor`, holding root's value.
    """
    _check_process_set(process_set)
    with torch.no_grad():
        return _broadcast_into(tensor, tensor, root_rank, name)


@_symmetric("broadcast")
def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: Any = None) -> Job:
    """Start a broadcast into a new tensor on the async lane (see _lane); returns at once.

    Returns:
        A handle; ``synchronize()`` returns the new tensor.
    """
    _check_process_set(process_set)
    return _broadcast_queue(tensor, _empty_like(tensor), root_rank, name)


@_symmetric("broadcast")
def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: Any = None) -> Job:
    """Start an in-place broadcast on the async lane (see _lane); returns at once.

    Returns:
        A handle; ``synchronize()`` returns `tensor`.
    """
    _check_process_set(process_set)
    return _broadcast_queue(tensor, tensor, root_rank, name)


def _broadcast_queue(tensor: torch.Tensor, output: torch.Tensor, root_rank: int,
                     name: Optional[str]) -> Job:
    """Check the arguments here, run the broadcast on the lane."""
    ctx = current()
    check_tensor(tensor)
    wire_dtype(tensor.dtype)
    set_root(ctx, root_rank)  # checked here; _broadcast_into maps it in the set
    root_rank = check_root(root_rank, HOLDER.context.size, "root_rank")
    return _queue("broadcast", name, lambda: _broadcast_into(tensor, output, root_rank, name),
                  tensor)


# ------------------------------------------------------------ barrier, join

@_symmetric("barrier")
def barrier(process_set: Any = None) -> None:
    """Return once every rank has called barrier (queued allreduces finish first)."""
    _check_process_set(process_set)
    ctx = current()
    if ctx.size > 1:  # the agreement's allgather is a barrier that also catches a rank elsewhere
        ctx.check_now("barrier", "barrier")
    else:  # the core's barrier waits for the queued (async) calls, as the docstring says
        ctx.lane.drain()
        ctx.core.barrier()
