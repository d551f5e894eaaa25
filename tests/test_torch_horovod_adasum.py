"""allreduce(op=hvd.Adasum) against a numpy reference of Horovod's CPU recursion
(pairwise adaptive summation, level by level, rank order) at 2 and 4 ranks."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import run_world  # noqa: E402

ADASUM_BODY = r'''
import numpy as np
import torch
import collectives.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()

def pair(a, b):  # Maleki et al.; a coefficient is 1 below a squared norm of 1e-8 (Horovod)
    dot, na, nb = a @ b, a @ a, b @ b
    ca = 1 - dot / (2 * na) if na >= 1e-8 else 1.0
    cb = 1 - dot / (2 * nb) if nb >= 1e-8 else 1.0
    return ca * a + cb * b

def reference(vs):
    while len(vs) > 1:
        vs = [pair(vs[i], vs[i + 1]) for i in range(0, len(vs), 2)]
    return vs[0]

def vec(k, seed, size=37):
    return np.random.default_rng(100 * seed + k).standard_normal(size)

cases = {
    "random": [vec(k, 1) for k in range(n)],
    "identical": [vec(0, 2)] * n,  # adasum(a, a) = a
    "orthogonal": [np.eye(n * 2)[k] * (k + 1) for k in range(n)],  # the plain sum
    "one zero": [np.zeros(37) if k == 0 else vec(k, 3) for k in range(n)],
    "scaled": [vec(0, 4) * (k + 1) + vec(k, 5) * 0.1 for k in range(n)],
}
for case, vs in cases.items():
    want = reference([v.copy() for v in vs])
    got = hvd.allreduce(torch.from_numpy(vs[r].copy()), op=hvd.Adasum)
    expect(np.allclose(got.numpy(), want, rtol=1e-12, atol=1e-12), case,
           f"got {got[:4].tolist()}, expected {want[:4].tolist()}")
    got = hvd.synchronize(hvd.allreduce_async(torch.from_numpy(vs[r].copy()).float().reshape(-1, 1),
                                              op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.5))
    expect(got.dtype == torch.float32 and got.shape == (len(vs[r]), 1), case + " f32", str(got.shape))
    expect(np.allclose(got.numpy().reshape(-1), want, rtol=1e-5, atol=1e-5), case + " f32 async",
           f"got {got[:4, 0].tolist()}, expected {want[:4].tolist()}")
try:
    hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum)
    fail("int", "Adasum of an integer tensor was accepted")
except TypeError as e:
    expect("floating-point" in str(e), "int", str(e))
expect(hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [n, n], "after", "")
'''


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 4])
def test_adasum_matches_the_recursion(n):
    res = run_world(n, ADASUM_BODY, launcher=True, timeout=80)
    for rank in range(n):
        assert res[rank].get("fail") == [], res.report()
    res.assert_ok()


def test_adasum_needs_a_power_of_two_rank_count():
    from collectives.torch import adasum

    for size in (3, 5, 6):
        with pytest.raises(NotImplementedError, match="power-of-two"):
            adasum.check(torch.ones(2), size)
    adasum.check(torch.ones(2), 8)
