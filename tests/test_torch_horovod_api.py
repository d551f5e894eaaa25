"""Horovod names in collectives.torch beyond the core ops: process sets (the global one),
sparse_allreduce_async, SyncBatchNorm; each against a reference computed in one process."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import run_world  # noqa: E402

API_BODY = r'''
import torch
import collectives.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()

# process sets: the global set (and a set of every rank) work; an unregistered set is refused
# (test_torch_process_sets has the others)
ps = hvd.global_process_set
expect((ps.size(), ps.rank(), ps.included()) == (n, r, True), "global set", repr(ps))
got = hvd.allreduce(torch.ones(3), op=hvd.Sum, process_set=ps)
expect(torch.equal(got, torch.full((3,), float(n))), "allreduce global set", str(got))
got = hvd.allgather(torch.ones(1) * r, process_set=hvd.ProcessSet(list(range(n))))
expect(got.tolist() == list(map(float, range(n))), "allgather every-rank set", str(got))
expect(hvd.add_process_set(list(range(n))) is ps, "add every-rank set", "")
expect(hvd.remove_process_set(ps) is False, "remove global", "")
for what, call in [("allreduce", lambda: hvd.allreduce(torch.ones(2), process_set=hvd.ProcessSet([0]))),
                   ("add_process_set", lambda: hvd.add_process_set([0])),
                   ("broadcast_object", lambda: hvd.broadcast_object(1, process_set=hvd.ProcessSet([1])))]:
    try:
        call()
        fail(what, "a subset process set was accepted")
    except ValueError as e:  # unregistered sets; add without HOROVOD_DYNAMIC_PROCESS_SETS
        expect("not registered" in str(e) or "HOROVOD_DYNAMIC_PROCESS_SETS" in str(e), what,
               str(e))
expect(hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n, "after refusals", "")

# sparse_allreduce_async: every rank's entries allgathered (Sum), divided by n (Average)
def sparse(k):
    idx = torch.tensor([[k % 4, (k + 1) % 4, 3], [0, 2, k % 3]])
    return torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0, 3.0]) * (k + 1), (4, 3))
dense = sum(sparse(k).to_dense() for k in range(n))
for op, div in [(hvd.Sum, 1), (hvd.Average, n)]:
    h = hvd.sparse_allreduce_async(sparse(r), name="emb", op=op)
    got = hvd.synchronize(h)
    expect(got.is_sparse, f"sparse {op.name}", "result is not sparse")
    expect(torch.allclose(got.to_dense(), dense / div), f"sparse {op.name}",
           f"{got.to_dense().tolist()} vs {(dense / div).tolist()}")

# a name passed by position is the same name as by keyword (one rank each way): the ops
# match by it; an unnamed op on one rank and a named one on the other would not
t = torch.full((2,), float(r + 1))
if r == 0:
    got = hvd.broadcast(t, 0, "pos")
    h = hvd.allreduce_async(t, None, "pos2", op=hvd.Sum)
else:
    got = hvd.broadcast(t, root_rank=0, name="pos")
    h = hvd.allreduce_async(t, name="pos2", op=hvd.Sum)
expect(torch.equal(got, torch.ones(2)), "positional name", str(got))
got = hvd.synchronize(h)
expect(torch.equal(got, torch.full((2,), float(n * (n + 1) // 2))), "positional name async",
       str(got))
'''


@pytest.mark.timeout(60)
def test_process_sets_and_sparse_allreduce():
    res = run_world(2, API_BODY, launcher=True, timeout=50)
    for rank in range(2):
        assert res[rank].get("fail") == [], res.report()
    res.assert_ok()


BN_BODY = r'''
import torch
import collectives.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
C = 3
sizes = [k + 2 for k in range(n)]  # uneven batches
off = sum(sizes[:r])

def gen(k, seed, shape):
    g = torch.Generator().manual_seed(1000 * seed + k)
    return torch.randn(shape, generator=g, dtype=torch.float64)

def close(case, got, want):
    if got is None or tuple(got.shape) != tuple(want.shape) or \
            not torch.allclose(got, want, atol=1e-10, rtol=1e-10):
        fail(case, f"got {None if got is None else got.flatten()[:6].tolist()}, "
                   f"expected {want.flatten()[:6].tolist()}")

for seed, (tail, Ref) in enumerate([((), torch.nn.BatchNorm1d), ((5,), torch.nn.BatchNorm1d),
                                    ((2, 3), torch.nn.BatchNorm2d)]):
    for momentum in (0.3, None):
        case = f"tail={tail} momentum={momentum}"
        bn = hvd.SyncBatchNorm(C, momentum=momentum).double()
        ref = Ref(C, momentum=momentum).double()
        with torch.no_grad():
            for m in (bn, ref):
                m.weight.copy_(torch.tensor([1.0, -2.0, 0.5]))
                m.bias.copy_(torch.tensor([0.1, 0.0, -3.0]))
        xs = [gen(k, seed, (sizes[k], C) + tail) * (k + 1) + k for k in range(n)]
        ws = [gen(k, seed + 50, (sizes[k], C) + tail) for k in range(n)]
        for step in range(2):  # twice: the running statistics' update, twice
            x = xs[r].clone().requires_grad_(True)
            y = bn(x)
            (y * ws[r]).sum().backward()
            X = torch.cat(xs).requires_grad_(True)
            Y = ref(X)
            (Y * torch.cat(ws)).sum().backward()
            close(f"{case} forward", y, Y[off:off + sizes[r]].detach())
            close(f"{case} input grad", x.grad, X.grad[off:off + sizes[r]])
            close(f"{case} weight grad", hvd.allreduce(bn.weight.grad, op=hvd.Sum), ref.weight.grad)
            close(f"{case} bias grad", hvd.allreduce(bn.bias.grad, op=hvd.Sum), ref.bias.grad)
            bn.zero_grad(); ref.zero_grad()
        close(f"{case} running_mean", bn.running_mean, ref.running_mean)
        close(f"{case} running_var", bn.running_var, ref.running_var)
        bn.eval(); ref.eval()
        with torch.no_grad():
            close(f"{case} eval", bn(xs[r]), ref(xs[r]))
'''


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 3])
def test_sync_batch_norm_equals_batch_norm_on_the_concatenated_batch(n):
    res = run_world(n, BN_BODY, launcher=True, timeout=80)
    for rank in range(n):
        assert res[rank].get("fail") == [], res.report()
    res.assert_ok()
