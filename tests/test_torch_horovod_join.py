"""hvd.join() with Horovod's semantics: a rank that joined serves the other ranks'
allreduces with zeros until every rank has joined; join() returns the rank that
joined last. Before, join() was a barrier: rank 0 (fewest steps) waited in it
while the others' allreduces waited for rank 0, until the timeout."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import run_world  # noqa: E402

JOIN_BODY = r'''
import torch
import collectives.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
for s in range(r + 1):  # rank r runs r + 1 steps, then joins
    live = [k for k in range(n) if k + 1 > s]
    cases = [
        ("small sum", hvd.allreduce(torch.ones(5) * (r + 1), op=hvd.Sum), torch.ones(5) * sum(k + 1 for k in live)),
        ("large average", hvd.allreduce(torch.ones(1000) * (r + 1)), torch.ones(1000) * sum(k + 1 for k in live) / n),
        ("int32 sum", hvd.allreduce(torch.ones(7, dtype=torch.int32) * (r + 1), op=hvd.Sum),
         torch.ones(7, dtype=torch.int32) * sum(k + 1 for k in live)),
        ("bf16 max", hvd.allreduce(torch.ones(3, dtype=torch.bfloat16) * -(r + 1), op=hvd.Max),
         torch.ones(3, dtype=torch.bfloat16) * (0.0 if len(live) < n else -1.0)),
        ("async sum", hvd.synchronize(hvd.allreduce_async(torch.ones(3000) * (r + 1), op=hvd.Sum)),
         torch.ones(3000) * sum(k + 1 for k in live)),
    ]
    for name, got, want in cases:
        expect(torch.equal(got, want), f"step {s} {name}", f"got {got[:3].tolist()}, expected {want[:3].tolist()}")
emit("last", value=hvd.join())

# a broadcast and an allgather while rank 0 has joined: LayoutMismatch on the ranks that
# called them; rank 0 keeps waiting in join() until they join too (Horovod's own
# test_horovod_join_broadcast/_allgather), which then returns the same rank everywhere
if r == 0:
    emit("mid", value=hvd.join())
else:
    for what, call in [("broadcast", lambda: hvd.broadcast(torch.ones(2), 1)),
                       ("allgather", lambda: hvd.allgather(torch.ones(2)))]:
        try:
            call()
            fail(f"{what} while joined", "no error")
        except hvd.LayoutMismatch as e:
            expect("join" in str(e), f"{what} while joined", str(e))
    emit("mid", value=hvd.join())
expect(hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n, "after", "")
emit("last2", value=hvd.join())
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [2, 3])
def test_join_serves_allreduces_with_zeros(n):
    res = run_world(n, JOIN_BODY, launcher=True, timeout=50, collective_timeout=20)
    for rank in range(n):
        assert res[rank].get("fail") == [], res.report()
    res.assert_ok()
    # rank n - 1 runs the most steps, so it joins last; after that the ranks join in an
    # order their timing decides (Horovod returns the rank whose join came last), so only
    # agreement is checked: the same rank everywhere, and never rank 0, which joined first
    mid = {res[rank].one("mid")["value"] for rank in range(n)}
    last2 = {res[rank].one("last2")["value"] for rank in range(n)}
    for rank in range(n):
        assert res[rank].one("last")["value"] == n - 1
    assert len(mid) == 1 and mid <= set(range(1, n)), res.report()
    assert len(last2) == 1 and last2 <= set(range(n)), res.report()
