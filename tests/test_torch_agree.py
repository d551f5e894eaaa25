"""collectives.torch: ranks that disagree all raise, then go on in step (issue 24).

Every reproduction of the issue runs at 2, 3 and 4 real ranks: a mismatch
after both layouts were seen once (the old per-layout cache let it through),
a broadcast whose root differs per rank, a dtype mismatch, a mismatch caught
by allreduce / grouped_allreduce followed by every op, and one rank raising
on its own argument. A seeded random sequence then drives allreduce,
broadcast and allgather with random shapes, dtypes, roots and deliberate
mismatches on random ranks: every call must give the right values on every
rank or raise on every rank.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from conftest import run_world  # noqa: E402

REPRO_BODY = r'''
import torch
import collectives.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()

def outcome(case, fn):
    """Run fn; record 'ok' or the exception's class (and message) under case."""
    try:
        fn()
        emit("case", case=case, result="ok")
    except Exception as e:
        emit("case", case=case, result=type(e).__name__, message=str(e))

def in_step(case):
    """Every op works and agrees after a caught error."""
    def body():
        got = hvd.allreduce(torch.full((3,), float(r + 1)), op=hvd.Sum)
        expect(torch.equal(got, torch.full((3,), n * (n + 1) / 2)), case, f"allreduce {got}")
        big = hvd.allreduce(torch.arange(1000.) + r, op=hvd.Sum)
        expect(torch.equal(big, n * torch.arange(1000.) + n * (n - 1) / 2), case, "big allreduce")
        g = hvd.grouped_allreduce([torch.ones(2), torch.ones(3, dtype=torch.int32)], op=hvd.Sum)
        expect(torch.equal(g[0], torch.full((2,), float(n))) and
               torch.equal(g[1], torch.full((3,), n, dtype=torch.int32)), case, f"grouped {g}")
        b = hvd.broadcast(torch.full((4,), float(r)), n - 1)
        expect(torch.equal(b, torch.full((4,), float(n - 1))), case, f"broadcast {b}")
        a = hvd.allgather(torch.full((r + 1, 2), r))
        want = torch.cat([torch.full((k + 1, 2), k) for k in range(n)])
        expect(torch.equal(a, want), case, f"allgather {a.tolist()}")
    outcome(case + "/after", body)

expect(issubclass(hvd.LayoutMismatch, RuntimeError) and issubclass(hvd.LayoutMismatch, ValueError),
       "class", "LayoutMismatch is not a RuntimeError and a ValueError")

# 1a. shapes differ after each rank has allreduced both shapes once
hvd.allreduce(torch.ones(2, 3), op=hvd.Sum)
hvd.allreduce(torch.ones(3, 2), op=hvd.Sum)
outcome("shape-after-warmup", lambda: hvd.allreduce(
    torch.arange(6.).reshape((2, 3) if r == 0 else (3, 2)), op=hvd.Sum))
in_step("shape-after-warmup")

# 1b. broadcast with a root that differs per rank, after every root was used
t = torch.arange(5.) + 10 * r
for root in range(n):
    hvd.broadcast(t, root)
outcome("root-per-rank", lambda: hvd.broadcast(t, r))
in_step("root-per-rank")

# 1c. dtype differs (uncached, and after both dtypes were seen)
outcome("dtype", lambda: hvd.allreduce(torch.ones(4, dtype=torch.float32 if r == 0 else torch.float64)))
in_step("dtype")
hvd.allreduce(torch.ones(4, dtype=torch.float32))
hvd.allreduce(torch.ones(4, dtype=torch.float64))
outcome("dtype-after-warmup", lambda: hvd.allreduce(
    torch.ones(4, dtype=torch.float32 if r == n - 1 else torch.float64)))
in_step("dtype-after-warmup")

# op differs
outcome("op", lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum if r else hvd.Max))
in_step("op")

# 2. a mismatch caught from allreduce / grouped_allreduce (async too), large and small
outcome("allreduce-big", lambda: hvd.allreduce(torch.ones(1000 + (r == 1))))
in_step("allreduce-big")
outcome("grouped", lambda: hvd.grouped_allreduce([torch.ones(2), torch.ones(3 if r else 4)]))
in_step("grouped")
outcome("async", lambda: hvd.synchronize(hvd.allreduce_async(torch.ones(500, 2 + (r == 0)))))
in_step("async")

