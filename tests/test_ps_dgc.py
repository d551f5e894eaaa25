"""collectives.ps with sparse (DGC) pushes: the SPUSH message, its checks, DGC through the
torch Optimizer."""
from __future__ import annotations

import numpy as np
import pytest

from test_ps import _run
import _ps_model as M

from collectives.ps import _sparse as S
from collectives.ps import _wire as W


# ---- the message, in process ------------------------------------------------------------
def test_sparse_payload_round_trip_and_per_shard_choice():
    layout = W.Layout(M.SHAPES, 2)  # shards of 12 and 13 elements
    idx = np.array([0, 5, 11, 12, 24], np.int64)
    val = np.array([1.5, -2.0, 3.0, 4.0, -0.25], np.float32)
    parts = S.split(layout, idx, val, W.DTYPE_F32, W.DTYPE_F32)
    assert [(k, d) for k, d, _ in parts] == [(W.SPUSH, W.DTYPE_F32)] * 2
    dense = np.zeros(M.TOTAL, np.float32)
    dense[idx] = val
    for s, (_, d, payload) in enumerate(parts):
        np.testing.assert_array_equal(S.densify(payload, layout.shard_size(s), d),
                                      dense[layout.shard(s)])
    # a shard whose entries cost more bytes sparse than dense goes dense
    full = np.arange(12, dtype=np.int64)
    parts = S.split(layout, full, np.ones(12, np.float32), W.DTYPE_F32, W.DTYPE_F16)
    assert parts[0][0] == W.PUSH and parts[0][2].dtype == np.float32
    np.testing.assert_array_equal(parts[0][2], np.ones(12, np.float32))
    assert parts[1][0] == W.SPUSH and S.densify(parts[1][2], 13, W.DTYPE_F16).sum() == 0
    # float16 values
    p16 = S.encode(np.array([3], np.int32), np.array([0.5], np.float16))
    assert S.densify(p16, 4, W.DTYPE_F16).tolist() == [0, 0, 0, 0.5]


@pytest.mark.parametrize("payload,size,match", [
    (S.encode(np.array([1, 4], np.int32), np.ones(2, np.float32)), 4, "index 4 outside"),
    (S.encode(np.array([-1, 2], np.int32), np.ones(2, np.float32)), 4, "index -1 outside"),
    (S.encode(np.arange(5, dtype=np.int32), np.ones(5, np.float32)), 4, "5 entries"),
    (S.encode(np.array([2, 2], np.int32), np.ones(2, np.float32)), 4, "strictly increasing"),
    (S.encode(np.array([1], np.int32), np.ones(1, np.float32))[:-1], 4, "in 19 bytes"),
    (np.zeros(4, np.uint8), 4, "shorter than its count"),
])
def test_densify_refuses_bad_counts_and_indices(payload, size, match):
    with pytest.raises(ValueError, match=match):
        S.densify(payload, size, W.DTYPE_F32)


def test_a_huge_claimed_count_is_refused_without_allocating():
    payload = np.zeros(16, np.uint8)
    payload[:8].view("<i8")[0] = 1 << 60
    with pytest.raises(ValueError, match="the shard holds 10 elements"):
        S.densify(payload, 10, W.DTYPE_F32)


def test_check_sparse_refuses_bad_user_input():
    with pytest.raises(ValueError, match="strictly increasing"):
        S.check_sparse([3, 1], np.ones(2, np.float32), 10)
    with pytest.raises(ValueError, match="strictly increasing"):
        S.check_sparse([10], np.ones(1, np.float32), 10)
    with pytest.raises(TypeError, match="float32"):
        S.check_sparse([1], np.ones(1, np.float64), 10)
    with pytest.raises(TypeError, match="integers"):
        S.check_sparse([1.0], np.ones(1, np.float32), 10)
    with pytest.raises(ValueError, match="same length"):
        S.check_sparse([1, 2], np.ones(1, np.float32), 10)


def test_dgc_compression_follows_the_optimizer():
    torch = pytest.importorskip("torch")
    from collectives.ps import DGCSGD, SGD
    from collectives.ps.torch import push_compressor, server_optimizer
    from collectives.torch.dgc import DGC, TopKCompressor

    p = [torch.zeros(3, requires_grad=True)]
    sgd = torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    comp = push_compressor(sgd, "dgc")
    assert isinstance(comp, DGC) and (comp.momentum, comp.nesterov) == (0.9, True)
    assert isinstance(server_optimizer(sgd, "dgc"), DGCSGD)
    assert isinstance(server_optimizer(sgd, TopKCompressor(0.1)), SGD)  # no momentum of its own
    with pytest.raises(ValueError, match="must equal SGD's"):
        push_compressor(sgd, DGC(0.1, momentum=0.5))
    adam = torch.optim.Adam(p, lr=0.01)
    assert push_compressor(adam, "dgc").momentum == 0.0


