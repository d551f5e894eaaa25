"""What PyTorch's own distributed_test.py asks of a CPU backend beyond the ops, gloo as reference:

- a timed-out op says so in gloo's words (torch's tests match " (Timed out|closed|timeout) "),
  on the caller's thread (barrier), through a queued Work (all_reduce) and point-to-point;
- ``group.monitored_barrier``: every rank passes; rank 0 names the rank that did not arrive
  (or every one, wait_all_ranks), and the others say rank 0 did not answer, each within the
  barrier's timeout; a zero timeout or a missing rank leaves the group usable (gloo's then
  hangs: not run on gloo);
- all_reduce of a sparse COO tensor: the sum (SUM only), written into the tensor, against a
  reference built from every rank's data; tensors of different shapes fail on every rank.

Each case runs as real ranks on both backends (gloo's outcome is checked the same way where
gloo has the feature). A rank that must stay out of an op waits until the others have their
outcome (_worker.wait_for), not a fixed sleep. Where a world can go on after a case, one
launch runs several cases (each test still checks its own case's records): gloo's two
timeout cases, each in a process group of its own; gloo's two missing-rank monitored
barriers, likewise; collectives' two, one after the other in the same group (it stays
usable); the sparse cases on both
backends in the same ranks, collectives first (in processes that ran nothing else, as
before), then gloo.
"""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

from conftest import free_port, run_world  # noqa: E402

INIT = r'''
import os, time
import torch
import torch.distributed as dist
from datetime import timedelta
import collectives.torch  # registers the backend

r, n = int(os.environ["COLLECTIVES_RANK"]), int(os.environ["COLLECTIVES_SIZE"])

def init(be, method):
    dist.init_process_group(be, init_method=method, rank=r, world_size=n,
                            timeout=timedelta(seconds=float(os.environ["PG_TIMEOUT"])))

def attempt(tag, fn, **fields):
    t0 = time.monotonic()
    try:
        fn()
        emit(tag, raised=None, seconds=time.monotonic() - t0, **fields)
    except Exception as exc:
        emit(tag, raised=type(exc).__name__, runtime=isinstance(exc, RuntimeError),
             message=str(exc), seconds=time.monotonic() - t0, **fields)
'''

_WORLDS: dict = {}


def _shared(key, launch):
    """The world of `key`, launched once by the first test that needs it (several tests
    read their own cases from one launch); a launch that failed is not kept."""
    if key not in _WORLDS:
        _WORLDS[key] = launch()
    return _WORLDS[key]


TIMEOUT_BODY = INIT + r'''
be = os.environ["BACKEND"]
for i, op in enumerate(os.environ["OPS"].split(",")):
    if i:  # the next case in a process group of its own
        dist.destroy_process_group()
        if be == "collectives":  # and on a world communicator of its own (see the test)
            import collectives
            collectives.finalize()
        init(be, f"file://{os.environ['WORLD_DIR']}/init{i}")
    else:
        init(be, f"tcp://127.0.0.1:{os.environ['TORCH_PORT']}")
    g = dist.new_group(timeout=timedelta(seconds=1))  # every rank; the timeout under test
    dist.barrier()
    if r == 0:
        if op == "barrier":
            attempt(op, lambda: dist.barrier(group=g))
        elif op == "all_reduce":
            attempt(op, lambda: dist.all_reduce(torch.ones(3), group=g, async_op=True).wait())
        elif op == "Work.wait":  # the wait's own timeout, before the group's
            work = dist.all_reduce(torch.ones(3), group=g, async_op=True)
            attempt(op, lambda: work.wait(timeout=timedelta(seconds=0.5)))
        else:
            attempt(op, lambda: dist.recv(torch.empty(3), src=1, group=g))
        arrive(op)
    else:
        expect(wait_for(op), op, "rank 0 never had an outcome")  # in no op of g meanwhile
'''


