"""The data of tests/_elastic_train.py: step s on rank r of n, drawn from a seeded generator."""
import torch


def batch(step, rank, size):
    """(x, y) of `step` on `rank` of a world of `size`: different for every (step, rank, size)."""
    g = torch.Generator().manual_seed(step * 10007 + rank * 101 + size)
    x = torch.randn(8, 4, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]], dtype=torch.float64) + rank - size
    return x, y
