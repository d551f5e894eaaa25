"""collectives.torch's *_async ops are asynchronous, reject a name in flight, and a
failed collective raises Horovod's HorovodInternalError.

Rank 1 starts each round a second late: rank 0's async call must return at
once with ``poll()`` False (before, allgather_async and reducescatter_async
ran the collective before returning, so rank 0 sat there for that second).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import run_world  # noqa: E402

ASYNC_BODY = r'''
import time
import torch
import collectives.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
LATE = 0.5  # an async call returns in well under a millisecond here

def rows(k):
    return torch.arange(3 * (k + 1), dtype=torch.float32).reshape(k + 1, 3) + 100 * k

full = torch.arange(6 * n, dtype=torch.float32).reshape(2 * n, 3)
cases = {
    "allgather_async": (lambda: hvd.allgather_async(rows(r)),
                        torch.cat([rows(k) for k in range(n)])),
    "reducescatter_async": (lambda: hvd.reducescatter_async(full * (r + 1), op=hvd.Sum),
                            full[2 * r:2 * r + 2] * sum(k + 1 for k in range(n))),
    "alltoall_async": (lambda: hvd.alltoall_async(full + r),
                       torch.cat([full[2 * r:2 * r + 2] + k for k in range(n)])),
    "broadcast_async": (lambda: hvd.broadcast_async(full + r, 1), full + 1),
    "grouped_allgather_async": (lambda: hvd.grouped_allgather_async([rows(r), rows(r)[:, :1]]),
                                [torch.cat([rows(k) for k in range(n)]),
                                 torch.cat([rows(k)[:, :1] for k in range(n)])]),
    "grouped_reducescatter_async": (lambda: hvd.grouped_reducescatter_async([full * (r + 1)], op=hvd.Sum),
                                    [full[2 * r:2 * r + 2] * sum(k + 1 for k in range(n))]),
}
for case, (start, want) in cases.items():
    hvd.barrier()
    if r == 1:
        time.sleep(LATE)
    t0 = time.monotonic()
    h = start()
    took = time.monotonic() - t0
    early = hvd.poll(h)
    got = hvd.synchronize(h)
    if case == "alltoall_async":
        got = got[0]  # Horovod's alltoall_async handle gives (output, received_splits)
    if r == 0:
        expect(took < LATE / 2, case, f"the call took {took:.2f} s: not asynchronous")
        expect(not early, case, "poll() was True while rank 1 had not started")
    expect(hvd.poll(h), case, "poll() False after synchronize")
    for g, x in zip(got if isinstance(got, list) else [got], want if isinstance(want, list) else [want]):
        expect(torch.equal(g, x), case, f"got {g.flatten()[:6].tolist()}, expected {x.flatten()[:6].tolist()}")

# async and blocking calls interleave in program order
hs = [hvd.allgather_async(rows(r)), hvd.allreduce_async(torch.ones(5000) * r, op=hvd.Sum)]
s = hvd.allreduce(torch.ones(3) * (r + 1), op=hvd.Sum)
hs.append(hvd.reducescatter_async(full, op=hvd.Sum))
expect(torch.equal(hvd.synchronize(hs[0]), torch.cat([rows(k) for k in range(n)])), "mixed", "allgather")
expect(torch.equal(hvd.synchronize(hs[1]), torch.full((5000,), float(sum(range(n))))), "mixed", "allreduce")
expect(torch.equal(s, torch.full((3,), float(sum(k + 1 for k in range(n))))), "mixed", "blocking allreduce")
expect(torch.equal(hvd.synchronize(hs[2]), full[2 * r:2 * r + 2] * n), "mixed", "reducescatter")

# a second in-flight op with the same name: ValueError on that rank only, before anything is
# queued (Horovod's); the first completes on every rank (matched by name) and all go on
for kind, call in [("allgather", lambda nm: hvd.allgather_async(rows(r), name=nm)),
                   ("allreduce", lambda nm: hvd.allreduce_async(torch.ones(4), name=nm)),
                   ("reducescatter", lambda nm: hvd.reducescatter_async(full, name=nm))]:
    hvd.barrier()
    if r == 1:
        time.sleep(LATE)  # rank 0's first call stays in flight until rank 1 starts it
    h = call("dup")
    if r == 0:
        try:
            call("dup")
            fail(kind, "no error for a second in-flight op with the same name")
        except ValueError as e:
            expect("already in flight" in str(e), kind, str(e))
    hvd.synchronize(h)
    h = call("dup")  # the first completed: the name is free again
    hvd.synchronize(h)
# DistributedOptimizer's gradient allreduces (launched from hooks, without an agreement)
# go after an async op in flight, on every rank
model = torch.nn.Linear(3, 1, bias=False)
with torch.no_grad():
    model.weight.fill_(1.0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                               named_parameters=model.named_parameters(), op=hvd.Sum)
hvd.barrier()
if r == 1:
    time.sleep(LATE)
hs = [hvd.allgather_async(rows(r) + i) for i in range(3)]  # rank 0: the 2nd and 3rd wait queued
model(torch.ones(1, 3) * (r + 1)).sum().backward()
opt.step()
for i, h in enumerate(hs):
    expect(torch.equal(hvd.synchronize(h), torch.cat([rows(k) + i for k in range(n)])), "optimizer",
           f"allgather {i}")
want = 1.0 - sum(k + 1 for k in range(n))
expect(torch.allclose(model.weight, torch.full((1, 3), want)), "optimizer", str(model.weight.tolist()))
emit("after", value=hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist())
'''


@pytest.mark.timeout(90)
def test_async_ops_return_while_in_flight_and_reject_duplicate_names():
    res = run_world(2, ASYNC_BODY, launcher=True, timeout=80)
    for rank in range(2):
        assert res[rank].get("fail") == [], res.report()
    res.assert_ok()
    assert res[0].one("after")["value"] == [2.0, 2.0]


DEATH_BODY = r'''
import os, time
import torch
import collectives.torch as hvd

hvd.init()
r = hvd.rank()
hvd.allreduce(torch.ones(1))
if r == 1:
    time.sleep(0.5)
    os._exit(0)
for case, call in [("allgather_async", lambda: hvd.synchronize(hvd.allgather_async(torch.ones(50000)))),
                   ("allreduce", lambda: hvd.allreduce(torch.ones(50000)))]:
    t0 = time.monotonic()
    try:
        call()
        fail(case, "no error although rank 1 is gone")
    except hvd.HorovodInternalError as e:
        emit("error", case=case, message=str(e), runtime=isinstance(e, RuntimeError),
             elapsed=time.monotonic() - t0)
    except Exception as e:
        fail(case, f"{type(e).__name__}: {e}")
    if case == "allgather_async":
        break  # the communicator is broken now; one is enough
'''


@pytest.mark.timeout(60)
def test_dead_peer_raises_horovod_internal_error():
    import collectives.torch as hvd

    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    assert issubclass(hvd.HostsUpdatedInterrupt, RuntimeError)
    assert hvd.HostsUpdatedInterrupt(True).skip_sync is True
    res = run_world(2, DEATH_BODY, timeout=50, collective_timeout=10)
    assert res[0].get("fail") == [], res.report()
    err = res[0].one("error")
    assert err["runtime"] and err["elapsed"] < 12, err
    assert "1" in err["message"], err
