"""Bayesian optimisation in a box: a Gaussian process and expected improvement, numpy only.

What Horovod's autotuner (``horovod/common/optim``) does, written for a
handful of samples of a noisy score:

- ``GaussianProcess``: regression with a squared-exponential (RBF) kernel
  ``a^2 exp(-|x - x'|^2 / 2l^2)`` plus ``noise^2`` on the diagonal, solved by
  Cholesky. The length ``l`` and amplitude ``a`` are the pair of a fixed grid
  with the highest marginal likelihood (Horovod runs L-BFGS from (1, 1); a
  grid is bounded in time, cannot diverge, and is deterministic).
- ``expected_improvement``: EI of a maximisation over the incumbent, with
  ``math.erf`` for the normal CDF.
- ``BayesianOptimizer``: inputs scaled to the unit box, scores standardised;
  the next sample is the candidate of highest EI among seeded uniform draws,
  refined by shrinking Gaussian steps around the best of them (Horovod: 25
  L-BFGS restarts). The incumbent is the highest posterior mean at a sampled
  point, not the highest raw score (Horovod's choice for noisy scores, after
  Brochu, Cora and de Freitas, "A Tutorial on Bayesian Optimization", 2.4).

Everything here is deterministic given the seed.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

__all__ = ["GaussianProcess", "expected_improvement", "BayesianOptimizer"]

LENGTHS = tuple(float(v) for v in np.geomspace(0.05, 2.0, 14))  # in unit-box widths
AMPLITUDES = (0.5, 1.0, 1.5, 2.0, 3.0)  # in standard deviations of the scores
JITTER = 1e-9  # keeps the factorisation defined when noise is 0 and two samples coincide
CANDIDATES = 1024  # uniform draws per proposal
REFINE = ((0.1, 32), (0.03, 32), (0.01, 32))  # (step, draws per kept point) per pass
KEEP = 8  # best candidates kept between refinement passes


def _solve(chol: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(L L^T)^-1 b for lower-triangular L (small systems: numpy's general solve)."""
    return np.linalg.solve(chol.T, np.linalg.solve(chol, b))


