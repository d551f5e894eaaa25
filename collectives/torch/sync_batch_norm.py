"""Horovod's ``hvd.SyncBatchNorm``: batch normalization with statistics over every rank.

In training, the mean and variance are those of the batch concatenated over
all ranks (ranks may hold different batch sizes): each rank allreduces its
per-channel element count and sum, then the sum of squared deviations from
the global mean (two passes, so no cancellation of E[x^2] - E[x]^2). The
allreduces are the differentiable ``allreduce(op=Sum)``, whose backward is the
allreduce of the gradient, so the input gradient is exactly that of the total
loss through the global statistics: the forward and the input gradient equal
``torch.nn.BatchNorm*d`` on the concatenated batch. The weight and bias
gradients stay local (each rank's share), as in Horovod; DistributedOptimizer
reduces them. Running statistics use the unbiased global variance. In eval
mode (with running statistics) it is plain batch norm, with no communication.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .basics import Sum
from .mpi_ops import allreduce

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Batch normalization synchronized over all ranks (Horovod's ``hvd.SyncBatchNorm``).

    Args:
        num_features: channels C of an input of shape (N, C, ...).
        eps: added to the variance.
        momentum: running statistics' update factor (None: cumulative average).
        affine: learnable weight and bias.
        track_running_stats: keep running mean and variance.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize `input` (N, C, ...) with statistics over every rank's batch."""
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm({self.num_features}) got {input.shape[1]} channels")
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, False, 0.0, self.eps)
        if self.momentum is None:
            factor = 1.0 / float(self.num_batches_tracked) if self.track_running_stats else 0.0
        else:
            factor = self.momentum
        return self._sync_forward(input, factor)

    def _sync_forward(self, x: torch.Tensor, factor: float) -> torch.Tensor:
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        view = [1, c] + [1] * (x.dim() - 2)
        local = x.numel() // c if c else 0
        counted = torch.cat([x.sum(dims), torch.full((1,), float(local), dtype=x.dtype)])
        total = allreduce(counted, op=Sum, name="sync_batch_norm.sum")
        count = float(total[c].detach())
        if count < 1:
            raise ValueError("SyncBatchNorm: the batch is empty on every rank")
        mean = total[:c] / count
        centered = x - mean.view(view)
        var = allreduce((centered * centered).sum(dims), op=Sum,
                        name="sync_batch_norm.sqdev") / count
        out = centered * torch.rsqrt(var + self.eps).view(view)
        if self.affine:
            out = out * self.weight.view(view) + self.bias.view(view)
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                unbiased = var.detach() * (count / max(count - 1.0, 1.0))
                self.running_mean.mul_(1 - factor).add_(mean.detach(), alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
        return out
