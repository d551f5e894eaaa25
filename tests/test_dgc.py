"""Deep Gradient Compression and top-k with error feedback (collectives.torch.dgc).

In process: the C pack / count / scatter-add kernels against a torch
reference; the warm-up schedule; the compressor's bookkeeping (what was sent
plus what stays in v is the accumulated velocity, never more than k entries).
Multi-process, one launch of 3 ranks running every check: density 1 gives
exactly dense momentum SGD on the global batch; allgatherv plus scatter-add
equals the dense sum of the ranks' sparse vectors; sparse training keeps
ranks identical and sends at most k per tensor; a state_dict round trip
resumes bit for bit; wrapping a momentum optimizer warns; Compression.fp16
still works.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import run_world  # noqa: E402

from collectives import _core  # noqa: E402
from collectives.torch import sparse_ops  # noqa: E402
from collectives.torch.dgc import DGC, DGCSGD, TopKCompressor  # noqa: E402


# ------------------------------------------------------------------ C kernels

def _reference_pack(x: torch.Tensor, thr: float, cap: int):
    idx = torch.nonzero(x.abs() >= thr).reshape(-1)[:cap]
    return x[idx], idx


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_pack_matches_torch(value_dtype, index_dtype):
    g = torch.Generator().manual_seed(7)
    for n in (0, 1, 255, 256, 257, 1000, 100_003):
        x = torch.randn(n, generator=g) * torch.rand(n, generator=g) ** 3
        if n > 10:
            x[3] = float("inf")
            x[5] = -0.0
        for thr in (1e-30, 0.5, 2.0, 100.0):
            expected_count = int((x.abs() >= thr).sum())
            assert _core.sparse_count_above(x.numpy(), thr) == expected_count
            for cap in (0, 1, 7, n):
                vals = torch.full((cap,), -9.0, dtype=value_dtype)
                idx = torch.full((cap,), -9, dtype=index_dtype)
                c = _core.sparse_pack(x.numpy(), thr, vals.numpy(), idx.numpy())
                ev, ei = _reference_pack(x, thr, cap)
                assert c == ev.numel() == min(cap, expected_count)
                assert torch.equal(idx[:c].long(), ei)
                assert torch.equal(vals[:c], ev.to(value_dtype))  # float16: round to nearest even


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_scatter_add_matches_index_add(value_dtype, index_dtype):
    g = torch.Generator().manual_seed(3)
    for n, count in ((1, 0), (1, 5), (1000, 37), (5000, 5000)):
        out = torch.randn(n, generator=g)
        vals = torch.randn(count, generator=g).to(value_dtype)
        idx = torch.randint(0, n, (count,), generator=g).to(index_dtype)  # repeats add up
        expected = out.clone().index_add_(0, idx.long(), vals.float())
        _core.sparse_scatter_add(out.numpy(), vals.numpy(), idx.numpy())
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    out = torch.zeros(10)
    for bad in (10, -1):
        with pytest.raises(ValueError, match="outside"):
            _core.sparse_scatter_add(out.numpy(), torch.ones(2, dtype=value_dtype).numpy(),
                                     torch.tensor([0, bad], dtype=index_dtype).numpy())
        assert not out.any()  # checked before any write


@pytest.mark.timeout(30)
def test_kernels_reject_bad_arguments():
    x = torch.ones(4)
    with pytest.raises(ValueError, match="threshold"):
        _core.sparse_count_above(x.numpy(), 0.0)
    with pytest.raises(ValueError, match="threshold"):
        _core.sparse_pack(x.numpy(), float("nan"), np.zeros(2, np.float32), np.zeros(2, np.int32))
    with pytest.raises(TypeError, match="float32"):
        _core.sparse_count_above(np.ones(4), 1.0)
    with pytest.raises(TypeError, match="indices"):
        _core.sparse_pack(x.numpy(), 1.0, np.zeros(2, np.float32), np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="mismatch"):
        _core.sparse_scatter_add(x.numpy(), np.zeros(2, np.float32), np.zeros(3, np.int32))


@pytest.mark.timeout(30)
def test_threshold_selects_at_most_k_and_close_to_k():
    g = torch.Generator().manual_seed(11)
    for n in (5000, 300_000):
        x = torch.randn(n, generator=g) * torch.rand(n, generator=g) ** 4
        for k in (1, 30, n // 100, n // 4):
            thr = sparse_ops.choose_threshold(x, k, 0.01, 3, start=5)
            vals = torch.empty(k)
            idx = torch.empty(k, dtype=torch.int32)
            c = sparse_ops.select(x, thr, k, vals, idx)
            assert 1 <= c <= k
            if k >= 30:
                assert c >= 0.5 * k, (n, k, c)
            # what was selected is the largest of what passed the threshold
            assert vals[:c].abs().min() >= thr


# ------------------------------------------------------------------ schedule

@pytest.mark.timeout(30)
def test_warmup_schedule():
    paper = DGC(compress_ratio=0.001, warmup_ratios=[0.25, 0.0625, 0.015625, 0.00390625])
    assert [paper.warmup_compress_ratio(e) for e in range(6)] == \
        [0.25, 0.0625, 0.015625, 0.00390625, 0.001, 0.001]
    assert paper.warmup_compress_ratio(2.7) == 0.015625  # fractional epochs: step-based use
    exp = DGC(compress_ratio=0.001, warmup_epochs=4)
    ds = [exp.density_at(e) for e in range(6)]
    assert all(a > b for a, b in zip(ds, ds[1:5])) and ds[4] == ds[5] == 0.001
    assert math.isclose(ds[0], 0.001 ** 0.2) and math.isclose(ds[3], 0.001 ** 0.8)
    steps = TopKCompressor(compress_ratio=0.01, warmup_epochs=2, steps_per_epoch=3)
    seen = []
    for _ in range(9):
        seen.append(steps.density)
        steps.end_step()
    assert seen[:3] == [0.01 ** (1 / 3)] * 3 and seen[3:6] == [0.01 ** (2 / 3)] * 3
    assert seen[6:] == [0.01] * 3
    # dense while sparse would cost more: density < 8 / (N * entry bytes)
    c = DGC(compress_ratio=0.25)  # fp32 values + int32 indices: 8 bytes an entry
    assert not c.sparse_now(10_000, 4) and c.sparse_now(10_000, 3)
    assert DGC(compress_ratio=0.001).sparse_now(10_000, 64)
    assert not DGC(compress_ratio=1.0).sparse_now(10_000, 1)
    p = torch.nn.Parameter(torch.zeros(64, 64))
    assert c.eligible("w", p) and not c.eligible("b", torch.nn.Parameter(torch.zeros(5000)))
    assert not DGC(dense=lambda name, t: name == "w").eligible("w", p)


# ------------------------------------------------------------------ compressor bookkeeping

@pytest.mark.timeout(30)
@pytest.mark.parametrize("fp16,nesterov,masking", [(False, False, True), (True, True, True),
                                                   (False, False, False)])
def test_sent_plus_residual_is_accumulated_velocity(fp16, nesterov, masking):
    comp = DGC(compress_ratio=0.01, momentum=0.9, nesterov=nesterov, momentum_masking=masking,
               fp16_values=fp16, int32_indices=not fp16)
    g = torch.Generator().manual_seed(5)
    n, total_sent = 20_000, torch.zeros(20_000, dtype=torch.float64)
    velocity = torch.zeros(n, dtype=torch.float64)  # sum of what entered v
    for step in range(6):
        grad = torch.randn(n, generator=g)
        u_before = comp.memory.get("w", {}).get("u", torch.zeros(n)).double()
        v = comp.accumulate_sparse("w", grad)
        u = comp.memory["w"]["u"]
        velocity += u.double() + (grad.double() if nesterov else 0)
        expected_u = 0.9 * (u_before + grad.double()) if nesterov else 0.9 * u_before + grad.double()
        torch.testing.assert_close(u.double(), expected_u, rtol=1e-6, atol=1e-6)
        v_before = v.clone()
        k = comp.k(n)
        thr = sparse_ops.choose_threshold(v, k, comp.sample_ratio, 3, comp.sample_start(0))
        buf, [(vals, idx)] = sparse_ops.pack([(v, thr, k)], comp.wire)
        assert 0 < vals.numel() <= k and buf.numel() == sparse_ops.buffer_bytes([vals.numel()], comp.wire)
        comp.sent("w", idx, vals)
        sent = torch.zeros(n).index_put_((idx,), vals)
        # exact in float32: v - sent is exact for the entries sent, zero elsewhere
        assert torch.equal(sent + comp.memory["w"]["v"], v_before)
        if masking:
            assert not comp.memory["w"]["u"][idx].any()
        total_sent += sent.double()
        comp.end_step()
    torch.testing.assert_close(total_sent + comp.memory["w"]["v"].double(), velocity,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(30)
def test_topk_error_feedback_keeps_the_rest():
    comp = TopKCompressor(compress_ratio=0.05)
    g = torch.Generator().manual_seed(9)
    grads = [torch.randn(4000, generator=g) for _ in range(4)]
    total = torch.zeros(4000)
    for grad in grads:
        v = comp.accumulate_sparse("w", grad)
        thr = sparse_ops.choose_threshold(v, comp.k(4000), 0.01)
        _, [(vals, idx)] = sparse_ops.pack([(v, thr, comp.k(4000))], comp.wire)
        comp.sent("w", idx, vals)
        total.index_add_(0, idx, vals)
    torch.testing.assert_close(total + comp.memory["w"]["v"], sum(grads), rtol=1e-5, atol=1e-5)
    # a dense step flushes the residual
    out = comp.accumulate_dense("w", torch.zeros(4000))
    torch.testing.assert_close(total + out, sum(grads), rtol=1e-5, atol=1e-5)
    assert not comp.memory["w"]["v"].any()


@pytest.mark.timeout(30)
def test_malformed_buffer_is_an_error():
    fmt = sparse_ops.WireFormat()
    x = torch.arange(100, dtype=torch.float32)
    buf, _ = sparse_ops.pack([(x, 90.0, 20)], fmt)
    out = torch.zeros(100)
    sparse_ops.decode(buf, [buf.numel()], [out], [20], fmt)
    assert torch.equal(out, torch.where(x >= 90, x, 0))
    with pytest.raises(ValueError, match="caps"):
        sparse_ops.decode(buf, [buf.numel()], [out], [5], fmt)
    with pytest.raises(ValueError, match="bytes"):
        sparse_ops.decode(buf[:-8], [buf.numel() - 8], [out], [20], fmt)
    bad = buf.clone()
    bad[-16:-8] = 255  # an index far outside the tensor
    with pytest.raises(ValueError, match="outside"):
        sparse_ops.decode(bad, [bad.numel()], [torch.zeros(100)], [20], fmt)


# ------------------------------------------------------------------ multi-process

WORLD_BODY = r'''
import math, warnings
import torch
import torch.nn as nn
import collectives.torch as hvd
from collectives.torch import sparse_ops
from collectives.torch._context import current
from collectives.torch.dgc import DGC, DGCSGD, TopKCompressor

hvd.init()
r, n = hvd.rank(), hvd.size()
torch.set_num_threads(1)
B = 4

def model_fn(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))

def batch(step, rank):
    g = torch.Generator().manual_seed(10007 * step + 101 * rank)
    return torch.randn(B, 16, generator=g), torch.randn(B, 1, generator=g)

def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])

def same_on_all_ranks(case, m):
    mine = flat(m)
    expect(all(torch.equal(o, mine) for o in hvd.allgather_object(mine)), case, "ranks differ")

def train(m, opt, steps, first=0, on_step=None):
    for s in range(first, first + steps):
        opt.zero_grad()
        x, y = batch(s, r)
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        if on_step:
            on_step(s)

# 1. density 1: exactly dense momentum SGD on the global batch (all tensors dense)
for nesterov in (False, True):
    case = dict(check="ratio1", nesterov=nesterov)
    ref = model_fn()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-2,
                              nesterov=nesterov)
    for s in range(4):
        ref_opt.zero_grad()
        xs, ys = zip(*[batch(s, k) for k in range(n)])
        nn.functional.mse_loss(ref(torch.cat(xs)), torch.cat(ys)).backward()
        ref_opt.step()
    m = model_fn()
    comp = DGC(compress_ratio=1.0, momentum=0.9, nesterov=nesterov, min_numel=1)
    opt = hvd.DistributedOptimizer(DGCSGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-2,
                                          nesterov=nesterov),
                                   named_parameters=m.named_parameters(), compression=comp)
    train(m, opt, 4)
    worst = (flat(m) - flat(ref)).abs().max().item()
    emit("diff", case=case, worst=worst)
    expect(worst <= 1e-5, case, f"max |param - dense momentum SGD| = {worst:g}")
    expect(comp.stats["sparse_bytes"] == 0, case, f"sparse path used: {comp.stats}")
    opt.remove_hooks()

# 2. allgatherv + scatter-add == dense sum of every rank's sparse vector
for fp16, int32 in ((False, True), (True, False)):
    case = dict(check="exchange", fp16=fp16, int32=int32)
    fmt = sparse_ops.WireFormat(torch.float16 if fp16 else torch.float32,
                                torch.int32 if int32 else torch.int64)
    sizes, ks = [1000, 37, 5000], [50, 37, 1]
    def data(rank):
        g = torch.Generator().manual_seed(77 + rank)
        return [torch.randn(s, generator=g) * (rank + 1) for s in sizes]
    parts = [(x, 1.0 + 0.3 * r, k) for x, k in zip(data(r), ks)]
    buf, mine = sparse_ops.pack(parts, fmt)
    gathered, nbytes = sparse_ops.exchange(current().core, n, buf)
    outs = [torch.zeros(s) for s in sizes]
    sparse_ops.decode(gathered, nbytes, outs, ks, fmt)
    expected = [torch.zeros(s, dtype=torch.float64) for s in sizes]
    for k in range(n):  # rebuild every rank's sparse vectors from its seed, on this rank
        kb, kparts = sparse_ops.pack([(x, 1.0 + 0.3 * k, c) for x, c in zip(data(k), ks)], fmt)
        expect(kb.numel() == nbytes[k], case, f"rank {k} sent {nbytes[k]} bytes, expected {kb.numel()}")
        for e, (v, i) in zip(expected, kparts):
            e.index_add_(0, i, v.double())
    for j, (o, e) in enumerate(zip(outs, expected)):
        err = (o.double() - e).abs().max().item()
        expect(err <= 1e-5 * n, case, f"tensor {j}: max |decoded - dense sum| = {err:g}")
    for (v, _), k in zip(mine, ks):
        expect(v.numel() <= k, case, f"sent {v.numel()} > k = {k}")

# 3. sparse training: at most k per tensor each step, ranks identical, bytes smaller
for name, make in (("dgc", lambda: DGC(compress_ratio=0.02, momentum=0.9, min_numel=256, clip_norm=1.0)),
                   ("dgc-fp16-int64", lambda: DGC(compress_ratio=0.05, fp16_values=True, int32_indices=False,
                                                   nesterov=True, momentum=0.9, min_numel=256)),
                   ("topk", lambda: TopKCompressor(compress_ratio=0.02, min_numel=256))):
    case = dict(check="sparse-train", comp=name)
    m = model_fn()
    comp = make()
    base = DGCSGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=name == "dgc-fp16-int64") \
        if name != "topk" else torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    opt = hvd.DistributedOptimizer(base, named_parameters=m.named_parameters(), compression=comp)
    def on_step(s):
        st = comp.stats
        expect(set(st["sent"]) == {"0.weight", "2.weight"}, case, f"sparse tensors {sorted(st['sent'])}")
        for t, c in st["sent"].items():
            expect(0 < c <= st["caps"][t], case, f"step {s} {t}: sent {c}, k = {st['caps'][t]}")
        expect(st["sparse_bytes"] + st["dense_bytes"] < 4 * sum(p.numel() for p in m.parameters()) / 4,
               case, f"bytes {st}")
    before = flat(m).clone()
    train(m, opt, 5, on_step=on_step)
    expect(not torch.equal(before, flat(m)), case, "parameters did not move")
    same_on_all_ranks(case, m)
    opt.remove_hooks()

# 4. state_dict round trip resumes identically (per-rank residuals restored)
case = dict(check="state_dict")
def setup():
    m = model_fn()
    comp = DGC(compress_ratio=0.03, momentum=0.9, min_numel=256, warmup_ratios=[0.3, 0.1])
    opt = hvd.DistributedOptimizer(DGCSGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3),
                                   named_parameters=m.named_parameters(), compression=comp)
    return m, comp, opt
m, comp, opt = setup()
for e in range(3):
    comp.warmup_compress_ratio(e)
    train(m, opt, 2, first=2 * e)
straight = flat(m).clone()
opt.remove_hooks()
m, comp, opt = setup()
comp.warmup_compress_ratio(0)
train(m, opt, 2)
comp.warmup_compress_ratio(1)
train(m, opt, 1, first=2)
saved = dict(model={k: v.clone() for k, v in m.state_dict().items()}, opt=opt.state_dict(),
             dgc=comp.state_dict())
opt.remove_hooks()
m, comp, opt = setup()
m.load_state_dict(saved["model"])
opt.load_state_dict(saved["opt"])
comp.load_state_dict(saved["dgc"])
comp.warmup_compress_ratio(1)
train(m, opt, 1, first=3)
comp.warmup_compress_ratio(2)
train(m, opt, 2, first=4)
expect(torch.equal(flat(m), straight), case,
       f"resumed differs by {(flat(m) - straight).abs().max().item():g}")
opt.remove_hooks()

# 5. a momentum optimizer under DGC warns; DGCSGD does not
m = model_fn()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    o = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                 named_parameters=m.named_parameters(), compression=DGC())
    o.remove_hooks()
    expect(any("momentum" in str(x.message) for x in w), "warn", "no warning for SGD(momentum=0.9)")
    n_before = len(w)
    o = hvd.DistributedOptimizer(DGCSGD(m.parameters(), lr=0.1, momentum=0.9),
                                 named_parameters=m.named_parameters(), compression=DGC())
    o.remove_hooks()
    expect(len(w) == n_before, "warn", f"unexpected warning {[str(x.message) for x in w[n_before:]]}")

# 6. Compression.fp16 still works beside them
m = model_fn()
opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
                               named_parameters=m.named_parameters(), compression=hvd.Compression.fp16)
train(m, opt, 2)
same_on_all_ranks("fp16", m)
emit("ok")
'''


@pytest.mark.timeout(90)
def test_dgc_in_a_world_of_three():
    res = run_world(3, WORLD_BODY, launcher=True, timeout=80).assert_ok()
    assert len(res[0].get("diff")) == 2, res.report()
    assert res[0].get("ok"), res.report()