# 4. one rank raises on its own argument: the others must not be left waiting
bad = torch.ones(3, dtype=torch.complex64) if r == n - 1 else torch.ones(3)
outcome("bad-arg", lambda: hvd.allreduce(bad))
in_step("bad-arg")
outcome("bad-root", lambda: hvd.broadcast(torch.ones(3), n + 5 if r == 0 else 0))
in_step("bad-root")
outcome("bad-splits", lambda: hvd.alltoall(torch.ones(n, 2), splits=[1] * n if r else [n + 1] + [0] * (n - 1)))
in_step("bad-splits")
outcome("reducescatter", lambda: hvd.reducescatter(torch.ones(n, 2 + (r == 0)), op=hvd.Sum))
in_step("reducescatter")
outcome("allgather-trailing", lambda: hvd.allgather(torch.ones(2, 2 + (r == 0))))
in_step("allgather-trailing")
outcome("object-root", lambda: hvd.broadcast_object({"from": r}, root_rank=r))
in_step("object-root")
outcome("params-bad-root", lambda: hvd.broadcast_parameters({"w": torch.ones(2)}, n + 1 if r == 0 else 0))
in_step("params-bad-root")
outcome("barrier-vs-allreduce", lambda: hvd.barrier() if r == 0 else hvd.allreduce(torch.ones(2)))
in_step("barrier-vs-allreduce")
def join_vs_broadcast():
    """Horovod's semantics: the others' broadcast raises LayoutMismatch while the joined rank
    keeps waiting in join(); their join() after the error releases it."""
    if r == n - 1:
        return hvd.join()
    try:
        hvd.broadcast(torch.ones(2000), 0)
    finally:
        hvd.join()
outcome("join-vs-broadcast", join_vs_broadcast)
in_step("join-vs-broadcast")

def hostile():
    """Rank 0 sends a slot claiming a 1 TiB payload in a broadcast's agreement: the others
    reject it unread. (Run as one negotiated op: only the negotiating thread uses the links.)"""
    import struct
    import numpy as np
    from collectives.torch import _agree
    from collectives.torch._context import current
    from collectives.torch._lane import run_call
    def on_lane():
        if r == 0:
            slot = bytearray(_agree.SLOT)
            struct.pack_into("<IIQqq", slot, 0, _agree.MAGIC, _agree.OK, 0, 1 << 40, 0)
            out = np.empty(n * _agree.SLOT, dtype=np.uint8)
            current().core.allgatherv(np.frombuffer(slot, dtype=np.uint8), out, [_agree.SLOT] * n)
            return
        hvd.broadcast(torch.ones(2), 0)
    run_call(current(), "hostile", None, on_lane)
outcome("hostile-slot", hostile)
in_step("hostile-slot")
emit("end")
'''

# case -> (what the rank that raised the local error gets, what the others get)
EXPECTED = {
    "shape-after-warmup": "LayoutMismatch", "root-per-rank": "LayoutMismatch",
    "dtype": "LayoutMismatch", "dtype-after-warmup": "LayoutMismatch", "op": "LayoutMismatch",
    "allreduce-big": "LayoutMismatch", "grouped": "LayoutMismatch", "async": "LayoutMismatch",
    "reducescatter": "LayoutMismatch", "allgather-trailing": "LayoutMismatch",
    "object-root": "LayoutMismatch",
    # matched by name (Horovod's): a barrier against an allreduce is two ops each waiting for
    # the other ranks; both fail after HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (set below)
    "barrier-vs-allreduce": "StalledOperation",
}
LOCAL_ERRORS = {"bad-arg": ("TypeError", lambda n: n - 1), "bad-root": ("ValueError", lambda n: 0),
                "bad-splits": ("ValueError", lambda n: 0),
                "params-bad-root": ("ValueError", lambda n: 0)}


@pytest.mark.timeout(90)
def test_issue_reproductions_raise_everywhere_then_go_on(world):
    n, res = world
    res.assert_ok()
    for rank in range(n):
        res[rank].one("end")
        assert res[rank].one("done")["failures"] == 0, res.report()
        got = {c["case"]: c for c in res[rank].get("case")}
        for case, want in EXPECTED.items():
            if case == "barrier-vs-allreduce":  # each rank names its own op
                assert got[case]["result"] == want and "not by rank" in got[case]["message"]
                assert got[case + "/after"]["result"] == "ok", (rank, got[case + "/after"])
                continue
            assert got[case]["result"] == want, (rank, case, got[case])
            assert got[case + "/after"]["result"] == "ok", (rank, case, got[case + "/after"])
        for case, (exc, culprit) in LOCAL_ERRORS.items():
            k = culprit(n)
            assert got[case]["result"] == (exc if rank == k else "LayoutMismatch"), (rank, got[case])
            if rank != k:
                assert f"rank {k} raised" in got[case]["message"] and exc in got[case]["message"]
            assert got[case + "/after"]["result"] == "ok", (rank, case, got[case + "/after"])
    for rank in range(n):  # the joined rank (n - 1) waits; the others raise naming it
        got = {c["case"]: c for c in res[rank].get("case")}
        want = "ok" if rank == n - 1 else "LayoutMismatch"
        assert got["join-vs-broadcast"]["result"] == want, (rank, got["join-vs-broadcast"])
        if rank != n - 1:
            assert "join" in got["join-vs-broadcast"]["message"], got["join-vs-broadcast"]
        assert got["join-vs-broadcast/after"]["result"] == "ok", (rank, got)
    for rank in range(1, n):
        got = [c for c in res[rank].get("case") if c["case"] == "hostile-slot"][0]
        assert got["result"] == "LayoutMismatch" and "rank 0 sent a malformed" in got["message"], got
    for rank in range(n):
        after = [c for c in res[rank].get("case") if c["case"] == "hostile-slot/after"]
        assert after and after[0]["result"] == "ok", (rank, after)
    # every rank names the same culprit with the same words
    for case in set(EXPECTED) - {"barrier-vs-allreduce"}:
        texts = {c["message"] for rank in range(n) for c in res[rank].get("case")
                 if c["case"] == case}
        assert len(texts) == 1, (case, texts)


RANDOM_BODY = r'''
import random
import torch
import collectives.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
import os
rng = random.Random(int(os.environ["SEED"]))  # the same sequence on every rank
DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
OPS = ["Sum", "Min", "Max", "Average"]

