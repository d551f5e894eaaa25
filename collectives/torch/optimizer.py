"""DistributedOptimizer: gradients allreduced while backward runs (Horovod's design).

Parameters are split into buckets once, at construction, in a fixed order
that every rank computes identically: parameters in reverse registration
order (roughly the order backward produces their gradients), a new bucket
when the dtype changes or the bucket would exceed the fusion threshold
(``COLLECTIVES_FUSION_THRESHOLD``, default 128 MiB; 0 = one parameter per
bucket) or a quarter of the model (but not below 1 MiB, so small models
keep one bucket), or as given by ``groups``. A hook after gradient accumulation
(``register_post_accumulate_grad_hook``) marks a parameter ready; bucket k is
launched once all its gradients are ready and buckets 0..k-1 are launched:
queued as an allreduce named after its first parameter (``_negotiate``), run
as one non-blocking core allreduce once every rank queued it (a rank in
``join()`` serves it with zeros). ``step()`` launches what is left and waits.

A bucket of one parameter is reduced in place in ``p.grad`` (no copy); larger
buckets are packed into a fusion buffer kept for the next step.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator, Optional

import torch

from ..elastic import worker as _elastic
from .._core import CollectivesError
from ._context import as_buffer, check_tensor, current, wire_dtype
from .compression import Compression
from .basics import Adasum, Average, ReduceOp, Sum
from ._join import encode_plan
from ._lane import Launched, queue_call, run_call
from .exceptions import internal_error
from .mpi_ops import _scale
from .process_sets import ProcessSet, in_process_set, set_context

__all__ = ["DistributedOptimizer"]

OVERLAP_BUCKETS = 4  # aim for this many buckets per model, for overlap with backward
MIN_BUCKET_BYTES = 1 << 20  # ... but never split below this (latency beats overlap there)


class _Bucket:
    """Parameters reduced by one allreduce; fixed at construction."""

    def __init__(self, index: int, params: list, dtype: torch.dtype) -> None:
        self.index = index
        self.params = params
        self.dtype = dtype  # the wire dtype (after compression and widening)
        self.numel = sum(p.numel() for p in params)
        self.ready = 0
        self.flat: Optional[torch.Tensor] = None  # fusion buffer, allocated on first use
        self.request: Any = None
        self.target: Optional[torch.Tensor] = None  # what the core writes: flat or p.grad
        self.contexts: list = []


class _DistributedOptimizer:
    """Mixin placed before the wrapped optimizer's class (see DistributedOptimizer)."""

    def __init__(self, params: Any, named_parameters: Any, compression: Any,
                 backward_passes_per_step: int, op: ReduceOp, gradient_predivide_factor: float,
                 groups: Any, sparse_as_dense: bool) -> None:
        super().__init__(params)
        ctx = current()
        if op is Adasum:
            raise NotImplementedError("collectives.torch: Adasum is not supported")
        if op not in (Average, Sum):
            raise ValueError(f"DistributedOptimizer supports op=Average or Sum, got {op!r}")
        if gradient_predivide_factor != 1.0 and op is not Average:
            raise ValueError("gradient_predivide_factor is only supported with op=Average")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._compression = compression
        self._op = op
        self._predivide = float(gradient_predivide_factor)
        self._sparse_as_dense = sparse_as_dense
        self._sparse: list = []  # parameters whose sparse gradients go at synchronize()
        self._densified: set = set()  # ids of sparse gradients reduced dense (sparse_as_dense)
        self.backward_passes_per_step = int(backward_passes_per_step)
        names = self._check_names(named_parameters)
        order = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        seen: set = set()
        order = [p for p in order if not (id(p) in seen or seen.add(id(p)))]
        self._buckets = self._make_buckets(order[::-1], groups, ctx.fusion_threshold)
        self._bucket_of = {id(p): b for b in self._buckets for p in b.params}
        self._delay = {id(p): self.backward_passes_per_step for p in order}
        self._next = 0
        self._launched = 0
        self._synchronized = False
        self._should_synchronize = True
        layout = tuple((b.index, str(b.dtype), tuple((names.get(id(p), "?"), tuple(p.shape),
                                                      str(p.dtype)) for p in b.params))
                       for b in self._buckets)
        if not _elastic.is_elastic():  # (a worker joining an elastic job builds its
            # optimizer while the others train: they would not be there to agree)
            key = ("DistributedOptimizer", op.name, self._predivide,
                   self.backward_passes_per_step, compression.__name__, layout)
            run_call(ctx, "DistributedOptimizer", None,
                     lambda: ctx.check_now(key, "DistributedOptimizer"))
        self._names = names
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in order]

    @property
    def _ctx(self) -> Any:
        """The context the gradients are averaged in: the process set's (resolved on every
        use, so a removed set raises ValueError), else the world's now (after an elastic
        re-forming: the new world's)."""
        ps = getattr(self, "_process_set", None)  # set by DistributedOptimizer after __init__
        return current() if ps is None else set_context(ps)

    # -- construction ----------------------------------------------------------
    def _check_names(self, named_parameters: Any) -> dict:
        if named_parameters is not None:
            named = list(named_parameters)
        else:
            named = [(f"allreduce.noname.{i}.{j}", p) for i, g in enumerate(self.param_groups)
                     for j, p in enumerate(g["params"])]
        if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
            raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                             "usually produced by model.named_parameters()")
        counts: dict = {}
        for k, _ in named:
            counts[k] = counts.get(k, 0) + 1
        dups = sorted(k for k, c in counts.items() if c > 1)
        if dups:
            raise ValueError(f"parameter names in named_parameters must be unique; duplicates: "
                             f"{', '.join(dups)}")
        ids = {id(p) for g in self.param_groups for p in g["params"]}
        unnamed = ids - {id(p) for _, p in named}
        if unnamed:
            raise ValueError(f"named_parameters was given but {len(unnamed)} optimizer "
                             "parameter(s) are not in it")
        # Horovod's attribute (some scripts read it): parameter -> name
        self._parameter_names = {p: k for k, p in sorted(named, key=lambda kv: kv[0])}
        return {id(p): k for k, p in named}

    def _make_buckets(self, order: list, groups: Any, threshold: int) -> list:
        wdt = {id(p): self._wire(p) for p in order}
        pos = {id(p): i for i, p in enumerate(order)}
        lists: list = []
        if isinstance(groups, int) and groups > 0:
            k = min(groups, len(order)) or 1
            step, extra = divmod(len(order), k)
            start = 0
            for i in range(k):
                end = start + step + (1 if i < extra else 0)
                lists.append(order[start:end])
                start = end
        elif isinstance(groups, (list, tuple)) and groups:
            listed: set = set()
            for g in groups:
                members = sorted((p for p in g if id(p) in pos), key=lambda p: pos[id(p)])
                listed.update(id(p) for p in members)
                if members:
                    lists.append(members)
            lists.extend([p] for p in order if id(p) not in listed)
            lists.sort(key=lambda ps: pos[id(ps[0])])
        else:
            # Buckets are also capped at a quarter of the model (not below MIN_BUCKET) so
            # that the first ones launch while backward is still running: Horovod gets that
            # overlap from its 5 ms cycle, fixed buckets need several to get it.
            total = sum(p.numel() * wdt[id(p)].itemsize for p in order)
            threshold = min(threshold, max(MIN_BUCKET_BYTES, -(-total // OVERLAP_BUCKETS)))
            current_list: list = []
            nbytes = 0
            for p in order:
                size = p.numel() * wdt[id(p)].itemsize
                if current_list and (wdt[id(p)] != wdt[id(current_list[0])] or
                                     nbytes + size > threshold):
                    lists.append(current_list)
                    current_list, nbytes = [], 0
                current_list.append(p)
                nbytes += size
            if current_list:
                lists.append(current_list)
        buckets = []
        for ps in lists:
            # a group of mixed dtypes is split by dtype, keeping the order
            run: list = []
            for p in ps:
                if run and wdt[id(p)] != wdt[id(run[0])]:
                    buckets.append(_Bucket(len(buckets), run, wdt[id(run[0])]))
                    run = []
                run.append(p)
            if run:
                buckets.append(_Bucket(len(buckets), run, wdt[id(run[0])]))
        return buckets

    def _wire(self, p: torch.Tensor) -> torch.dtype:
        check_tensor(p, f"parameter on {p.device}")
        compressed, _ = self._compression.compress(torch.empty(0, dtype=p.dtype))
        return wire_dtype(compressed.dtype)

    # -- hooks and launching -----------------------------------------------------
    def _on_grad(self, p: torch.Tensor) -> None:
        key = id(p)
        if self._delay[key] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call "
                "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
        self._delay[key] -= 1
        if self._delay[key] == 0:
            self._bucket_of[key].ready += 1
            self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        """Launch buckets in order while the next one is complete (all of them if force)."""
        while self._next < len(self._buckets):
            b = self._buckets[self._next]
            if not force and b.ready < len(b.params):
                return
            self._launch(b)
            self._next += 1

    def _grad(self, p: torch.Tensor) -> torch.Tensor:
        if p.grad is None:
            p.grad = torch.zeros_like(p)  # unused on this rank: it still takes part
        elif p.grad.is_sparse:
            if not self._sparse_as_dense:
                # As Horovod's: allgathered as indices and values (at synchronize()); its
                # place in the fused buffer carries zeros, so the buckets stay the same.
                self._sparse.append(p)
                return torch.zeros(p.shape, dtype=p.dtype, device=p.device)
            # Reduced dense in the bucket, written back sparse (Horovod's: e.g. SparseAdam
            # takes only sparse gradients).
            self._densified.add(id(p))
            return p.grad.to_dense()
        return p.grad

    def _launch(self, b: _Bucket) -> None:
        self._synchronized = False
        core_op = "avg" if (self._op is Average and self._predivide == 1.0) else "sum"
        prescale = 1.0 / self._predivide if self._op is Average else 1.0
        with torch.no_grad():
            grads = [self._grad(p) for p in b.params]
            pairs = [self._compression.compress(g) for g in grads]
            b.contexts = [c for _, c in pairs]
            g0 = pairs[0][0]
            if len(b.params) == 1 and g0 is grads[0] and g0.dtype == b.dtype and \
                    g0.is_contiguous():
                b.target = g0  # reduced in place in p.grad: no copy
            else:
                if b.flat is None:
                    b.flat = torch.empty(b.numel, dtype=b.dtype, device=grads[0].device)
                pos = 0
                for c, _ in pairs:
                    b.flat[pos:pos + c.numel()].copy_(c.reshape(-1))
                    pos += c.numel()
                b.target = b.flat
            _scale(b.target, prescale)
            buf, dt = as_buffer(b.target)
            ctx = self._ctx
            # queued under the name of its first parameter, as Horovod's per-parameter names
            name = f"{self._names.get(id(b.params[0]), '?')}.bucket{b.index}"
            plan = encode_plan(b.numel, dt or buf.dtype.name, core_op) \
                if b.target.device.type == "cpu" else 0
            try:
                b.request = queue_call(
                    ctx, "allreduce", name,
                    lambda: Launched(ctx.core.iallreduce(None, buf, op=core_op, dtype=dt)),
                    desc=f"DistributedOptimizer bucket {b.index} numel={b.numel} "
                         f"dtype={str(b.dtype)[6:]} op={core_op}", keep=b.target, chained=True,
                    plan=plan)
            except CollectivesError as exc:  # the world is broken: Horovod's class
                raise internal_error(exc) from None
        self._launched += 1

    # -- public API ----------------------------------------------------------------
    def synchronize(self) -> None:
        """Launch the allreduces not yet started, wait for all, and write the averaged grads."""
        if self._launched == 0 and self._synchronized:
            return
        self._launch_ready(force=True)
        postscale = 1.0
        if self._op is Average and self._predivide != 1.0:
            postscale = self._predivide / self._ctx.size
        error = _wait_buckets(self._buckets)
        try:
            if error is not None:
                raise internal_error(error)  # a failed collective: Horovod's class
            with torch.no_grad():
                for b in self._buckets:
                    _scale(b.target, postscale)
                    pos = 0
                    for p, cctx in zip(b.params, b.contexts):
                        n = p.numel()
                        flat = b.target is b.flat
                        part = b.flat[pos:pos + n].view(p.shape) if flat else b.target
                        pos += n
                        if p.grad.is_sparse:  # (the allgathered ones: _reduce_sparse)
                            if id(p) in self._densified:
                                dense = self._compression.decompress(part, cctx)
                                p.grad.zero_().add_(dense.to_sparse())
                        elif flat or cctx is not None:  # (else reduced in place in p.grad)
                            p.grad.copy_(self._compression.decompress(part, cctx))
            self._reduce_sparse()
        finally:
            self._reset_step()
        self._synchronized = True

    def _reduce_sparse(self) -> None:
        """The sparse gradients of this step, in bucket order (the same on every rank):
        Horovod's sparse allreduce (every rank's indices and values allgathered)."""
        from .gather_ops import sparse_allreduce_async

        names = getattr(self, "_parameter_names", {})
        for p in self._sparse:
            handle = sparse_allreduce_async(p.grad, name=f"sparse.{names.get(p, '?')}",
                                            op=self._op,
                                            process_set=getattr(self, "_process_set", None))
            reduced = handle()
            with torch.no_grad():
                p.grad.zero_().add_(reduced)

    def _reset_step(self) -> None:
        """Empty the buckets and re-arm the per-parameter countdowns for the next step."""
        self._sparse = []
        self._densified = set()
        for b in self._buckets:
            b.ready = 0
            b.request = None  # (after an elastic reset: a request of the closed world)
            b.target = None
            b.contexts = []
        for k in self._delay:
            self._delay[k] = self.backward_passes_per_step
        self._next = 0
        self._launched = 0

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within this block step() does not synchronize (call synchronize() yourself first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        """Synchronize the gradients (unless inside skip_synchronize), then step the optimizer."""
        if self._should_synchronize:
            if self._synchronized:
                _warn_step_after_synchronize()
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients; an error while allreduces are still outstanding."""
        if self._launched:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(): gradients are still being "
                "allreduced. Call zero_grad() before backward() or after step().")
        return super().zero_grad(set_to_none=set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate locally before an allreduce."""
        if passes < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        if self._launched:
            raise AssertionError("cannot change backward_passes_per_step with allreduces in flight")
        self.backward_passes_per_step = int(passes)
        for k in self._delay:
            self._delay[k] = self.backward_passes_per_step

    def remove_hooks(self) -> None:
        """Detach the gradient hooks (the optimizer then no longer communicates in backward)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []


def _wait_buckets(buckets: Any) -> Optional[BaseException]:
    """Wait for every bucket's request (none left in flight), returning the first error."""
    error: Optional[BaseException] = None
    for b in buckets:
        try:
            if b.request is not None:
                b.request.Wait()
        except BaseException as exc:  # wait for every request before raising
            error = error or exc
        b.request = None
    return error


def _warn_step_after_synchronize() -> None:
    warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                  "optimizer.synchronize(). This can cause training slowdown. You may want to "
                  "consider using optimizer.skip_synchronize() context if you use "
                  "optimizer.synchronize() in your code.")


class _LocalOptimizer:
    """Mixin for a DistributedOptimizer on a rank outside its process_set: as Horovod's, a
    plain local optimizer (no gradient hooks; synchronize() exchanges nothing)."""

    def __init__(self, params: Any, named_parameters: Any, backward_passes_per_step: int) -> None:
        super().__init__(params)
        _DistributedOptimizer._check_names(self, named_parameters)  # same argument errors
        self.backward_passes_per_step = int(backward_passes_per_step)
        self._synchronized = False
        self._should_synchronize = True

    def synchronize(self) -> None:
        """Nothing to exchange: this rank is not in the optimizer's process set."""
        self._synchronized = True

    skip_synchronize = _DistributedOptimizer.skip_synchronize

    def step(self, closure: Any = None) -> Any:
        """Step the local optimizer (Horovod's warning after an explicit synchronize())."""
        if self._should_synchronize and self._synchronized:
            _warn_step_after_synchronize()
        self._synchronized = False
        return super().step(closure)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Recorded only (nothing is accumulated for an exchange on this rank)."""
        self.backward_passes_per_step = int(passes)


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any = None,
                         compression: Any = Compression.none, backward_passes_per_step: int = 1,
                         op: ReduceOp = Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups: Any = None, sparse_as_dense: bool = False,
                         process_set: Any = None) -> torch.optim.Optimizer:
    """Wrap an optimizer so that gradients are averaged across ranks before each step.

    The result is an instance of a subclass of the optimizer's class sharing
    its param_groups; its state starts empty (as Horovod's). On a rank outside
    `process_set` it is, as Horovod's, a plain local optimizer (nothing is
    exchanged; its construction is not collective there).

    Args:
        optimizer: the torch optimizer to wrap.
        named_parameters: ``model.named_parameters()``, used to name the tensors in errors.
        compression: Compression.none, Compression.fp16, or a sparse compressor
            (collectives.torch.dgc.DGC / TopKCompressor instance).
        backward_passes_per_step: backward passes accumulated locally per allreduce.
        op: Average (default) or Sum.
        gradient_predivide_factor: with Average, divide by this before the sum and by
            size/factor after.
        num_groups: deprecated; same as an integer `groups`.
        groups: an int k (k fused groups) or a list of lists of parameters (each list
            one fused allreduce); None fuses by COLLECTIVES_FUSION_THRESHOLD.
        sparse_as_dense: convert sparse gradients to dense (otherwise TypeError).
        process_set: the ProcessSet whose ranks average the gradients (default: every rank).

    Returns:
        The distributed optimizer.
    """
    if isinstance(process_set, ProcessSet) and process_set.included() is False:
        cls = type(optimizer.__class__.__name__, (_LocalOptimizer, optimizer.__class__),
                   {"__doc__": _LocalOptimizer.__doc__})
        return cls(optimizer.param_groups, named_parameters, backward_passes_per_step)
    opt = _distributed_optimizer(optimizer, named_parameters, compression,
                                 backward_passes_per_step, op, gradient_predivide_factor,
                                 num_groups, groups, sparse_as_dense, process_set)
    if process_set is not None:
        opt._process_set = process_set  # its gradients go over the set (see _ctx)
    return opt


@in_process_set
def _distributed_optimizer(optimizer: torch.optim.Optimizer, named_parameters: Any,
                           compression: Any, backward_passes_per_step: int, op: ReduceOp,
                           gradient_predivide_factor: float, num_groups: int, groups: Any,
                           sparse_as_dense: bool, process_set: Any) -> torch.optim.Optimizer:
    """DistributedOptimizer on a member of `process_set` (run in the set: see in_process_set;
    the arguments are DistributedOptimizer's)."""
    from .process_sets import check_process_set

    check_process_set(process_set)
    if num_groups and groups is None:
        groups = num_groups
    # A compressor with its own exchange (collectives.torch.dgc) brings its own subclass.
    base = getattr(compression, "optimizer_mixin", _DistributedOptimizer)
    cls = type(optimizer.__class__.__name__, (base, optimizer.__class__),
               {"__doc__": _DistributedOptimizer.__doc__})
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense)

