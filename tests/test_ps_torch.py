"""collectives.ps.torch: a torch optimizer trained through the parameter server, end to end."""
from __future__ import annotations

import os

import numpy as np
import pytest

from test_ps import _run

torch = pytest.importorskip("torch")

BODY = """
import os, torch, collectives.ps.torch as pst
torch.manual_seed(SEED + int(os.environ["COLLECTIVES_RANK"]))  # each rank its own init
model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
opt = pst.Optimizer(OPT, MODE, compression=COMP, checkpoint=CKPT, num_servers=1)
if opt.is_server:
    reps = opt.serve()
    emit("server", steps=[r.step for r in reps])
else:
    emit("start", params=[p.detach().reshape(-1).tolist() for p in model.parameters()])
    g = torch.Generator().manual_seed(7)
    n, i = opt.role.num_workers, opt.role.index
    for k in range(STEPS):
        x = torch.randn(8, 5, generator=g); y = torch.randn(8, 2, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[i::n]), y[i::n]).backward()
        opt.step()
    emit("final", params=[p.detach().reshape(-1).tolist() for p in model.parameters()])
    opt.finish()
"""


def _body(seed, opt, mode, comp, ckpt, steps):
    return (BODY.replace("SEED", str(seed)).replace("OPT", opt).replace("MODE", repr(mode))
            .replace("COMP", repr(comp))
            .replace("CKPT", repr(ckpt)).replace("STEPS", str(steps)))


def _reference(opt_text, steps):
    torch.manual_seed(0)  # worker 0's (rank 0's) initial values
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    opt = eval(opt_text, {"torch": torch, "model": model})
    g = torch.Generator().manual_seed(7)
    for _ in range(steps):
        x = torch.randn(8, 5, generator=g)
        y = torch.randn(8, 2, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return np.concatenate([p.detach().reshape(-1).numpy() for p in model.parameters()])


SYNC_OPTS = [
    "torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)",
    "torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-3)",
]
_SYNC: list = []


def _sync_world():
    """One launch trains with each optimizer of SYNC_OPTS in turn, each from fresh seeds
    through a parameter server of its own (the records carry the optimizer's index): the
    world's 3 processes start once, not once per optimizer."""
    if not _SYNC:
        body = "\n".join(
            "emit('opt', index=%d)\n" % i + _body(0, opt, "sync", "none", None, 8)
            .replace('emit("start", ', 'emit("start", opt=%d, ' % i)
            .replace('emit("final", ', 'emit("final", opt=%d, ' % i)
            .replace('emit("server", ', 'emit("server", opt=%d, ' % i)
            for i, opt in enumerate(SYNC_OPTS))
        _SYNC.append(_run(3, 1, body, timeout=90))
    return _SYNC[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("opt", SYNC_OPTS)
def test_torch_sync_equals_single_process_training(opt):
    res = _sync_world().assert_ok()
    i = SYNC_OPTS.index(opt)
    want = _reference(opt, 8)

    def one(r, tag):
        got = [rec for rec in res[r].get(tag) if rec["opt"] == i]
        assert len(got) == 1, res.report()
        return got[0]

    for r in (0, 1):
        got = np.concatenate(one(r, "final")["params"])
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert len(one(2, "server")["steps"]) == 8
    # worker 1 started from worker 0's values, not from its own seed
    assert one(0, "start") == {**one(1, "start"), "rank": 0}


@pytest.mark.timeout(120)
def test_torch_async_fp16_with_server_checkpoint(tmp_path):
    ckpt = str(tmp_path / "ps")
    opt = "torch.optim.SGD(model.parameters(), lr=0.05)"
    first = _run(3, 1, _body(0, opt, "async", "fp16", ckpt, 5), timeout=90).assert_ok()
    assert first[2].one("server")["steps"] == list(range(10))
    assert os.path.exists(ckpt + ".shard0.npz")
    with np.load(ckpt + ".shard0.npz") as z:
        saved, version = z["params"].copy(), int(z["version"])
    assert version == 10
    # A new job (other seeds) resumes from the checkpoint: workers pull the saved values.
    second = _run(3, 1, _body(100, opt, "async", "fp16", ckpt, 5), timeout=90).assert_ok()
    assert second[2].one("server")["steps"] == list(range(10, 20))
    # Each worker pulls before its own first push, so the first pull of all precedes every
    # push and returns the saved values (in async mode the other may pull after a push).
    starts = [np.concatenate(second[r].one("start")["params"]) for r in (0, 1)]
    assert any(np.array_equal(s, saved) for s in starts), (starts, saved)
    with np.load(ckpt + ".shard0.npz") as z:
        assert int(z["version"]) == 20
    # fp16-compressed async training moved the model, and stayed finite
    end = np.concatenate(second[0].one("final")["params"])
    assert np.isfinite(end).all() and not np.allclose(end, saved)


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5, dampening=0.3),
    lambda p: torch.optim.SGD(p, lr=0.1),
    lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), weight_decay=0.1),
    lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
])
def test_server_optimizers_match_torch(make):
    """The server's numpy update (on a flat shard) equals the torch optimizer's, step by step."""
    from collectives.ps.torch import server_optimizer

    g = torch.Generator().manual_seed(3)
    p = torch.randn(257, generator=g, requires_grad=True)
    opt = make([p])
    mine = server_optimizer(opt)
    flat = p.detach().numpy().copy()
    for _ in range(6):
        grad = torch.randn(257, generator=g)
        p.grad = grad.clone()
        opt.step()
        mine.apply(flat, grad.numpy().copy())
        np.testing.assert_allclose(flat, p.detach().numpy(), atol=1e-6, rtol=1e-5)


def test_unsupported_optimizers_are_refused():
    from collectives.ps.torch import server_optimizer

    p = [torch.zeros(3, requires_grad=True)]
    with pytest.raises(ValueError, match="SGD, Adam and AdamW"):
        server_optimizer(torch.optim.RMSprop(p))
    with pytest.raises(ValueError, match="amsgrad"):
        server_optimizer(torch.optim.Adam(p, amsgrad=True))
    q = [torch.zeros(2, requires_grad=True)]
    with pytest.raises(ValueError, match="param_groups"):
        server_optimizer(torch.optim.SGD([{"params": p, "lr": 0.1}, {"params": q, "lr": 0.2}],
                                         lr=0.1))