@pytest.mark.timeout(90)
@pytest.mark.parametrize("backend,op", [("gloo", "barrier"), ("collectives", "barrier"),
                                        ("collectives", "all_reduce"), ("collectives", "recv"),
                                        ("gloo", "Work.wait"), ("collectives", "Work.wait")])
def test_timeout_is_worded_as_gloos(backend, op):
    """A group op one rank enters alone fails at the group's 1 s with " Timed out " in the
    message (distributed_test.py's test_barrier_timeout_* regex), still a RuntimeError;
    Work.wait(timeout) that expires first says "Operation timed out!", as gloo's."""
    # one launch per backend runs its cases in turn, each in a process group of its own;
    # for collectives also on a world communicator of its own (collectives.finalize, then
    # the next init_process_group makes a new one): the backend runs on the ranks' world
    # communicator, which the timed-out op breaks on rank 0 only
    ops = "barrier,Work.wait" if backend == "gloo" else "barrier,all_reduce,recv,Work.wait"
    res = _shared(("timeout", backend, ops), lambda: run_world(
        2, TIMEOUT_BODY, timeout=50, collective_timeout=30,
        env={"BACKEND": backend, "OPS": ops, "PG_TIMEOUT": "30", "TORCH_PORT": free_port()}))
    assert not res.timed_out, res.report()
    got = res[0].one(op)
    assert got["runtime"], got
    if op == "Work.wait":  # gloo: "Operation timed out!"
        assert "Operation timed out!" in got["message"], got
        assert 0.4 <= got["seconds"] < 0.9, got
        return
    assert re.search(" (Timed out|closed|timeout) ", got["message"]), got
    assert 0.9 <= got["seconds"] < 4.0, got
    if backend == "collectives":
        assert "Timed out waiting 1000ms" in got["message"] and "rank 1" in got["message"], got


MONITOR_BODY = INIT + r'''
be = os.environ["BACKEND"]
init(be, f"tcp://127.0.0.1:{os.environ['TORCH_PORT']}")
g = dist.new_group()  # every rank, as test_monitored_barrier_gloo_rank_0_timeout's
attempt("all pass", lambda: g.monitored_barrier(timedelta(seconds=10)))
attempt("all pass, wait_all_ranks", lambda: g.monitored_barrier(timedelta(seconds=10),
                                                                wait_all_ranks=True))
if be == "collectives":  # (gloo's group hangs in the next collective after this)
    if r == 0:
        attempt("zero timeout", lambda: g.monitored_barrier(timedelta(seconds=0)))
    t = torch.ones(2) * (r + 1)
    dist.all_reduce(t, group=g)  # still usable after rank 0's zero-timeout failure
    emit("after", value=t.tolist())
# gloo: each case in a process group of its own (its per-call tags are out of step after a
# failure); collectives: one after the other in the same group, which a failed monitored
# barrier leaves usable
for i, missing in enumerate(os.environ["MISSING"].split(",")):
    if i and be == "gloo":
        dist.destroy_process_group()
        init(be, f"file://{os.environ['WORLD_DIR']}/init{i}")
        g = dist.new_group()
    if missing == "last":  # the last rank never arrives
        waiting = list(range(n - 1))
        if r != n - 1:
            attempt("missing", lambda: g.monitored_barrier(timedelta(seconds=1)), case=missing)
    else:  # every other rank never arrives
        waiting = [0]
        if r == 0:
            attempt("missing", lambda: g.monitored_barrier(timedelta(seconds=1),
                                                           wait_all_ranks=True), case=missing)
    if r in waiting:
        arrive(f"{missing}-{r}")
    else:  # stays out until the ranks in the barrier have their outcome
        expect(wait_for(*(f"{missing}-{q}" for q in waiting)), missing, "no outcome")
    if be == "collectives":  # (gloo's per-call tags are out of step now: not run on gloo)
        t = torch.ones(2) * (r + 1)
        dist.all_reduce(t, group=g)  # a failed monitored barrier leaves the group usable
        emit("after failure", value=t.tolist(), case=missing)
'''


