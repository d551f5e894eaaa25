"""The parameter server under a torch optimizer: ``collectives.ps.torch.Optimizer``.

In the spirit of Horovod's ``DistributedOptimizer``, it wraps the optimizer
the script already builds; the servers apply the same update (torch.optim.SGD,
Adam and AdamW are mapped to ``collectives.ps.SGD``/``Adam`` with the same
hyperparameters) to their shards::

    import collectives.ps.torch as pst
    opt = pst.Optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                        mode="sync", backup_workers=1, num_servers=2)
    if opt.is_server:
        opt.serve()                     # until every worker has finished
    else:                               # the model now holds worker 0's initial values
        for x, y in data:
            opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
        opt.finish()
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import torch

from . import DGCSGD, SGD, Adam, Role, StepReport, init, serve, worker


def server_optimizer(optimizer: torch.optim.Optimizer, compression: Any = "none"):
    """The collectives.ps optimizer that applies what `optimizer` would (ValueError if none).

    With DGC compression (compression="dgc" or a DGC instance) the workers apply the
    gradient momentum: torch.optim.SGD then maps to collectives.ps.DGCSGD.
    """
    groups = optimizer.param_groups
    keys = ("lr", "momentum", "weight_decay", "dampening", "nesterov", "betas", "eps")
    first = {k: groups[0].get(k) for k in keys}
    if any({k: g.get(k) for k in keys} != first for g in groups[1:]):
        raise ValueError("the parameter server applies one set of hyperparameters: "
                         "param_groups must agree on them")
    g = groups[0]
    if isinstance(optimizer, torch.optim.SGD):
        if _owns_momentum(compression):
            if g["dampening"]:
                raise ValueError("DGC's momentum correction has no dampening: use dampening=0")
            return DGCSGD(g["lr"], g["momentum"], g["weight_decay"], g["nesterov"])
        return SGD(g["lr"], g["momentum"], g["weight_decay"], g["dampening"], g["nesterov"])
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        if g.get("amsgrad"):
            raise ValueError("amsgrad is not supported by the parameter server's Adam")
        return Adam(g["lr"], tuple(g["betas"]), g["eps"], g["weight_decay"],
                    decoupled=isinstance(optimizer, torch.optim.AdamW))
    raise ValueError(f"{type(optimizer).__name__}: the parameter server applies SGD, Adam "
                     f"and AdamW")


def _owns_momentum(compression: Any) -> bool:
    from ..torch.dgc import SparseCompressor

    if isinstance(compression, SparseCompressor):
        return compression.owns_momentum
    return compression == "dgc"


def push_compressor(optimizer: torch.optim.Optimizer, compression: Any) -> Any:
    """What Worker gets as compression: the string, or the DGC instance that goes with
    `optimizer` (compression="dgc": density 0.001, SGD's momentum and nesterov, none under
    Adam); ValueError if a DGC instance's momentum disagrees with the optimizer's."""
    from ..torch.dgc import DGC

    g = optimizer.param_groups[0]
    sgd = isinstance(optimizer, torch.optim.SGD)
    momentum = float(g.get("momentum", 0.0)) if sgd else 0.0
    nesterov = bool(g.get("nesterov", False)) if sgd else False
    if compression == "dgc":
        return DGC(momentum=momentum, nesterov=nesterov)
    if isinstance(compression, DGC) and (compression.momentum, compression.nesterov) != (
            momentum, nesterov):
        raise ValueError(f"DGC(momentum={compression.momentum}, nesterov="
                         f"{compression.nesterov}) applies the gradient momentum for the "
                         f"server: it must equal {type(optimizer).__name__}'s (momentum="
                         f"{momentum}, nesterov={nesterov}; Adam: momentum 0)")
    return compression


class Optimizer:
    """Trains the wrapped optimizer's parameters through the parameter server.

    Args:
        optimizer: a torch.optim.SGD, Adam or AdamW over the model's parameters (the same
            model, built the same way, on every rank).
        mode: "sync", "async" or "ssp".
        backup_workers: sync: each step applies the first num_workers - backup_workers.
        staleness: ssp: how many steps a worker may run ahead of the slowest.
        compression: "none"; "fp16": gradients are pushed as float16; "dgc": Deep Gradient
            Compression (density 0.001) of pushed gradients, with the optimizer's momentum
            applied on the worker (momentum correction; the servers then apply momentum to
            the weight decay only); or a collectives.torch.dgc.DGC / TopKCompressor
            instance (its density, warm-up, clipping, fp16 values). See ``compression``.
        checkpoint: servers load their shard from ``<checkpoint>.shard<i>.npz`` if it
            exists and save it there when serving ends (and every checkpoint_every steps).
        checkpoint_every: save the shard after every this many updates (0: only at the end).
        num_servers: as collectives.ps.init (default COLLECTIVES_PS_SERVERS).
        on_step: servers: called with each StepReport.
        host_sum: as collectives.ps.init: a host's workers sum their gradients before one
            push per host (mode "sync" without backup workers).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, mode: str = "sync", *,
                 backup_workers: int = 0, staleness: int = 0, compression: Any = "none",
                 checkpoint: Optional[str] = None, checkpoint_every: int = 0,
                 num_servers: Optional[int] = None,
                 on_step: Optional[Callable[[StepReport], None]] = None,
                 host_sum: bool = False) -> None:
        self.optimizer = optimizer
        self.update = server_optimizer(optimizer, compression)
        # the worker's compressor (DGC keeps this worker's residuals; call its
        # warmup_compress_ratio(epoch) for a warm-up schedule), or the compression string
        self.compression = push_compressor(optimizer, compression)
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        if any(p.dtype != torch.float32 for p in self.params):
            raise TypeError("the parameter server holds float32 parameters")
        self.mode, self.backup_workers, self.staleness = mode, backup_workers, staleness
        self.checkpoint, self.checkpoint_every, self.on_step = checkpoint, checkpoint_every, on_step
        self.role: Role = init(num_servers, host_sum=host_sum)
        self.reports: list = []
        self.client = None
        if self.role.is_worker:
            self.client = worker(self.params, self.compression)
            first = self._flat(lambda p: p.detach()) if self.role.index == 0 else None
            self._load(self.client.start(first))

    @property
    def is_server(self) -> bool:
        """True on the ranks that hold parameters (they call serve())."""
        return self.role.is_server

    @property
    def is_worker(self) -> bool:
        """True on the ranks that compute gradients (they call step())."""
        return self.role.is_worker

    def _flat(self, pick: Callable[[torch.Tensor], Any]) -> np.ndarray:
        parts = []
        for p in self.params:
            t = pick(p)
            parts.append(np.zeros(p.numel(), np.float32) if t is None
                         else t.detach().cpu().reshape(-1).numpy())
        return np.concatenate(parts).astype(np.float32, copy=False)

    def _load(self, flat: np.ndarray) -> None:
        src = torch.from_numpy(flat)
        with torch.no_grad():
            i = 0
            for p in self.params:
                n = p.numel()
                p.copy_(src[i:i + n].view_as(p))
                i += n

    def serve(self) -> list:
        """Servers: serve until every worker has finished or failed; returns the StepReports."""
        holder: list = []

        def on_step(r: StepReport) -> None:
            if self.on_step is not None:
                self.on_step(r)
            every = self.checkpoint_every
            if self.checkpoint and every and (r.step + 1) % every == 0:
                holder[0].save(f"{self.checkpoint}.shard{self.role.index}.npz")

        self.reports = serve(self.params, self.update, self.mode,
                             backup_workers=self.backup_workers, staleness=self.staleness,
                             checkpoint=self.checkpoint, on_step=on_step, server=holder.append)
        return self.reports

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch.optim.Optimizer.zero_grad."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Workers: push the gradients, load the parameters the servers send back."""
        if self.client is None:
            raise RuntimeError(f"rank {self.role.rank} is a server: it calls serve(), not step()")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._load(self.client.push_pull(self._flat(lambda p: p.grad)))
        return loss

    def finish(self) -> None:
        """Workers: tell the servers this worker is done (they stop once all are)."""
        if self.client is not None:
            self.client.finish()
