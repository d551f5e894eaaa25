"""torch.distributed sub-groups on the "collectives" backend (issue 19): new_group and
new_subgroups, each with links of its own (issue 37: as gloo's groups), with torch's
semantics (collective over the default group; non-members get NON_GROUP_MEMBER; src/dst are
global ranks), against references computed from rank-derived data, overlapping and disjoint
groups interleaved with default-group ops; a member that dies: the other members raise
naming it.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import free_port, run_world  # noqa: E402

PREAMBLE = r'''
import os
import torch
import torch.distributed as dist
import collectives.torch  # registers the backend
from torch.distributed import GroupMember

r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("collectives")
'''

GRID = PREAMBLE + r'''
assert n == 4
T = lambda v, k=3: torch.full((k,), float(v))
dist.all_to_all_single(torch.empty(n), torch.arange(n, dtype=torch.float32))  # every pair
core = dist.distributed_c10d._get_default_group()._core
ga = dist.new_group([2, 0])          # torch sorts: [0, 2]
gb = dist.new_group([1, 2, 3])       # overlaps ga at rank 2
gw = dist.new_group(list(range(n)))
gs = dist.new_group([3])
for g, ranks in [(ga, [0, 2]), (gb, [1, 2, 3]), (gw, list(range(n))), (gs, [3])]:
    if r in ranks:
        expect(g._core is not core, ("own communicator", ranks), "shares the default's")
        expect(dist.get_rank(g) == ranks.index(r) and dist.get_world_size(g) == len(ranks)
               and dist.get_process_group_ranks(g) == ranks, ("identity", ranks),
               f"{dist.get_rank(g)} {dist.get_world_size(g)}")
    else:
        expect(g is GroupMember.NON_GROUP_MEMBER, ("non-member", ranks), repr(g))

def on(g, ranks, it):
    me, m = ranks.index(r), len(ranks)
    t = T(r + 1)
    dist.all_reduce(t, group=g)
    expect(torch.equal(t, T(sum(q + 1 for q in ranks))), ("all_reduce", ranks, it), str(t))
    big = torch.arange(20000.) * (r + 1)
    w = dist.all_reduce(big, op=dist.ReduceOp.MAX, group=g, async_op=True)
    w.wait()
    expect(torch.equal(big, torch.arange(20000.) * (max(ranks) + 1)), ("async max", ranks, it), "")
    t = T(r * 10)
    dist.broadcast(t, src=ranks[-1], group=g)  # src: a global rank
    expect(torch.equal(t, T(ranks[-1] * 10)), ("broadcast", ranks, it), str(t))
    outs = [torch.empty(2) for _ in ranks]
    dist.all_gather(outs, torch.full((2,), float(r)), group=g)
    expect([o[0].item() for o in outs] == [float(q) for q in ranks], ("all_gather", ranks, it), "")
    o = torch.empty(2)
    dist.reduce_scatter_tensor(o, torch.arange(2. * m) * (r + 1), group=g)
    tot = sum(q + 1 for q in ranks)
    expect(torch.equal(o, torch.arange(2. * me, 2. * me + 2) * tot), ("reduce_scatter", ranks, it),
           str(o))
    o = torch.empty(m)
    dist.all_to_all_single(o, torch.arange(m, dtype=torch.float32) + 10 * r, group=g)
    expect(o.tolist() == [10. * q + me for q in ranks], ("all_to_all", ranks, it), str(o))
    got = [None] * m
    dist.all_gather_object(got, ("r", r), group=g)
    expect(got == [("r", q) for q in ranks], ("all_gather_object", ranks, it), str(got))
    if m > 1:  # point-to-point inside the group, global ranks
        nxt, prv = ranks[(me + 1) % m], ranks[(me - 1) % m]
        rq = dist.irecv(t := torch.empty(2), src=prv, group=g)
        dist.send(torch.full((2,), float(r)), dst=nxt, group=g)
        rq.wait()
        expect(torch.equal(t, torch.full((2,), float(prv))), ("send/recv", ranks, it), str(t))
    dist.barrier(group=g)

for it in range(2):
    if r in (0, 2):
        on(ga, [0, 2], it)
    if r in (1, 2, 3):
        on(gb, [1, 2, 3], it)
    t = T(r)
    dist.all_reduce(t)  # the default group, interleaved
    expect(torch.equal(t, T(n * (n - 1) / 2)), ("world", it), str(t))
    on(gw, list(range(n)), it)
    if r == 3:
        on(gs, [3], it)

# new_subgroups: consecutive groups of 2, every rank in one
cur, subs = dist.new_subgroups(group_size=2)
mine = [0, 1] if r < 2 else [2, 3]
expect(dist.get_process_group_ranks(cur) == mine and len(subs) == 2, "new_subgroups", "")
t = T(r)
dist.all_reduce(t, group=cur)
expect(torch.equal(t, T(sum(mine))), "new_subgroups all_reduce", str(t))
# a non-member passing the group: torch warns and does nothing (as on gloo)
if r == 1:
    import warnings
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        t = T(5)
        dist.all_reduce(t, group=ga)
    expect(torch.equal(t, T(5)) and any("does not belong" in str(w.message) for w in seen),
           "non-member op", str([str(w.message) for w in seen]))
# destroy_process_group(group) on its members; the default group goes on
gd = dist.new_group([0, 1])
if r in (0, 1):
    dist.all_reduce(T(1), group=gd)
    dist.destroy_process_group(gd)
t = T(1)
dist.all_reduce(t)
expect(torch.equal(t, T(n)), "after destroying a group", str(t))
dist.barrier()
dist.destroy_process_group()
'''


def _torchrun_env(port):
    def env(rank, n):
        return {"RANK": rank, "WORLD_SIZE": n, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": n,
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TORCHELASTIC_RUN_ID": "none"}
    return env


@pytest.mark.timeout(90)
def test_subgroups_grid():
    run_world(4, GRID, rank_env=_torchrun_env(free_port()), timeout=80).assert_ok()


@pytest.mark.timeout(90)
def test_subgroups_under_launcher():
    """The default group is the collectives world (collectives-run); sub-groups have their own."""
    run_world(4, GRID, launcher=True, timeout=80).assert_ok()


DEAD = PREAMBLE + r'''
import time
g = dist.new_group([0, 1, 3])
dist.barrier()
if r == 3:
    os._exit(0)
if r == 2:  # not a member: leaves after the others have failed
    expect(wait_for("failed 0", "failed 1"), "dead", "the members never failed")
    sys.exit(0)
start = time.monotonic()
try:
    for _ in range(3):
        dist.all_reduce(torch.ones(1 << 16), group=g)
    fail("dead", "no error")
except Exception as exc:
    error_record(exc, start)
arrive(f"failed {r}")  # stay until every member has failed (a rank leaving is a failure too)
expect(wait_for("failed 0", "failed 1"), "dead", "the other member never failed")
'''


@pytest.mark.timeout(60)
def test_dead_member_named():
    # Every member fails fast, on the group's own communicator; the cause looked up in the
    # group's store comes first: the dead member (the group's rank 2) never reported.
    res = run_world(4, DEAD, launcher=True, timeout=50, collective_timeout=20)
    for r in (0, 1):
        rec = res[r].one("error")
        msg = rec["message"]
        assert rec["elapsed"] < 10 and "global ranks 0,1,3" in msg, res.report()
        assert msg.startswith(f"rank {r}: rank 2 (global rank 3) reported no error"), \
            res.report()
        assert not res[r].get("fail"), res.report()