def data(rank, step, shape, dtype):
    g = torch.Generator().manual_seed(7919 * step + rank)
    return torch.randint(0, 5, shape, generator=g).to(dtype)

def random_shape():
    if rng.random() < 0.25:  # above the 384 bytes carried inside the agreement
        return (rng.randint(40, 70), rng.randint(1, 9))
    return tuple(rng.randint(0, 4) for _ in range(rng.randint(0, 3)))

def other_shape(shape, trailing_only=False):
    if trailing_only:
        return shape[:1] + (shape[1] + 1,) if len(shape) > 1 else shape + (2,)
    if len(shape) > 1 and shape[0] != shape[-1]:
        return shape[::-1]  # same element count, other shape
    return tuple(d + 1 for d in shape) or (2,)

for step in range(int(os.environ["STEPS"])):
    kind = rng.choice(["allreduce", "broadcast", "allgather"])
    shape, dtype, root = random_shape(), rng.choice(DTYPES), rng.randrange(n)
    op = rng.choice(OPS[:3] if not dtype.is_floating_point else OPS)
    rows = [rng.randint(0, 3) for _ in range(n)]  # allgather: dim 0 per rank
    # every draw happens on every rank, so the ranks' sequences stay equal
    culprit, what = rng.randrange(n), rng.choice(["shape", "dtype", "param", "bad"])
    alt_dtype, alt_op = rng.choice([d for d in DTYPES if d != dtype]), rng.choice([o for o in OPS[:3] if o != op])
    if rng.random() >= 0.3:
        culprit = what = None
    my_shape, my_dtype, my_root, my_op = shape, dtype, root, op
    if kind == "allgather":
        shape = my_shape = (rows[r],) + shape[1:] if shape else (rows[r],)
    if r == culprit:
        if what == "shape":
            my_shape = other_shape(shape, trailing_only=kind == "allgather")
        elif what == "dtype":
            my_dtype = alt_dtype
        elif what == "param" and kind == "allreduce":
            my_op = alt_op
        elif what == "param" and kind == "broadcast":
            my_root = (root + 1) % n
        elif kind == "broadcast":
            my_root = n + 3  # out of range: ValueError here
        else:
            my_dtype = torch.complex64  # unsupported: TypeError here
        if what == "param" and kind == "allgather":
            my_shape = other_shape(shape, trailing_only=True)
    mine = data(r, step, my_shape, my_dtype if my_dtype != torch.complex64 else torch.float32)
    if my_dtype == torch.complex64:
        mine = mine.to(torch.complex64)
    emit("plan", step=step, injected=culprit is not None)
    case = dict(step=step, kind=kind, shape=shape, dtype=str(dtype), op=op, root=root,
                culprit=culprit, what=what)
    try:
        if kind == "allreduce":
            got = hvd.allreduce(mine, op=getattr(hvd, my_op))
            parts = torch.stack([data(k, step, shape, dtype).to(torch.float64) for k in range(n)])
            want = {"Sum": parts.sum(0), "Min": parts.min(0).values, "Max": parts.max(0).values,
                    "Average": parts.mean(0)}[op]
        elif kind == "broadcast":
            got = hvd.broadcast(mine, my_root)
            want = data(root, step, shape, dtype).to(torch.float64)
        else:
            got = hvd.allgather(mine)
            want = torch.cat([data(k, step, (rows[k],) + shape[1:], dtype).to(torch.float64)
                              for k in range(n)])
        emit("step", step=step, result="ok")
        expect(got.dtype == dtype and tuple(got.shape) == tuple(want.shape), case,
               f"got {got.dtype}{tuple(got.shape)}")
        top = float(want.abs().max()) if want.numel() else 0.0
        # exact small integers, except Average's division (and half precision's rounding)
        tol = 0.05 * top if dtype in (torch.float16, torch.bfloat16) else \
            1e-6 * (1 + top) if dtype.is_floating_point else 0.0
        expect(want.numel() == 0 or (got.to(torch.float64) - want).abs().max().item() <= tol, case,
               "wrong values")
    except Exception as e:
        emit("step", step=step, result=type(e).__name__, message=str(e)[:200])
