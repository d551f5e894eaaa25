"""Adasum (Maleki et al., "Scaling Distributed Training with Adaptive Summation"), as
Horovod computes it on CPU: ``allreduce(t, op=hvd.Adasum)``.

Two vectors combine as

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

(a coefficient is 1 when its vector's squared norm is below 1e-8), and the
ranks combine recursively in pairs: level 1 combines ranks (0, 1), (2, 3), ...,
level 2 combines those results pairwise, and so on, so the rank count must
be a power of two (Horovod's CPU Adasum has the same rule). Horovod spreads
the work with vector halving and distance doubling, computing the dot
products over each pair's whole vectors; here every rank allgathers the
vectors (bandwidth n times the tensor, not Horovod's) and computes the same
recursion in float64, in the same order on every rank, so every rank gets
bit-identical results. Float tensors only (float16, bfloat16, float32, float64).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import torch

from ._context import check_tensor, current

__all__ = ["combine", "adasum_recursive", "check", "adasum_into"]

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
NORM_FLOOR = 1e-8


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """adasum(a, b) of two float64 vectors."""
    dot = float(a @ b)
    anorm, bnorm = float(a @ a), float(b @ b)
    acoeff = 1.0 - dot / anorm * 0.5 if anorm >= NORM_FLOOR else 1.0
    bcoeff = 1.0 - dot / bnorm * 0.5 if bnorm >= NORM_FLOOR else 1.0
    return acoeff * a + bcoeff * b


def adasum_recursive(vectors: list) -> np.ndarray:
    """The pairwise recursion over a power-of-two list of vectors, in rank order."""
    level = list(vectors)
    while len(level) > 1:
        level = [combine(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def check(tensor: torch.Tensor, size: int) -> None:
    """The errors Horovod gives, raised before anything is sent."""
    check_tensor(tensor)
    if size & (size - 1):
        raise NotImplementedError(f"Adasum needs a power-of-two number of ranks (as Horovod's "
                                  f"CPU Adasum); this world has {size}")
    if tensor.dtype not in FLOATS:
        raise TypeError(f"Adasum reduces floating-point tensors only, got {tensor.dtype}")


def adasum_into(tensor: torch.Tensor, output: torch.Tensor, prescale: float, postscale: float,
                name: Optional[str], allgather: Callable[..., Any]) -> torch.Tensor:
    """output = Adasum over ranks of prescale * tensor, times postscale (output may be
    tensor); `allgather(rows, what)` is mpi_ops' agreed allgather (rows, dim-0 sizes)."""
    ctx = current()
    check(tensor, ctx.size)
    x = tensor.detach().to(torch.float64).reshape(1, -1) * prescale
    rows = allgather(x, f"allreduce Adasum name={name!r}")[0].numpy()
    result = adasum_recursive([rows[r] for r in range(ctx.size)]) * postscale
    output.detach().copy_(torch.from_numpy(result).reshape(tensor.shape).to(output.dtype))
    return output
