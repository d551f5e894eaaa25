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

# process sets: the global set (and a set of every rank) work; any other set is refused by name
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
    except NotImplementedError as e:
        expect("ProcessSet(" in str(e) and "global_process_set" in str(e), what, str(e))
    except hvd.LayoutMismatch as e:  # another rank raised first: told through the agreement
        expect("NotImplementedError" in str(e), what, str(e))
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
'''


@pytest.mark.timeout(60)
def test_process_sets_and_sparse_allreduce():
    res = run_world(2, API_BODY, launcher=True, timeout=50)
    for rank in range(2):
        assert res[rank].get("fail") == [], res.report()
    res.assert_ok()
