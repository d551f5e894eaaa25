"""Horovod's operations run on links of their own, so the user's thread may use the world.

collectives.torch negotiates on a background thread (rounds every cycle, and
ten a second when idle). Each rank here interleaves named hvd async ops with
MPI.COMM_WORLD and torch.distributed collectives from its own thread in its own
random order (the world's calls in the same order on every rank, as their
contract wants; where the hvd ops fall between them differs per rank), with
pauses long enough for idle rounds to run meanwhile: every value must be
right. Then an idle rank must cost ~no CPU (its thread sleeps, rounds are
ten a second), and shutdown closes Horovod's links.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from conftest import free_port, run_world  # noqa: E402

BODY = r'''
import os
import random
import resource
import time
import numpy as np
import torch
import torch.distributed as dist
import collectives.torch as hvd
from collectives import MPI
from collectives.torch._context import current

hvd.init()
r, n = hvd.rank(), hvd.size()
dist.init_process_group("collectives", init_method=f"tcp://127.0.0.1:{os.environ['TORCH_PORT']}",
                        rank=r, world_size=n)  # the world's links (the backend reuses them)
world = MPI.COMM_WORLD
ctx = current()
emit("links", own=ctx.core is not world._core and ctx.control is not world._core,
     roots=[type(ctx.core).__name__, type(ctx.control).__name__])
rng = random.Random(int(os.environ["SEED"]) * 100 + r)  # this rank's own interleaving
bad = []
for step in range(int(os.environ["STEPS"])):
    hvd_ops = [("hvd", i) for i in range(4)]
    world_ops = [("mpi", 0), ("dist", 0), ("mpi", 1)]   # this order on every rank
    seq = list(world_ops)
    for op in hvd_ops:
        seq.insert(rng.randrange(len(seq) + 1), op)
    handles = {}
    for kind, i in seq:
        if rng.random() < 0.15:
            time.sleep(rng.choice([0.002, 0.03, 0.12]))  # idle rounds run meanwhile
        if kind == "hvd":
            t = torch.full((5 + i,), float(r + 1 + step))
            handles[i] = hvd.allreduce_async(t, name=f"s{step}.{i}", op=hvd.Sum)
        elif kind == "mpi":
            got = world.allreduce(r * 10 + step + i)
            if got != sum(q * 10 + step + i for q in range(n)):
                bad.append(("mpi", step, i, got))
        else:
            t = torch.tensor([float(r + step)])
            dist.all_reduce(t)
            if t.item() != sum(q + step for q in range(n)):
                bad.append(("dist", step, t.item()))
    for i in rng.sample(sorted(handles), len(handles)):
        got = hvd.synchronize(handles[i])
        want = sum(q + 1 + step for q in range(n))
        if got.shape != (5 + i,) or not bool((got == want).all()):
            bad.append(("hvd", step, i, got.tolist()))
emit("mixed", bad=bad)

# idle: this process's CPU while every rank sleeps (the rounds go on, ten a second)
hvd.barrier()
rounds = ctx.lane.stats["rounds"]
before = resource.getrusage(resource.RUSAGE_SELF)
time.sleep(1.0)
after = resource.getrusage(resource.RUSAGE_SELF)
cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
emit("idle", cpu=cpu, rounds=ctx.lane.stats["rounds"] - rounds)
got = hvd.allreduce(torch.ones(2) * (r + 1), op=hvd.Sum)
emit("after", value=got.tolist())
core, control = ctx.core, ctx.control
hvd.shutdown()
emit("closed", value=[core.closed, control.closed])
dist.destroy_process_group()
'''


@pytest.fixture(scope="module", params=[3])
def world(request):
    """(n, result) of one launch at n ranks."""
    n = request.param
    return n, run_world(n, BODY, timeout=90, env={"SEED": str(n), "STEPS": "5",
                                               "TORCH_PORT": str(free_port())})


@pytest.mark.timeout(120)
def test_hvd_ops_and_world_collectives_in_any_interleaving(world):
    n, res = world
    res.assert_ok()
    for rank in range(n):
        links = res[rank].one("links")
        assert links["own"] and links["roots"] == ["Communicator", "Communicator"], links
        assert res[rank].one("mixed")["bad"] == [], res.report()
        assert res[rank].one("after")["value"] == [n * (n + 1) / 2] * 2
        assert res[rank].one("closed")["value"] == [True, True]


@pytest.mark.timeout(120)
def test_idle_rank_costs_no_cpu(world):
    n, res = world
    for rank in range(n):
        idle = res[rank].one("idle")
        # ten small rounds a second when idle, the thread asleep between: a few ms of CPU
        # (a loaded CI host included); a thread that cycled every ms would cost far more
        assert idle["rounds"] <= 15, idle
        assert idle["cpu"] < 0.1, idle