'''


@pytest.mark.timeout(90)
def test_random_sequences_right_everywhere_or_raise_everywhere(world):
    n, res = world
    steps = STEPS
    script = {}
    for rank in range(n):
        assert res[rank].returncode == 0 and not res[rank].get("fail"), res.report()
        script[rank] = {s["step"]: s for s in res[rank].get("step")}
        assert sorted(script[rank]) == list(range(steps)), res.report()
    injected = {p["step"]: p["injected"] for p in res[0].get("plan")}
    for step in range(steps):
        results = [script[rank][step]["result"] for rank in range(n)]
        # an injected mismatch raises on every rank; anything else succeeds on every rank
        want = "raise" if injected[step] else "ok"
        assert all((x == "ok") == (want == "ok") for x in results), \
            (step, want, [script[k][step] for k in range(n)])
    assert 5 <= sum(injected.values()) <= steps - 20  # the seed mixes both kinds


HOROVOD_STYLE_TESTS = r'''
import pytest
import torch
import collectives.torch as hvd

def setup_module():
    hvd.init()

def test_allreduce_error():  # Horovod's: shapes differ by rank; every rank must raise
    r = hvd.rank()
    with pytest.raises(RuntimeError):
        hvd.allreduce(torch.ones(17 + r, 17))

def test_allreduce_type_error():
    t = torch.ones(17, dtype=torch.int32 if hvd.rank() % 2 == 0 else torch.float32)
    with pytest.raises(RuntimeError):
        hvd.allreduce(t)

def test_broadcast_rank_error():
    with pytest.raises(RuntimeError):
        hvd.broadcast(torch.ones(17), hvd.rank())

def test_bad_argument_on_one_rank():  # fails on the last rank only, as a buggy test does
    t = torch.ones(3, dtype=torch.complex64) if hvd.rank() == hvd.size() - 1 else torch.ones(3)
    hvd.allreduce(t)

def test_after_one_failed_test():
    n = hvd.size()
    assert torch.equal(hvd.allreduce(torch.ones(5), op=hvd.Sum), torch.full((5,), float(n)))
    assert hvd.allgather(torch.ones(1, 2) * hvd.rank()).shape == (n, 2)
    hvd.barrier()

def test_grouped_after():
    out = hvd.grouped_allreduce([torch.ones(300), torch.ones(2)], op=hvd.Sum)
    assert torch.equal(out[0], torch.full((300,), float(hvd.size())))
'''

PYTEST_RUNNER = r'''
import os
import sys
import pytest

class Report:
    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            sys.stdout.write("\n")  # pytest's progress dots leave the line open
            emit("test", name=report.nodeid.split("::")[-1], when=report.when, outcome=report.outcome)

with open("test_horovod_style.py", "w") as f:
    f.write(os.environ["TESTS_SOURCE"])
pytest.main(["-q", "-p", "no:cacheprovider", "test_horovod_style.py"], plugins=[Report()])
'''


@pytest.mark.timeout(90)
def test_horovod_style_test_file_one_process_per_rank(world):
    """Issue 24 item 4: a test file run by pytest in one process per rank (as Horovod's
    CI does): a test failing on one rank only must not make the later tests fail."""
    n, res = world
    for rank in range(n):
        got = {t["name"]: t["outcome"] for t in res[rank].get("test")}
        want = dict.fromkeys(["test_allreduce_error", "test_allreduce_type_error",
                              "test_broadcast_rank_error", "test_after_one_failed_test",
                              "test_grouped_after"], "passed")
        want["test_bad_argument_on_one_rank"] = "failed"  # TypeError there, LayoutMismatch elsewhere
        assert got == want, (rank, got, res.report())


STEPS = 60


@pytest.fixture(scope="module", params=[2, 3, 4])
def world(request):
    """(n, result) of one launch at n ranks running the three bodies above in turn
    (a launch costs seconds on 2 cores: one per rank count, not one per test)."""
    n = request.param
    res = run_world(n, REPRO_BODY + RANDOM_BODY + PYTEST_RUNNER, timeout=80,
                    env={"SEED": n - 1, "STEPS": STEPS, "TESTS_SOURCE": HOROVOD_STYLE_TESTS,
                         "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"})
    return n, res