@pytest.mark.timeout(90)
@pytest.mark.parametrize("backend", ["gloo", "collectives"])
@pytest.mark.parametrize("missing", ["last", "all"])
def test_monitored_barrier(backend, missing):
    """gloo's monitored barrier: passes when all arrive; rank 0 names who did not."""
    n = 3
    res = _shared(("monitor", backend), lambda: run_world(
        n, MONITOR_BODY, timeout=60, collective_timeout=30,
        env={"BACKEND": backend, "MISSING": "last,all", "PG_TIMEOUT": "3",
             "TORCH_PORT": free_port()}))
    assert not res.timed_out, res.report()
    for r in range(n):
        for tag in ("all pass", "all pass, wait_all_ranks"):
            assert res[r].one(tag)["raised"] is None, res.report()
        if backend == "collectives":
            assert res[r].one("after")["value"] == [n * (n + 1) / 2] * 2, res.report()
    if backend == "collectives":
        zero = res[0].one("zero timeout")
        assert zero["runtime"] and "Rank 0 timed out in monitoredBarrier" in zero["message"], zero

    def outcome(rank):
        got = [rec for rec in res[rank].get("missing") if rec["case"] == missing]
        assert len(got) == 1, res.report()
        return got[0]

    first = outcome(0)
    if missing == "last":
        assert first["runtime"], first
        assert f"Rank {n - 1} failed to pass monitoredBarrier" in first["message"], first
        assert 0.9 <= first["seconds"] < 3.0, first
        other = outcome(1)
        assert other["runtime"] and ("Rank 1 successfully reached monitoredBarrier, but received "
                                     "errors while waiting for send/recv from rank 0"
                                     in other["message"]), other
        assert 0.9 <= other["seconds"] < 3.0, other  # the barrier's timeout, as gloo's
    else:
        assert first["runtime"], first
        assert "Ranks 1, 2 failed to pass monitoredBarrier in 1000 ms" in first["message"], first
    assert not any(rr.get("fail") for rr in res.ranks), res.report()
    if backend == "collectives":
        for r in range(n):
            after = [rec for rec in res[r].get("after failure") if rec["case"] == missing]
            assert [rec["value"] for rec in after] == [[n * (n + 1) / 2] * 2], res.report()


SPARSE_BODY = INIT + r'''
def sparse(rank, sdim, ddim, dtype):
    # rank-dependent entries, some shared by every rank, one repeated (uncoalesced input)
    k = rank + 2
    idx = torch.stack([torch.arange(k) % 5] + [torch.full((k,), rank % 3)] * (sdim - 1))
    idx = torch.cat([idx, idx[:, :1]], dim=1)
    vals = torch.arange(1, k + 2, dtype=torch.float64).reshape([k + 1] + [1] * ddim)
    vals = (vals * (rank + 1)).expand([k + 1] + [2] * ddim).to(dtype)
    return torch.sparse_coo_tensor(idx, vals, [5] + [3] * (sdim - 1) + [2] * ddim)

# collectives first, in processes that ran nothing else (as a launch of its own would);
# then gloo, the reference, in a process group of its own
for be, port in (("collectives", os.environ["PORT_COLLECTIVES"]), ("gloo", os.environ["PORT_GLOO"])):
    init(be, f"tcp://127.0.0.1:{port}")
    for sdim, ddim, dtype in [(1, 0, torch.float32), (2, 1, torch.float64), (3, 0, torch.int64),
                              (1, 2, torch.float32)]:
        t = sparse(r, sdim, ddim, dtype)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        want = sum(sparse(q, sdim, ddim, dtype).to_dense() for q in range(n))
        expect(t.is_sparse and torch.equal(t.to_dense(), want),
               (be, "sparse sum", sdim, ddim, str(dtype)), f"{t.to_dense()} != {want}")
        emit("sparse", backend=be, case=[sdim, ddim, str(dtype)])
    if be == "collectives":
        attempt("max", lambda: dist.all_reduce(sparse(r, 1, 0, torch.float32),
                                               op=dist.ReduceOp.MAX))
        bad = torch.sparse_coo_tensor(torch.zeros(1, 1, dtype=torch.long), torch.ones(1),
                                      [5 + (r == n - 1)])
        attempt("shapes", lambda: dist.all_reduce(bad))
        dist.barrier()  # every rank has its outcome before the group goes
    dist.destroy_process_group()
    emit("finished", backend=be)
'''


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("backend", ["gloo", "collectives"])
def test_sparse_all_reduce(n, backend):
    """The sum of sparse COO tensors over ranks, in place, as gloo; shapes that differ
    between ranks fail on every rank naming them; ops other than SUM are refused."""
    res = _shared(("sparse", n), lambda: run_world(
        n, SPARSE_BODY, timeout=70, collective_timeout=30,
        env={"PG_TIMEOUT": "20", "PORT_COLLECTIVES": free_port(), "PORT_GLOO": free_port()}))
    assert not res.timed_out, res.report()
    # this backend's part: no wrong sum, and it ran to its end on every rank (the other
    # backend's part is the other test's)
    bad = [f for rr in res.ranks for f in rr.get("fail") if f["case"][0] == backend]
    assert not bad, res.report()
    assert all(rr.get("finished") and backend in [f["backend"] for f in rr.get("finished")]
               for rr in res.ranks), res.report()
    for r in range(n):
        assert len([s for s in res[r].get("sparse") if s["backend"] == backend]) == 4, \
            res.report()
        if backend == "collectives":
            assert res[r].one("max")["raised"] == "ValueError", res.report()
            assert "ReduceOp.SUM only" in res[r].one("max")["message"]
            shapes = res[r].one("shapes")
            assert shapes["raised"] == "ValueError", shapes
            assert f"rank {n - 1}: (6,)" in shapes["message"] and "rank 0: (5,)" in \
                shapes["message"], shapes


