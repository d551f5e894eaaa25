"""Deep Gradient Compression and top-k with error feedback for ``DistributedOptimizer``.

DGC (Lin, Han, Mao, Wang, Dally, ICLR 2018, arXiv:1712.01887) sends only the
largest 0.1 % of each gradient and keeps the rest locally until it grows.
Per tensor and step, on each rank:

1. local clipping (optional): the gradient's norm is clipped at
   ``clip_norm * N**-0.5``;
2. momentum correction: ``u = m*u + g; v = v + u`` (Nesterov:
   ``u = m*(u + g); v = v + u + g``);
3. a threshold from a strided sample of |v| (a few adaptation rounds) picks
   at most ``k = ceil(density * numel)`` entries;
4. those (values, indices) are sent and zeroed in v, and in u with momentum
   masking;
5. one packed buffer per rank and fusion bucket is allgathered and
   scatter-added, then divided by N (``sparse_ops``). The allgather starts
   from the gradient hook as soon as the bucket's gradients are ready, while
   backward goes on (``overlap=True``, the default); its buffer has the fixed
   size of k entries per tensor, so no size exchange has to come first.
   ``overlap=False`` exchanges all sparse tensors in ``synchronize()``, sized
   by what was selected; both give the same gradients bit for bit. With
   ``host_merge=True``, on several hosts with several ranks on one, a host's
   selections are merged (summed at equal indices) before they cross hosts
   (``dgc_hosts``), in synchronize();
6. small tensors, and every tensor while the warm-up density is so high
   that the sparse form would cost more bytes than a dense allreduce, go
   through the dense allreduce (momentum applied, no masking).

Steps 2-4 run as one native pass per tensor (``fused=True``, the default;
native/reduce/dgc_fused.c): the momentum update, the counts at every threshold
the adaptation rounds may try (from a sample of the updated values, computed
first), and the entries above the lowest of them, while g, u and v stream
through once; only the chosen entries are then touched again. ``fused=False``
runs the same steps as torch ops (several passes), with the same result bit
for bit.

Usage, as in Horovod::

    compression = DGC(compress_ratio=0.001, momentum=0.9, warmup_epochs=4)
    opt = DGCSGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression)
    for epoch in ...:
        compression.warmup_compress_ratio(epoch)

DGC keeps the gradient momentum itself, so the optimizer must not add
another: pair it with ``DGCSGD`` (momentum on the weight decay only). The
simpler ``TopKCompressor`` (error feedback, no momentum) pairs with any
optimizer. The residuals are per rank: checkpoint ``compression.state_dict()``
on every rank to resume exactly.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np
import torch

from .. import _core
from . import sparse_ops
from ._context import as_buffer
from ._lane import Launched, queue_call, run_call
from .compression import NoneCompressor
from .dgc_hosts import HostExchange
from .mpi_ops import _scale
from .basics import Average
from .optimizer import _DistributedOptimizer, _wait_buckets

__all__ = ["SparseCompressor", "TopKCompressor", "DGC", "DGCSGD"]

DEFAULT_MIN_NUMEL = 1024


class SparseCompressor(NoneCompressor):
    """Common part of TopKCompressor and DGC: schedule, selection knobs, per-tensor memory.

    Passed as ``compression=`` to ``hvd.DistributedOptimizer``, which then
    exchanges the eligible tensors sparsely (``optimizer_mixin``). An instance
    holds one rank's memory: use one per optimizer. Dense tensors pass through
    unchanged (NoneCompressor's compress/decompress); momentum is applied by
    the optimizer hook.

    Args:
        compress_ratio: final density (fraction of entries sent per tensor).
        sample_ratio: fraction of |v| sampled to estimate the threshold.
        warmup_epochs: densities decrease exponentially from 1 to compress_ratio over
            this many epochs (epoch e < warmup_epochs: ``compress_ratio**((e+1)/(W+1))``).
        warmup_ratios: explicit densities for epochs 0, 1, ... (overrides warmup_epochs);
            the paper's schedule is ``[0.25, 0.0625, 0.015625, 0.00390625]``.
        steps_per_epoch: if given, the epoch advances by itself every this many steps;
            otherwise call ``warmup_compress_ratio(epoch)``.
        fp16_values: send values as float16 (the rounding error stays in the memory).
        int32_indices: send indices as int32 (int64 otherwise).
        min_numel: tensors with fewer elements, or with at most one dimension
            (biases, norms), always go dense.
        dense: optional ``f(name, param) -> bool``: True keeps that tensor dense.
        rounds: threshold adaptation rounds.
        fused: select with the fused native pass (one pass over gradient and memory per
            tensor: update, threshold counts and candidates); False: the torch-op
            reference (same result, several passes).
        overlap: exchange each bucket's sparse entries as soon as its gradients are ready
            (during backward); False: all of them in synchronize() after backward.
        host_merge: on a world of two or more hosts with several ranks on one, merge a
            host's selections (union, values at equal indices summed) before they cross
            hosts, so each host link carries its host's union once (``dgc_hosts``); the
            exchange then runs in synchronize(). It saves host-link bytes by as much as
            the host's ranks' selections overlap, for more CPU per rank: opt in where
            the host links, not the CPUs, bound the step (bench/README.md). False:
            every rank's selections cross (the two-level allgatherv).
    """

    owns_momentum = False
    fused_mode = "topk"  # the update dgc_update applies (DGC: momentum / nesterov)

    def __init__(self, compress_ratio: float = 0.01, sample_ratio: float = 0.01,
                 warmup_epochs: int = 0, warmup_ratios: Optional[Sequence[float]] = None,
                 steps_per_epoch: Optional[int] = None, fp16_values: bool = False,
                 int32_indices: bool = True, min_numel: int = DEFAULT_MIN_NUMEL,
                 dense: Optional[Callable[[str, torch.Tensor], bool]] = None,
                 rounds: int = 3, fused: bool = True, overlap: bool = True,
                 host_merge: bool = False) -> None:
        if not 0 < compress_ratio <= 1:
            raise ValueError(f"compress_ratio must be in (0, 1], got {compress_ratio}")
        if not 0 < sample_ratio <= 1:
            raise ValueError(f"sample_ratio must be in (0, 1], got {sample_ratio}")
        if warmup_epochs < 0:
            raise ValueError(f"warmup_epochs must be >= 0, got {warmup_epochs}")
        if warmup_ratios is not None and not all(0 < r <= 1 for r in warmup_ratios):
            raise ValueError(f"warmup_ratios must be in (0, 1], got {list(warmup_ratios)}")
        if steps_per_epoch is not None and steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
        self.compress_ratio = float(compress_ratio)
        self.sample_ratio = float(sample_ratio)
        self.warmup_epochs = int(warmup_epochs)
        self.warmup_ratios = None if warmup_ratios is None else [float(r) for r in warmup_ratios]
        self.steps_per_epoch = steps_per_epoch
        self.fp16_values = bool(fp16_values)
        self.int32_indices = bool(int32_indices)
        self.min_numel = int(min_numel)
        self.dense = dense
        self.rounds = int(rounds)
        self.fused = bool(fused)
        self.overlap = bool(overlap)
        self.host_merge = bool(host_merge)
        self.wire = sparse_ops.WireFormat(torch.float16 if fp16_values else torch.float32,
                                          torch.int32 if int32_indices else torch.int64)
        self.epoch = 0.0
        self.step = 0
        self.memory: dict = {}  # name -> {buffer name: flat tensor}
        self.stats: dict = {}  # what the last step sent; see DistributedOptimizer's step
        # the layout check compares this across ranks (DistributedOptimizer uses __name__)
        self.__name__ = (f"{type(self).__name__}(ratio={self.compress_ratio}, "
                         f"sample={self.sample_ratio}, warmup={self.warmup_epochs}/"
                         f"{self.warmup_ratios}, fp16={self.fp16_values}, "
                         f"int32={self.int32_indices}, min_numel={self.min_numel}, "
                         f"overlap={self.overlap}, host_merge={self.host_merge})")

    # -- the Compressor interface: the dense path sends tensors unchanged ---------------
    @property
    def optimizer_mixin(self) -> type:
        """The DistributedOptimizer class that exchanges sparse tensors for this compressor."""
        return _SparseDistributedOptimizer

    # -- schedule ---------------------------------------------------------------------
    def density_at(self, epoch: float) -> float:
        """The density the schedule gives at `epoch` (warm-up, then compress_ratio)."""
        e = int(math.floor(epoch))
        if self.warmup_ratios is not None:
            return self.warmup_ratios[e] if 0 <= e < len(self.warmup_ratios) else \
                self.compress_ratio
        if 0 <= e < self.warmup_epochs:
            return self.compress_ratio ** ((e + 1) / (self.warmup_epochs + 1))
        return self.compress_ratio

    def warmup_compress_ratio(self, epoch: float) -> float:
        """Set the current epoch (fractions allowed) and return the density it gives.

        Every rank must call it with the same epoch: which tensors go dense
        depends on the density.
        """
        self.epoch = float(epoch)
        return self.density_at(self.epoch)

    @property
    def density(self) -> float:
        """The current density."""
        return self.density_at(self.epoch)

    def end_step(self) -> None:
        """Called once per synchronize: count the step, advance a step-based schedule."""
        self.step += 1
        if self.steps_per_epoch:
            self.epoch = self.step / self.steps_per_epoch

    # -- which tensors, and how many entries -----------------------------------------
    def eligible(self, name: str, p: torch.Tensor) -> bool:
        """Whether `p` may go sparse at all (float32, >= min_numel, >= 2 dims, not `dense`)."""
        if p.dtype != torch.float32 or p.dim() <= 1 or p.numel() < self.min_numel:
            return False
        return not (self.dense is not None and self.dense(name, p))

    def sparse_now(self, numel: int, nranks: int) -> bool:
        """True if at the current density the sparse exchange moves fewer bytes than dense.

        A ring allreduce sends 2(N-1)/N * 4 * numel bytes per rank, the
        allgather of k entries (N-1) * k * entry_bytes: sparse wins while
        density < 8 / (N * entry_bytes).
        """
        return self.k(numel) * self.wire.entry_bytes * nranks < 8 * numel

    def k(self, numel: int) -> int:
        """Most entries sent for a tensor of `numel` elements: ceil(density * numel)."""
        return max(1, math.ceil(self.density * numel))

    def sample_start(self, index: int) -> int:
        """Offset of the strided sample of tensor `index` this step (varies with the step)."""
        return (self.step * 2654435761 + index * 40503) & 0x7FFFFFFF

    # -- selection: fold g into the memory, pick the entries, remove them -------------
    def select(self, name: str, g: torch.Tensor, index: int) -> tuple:
        """Fold gradient `g` into the memory of `name`, select at most k entries, remove
        them from the memory; return them as sent (float32 values as decoded, int64
        indices, in index order). `index` is the tensor's position among this step's
        sparse tensors (it varies the sample)."""
        if self.fused:
            return self._select_fused(name, g, index)
        return self._select_reference(name, g, index)

    def _select_reference(self, name: str, g: torch.Tensor, index: int) -> tuple:
        v = self.accumulate_sparse(name, g)
        k = self.k(v.numel())
        thr = sparse_ops.choose_threshold(v, k, self.sample_ratio, self.rounds,
                                          self.sample_start(index))
        vals = torch.empty(k, dtype=self.wire.value_dtype)
        idx = torch.empty(k, dtype=self.wire.index_dtype)
        c = sparse_ops.select(v, thr, k, vals, idx)
        vals, idx = vals[:c].float(), idx[:c].long()
        self.sent(name, idx, vals)
        return vals, idx

    def _clip_scale(self, g: torch.Tensor) -> float:
        return 1.0

    def _select_fused(self, name: str, g: torch.Tensor, index: int) -> tuple:
        g = g.reshape(-1)
        if not g.is_contiguous() or g.dtype != torch.float32:
            g = g.contiguous().float()
        mode = self.fused_mode
        mem = self._buffers(name, g, ("v",) if mode == "topk" else ("u", "v"))
        u = None if mode == "topk" else mem["u"].numpy()
        v = mem["v"]
        gn, vn = g.numpy(), v.numpy()
        m, scale = getattr(self, "momentum", 0.0), self._clip_scale(g)
        n = g.numel()
        k = self.k(n)
        off, stride, s, rank = sparse_ops.sample_plan(n, k, self.sample_ratio,
                                                      self.sample_start(index))
        sample = torch.empty(s, dtype=torch.float32)
        _core.dgc_sample(gn, u, vn, mode, m, scale, off, stride, sample.numpy())
        top = torch.topk(sample, min(s, 4 * rank + 16)).values
        thresholds = top.clamp_min(sparse_ops.TINY).numpy()
        hist = np.zeros(len(thresholds), dtype=np.int64)
        # about stride entries of the tensor per sampled one reach the lowest threshold
        cap = min(n, 2 * len(thresholds) * stride + 4096)
        cand_v = np.empty(cap, dtype=np.float32)
        cand_i = np.empty(cap, dtype=np.int64)
        ncand = _core.dgc_update(gn, u, vn, mode, m, scale, thresholds, hist, cand_v, cand_i)
        cum = np.cumsum(hist)
        thr = sparse_ops.adapt_threshold(top.tolist(), k, rank, self.rounds,
                                         lambda i, t: int(cum[i]))
        if ncand > cap:  # the sample misjudged the tail: pick from v in a second pass
            vals = torch.empty(k, dtype=self.wire.value_dtype)
            idx = torch.empty(k, dtype=self.wire.index_dtype)
            c = sparse_ops.select(v, thr, k, vals, idx)
            vals, idx = vals[:c].float(), idx[:c].long()
        else:
            tb = np.array([thr], dtype=np.float32).view(np.uint32)[0]
            hit = (cand_v[:ncand].view(np.uint32) & np.uint32(0x7FFFFFFF)) >= tb
            cv = torch.from_numpy(cand_v[:ncand][hit])
            ci = torch.from_numpy(cand_i[:ncand][hit])
            if cv.numel() > k:  # as select(): the exact top k of the candidates
                keep = torch.topk(cv.abs(), k, sorted=False).indices.sort().values
                cv, ci = cv[keep], ci[keep]
            vals = cv.to(self.wire.value_dtype).float()
            idx = ci.to(self.wire.index_dtype).long()
        self.sent(name, idx, vals)
        return vals, idx

    # -- memory -------------------------------------------------------------------------
    def _buffers(self, name: str, g: torch.Tensor, keys: Iterable[str]) -> dict:
        mem = self.memory.get(name)
        if mem is None or any(k not in mem for k in keys):
            mem = mem or {}
            for k in keys:
                mem.setdefault(k, torch.zeros(g.numel(), dtype=g.dtype))
            self.memory[name] = mem
        return mem

    def accumulate_dense(self, name: str, g: torch.Tensor) -> torch.Tensor:
        """What this rank contributes to the dense allreduce of `g` (a new tensor)."""
        raise NotImplementedError

    def accumulate_sparse(self, name: str, g: torch.Tensor) -> torch.Tensor:
        """Fold `g` into the memory; return the flat float32 tensor to select from."""
        raise NotImplementedError

    def sent(self, name: str, indices: torch.Tensor, values: torch.Tensor) -> None:
        """Remove what was sent (int64 indices, float32 values as decoded) from the memory."""
        v = self.memory[name]["v"]
        # v - sent, not 0: with float16 values the rounding error stays for later.
        v.index_put_((indices,), v[indices] - values)

    def state_dict(self) -> dict:
        """This rank's memory and schedule position (residuals differ per rank)."""
        return {"epoch": self.epoch, "step": self.step,
                "memory": {n: {k: t.clone() for k, t in m.items()} for n, m in self.memory.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict returned (on the same rank)."""
        self.epoch = float(state["epoch"])
        self.step = int(state["step"])
        self.memory = {n: {k: t.clone() for k, t in m.items()}
                       for n, m in state["memory"].items()}


class TopKCompressor(SparseCompressor):
    """Top-k sparsification with error feedback: v = v + g; send the largest k; keep the rest.

    No momentum of its own: pair it with any optimizer (momentum SGD included).
    Arguments as SparseCompressor.
    """

    def accumulate_dense(self, name: str, g: torch.Tensor) -> torch.Tensor:
        """g plus any residual left from sparse steps (the residual is then empty)."""
        out = g.reshape(-1).clone()
        mem = self.memory.get(name)
        if mem is not None:
            out.add_(mem["v"])
            mem["v"].zero_()
        return out

    def accumulate_sparse(self, name: str, g: torch.Tensor) -> torch.Tensor:
        """v += g; return v."""
        v = self._buffers(name, g, ("v",))["v"]
        return v.add_(g.reshape(-1))


class DGC(SparseCompressor):
    """Deep Gradient Compression: momentum correction, masking, local clipping, warm-up.

    Args:
        compress_ratio: final density (default 0.001, the paper's 99.9 % sparsity).
        sample_ratio: fraction of |v| sampled for the threshold (default 0.01).
        momentum: the momentum DGC applies (use DGCSGD with the same value).
        nesterov: Nesterov momentum.
        momentum_masking: zero the momentum where entries were sent (on by default).
        clip_norm: local clipping: each tensor's gradient norm is clipped at
            clip_norm * N**-0.5 before accumulation (None: off).
        **kwargs: the other SparseCompressor arguments (warmup_epochs, warmup_ratios,
            steps_per_epoch, fp16_values, int32_indices, min_numel, dense, rounds).
    """

    owns_momentum = True

    @property
    def fused_mode(self) -> str:
        """The update the fused pass applies: "momentum" or "nesterov"."""
        return "nesterov" if self.nesterov else "momentum"

    def __init__(self, compress_ratio: float = 0.001, sample_ratio: float = 0.01,
                 momentum: float = 0.9, nesterov: bool = False, momentum_masking: bool = True,
                 clip_norm: Optional[float] = None, **kwargs: Any) -> None:
        super().__init__(compress_ratio, sample_ratio, **kwargs)
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.momentum_masking = bool(momentum_masking)
        self.clip_norm = clip_norm
        self.nranks = 1  # set by the optimizer: the clipping threshold scales with N**-0.5
        self.__name__ += (f"[m={self.momentum}, nesterov={self.nesterov}, "
                          f"masking={self.momentum_masking}, clip={self.clip_norm}]")

    def _clip_scale(self, g: torch.Tensor) -> float:
        if self.clip_norm is None:
            return 1.0
        limit = self.clip_norm / math.sqrt(self.nranks)
        norm = float(torch.linalg.vector_norm(g))
        return limit / (norm + 1e-6) if norm > limit else 1.0

    def _clip(self, g: torch.Tensor) -> torch.Tensor:
        g = g.reshape(-1)
        scale = self._clip_scale(g)
        return g if scale == 1.0 else g * scale

    def _momentum(self, u: torch.Tensor, g: torch.Tensor) -> None:
        # two roundings (no fused multiply-add), exactly as the fused native pass
        if self.nesterov:
            u.add_(g).mul_(self.momentum)
        else:
            u.mul_(self.momentum).add_(g)

    def accumulate_dense(self, name: str, g: torch.Tensor) -> torch.Tensor:
        """Momentum without masking: send u (Nesterov: u + g), plus any residual v."""
        g = self._clip(g)
        mem = self._buffers(name, g, ("u",))
        self._momentum(mem["u"], g)
        out = mem["u"] + g if self.nesterov else mem["u"].clone()
        if "v" in mem:
            out.add_(mem["v"])
            mem["v"].zero_()
        return out

    def accumulate_sparse(self, name: str, g: torch.Tensor) -> torch.Tensor:
        """Momentum correction: u = m*u + g, v += u (Nesterov: u = m*(u+g), v += u + g)."""
        g = self._clip(g)
        mem = self._buffers(name, g, ("u", "v"))
        self._momentum(mem["u"], g)
        mem["v"].add_(mem["u"])
        if self.nesterov:
            mem["v"].add_(g)
        return mem["v"]

    def sent(self, name: str, indices: torch.Tensor, values: torch.Tensor) -> None:
        """Zero v where sent (keeping float16 rounding error) and, with masking, u too."""
        super().sent(name, indices, values)
        if self.momentum_masking:
            self.memory[name]["u"].index_fill_(0, indices, 0.0)


class DGCSGD(torch.optim.Optimizer):
    """SGD to pair with DGC: momentum applies only to the weight decay.

    DGC already applied momentum to the exchanged gradient (momentum
    correction), so the step is ``p -= lr * (grad + b)`` with
    ``b = m*b + wd*p`` (Nesterov: ``p -= lr * (grad + wd*p + m*b)``). With
    compress_ratio 1 this is exactly torch.optim.SGD with the same momentum,
    weight decay and nesterov flag.

    Args:
        params: parameters or parameter groups.
        lr: learning rate.
        momentum: must equal DGC's momentum.
        weight_decay: L2 penalty.
        nesterov: must equal DGC's nesterov.
    """

    def __init__(self, params: Any, lr: float = 1e-3, momentum: float = 0.9, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError("lr, momentum and weight_decay must be >= 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      nesterov=nesterov))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update of every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, m, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad
                if wd != 0:
                    decay = p * wd
                    if m != 0:
                        buf = self.state[p].get("decay_buffer")
                        if buf is None:
                            buf = self.state[p]["decay_buffer"] = decay.clone()
                        else:
                            buf.mul_(m).add_(decay)
                        decay = decay.add(buf, alpha=m) if group["nesterov"] else buf
                    d = d + decay
                p.add_(d, alpha=-lr)
        return loss


class _SparseDistributedOptimizer(_DistributedOptimizer):
    """DistributedOptimizer for a SparseCompressor: dense tensors allreduced as they become
    ready (fused per bucket), sparse ones packed into one allgatherv at synchronize()."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        comp = self._compression
        if self._predivide != 1.0:
            raise ValueError("gradient_predivide_factor is not supported with sparse compression")
        if isinstance(comp, DGC):
            comp.nranks = self._ctx.size
        self._check_momentum(comp)
        self._eligible = {id(p): comp.eligible(self._names[id(p)], p)
                          for b in self._buckets for p in b.params}
        self._sparse: list = []  # (param, grad) left for synchronize, in wire order
        self._sparse_index = 0  # sparse tensors selected so far this step
        self._stats = self._new_stats()
        # Host and rail communicators (a collective on the world, here where every
        # rank builds its optimizer): None where the world is not in two levels.
        self._hosts = None
        if comp.host_merge and self._ctx.size > 1:
            self._ctx.lane.drain()
            ctx = self._ctx  # on the negotiating thread, as every op on ctx.core (_lane)
            self._hosts = run_call(ctx, "allgather", None, lambda: HostExchange.create(ctx.core),
                                   desc="dgc host exchange")

    @staticmethod
    def _new_stats() -> dict:
        return {"dense_bytes": 0, "sparse_bytes": 0, "host_link_bytes": 0, "sent": {}, "caps": {}}

    def _check_names(self, named_parameters: Any) -> dict:
        self._names = super()._check_names(named_parameters)
        return self._names

    def _check_momentum(self, comp: SparseCompressor) -> None:
        if not comp.owns_momentum:
            return
        name = next(c for c in type(self).__mro__
                    if not issubclass(c, _DistributedOptimizer)).__name__
        for g in self.param_groups:
            if isinstance(self, DGCSGD):
                if g["momentum"] != comp.momentum or g["nesterov"] != comp.nesterov:
                    warnings.warn(f"DGCSGD has momentum={g['momentum']}, nesterov="
                                  f"{g['nesterov']} but DGC has momentum={comp.momentum}, "
                                  f"nesterov={comp.nesterov}: the weight decay then follows a "
                                  "different momentum than the gradient", stacklevel=4)
                    return
            elif g.get("momentum", 0) or "betas" in g:
                warnings.warn(f"DGC applies gradient momentum itself (momentum correction); the "
                              f"wrapped {name} adds its own momentum on top. Use "
                              "collectives.torch.dgc.DGCSGD (momentum on weight decay only), "
                              "or TopKCompressor to keep this optimizer.", stacklevel=4)
                return

    def _launch(self, b: Any) -> None:
        self._synchronized = False
        comp, n = self._compression, self._ctx.size
        with torch.no_grad():
            dense_p, dense_t, sparse = [], [], []
            for p in b.params:
                g = self._grad(p)
                if g.device.type != "cpu":
                    # DGC's selection and memory run on the host (the native
                    # kernels): a GPU gradient is copied there, and what comes
                    # back is written into p.grad on its device (_finish_buckets,
                    # _write_sparse).
                    g = g.detach().to("cpu")
                name = self._names[id(p)]
                if self._eligible[id(p)] and comp.sparse_now(p.numel(), n):
                    sparse.append((p, g))
                else:
                    dense_p.append(p)
                    dense_t.append(comp.accumulate_dense(name, g))
            b.contexts = dense_p
            b.target = None
            b.request = None
            b.sparse = None
            if dense_t:
                b.target = torch.cat(dense_t) if len(dense_t) > 1 else dense_t[0]
                buf, dt = as_buffer(b.target)
                op = "avg" if self._op is Average else "sum"
                ctx = self._ctx
                b.request = queue_call(  # negotiated as every op (see _negotiate)
                    ctx, "allreduce", f"dgc.dense.bucket{b.index}",
                    lambda: Launched(ctx.core.iallreduce(None, buf, op=op, dtype=dt)),
                    desc=f"dgc dense bucket {b.index} numel={b.target.numel()} op={op}",
                    keep=b.target, chained=True)
                self._stats["dense_bytes"] += b.target.numel() * b.target.element_size()
            if sparse and comp.overlap and self._hosts is None:
                b.sparse = self._start_sparse(sparse)
            else:
                self._sparse.extend(sparse)
        self._launched += 1

    def _select(self, items: list) -> tuple:
        """Select from each (param, grad) in wire order: (names, caps, [(values, indices)])."""
        comp = self._compression
        names, caps, sel = [], [], []
        for p, g in items:
            name = self._names[id(p)]
            sel.append(comp.select(name, g, self._sparse_index))
            self._sparse_index += 1
            names.append(name)
            caps.append(comp.k(p.numel()))
        return names, caps, sel

    def _start_sparse(self, items: list) -> dict:
        """Select this bucket's sparse entries and start their allgather (fixed-size buffers)."""
        ctx, wire = self._ctx, self._compression.wire
        names, caps, sel = self._select(items)
        buf = sparse_ops.pack_selected(sel, caps, wire)
        st = dict(params=[p for p, _ in items], names=names, caps=caps, sel=sel, buf=buf,
                  gathered=buf, request=None)
        if ctx.size > 1:
            st["gathered"] = torch.empty(ctx.size * buf.numel(), dtype=torch.uint8)
            gathered, counts = st["gathered"].numpy(), [buf.numel()] * ctx.size
            st["request"] = queue_call(
                ctx, "allgather", None,
                lambda: Launched(ctx.core.iallgatherv(buf.numpy(), gathered, counts)),
                desc=f"dgc sparse allgather bytes={buf.numel()}", keep=(buf, gathered),
                chained=True)
        return st

    def _write_sparse(self, params: list, gathered: torch.Tensor, sizes: list, caps: list,
                      fixed: bool, fmt: Optional[sparse_ops.WireFormat] = None) -> None:
        outs, devs = [], []
        for p in params:
            if not (p.grad.is_contiguous() and p.grad.dtype == torch.float32):
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            if p.grad.device.type == "cpu":
                p.grad.zero_()
                outs.append(p.grad.view(-1))
            else:  # decoded on the host, then copied to the GPU gradient
                outs.append(torch.zeros(p.numel(), dtype=torch.float32))
                devs.append((p, outs[-1]))
        sparse_ops.decode(gathered, sizes, outs, caps, fmt or self._compression.wire, fixed=fixed)
        if self._op is Average:
            for o in outs:
                _scale(o, 1.0 / self._ctx.size)
        for p, o in devs:
            p.grad.view(-1).copy_(o)

    def _record(self, names: list, caps: list, sel: list, nbytes: int) -> None:
        self._stats["sparse_bytes"] += nbytes
        self._stats["sent"].update({n: int(v.numel()) for n, (v, _) in zip(names, sel)})
        self._stats["caps"].update(zip(names, caps))

    def _exchange_sparse(self) -> None:
        """The exchange after backward (overlap=False): one packed allgatherv of all of them."""
        ctx = self._ctx
        names, caps, sel = self._select(self._sparse)
        # the same layout as the fixed one, sized by what was selected (sizes exchanged first)
        wire = self._compression.wire
        buf = sparse_ops.pack_selected(sel, [v.numel() for v, _ in sel], wire)
        params = [p for p, _ in self._sparse]
        if self._hosts is not None:  # merged per host before crossing hosts (dgc_hosts)
            numels = [p.numel() for p in params]
            gathered, sizes, mcaps = run_call(
                ctx, "allgather", None, lambda: self._hosts.exchange(buf, caps, numels, wire),
                desc="dgc sparse exchange merged per host")
            self._write_sparse(params, gathered, sizes, mcaps, fixed=False,
                               fmt=HostExchange.merged_format(wire))
            self._stats["host_link_bytes"] += self._hosts.host_link_bytes
        else:
            gathered, sizes = run_call(ctx, "allgather", None,
                                       lambda: sparse_ops.exchange(ctx.core, ctx.size, buf),
                                       desc="dgc sparse exchange")
            self._write_sparse(params, gathered, sizes, caps, fixed=False)
        self._record(names, caps, sel, buf.numel() + 8)  # + the size exchanged first

    def _finish_buckets(self) -> None:
        """Wait for every dense and sparse request (all, even after an error), then write."""
        error = _wait_buckets(self._buckets)
        for b in self._buckets:
            st = getattr(b, "sparse", None)
            if st is not None and st["request"] is not None:
                try:
                    st["request"].Wait()
                except BaseException as exc:  # wait for every request before raising
                    error = error or exc
                st["request"] = None
        if error is not None:
            raise error
        for b in self._buckets:
            pos = 0
            for p in b.contexts:
                n = p.numel()
                p.grad.copy_(b.target[pos:pos + n].view(p.shape))
                pos += n
            st = getattr(b, "sparse", None)
            if st is not None:
                size = st["buf"].numel()
                self._write_sparse(st["params"], st["gathered"], [size] * self._ctx.size,
                                   st["caps"], fixed=True)
                self._record(st["names"], st["caps"], st["sel"], size)

    def synchronize(self) -> None:
        """Launch what is left, wait for the dense allreduces, exchange the sparse tensors."""
        if self._launched == 0 and self._synchronized:
            return
        try:
            self._launch_ready(force=True)
        finally:
            try:
                with torch.no_grad():
                    self._finish_buckets()
                    if self._sparse:
                        self._exchange_sparse()
            finally:
                self._end_sparse_step()
        self._synchronized = True

    def _end_sparse_step(self) -> None:
        comp = self._compression
        self._reset_step()
        for b in self._buckets:
            b.sparse = None
        self._sparse = []
        self._sparse_index = 0
        comp.stats, self._stats = self._stats, self._new_stats()
        comp.end_step()