# ---- on real ranks ----------------------------------------------------------------------
DENSITY_ONE = """
from collectives.torch.dgc import DGC
if role.is_server:
    opt = ps.DGCSGD(0.05, 0.9, 0.01) if COMP != "none" else ps.SGD(0.05, 0.9, 0.01)
    ps.serve(M.SHAPES, opt, "sync")
else:
    comp = DGC(compress_ratio=1.0, momentum=0.9, min_numel=1) if COMP != "none" else "none"
    w = ps.worker(M.SHAPES, compression=comp)
    flat = w.start(M.initial() if role.index == 0 else None)
    n = role.num_workers
    for k in range(12):
        flat = w.push_pull(M.grad(flat, k, slice(role.index, None, n)))
    emit("final", params=flat.tolist())
    w.finish()
"""


_WORLD: list = []


def _four_ranks():
    """The one launch of 4 ranks (2 servers) that both tests below read: three trainings
    in turn, each serving of its own: DENSITY_ONE with DGC, then dense, then TORCH_DGC
    (the ranks import torch once, not once per training)."""
    if not _WORLD:
        body = "".join(DENSITY_ONE.replace("COMP", repr(comp))
                       .replace('emit("final", ', f'emit("final", comp={comp!r}, ')
                       for comp in ("dgc", "none"))
        _WORLD.append(_run(4, 2, body + TORCH_DGC, timeout=110))
    return _WORLD[0]


@pytest.mark.timeout(120)
def test_dgc_push_at_density_one_equals_the_dense_push():
    res = _four_ranks().assert_ok()
    want = M.sgd_reference(12, 0.05, 0.9, 0.01)
    for r in (0, 1):
        final = {rec["comp"]: rec["params"] for rec in res[r].get("final")}
        assert sorted(final) == ["dgc", "none"] and len(res[r].get("final")) == 2, res.report()
        a = np.array(final["dgc"])
        np.testing.assert_allclose(a, np.array(final["none"]), atol=1e-5)
        np.testing.assert_allclose(a, want, atol=1e-5)


SPARSE_VS_DENSE = """
from collectives.ps import _wire as W
if role.is_server:
    got = []
    ps.serve(M.SHAPES, ps.SGD(lr=0.1, momentum=0.9), "sync", server=got.append)
    emit("server", params=got[0].params.tolist())
else:
    w = ps.worker(M.SHAPES)
    flat = w.start(M.initial() if role.index == 0 else None)
    sent = []
    orig = w._exchange
    w._exchange = lambda s, msg, reply: (sent.append(int(msg[:16].view("<i8")[1])),
                                         orig(s, msg, reply))[1]
    rng = np.random.default_rng(role.index)
    for k in range(8):
        g = M.grad(flat, k, slice(role.index, None, 2))
        keep = np.sort(rng.choice(M.TOTAL, 3, replace=False))  # a sparse gradient
        if SPARSE:
            flat = w.push_pull_sparse(keep, g[keep])
        else:
            dense = np.zeros(M.TOTAL, np.float32); dense[keep] = g[keep]
            flat = w.push_pull(dense)
    emit("final", params=flat.tolist(), kinds=sorted(set(sent)))
    w.finish()
"""


@pytest.mark.timeout(90)
def test_a_sparse_push_applies_exactly_what_the_dense_push_of_its_entries_does():
    sparse = _run(4, 2, SPARSE_VS_DENSE.replace("SPARSE", "True")).assert_ok()
    dense = _run(4, 2, SPARSE_VS_DENSE.replace("SPARSE", "False")).assert_ok()
    for r in (0, 1):
        assert sparse[r].one("final")["kinds"] == [W.SPUSH], sparse.report()
        assert dense[r].one("final")["kinds"] == [W.PUSH], dense.report()
        np.testing.assert_array_equal(sparse[r].one("final")["params"],
                                      dense[r].one("final")["params"])


