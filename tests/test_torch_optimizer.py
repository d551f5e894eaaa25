"""Synchronous data-parallel SGD equals single-process SGD on the global batch.

After k steps, parameters on every rank must match (atol 1e-5) those of one
process that trains on the concatenation of all ranks' mini-batches: through
DistributedOptimizer (fused and unfused, accumulation, predivide, groups),
through DDP on the "collectives" backend, and through DDP on gloo.
"""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")

from conftest import REPO, free_port, run_world  # noqa: E402

SGD_BODY = r'''
import os
import torch
import torch.nn as nn
import torch.distributed as dist
import collectives.torch as hvd
from collectives.torch._context import current

hvd.init()
r, n = hvd.rank(), hvd.size()
B, STEPS = 4, 3
torch.set_num_threads(1)

def model_fn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))

def batch(step, rank, micro=0):
    g = torch.Generator().manual_seed(10007 * step + 101 * rank + micro)
    return torch.randn(B, 6, generator=g), torch.randn(B, 1, generator=g)

def make_opt(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
    return torch.optim.Adam(params, lr=0.01)

def reference(opt_name, passes=1):
    m = model_fn()
    opt = make_opt(opt_name, m.parameters())
    for s in range(STEPS):
        opt.zero_grad()
        for micro in range(passes):
            xs, ys = zip(*[batch(s, k, micro) for k in range(n)])
            nn.functional.mse_loss(m(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return [p.detach().clone() for p in m.parameters()]

def compare(case, params, ref, atol=1e-5):
    worst = max((a.detach() - b).abs().max().item() for a, b in zip(params, ref))
    emit("diff", case=case, worst=worst)
    expect(worst <= atol, case, f"max |param - single process| = {worst:g}")
    mine = torch.cat([p.detach().reshape(-1) for p in params])
    others = hvd.allgather_object(mine)
    expect(all(torch.equal(o, mine) for o in others), case, "ranks differ")

refs = {}
for opt_name, threshold, passes, predivide, groups, compression in [
        ("sgd", 128 << 20, 1, 1.0, None, "none"),
        ("sgd", 0, 1, 1.0, None, "none"),
        ("sgd", 300, 1, 1.0, None, "none"),
        ("adam", 128 << 20, 1, 1.0, None, "none"),
        ("sgd", 128 << 20, 2, 1.0, None, "none"),
        ("sgd", 0, 1, 2.0, None, "none"),
        ("sgd", 0, 1, 1.0, 2, "none"),
        ("sgd", 128 << 20, 1, 1.0, None, "fp16")]:
    case = dict(opt=opt_name, threshold=threshold, passes=passes, predivide=predivide, groups=groups, compression=compression)
    current().fusion_threshold = threshold
    torch.manual_seed(1234 + r)  # different init per rank: broadcast_parameters must fix it
    m = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    if r == 0:
        m.load_state_dict(model_fn().state_dict())
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    opt = make_opt(opt_name, m.parameters())
    opt = hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters(), backward_passes_per_step=passes,
                                   gradient_predivide_factor=predivide, groups=groups,
                                   compression=getattr(hvd.Compression, compression))
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    emit("buckets", case=case, buckets=len(opt._buckets))
    for s in range(STEPS):
        opt.zero_grad()
        for micro in range(passes):
            x, y = batch(s, r, micro)
            nn.functional.mse_loss(m(x), y).backward()
        if passes == 1:  # every bucket was launched during backward (overlap)
            expect(opt._launched == len(opt._buckets), case, f"{opt._launched} of {len(opt._buckets)} launched in backward")
        if s == 1 and passes == 1:
            try:
                opt.zero_grad()
                fail(case, "zero_grad with allreduces outstanding did not raise")
            except AssertionError:
                pass
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1e9)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    key = (opt_name, passes)
    if key not in refs:
        refs[key] = reference(opt_name, passes)
    compare(case, list(m.parameters()), refs[key], atol=2e-3 if compression == "fp16" else 1e-5)
    opt.remove_hooks()

# DDP on the collectives backend and on gloo, same data
dist.init_process_group("collectives", init_method=f"tcp://127.0.0.1:{os.environ['TORCH_PORT']}", rank=r, world_size=n)
gloo = dist.new_group(backend="gloo")
for backend, group in (("collectives", None), ("gloo", gloo)):
    torch.manual_seed(99 + r)
    m = model_fn() if r == 0 else nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    ddp = nn.parallel.DistributedDataParallel(m, process_group=group, bucket_cap_mb=0.001)
    opt = make_opt("sgd", ddp.parameters())
    for s in range(STEPS):
        opt.zero_grad()
        x, y = batch(s, r)
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    compare(dict(ddp=backend), list(m.parameters()), refs[("sgd", 1)])
dist.destroy_process_group()

# a rank whose model differs gets a clear error at construction, not a hang
current().fusion_threshold = 128 << 20
m = nn.Linear(4, 3 if r == 0 else 2)
try:
    hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters())
    if n > 1:
        fail("layout", "no error for different models")
except hvd.LayoutMismatch as e:
    emit("mismatch", message=str(e))
'''


@pytest.mark.timeout(120)
def test_data_parallel_sgd_equals_single_process():
    res = run_world(2, SGD_BODY, launcher=True, timeout=110,
                    env={"TORCH_PORT": str(free_port())}).assert_ok()
    diffs = res[0].get("diff")
    assert len(diffs) == 10, res.report()
    buckets = {str(b["case"]): b["buckets"] for b in res[0].get("buckets")}
    assert min(buckets.values()) == 1 and max(buckets.values()) == 6, buckets
    assert "different arguments" in res[0].one("mismatch")["message"]


@pytest.mark.timeout(60)
def test_example_pytorch_synthetic_runs_under_launcher():
    script = os.path.join(str(REPO), "examples", "pytorch_synthetic.py")
    res = run_world(2, script=script, launcher=True, timeout=50,
                    args=["--steps", "4", "--batch-size", "8"])
    assert res.launcher_rc == 0, res.report()
    out = res[0].stdout
    assert "final loss" in out and "parameters equal on all ranks: True" in out, res.report()


@pytest.mark.parametrize("text,value", [("", 128 << 20), ("0", 0), ("64M", 64 << 20),
                                        ("1048576", 1 << 20)])
def test_fusion_threshold_reads_sizes_like_the_other_variables(monkeypatch, text, value):
    """COLLECTIVES_FUSION_THRESHOLD takes the form the README's table shows (128M), as the
    core's size variables do; anything else names the variable."""
    from collectives.torch._context import FUSION_ENV, fusion_threshold

    monkeypatch.setenv(FUSION_ENV, text)
    assert fusion_threshold() == value
    monkeypatch.setenv(FUSION_ENV, "-5")
    with pytest.raises(ValueError, match="COLLECTIVES_FUSION_THRESHOLD='-5' is not a number"):
        fusion_threshold()
