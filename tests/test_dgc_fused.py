"""The fused DGC pass (native/reduce/dgc_fused.c) and the per-bucket overlapped exchange.

In process: the fused selection (one native pass: update, threshold counts,
candidates) gives bit for bit the torch-op reference's selected entries and
residuals, over several steps, for DGC (momentum, Nesterov, masking,
clipping, float16 values, warm-up densities) and top-k; the candidate
overflow fallback too; the kernels reject bad arguments.
Multi-process (2 and 3 ranks): the overlapped path (each bucket's sparse
exchange started from the gradient hook, during backward) trains bit for bit
like the old path (all sparse tensors exchanged in synchronize()), same sent
entries and same residuals, and its requests really are in flight before
step().
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import run_world  # noqa: E402

from collectives import _core  # noqa: E402
from collectives.torch import sparse_ops  # noqa: E402
from collectives.torch.dgc import DGC, TopKCompressor  # noqa: E402


def _grads(seed: int, shapes, steps: int):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(*s, generator=g) * torch.rand(*s, generator=g) ** 4 for s in shapes]
            for _ in range(steps)]


CASES = [
    ("dgc", dict(momentum=0.9)),
    ("dgc", dict(momentum=0.9, nesterov=True)),
    ("dgc", dict(momentum=0.8, momentum_masking=False, fp16_values=True, int32_indices=False)),
    ("dgc", dict(momentum=0.9, clip_norm=0.5)),
    ("dgc", dict(momentum=0.9, warmup_ratios=[0.3, 0.05], sample_ratio=0.001)),
    ("topk", dict(compress_ratio=0.01)),
    ("topk", dict(compress_ratio=0.002, fp16_values=True)),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind,kw", CASES)
def test_fused_pass_equals_torch_reference(kind, kw):
    cls = DGC if kind == "dgc" else TopKCompressor
    kw = dict(kw)
    ratio = kw.pop("compress_ratio", 0.003)
    comps = [cls(compress_ratio=ratio, fused=f, **kw) for f in (True, False)]
    for c in comps:
        c.nranks = 3
    shapes = [(300, 211), (77, 1000), (5000,)]
    steps = _grads(11, shapes, 6)
    for s, grads in enumerate(steps):
        for c in comps:
            c.warmup_compress_ratio(s // 2)
        for j, g in enumerate(grads):
            name = f"t{j}"
            got = comps[0].select(name, g, j)
            want = comps[1].select(name, g.clone(), j)
            assert torch.equal(got[1], want[1]), (s, j, "indices")
            assert torch.equal(got[0], want[0]), (s, j, "values")
            assert 0 < got[1].numel() <= comps[0].k(g.numel())
            for key, t in comps[1].memory[name].items():
                assert torch.equal(comps[0].memory[name][key], t), (s, j, key)
        for c in comps:
            c.end_step()


@pytest.mark.timeout(30)
def test_fused_pass_candidate_overflow_falls_back():
    # the sampled entries are tiny, every other one is large: the sample puts the
    # lowest threshold far below the tensor's real tail, more candidates than fit
    n, index = 200_000, 0
    comps = [TopKCompressor(compress_ratio=0.001, fused=f) for f in (True, False)]
    off, stride, s, _ = sparse_ops.sample_plan(n, comps[0].k(n), comps[0].sample_ratio,
                                               comps[0].sample_start(index))
    g = torch.randn(n, generator=torch.Generator().manual_seed(3)).add_(10)
    g[off::stride] = 1e-3
    got = comps[0].select("x", g, index)
    want = comps[1].select("x", g.clone(), index)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    assert torch.equal(comps[0].memory["x"]["v"], comps[1].memory["x"]["v"])
    assert got[1].numel() == comps[0].k(n)


@pytest.mark.timeout(30)
def test_fused_kernels_against_numpy_and_bad_arguments():
    rng = np.random.default_rng(5)
    n = 10_007
    g, u, v = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    m, sc = np.float32(0.9), np.float32(0.7)
    nu = m * u + g * sc
    nv = v + nu
    sample = np.empty(100, np.float32)
    _core.dgc_sample(g, u, v, "momentum", 0.9, 0.7, 3, 97, sample)
    assert np.array_equal(sample, np.abs(nv[3::97][:100]))
    thr = np.array([2.5, 2.0, 2.0, 1.0], np.float32)
    hist = np.zeros(4, np.int64)
    cv, ci = np.empty(n, np.float32), np.empty(n, np.int64)
    uu, vv = u.copy(), v.copy()
    c = _core.dgc_update(g, uu, vv, "momentum", 0.9, 0.7, thr, hist, cv, ci)
    assert np.array_equal(uu, nu) and np.array_equal(vv, nv)
    assert list(np.cumsum(hist)) == [int((np.abs(nv) >= t).sum()) for t in thr]
    sel = np.nonzero(np.abs(nv) >= 1.0)[0]
    assert c == sel.size and np.array_equal(ci[:c], sel) and np.array_equal(cv[:c], nv[sel])
    with pytest.raises(ValueError, match="non-increasing"):
        _core.dgc_update(g, u.copy(), v.copy(), "momentum", 0.9, 1.0,
                         np.array([1.0, 2.0], np.float32), np.zeros(2, np.int64), cv, ci)
    with pytest.raises(ValueError, match="non-increasing"):
        _core.dgc_update(g, u.copy(), v.copy(), "momentum", 0.9, 1.0,
                         np.array([0.0], np.float32), np.zeros(1, np.int64), cv, ci)
    with pytest.raises(ValueError, match="mode"):
        _core.dgc_sample(g, u, v, "adam", 0.9, 1.0, 0, 1, sample)
    with pytest.raises(ValueError, match="needs the momentum buffer"):
        _core.dgc_sample(g, None, v, "nesterov", 0.9, 1.0, 0, 1, sample)
    with pytest.raises(ValueError, match="elements"):
        _core.dgc_sample(g, u[:-1], v, "momentum", 0.9, 1.0, 0, 1, sample)
    with pytest.raises(TypeError, match="float32"):
        _core.dgc_sample(g.astype(np.float64), u, v, "momentum", 0.9, 1.0, 0, 1, sample)
    with pytest.raises(ValueError, match="run past"):
        _core.dgc_sample(g, u, v, "momentum", 0.9, 1.0, 9000, 97, sample)
    with pytest.raises(ValueError, match="overlap"):
        _core.dgc_update(g, v, v, "momentum", 0.9, 1.0, thr, hist, cv, ci)
    with pytest.raises(TypeError, match="hist"):
        _core.dgc_update(g, u.copy(), v.copy(), "momentum", 0.9, 1.0, thr, np.zeros(3, np.int64),
                         cv, ci)
    with pytest.raises(ValueError, match="cand_v"):
        _core.dgc_update(g, u.copy(), v.copy(), "momentum", 0.9, 1.0, thr, hist, cv[:5], ci)


OVERLAP_BODY = r'''
import torch
import torch.nn as nn
import collectives.torch as hvd
from collectives.torch.dgc import DGC, DGCSGD, TopKCompressor

hvd.init()
r, n = hvd.rank(), hvd.size()
torch.set_num_threads(1)

def model_fn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96), nn.Tanh(), nn.Linear(96, 80), nn.ReLU(),
                         nn.Linear(80, 48), nn.ReLU(), nn.Linear(48, 4))

def run(make, overlap, fused):
    m = model_fn()
    comp = make(overlap=overlap, fused=fused)
    base = DGCSGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3) \
        if isinstance(comp, DGC) else torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    opt = hvd.DistributedOptimizer(base, named_parameters=m.named_parameters(),
                                   compression=comp, groups=3)
    sent, in_flight = [], 0
    for s in range(6):
        comp.warmup_compress_ratio(s // 3)
        g = torch.Generator().manual_seed(1000 * s + r)
        x, y = torch.randn(8, 64, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        in_flight += sum(getattr(b, "sparse", None) is not None and
                         (n == 1 or b.sparse["request"] is not None) for b in opt._buckets)
        opt.step()
        sent.append(dict(comp.stats["sent"]))
    opt.remove_hooks()
    params = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    return params, comp.memory, sent, in_flight

for name, make in (
        ("dgc", lambda **a: DGC(compress_ratio=0.02, momentum=0.9, min_numel=256, clip_norm=2.0,
                                warmup_ratios=[0.2], **a)),
        ("dgc-nesterov-fp16", lambda **a: DGC(compress_ratio=0.05, momentum=0.9, nesterov=True,
                                              fp16_values=True, min_numel=256, **a)),
        ("topk", lambda **a: TopKCompressor(compress_ratio=0.03, min_numel=256, **a))):
    new = run(make, True, True)
    old = run(make, False, False)
    expect(torch.equal(new[0], old[0]), name,
           f"parameters differ by {(new[0] - old[0]).abs().max().item():g}")
    expect(new[2] == old[2], name, f"sent {new[2]} vs {old[2]}")
    expect(any(st for st in new[2]), name, "nothing went sparse")
    for t, mem in old[1].items():
        for key, buf in mem.items():
            expect(torch.equal(new[1][t][key], buf), name, f"memory {t}.{key} differs")
    expect(new[3] >= 6 and old[3] == 0, name, f"sparse buckets in flight before step(): "
           f"overlap {new[3]}, old {old[3]}")
    same = hvd.allgather_object(new[0])
    expect(all(torch.equal(o, new[0]) for o in same), name, "ranks differ")
emit("ok")
'''


@pytest.mark.timeout(90)
@pytest.mark.parametrize("nranks", [2, 3])
def test_overlap_equals_synchronize_path(nranks):
    res = run_world(nranks, OVERLAP_BODY, launcher=True, timeout=80).assert_ok()
    assert res[0].get("ok"), res.report()