HOSTILE = """
from collectives.ps import _wire as W, _sparse as S
if role.is_server:
    got = []
    ps.serve(M.SHAPES, ps.SGD(lr=0.5), "sync", server=got.append)
    emit("server", version=got[0].version)
else:
    w = ps.worker(M.SHAPES)
    flat = w.start(M.initial()).copy()
    errors = []
    size = w.layout.shard_size(0)
    for idx, val in (([M.TOTAL], [1.0]), ([2, 1], [1.0, 1.0]), (list(range(M.TOTAL + 1)),
                     [1.0] * (M.TOTAL + 1))):
        try:
            w.push_pull_sparse(np.array(idx), np.array(val, np.float32))
        except ValueError as exc:
            errors.append("ValueError: " + str(exc))
    def forged(index, values, count=None):
        p = S.encode(np.array(index, np.int32), np.array(values, np.float32))
        if count is not None:
            p[:8].view("<i8")[0] = count
        return W.message(W.SPUSH, 0, 0, 0, w.layout.hash, p)
    for msg in (forged([0, size], [1.0, 1.0]),                     # past the shard's end
                forged([-3], [1.0]),                               # negative
                forged(range(size + 1), [1.0] * (size + 1)),       # more entries than the shard
                forged([1], [1.0], count=size + 1),                # a count above the shard
                forged([4, 4], [1.0, 1.0])):                       # the same entry twice
        try:
            w._exchange(0, msg, True)
        except ps.PSError as exc:
            errors.append("PSError: " + str(exc))
    after = w.push_pull_sparse(np.array([0, M.TOTAL - 1]), np.array([2.0, 4.0], np.float32))
    emit("worker", errors=errors, params=after.tolist())
    w.finish()
"""


@pytest.mark.timeout(60)
def test_a_sparse_push_outside_the_shard_is_refused_and_changes_nothing():
    res = _run(2, 1, HOSTILE).assert_ok()
    errors = res[0].one("worker")["errors"]
    assert len(errors) == 8, errors
    assert all(e.startswith("ValueError: sparse gradient") for e in errors[:3]), errors
    assert all(e.startswith("PSError: parameter server 0: rejected from worker 0: sparse push")
               for e in errors[3:]), errors
    assert "index 25 outside" in errors[3] and "index -3 outside" in errors[4]
    assert "26 entries" in errors[5] and "26 entries" in errors[6]
    assert "strictly increasing" in errors[7]
    want = M.initial()
    want[0] -= np.float32(0.5) * np.float32(2.0)  # only the one good push applied
    want[-1] -= np.float32(0.5) * np.float32(4.0)
    np.testing.assert_allclose(res[0].one("worker")["params"], want, atol=1e-6)
    assert res[1].one("server")["version"] == 1


TORCH_DGC = """
import torch, collectives.ps.torch as pst
from collectives.torch.dgc import DGC
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                            torch.nn.Tanh(), torch.nn.Linear(64, 4))
teacher = torch.nn.Linear(16, 4)
comp = DGC(compress_ratio=0.05, momentum=0.9, min_numel=512, warmup_ratios=[0.5, 0.2],
           steps_per_epoch=10)
opt = pst.Optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), "sync",
                    compression=comp, num_servers=2)
if opt.is_server:
    opt.serve()
else:
    g = torch.Generator().manual_seed(100 + opt.role.index)
    xt = torch.randn(256, 16, generator=torch.Generator().manual_seed(5))
    yt = teacher(xt).detach()
    def loss():
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(xt), yt))
    first, sparse, sent = loss(), 0, []
    for k in range(120):
        x = torch.randn(32, 16, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), teacher(x).detach()).backward()
        opt.step()
        st = opt.client.sparse.stats
        sparse += st["sparse_entries"]
        sent.append(st["bytes"])
    emit("trained", first=first, last=loss(), sparse=sparse, bytes=sent[-1],
         dense_bytes=4 * sum(p.numel() for p in model.parameters()))
    opt.finish()
"""


@pytest.mark.timeout(120)
def test_torch_optimizer_with_dgc_pushes_converges():
    res = _four_ranks().assert_ok()
    for r in (0, 1):
        d = res[r].one("trained")
        assert d["sparse"] > 0, d
        # after the warm-up: the large weights at 5 % (8 bytes an entry), the rest dense
        assert d["bytes"] < 0.3 * d["dense_bytes"], d
        assert d["last"] < 0.2 * d["first"], d