class GaussianProcess:
    """Gaussian-process regression with an RBF kernel (inputs in the unit box).

    Args:
        noise: standard deviation of the observation noise, in units of the scores
            (Horovod's HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE, on standardised scores).
    """

    def __init__(self, noise: float) -> None:
        self.noise = float(noise)
        self.length, self.amplitude = 1.0, 1.0
        self.x = np.zeros((0, 1))
        self._chol = np.zeros((0, 0))
        self._alpha = np.zeros(0)

    @staticmethod
    def kernel(a: np.ndarray, b: np.ndarray, length: float, amplitude: float) -> np.ndarray:
        """The RBF kernel matrix between the rows of a and the rows of b."""
        d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=-1)
        return amplitude ** 2 * np.exp(-0.5 * d2 / length ** 2)

    def _factor(self, x: np.ndarray, length: float, amplitude: float) -> np.ndarray:
        k = self.kernel(x, x, length, amplitude)
        k[np.diag_indices_from(k)] += self.noise ** 2 + JITTER
        return np.linalg.cholesky(k)

    def fit(self, x: np.ndarray, y: np.ndarray) -> "GaussianProcess":
        """Condition on samples x (n, d) with scores y (n,), choosing the kernel's length
        and amplitude from the grid by marginal likelihood. Returns self."""
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        best: Optional[tuple] = None
        for length in LENGTHS:
            for amplitude in AMPLITUDES:
                chol = self._factor(x, length, amplitude)
                alpha = _solve(chol, y)
                # negative log marginal likelihood, without its constant 0.5 n log(2 pi)
                nll = 0.5 * float(y @ alpha) + float(np.log(np.diag(chol)).sum())
                if best is None or nll < best[0]:
                    best = (nll, length, amplitude, chol, alpha)
        assert best is not None  # (the grids are not empty)
        _, self.length, self.amplitude, self._chol, self._alpha = best
        self.x = x
        return self

    def predict(self, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation at the rows of xs (m, d)."""
        xs = np.asarray(xs, dtype=float)
        ks = self.kernel(self.x, xs, self.length, self.amplitude)  # (n, m)
        mu = ks.T @ self._alpha
        v = np.linalg.solve(self._chol, ks)
        var = self.amplitude ** 2 - (v * v).sum(axis=0)
        return mu, np.sqrt(np.maximum(var, 0.0))


_SQRT2 = math.sqrt(2.0)
_SQRT2PI = math.sqrt(2.0 * math.pi)


def expected_improvement(mu: np.ndarray, sigma: np.ndarray, best: float,
                         xi: float = 0.01) -> np.ndarray:
    """Expected improvement over `best` of a maximisation, per point (0 where sigma is 0);
    xi > 0 trades some of the predicted gain for exploration (Horovod's 0.01)."""
    out = np.zeros(len(mu))
    for i, (m, s) in enumerate(zip(np.asarray(mu, dtype=float), np.asarray(sigma, dtype=float))):
        if s <= 0.0:
            continue
        imp = m - best - xi
        z = imp / s
        out[i] = imp * 0.5 * (1.0 + math.erf(z / _SQRT2)) + s * math.exp(-0.5 * z * z) / _SQRT2PI
    return out


class BayesianOptimizer:
    """Maximise a noisy function over a box, one sample at a time.

    Args:
        bounds: (low, high) per dimension.
        noise: the Gaussian process's noise, on standardised scores.
        seed: seeds the candidate draws (the same seed, samples and scores give the same
            proposals).
        xi: EI's exploration term.
    """

    def __init__(self, bounds: Sequence[tuple], noise: float, seed: int = 0,
                 xi: float = 0.01) -> None:
        self.lo = np.array([float(b[0]) for b in bounds])
        self.hi = np.array([float(b[1]) for b in bounds])
        if not len(self.lo) or np.any(self.hi <= self.lo):
            raise ValueError(f"BayesianOptimizer: bounds {list(bounds)} are empty")
        self.noise, self.xi = float(noise), float(xi)
        self.rng = np.random.default_rng(seed)
        self.xs: list = []
        self.ys: list = []

    @property
    def dims(self) -> int:
        """The number of dimensions."""
        return len(self.lo)

    def add(self, x: Sequence[float], y: float) -> None:
        """Record that the function scored y at x."""
        self.xs.append(np.clip(np.asarray(x, dtype=float), self.lo, self.hi))
        self.ys.append(float(y))

    def _unit(self, x: np.ndarray) -> np.ndarray:
        return (x - self.lo) / (self.hi - self.lo)

    def model(self) -> GaussianProcess:
        """The process fitted to the samples so far (scores standardised)."""
        y = np.array(self.ys)
        sd = float(y.std())
        y = (y - y.mean()) / (sd if sd > 0 else 1.0)
        return GaussianProcess(self.noise).fit(self._unit(np.array(self.xs)), y)

    def propose(self) -> np.ndarray:
        """The next point to sample: the highest expected improvement found (a uniform
        draw while there are fewer than two samples)."""
        if len(self.ys) < 2:
            return self.lo + self.rng.random(self.dims) * (self.hi - self.lo)
        gp = self.model()
        incumbent = float(gp.predict(gp.x)[0].max())
        cand = self.rng.random((CANDIDATES, self.dims))
        ei = expected_improvement(*gp.predict(cand), incumbent, self.xi)
        for step, draws in REFINE:
            top = cand[np.argsort(-ei, kind="stable")[:KEEP]]
            local = top[:, None, :] + self.rng.normal(0.0, step, (len(top), draws, self.dims))
            cand = np.vstack([top, np.clip(local, 0.0, 1.0).reshape(-1, self.dims)])
            ei = expected_improvement(*gp.predict(cand), incumbent, self.xi)
        return self.lo + cand[int(np.argmax(ei))] * (self.hi - self.lo)

    def best(self) -> tuple[np.ndarray, float]:
        """(x, score) of the sample the process predicts highest: a single lucky score on
        a noisy host does not win over a consistent neighbourhood."""
        if not self.ys:
            raise ValueError("BayesianOptimizer.best: no samples yet")
        if len(self.ys) < 2:
            return self.xs[0], self.ys[0]
        gp = self.model()
        i = int(np.argmax(gp.predict(gp.x)[0]))
        return self.xs[i], self.ys[i]