SUBGROUP_TIMEOUT_BODY = INIT + r'''
be = os.environ["BACKEND"]
init(be, f"tcp://127.0.0.1:{os.environ['TORCH_PORT']}")
g = dist.new_group(timeout=timedelta(seconds=1))
dist.barrier()
if r == 0:
    attempt("sub barrier", lambda: dist.barrier(group=g))
    arrive("sub barrier")
else:
    expect(wait_for("sub barrier"), "sub barrier", "rank 0 never had an outcome")
attempt("default after", lambda: dist.all_reduce(torch.ones(1)))
dist.destroy_process_group()
dist.init_process_group(be, init_method="file://" + os.environ["REINIT"], rank=r, world_size=n,
                        timeout=timedelta(seconds=10))
t = torch.ones(1) * (r + 1)
dist.all_reduce(t)
g = dist.new_group()
dist.all_reduce(t, group=g)
emit("re-init", value=t.item())
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["collectives", "gloo"])
def test_subgroup_timeout_leaves_the_default_group_working(tmp_path, backend):
    """A sub-group's timeout raises on the rank that called (worded as gloo's) and, as on
    gloo, the default group goes on (the sub-group has links of its own, issue 37);
    destroy_process_group and init_process_group again give working groups."""
    res = run_world(2, SUBGROUP_TIMEOUT_BODY, timeout=40, collective_timeout=30,
                    env={"BACKEND": backend, "PG_TIMEOUT": "10",
                         "REINIT": str(tmp_path / "init"), "TORCH_PORT": free_port()})
    assert not res.timed_out, res.report()
    if backend == "gloo":
        # torch's gloo sometimes aborts at exit after a group timed out ("terminate called
        # without an active exception", SIGABRT, once every rank emitted "done"): the
        # reference's own teardown, so for gloo the records are what is compared
        for r in range(2):
            assert res[r].one("done") is not None and res[r].get("fail") == [], res.report()
    else:
        res.assert_ok()
    assert " Timed out " in res[0].one("sub barrier")["message"], res.report()
    for r in range(2):
        after = res[r].one("default after")
        assert after["raised"] is None and after["seconds"] < 3.0, after
        assert res[r].one("re-init")["value"] == 6.0, res.report()
