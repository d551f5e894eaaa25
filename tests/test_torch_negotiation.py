"""collectives.torch matches operations across ranks by name (Horovod's negotiation).

A seeded random sequence at 2, 3 and 4 real ranks: each round every rank
queues the same named async ops (allreduce, allgather, broadcast, alltoall,
reducescatter, grouped allreduce) in its own random order, with a blocking
op at a random place of that order, and some ops made to disagree on one
random rank (shape, dtype, root or op); it then synchronizes them in another
random order. Every op must give the right values on every rank, or raise
``LayoutMismatch`` on every rank (naming the op), and the ranks stay in step:
a last allreduce after every round. Then the steady state: a repeated step of
25 named allreduces is agreed from the response cache alone (no round with
records after the first step), and Horovod's duplicate-name test.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from conftest import run_world  # noqa: E402

BODY = r'''
import os
import random
import time
import torch
import collectives.torch as hvd
from collectives.torch._context import current

hvd.init()
r, n = hvd.rank(), hvd.size()
seed = int(os.environ["SEED"])
plan_rng = random.Random(seed)            # the same plan on every rank
my_rng = random.Random(seed * 1000 + r)   # this rank's own order
KINDS = ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "grouped"]

def data(rank, tag, shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(1009 * tag + rank)
    return torch.randint(0, 7, shape, generator=g).to(dtype)

def make(i, tag, kind, bad):
    """(start() -> handle, expected output or None if it must raise) for op i."""
    rows = 2 * n
    shape = (rows, plan_rng.randint(1, 5))
    root = plan_rng.randrange(n)
    dtype = plan_rng.choice([torch.float32, torch.float64, torch.int32])
    op = plan_rng.choice([hvd.Sum, hvd.Max, hvd.Min])
    culprit = plan_rng.randrange(n)
    how = plan_rng.choice(["shape", "dtype", "param"])
    name = f"op{tag}"
    mine_shape, mine_dtype, mine_root, mine_op = shape, dtype, root, op
    if bad and r == culprit:
        if how == "shape":
            mine_shape = (rows, shape[1] + 1)
        elif how == "dtype":
            mine_dtype = torch.float64 if dtype != torch.float64 else torch.float32
        elif kind == "broadcast":
            mine_root = (root + 1) % n
        elif kind in ("allreduce", "reducescatter", "grouped"):
            mine_op = hvd.Max if op is not hvd.Max else hvd.Min
        else:
            mine_shape = (rows, shape[1] + 1)
    x = data(r, tag, mine_shape, mine_dtype)
    parts = [data(k, tag, shape, dtype) for k in range(n)]
    red = {hvd.Sum: lambda: sum(parts), hvd.Max: lambda: torch.stack(parts).max(0).values,
           hvd.Min: lambda: torch.stack(parts).min(0).values}[op]
    if kind == "allreduce":
        return (lambda: hvd.allreduce_async(x, name=name, op=mine_op)), red()
    if kind == "grouped":
        y = data(r, tag + 5000, (3,), mine_dtype)
        ys = [data(k, tag + 5000, (3,), dtype) for k in range(n)]
        yred = {hvd.Sum: sum(ys), hvd.Max: torch.stack(ys).max(0).values,
                hvd.Min: torch.stack(ys).min(0).values}[op]
        return (lambda: hvd.grouped_allreduce_async([x, y], name=name, op=mine_op)), [red(), yred]
    if kind == "allgather":
        return (lambda: hvd.allgather_async(x, name=name)), torch.cat(parts)
    if kind == "broadcast":
        return (lambda: hvd.broadcast_async(x, mine_root, name=name)), parts[root]
    if kind == "alltoall":
        want = torch.cat([p[2 * r:2 * r + 2] for p in parts])
        return (lambda: hvd.alltoall_async(x, name=name)), want
    want = red()[2 * r:2 * r + 2]
    return (lambda: hvd.reducescatter_async(x, name=name, op=mine_op)), want

results = []
tag = 0
for rnd in range(int(os.environ["ROUNDS"])):
    count = plan_rng.randint(2, 6)
    ops = []
    for i in range(count):
        tag += 1
        kind = plan_rng.choice(KINDS)
        bad = plan_rng.random() < 0.2
        start, want = make(i, tag, kind, bad)
        ops.append((tag, kind, bad, start, want))
    order = list(range(count))
    my_rng.shuffle(order)
    block_at = my_rng.randrange(count + 1)  # a blocking op at a random place of my order
    handles = {}
    def blocking():
        got = hvd.allreduce(torch.ones(2) * (r + 1), name=f"blocking{rnd}", op=hvd.Sum)
        expect(torch.equal(got, torch.ones(2) * n * (n + 1) / 2), f"round {rnd}", "blocking")
    for pos, i in enumerate(order):
        if pos == block_at:
            blocking()
        handles[i] = ops[i][3]()
        if my_rng.random() < 0.3:
            time.sleep(my_rng.random() * 0.01)
    if block_at == count:
        blocking()
    my_rng.shuffle(order)
    for i in order:
        t, kind, bad, _, want = ops[i]
        try:
            got = hvd.synchronize(handles[i])
            if kind == "alltoall":
                got = got[0] if isinstance(got, tuple) else got
            same = all(torch.equal(g, w) for g, w in zip(got, want)) if kind == "grouped" \
                else torch.equal(got, want)
            results.append((t, "ok" if same else "wrong"))
        except hvd.LayoutMismatch as e:
            expect(f"op{t}" in str(e), f"op{t}", f"the error does not name the op: {e}")
            results.append((t, "raised"))
        except Exception as e:
            results.append((t, type(e).__name__ + ": " + str(e)[:200]))
    emit("round", round=rnd, bad=[o[0] for o in ops if o[2]])
emit("results", value=results)
got = hvd.allreduce(torch.ones(3) * (r + 1), op=hvd.Sum)
emit("after", value=got.tolist())

# steady state: a repeated step of 25 named allreduces (8 B .. 4 MiB) comes from the cache
sizes = [2 * 4 ** (k % 11) for k in range(25)]
grads = [torch.ones(s) for s in sizes]
lane = current().lane
for step in range(6):
    if step == 2:
        full_before = lane.stats["full_rounds"]
    hs = [hvd.allreduce_async_(g, name=f"grad{k}", op=hvd.Average) for k, g in enumerate(grads)]
    for h in hs:
        hvd.synchronize(h)
emit("steady", full=lane.stats["full_rounds"] - full_before)
expect(all(torch.equal(g, torch.ones_like(g)) for g in grads), "steady", "values")

# Horovod's test_horovod_allgather_duplicate_name_error: rank 0 queues before a barrier,
# the others after it; a second op with a name in flight raises ValueError there
t = torch.ones(17, 3)
for phase in range(2):
    if (r == 0) == (phase == 0):
        h = hvd.allgather_async(t, name="duplicate_name")
        try:
            hvd.allgather_async(t, name="duplicate_name")
            fail("duplicate", "no ValueError")
        except ValueError:
            pass
    hvd.barrier()
expect(hvd.synchronize(h).shape == (17 * n, 3), "duplicate", "the first op's result")
got = hvd.allreduce(torch.ones(3) * (r + 1), op=hvd.Sum)
emit("after2", value=got.tolist())
'''


@pytest.fixture(scope="module", params=[2, 3, 4])
def world(request):
    """(n, result) of one launch at n ranks (one per rank count: launches cost seconds)."""
    n = request.param
    return n, run_world(n, BODY, timeout=100, env={"SEED": str(n + 40), "ROUNDS": "12"})


@pytest.mark.timeout(120)
def test_any_order_right_everywhere_or_raise_everywhere(world):
    n, res = world
    res.assert_ok()
    per_rank = []
    for rank in range(n):
        assert res[rank].get("fail") == [], res.report()
        per_rank.append(dict((t, v) for t, v in res[rank].one("results")["value"]))
    bad = {t for rnd in res[0].get("round") for t in rnd["bad"]}
    assert bad and len(bad) < len(per_rank[0]), "the seed should mix good and bad ops"
    for t in per_rank[0]:
        outcomes = [per_rank[k][t] for k in range(n)]
        want = "raised" if t in bad else "ok"
        assert outcomes == [want] * n, (t, outcomes)
    want = [n * (n + 1) / 2] * 3
    for rank in range(n):
        assert res[rank].one("after")["value"] == want
        assert res[rank].one("after2")["value"] == want


@pytest.mark.timeout(120)
def test_repeated_step_is_agreed_from_the_cache(world):
    n, res = world
    for rank in range(n):
        assert res[rank].one("steady")["full"] == 0, res.report()
