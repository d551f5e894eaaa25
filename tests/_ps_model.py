"""A tiny linear model with exact data, shared by the parameter-server tests' ranks and oracle.

Step k's global batch is drawn from seed k; worker w of n takes rows w::n, so
the mean of the workers' gradients is the gradient of the global batch.
"""
from __future__ import annotations

import numpy as np

SHAPES = [(6, 3), (3,), (2, 2)]  # 18 + 3 + 4 = 25 elements
TOTAL = 25
BATCH = 12  # divisible by 1, 2, 3, 4, 6


def initial() -> np.ndarray:
    """The model's starting values (flat float32)."""
    return np.random.default_rng(1234).standard_normal(TOTAL).astype(np.float32)


def batch(step: int):
    """(X, Y) of the global batch of this step."""
    rng = np.random.default_rng(step)
    return rng.standard_normal((BATCH, 6)), rng.standard_normal((BATCH, 3))


def grad(flat, step: int, rows=slice(None)) -> np.ndarray:
    """Gradient of mean squared error of rows of step's batch at flat (float64 math)."""
    p = np.asarray(flat, dtype=np.float64)
    Wm, b, E = p[:18].reshape(6, 3), p[18:21], p[21:25].reshape(2, 2)
    X, Y = batch(step)
    X, Y = X[rows], Y[rows]
    r = X @ Wm + b - Y
    n = len(X)
    g = np.zeros(TOTAL)
    g[:18] = (2.0 / n) * (X.T @ r).ravel()
    g[18:21] = (2.0 / n) * r.sum(0)
    g[21:25] = 2.0 * 0.01 * E.ravel()  # a parameter with its own small quadratic loss
    return g.astype(np.float32)


def sgd_reference(steps: int, lr: float, momentum: float, weight_decay: float) -> np.ndarray:
    """Single-process SGD (torch.optim.SGD's formula) on the global batch."""
    p = initial().astype(np.float64)
    buf = None
    for k in range(steps):
        g = grad(p, k).astype(np.float64) + weight_decay * p
        buf = g if buf is None else momentum * buf + g
        p = p - lr * buf
    return p


def replay(steps, lr: float, momentum: float, nworkers: int) -> np.ndarray:
    """SGD (torch's formula) where step k applies the mean gradient of the workers listed in
    steps[k] (a server's reports), each on its rows w::nworkers of batch k, at step k's params."""
    p = initial().astype(np.float32)
    buf = None
    for k, contributors in enumerate(steps):
        g = np.mean([grad(p, k, slice(w, None, nworkers)) for w in contributors],
                    axis=0).astype(np.float32)
        buf = g if buf is None else np.float32(momentum) * buf + g
        p = p - np.float32(lr) * buf
    return p
