"""Horovod process sets in collectives.torch (issue 19): add/remove/init(process_sets=...),
process_set= on every op, against references computed from the members' rank-derived data.

One 3-rank world registers overlapping and disjoint sets ([0, 2], [1], [0, 1]), runs every
op on them interleaved with world ops (each rank on the sets it belongs to, so disjoint sets
run at the same time), counts descriptors (registering a set opens no socket), checks the
errors (non-member, root outside the set, unregistered/removed set, no dynamic flag, ranks
that disagree). Other worlds: static sets through init(process_sets=...), and a member of a
set that dies (every surviving member raises naming it).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import run_world  # noqa: E402

GRID = r'''
import os
import torch
import collectives.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
assert n == 3
T = lambda v, k=4: torch.full((k,), float(v))

# registration opens no socket: connect every pair first, then count
hvd.alltoall(torch.arange(n, dtype=torch.float32))
fds = fd_count()
even = hvd.add_process_set([2, 0])          # sorted: [0, 2]
odd = hvd.add_process_set(hvd.ProcessSet([1]))
ab = hvd.add_process_set([0, 1])            # overlaps even at rank 0
expect(fd_count() == fds, "no new sockets", f"{fds} -> {fd_count()}")
expect([even.process_set_id, odd.process_set_id, ab.process_set_id] == [1, 2, 3], "ids",
       str([even.process_set_id, odd.process_set_id, ab.process_set_id]))
expect(even.ranks == [0, 2] and ab.ranks == [0, 1], "ranks", f"{even.ranks} {ab.ranks}")
mine = even if r in (0, 2) else odd
members = mine.ranks
for ps, ranks in [(even, [0, 2]), (odd, [1]), (ab, [0, 1])]:
    inc = r in ranks
    expect((ps.included(), ps.size(), ps.rank()) == (inc, len(ranks),
                                                      ranks.index(r) if inc else -1),
           ("identity", ps.process_set_id), f"{ps.included()} {ps.size()} {ps.rank()}")
from collectives.torch.process_sets import process_set_by_id, process_sets
expect(process_set_by_id(3) is ab and len(process_sets()) == 4, "registry", "")

for it in range(2):  # twice: the sets stay usable, world ops in between
    # allreduce (Sum, Average) on this rank's set of the even/odd partition
    got = hvd.allreduce(T(r + 1), op=hvd.Sum, process_set=mine)
    expect(torch.equal(got, T(sum(m + 1 for m in members))), ("allreduce", it), str(got))
    got = hvd.allreduce(T(r + 1), process_set=mine)
    expect(torch.allclose(got, T(sum(m + 1 for m in members) / len(members))),
           ("allreduce avg", it), str(got))
    # the overlapping set, large enough not to be inlined in the agreement
    if r in (0, 1):
        got = hvd.allreduce(torch.arange(5000.) * (r + 1), op=hvd.Sum, process_set=ab)
        expect(torch.equal(got, torch.arange(5000.) * 3), ("allreduce ab", it), "")
    # world op interleaved
    got = hvd.allreduce(T(r), op=hvd.Sum)
    expect(torch.equal(got, T(n * (n - 1) / 2)), ("world", it), str(got))
    # allgather: variable first dimension, in set rank order
    got = hvd.allgather(torch.full((r + 1, 2), float(r)), process_set=mine)
    want = torch.cat([torch.full((m + 1, 2), float(m)) for m in members])
    expect(torch.equal(got, want), ("allgather", it), str(got))
    # broadcast: root_rank is a global rank, as in Horovod
    root = members[-1]
    got = hvd.broadcast(T(r * 10, 300), root_rank=root, process_set=mine)
    expect(torch.equal(got, T(root * 10, 300)), ("broadcast", it), str(got[:3]))
    x = T(r * 7)
    hvd.broadcast_(x, root_rank=members[0], process_set=mine)
    expect(torch.equal(x, T(members[0] * 7)), ("broadcast_", it), str(x))
    # alltoall with splits: row j of each member goes to set rank j
    m = len(members)
    src = torch.tensor([100. * r + j for j in range(m)])
    got, recv = hvd.alltoall(src, splits=[1] * m, process_set=mine)
    me = members.index(r)
    expect(got.tolist() == [100. * q + me for q in members] and recv.tolist() == [1] * m,
           ("alltoall", it), f"{got} {recv}")
    # reducescatter: set rank i gets rows i
    rs = hvd.reducescatter(torch.arange(2. * m).reshape(m, 2) * (r + 1), op=hvd.Sum,
                           process_set=mine)
    tot = sum(q + 1 for q in members)
    expect(torch.equal(rs, torch.arange(2. * me, 2. * me + 2).reshape(1, 2) * tot),
           ("reducescatter", it), str(rs))
    # grouped allreduce, async allreduce with poll/synchronize, objects
    g = hvd.grouped_allreduce([T(r), T(1, 3)], op=hvd.Sum, process_set=mine)
    expect(torch.equal(g[0], T(sum(members))) and torch.equal(g[1], T(m, 3)),
           ("grouped", it), str(g))
    h = hvd.allreduce_async(T(r + 1, 10000), op=hvd.Sum, name="same", process_set=mine)
    h2 = hvd.allreduce_async(T(1), op=hvd.Sum, name="same")  # the world: another name space
    expect(torch.equal(hvd.synchronize(h), T(tot, 10000)), ("async", it), "")
    expect(torch.equal(hvd.synchronize(h2), T(n)), ("async world", it), "")
    expect(hvd.broadcast_object({"r": r}, root_rank=members[-1], process_set=mine)
           == {"r": members[-1]}, ("broadcast_object", it), "")
    expect(hvd.allgather_object(r, process_set=mine) == members, ("allgather_object", it), "")
    hvd.barrier(process_set=mine)

# autograd: the backward runs over the same set
x = torch.full((3,), float(r + 1), requires_grad=True)
y = hvd.allreduce(x, op=hvd.Sum, process_set=mine)
(y * (r + 1)).sum().backward()
expect(torch.equal(x.grad, torch.full((3,), float(tot))), "grad allreduce", str(x.grad))
x = torch.full((2,), float(r), requires_grad=True)
y = hvd.allgather(x, process_set=mine)
(y * torch.arange(2. * len(members))).sum().backward()
want = torch.arange(2. * me, 2. * me + 2)  # Horovod: the averaged gradient's own slice
expect(torch.allclose(x.grad, want), "grad allgather", f"{x.grad} vs {want}")

# broadcast_parameters, DistributedOptimizer averaging over the set only
torch.manual_seed(r)
model = torch.nn.Linear(4, 1, bias=False)
hvd.broadcast_parameters(model.state_dict(), root_rank=members[0], process_set=mine)
w0 = model.weight.detach().clone()
torch.manual_seed(members[0])
expect(torch.equal(w0, torch.nn.Linear(4, 1, bias=False).weight.detach()), "bcast params", "")
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                               named_parameters=model.named_parameters(), process_set=mine)
model(torch.full((1, 4), float(r + 1))).sum().backward()
opt.step()
avg = sum(q + 1 for q in members) / len(members)
expect(torch.allclose(model.weight.detach(), w0 - avg), "optimizer", f"{model.weight} {w0}")
hvd.broadcast_optimizer_state(opt, root_rank=members[-1], process_set=mine)

# errors, before anything is sent: a non-member, a root outside the set
if r == 2:
    try:
        hvd.allreduce(T(1), process_set=ab)
        fail("non-member", "accepted")
    except ValueError as e:
        expect("not in process set 3" in str(e), "non-member", str(e))
    try:
        hvd.allreduce_async(T(1), process_set=odd)
        fail("non-member async", "accepted")
    except ValueError as e:
        expect("not in process set 2" in str(e), "non-member async", str(e))
if r in (0, 2):
    try:
        hvd.broadcast(T(1), root_rank=1, process_set=even)
        fail("root outside", "accepted")
    except ValueError as e:
        expect("root_rank 1 is not in process set 1" in str(e), "root outside", str(e))
try:
    hvd.allreduce(T(1), process_set=hvd.ProcessSet([0, 1]))
    fail("unregistered", "accepted")
except ValueError as e:
    expect("not registered" in str(e), "unregistered", str(e))
os.environ.pop("HOROVOD_DYNAMIC_PROCESS_SETS")
try:
    hvd.add_process_set([1, 2])
    fail("dynamic flag", "accepted")
except ValueError as e:
    expect("HOROVOD_DYNAMIC_PROCESS_SETS" in str(e), "dynamic flag", str(e))
os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
try:
    hvd.add_process_set([0, 2])
    fail("duplicate", "accepted")
except ValueError as e:
    expect("duplicate" in str(e), "duplicate", str(e))
try:  # ranks that pass different sets all raise, and nothing is registered
    hvd.add_process_set([[1, 2], [0], [2]][r])
    fail("disagree", "accepted")
except hvd.LayoutMismatch as e:
    expect("add_process_set" in str(e), "disagree", str(e))
got = hvd.allreduce(T(1), op=hvd.Sum)
expect(torch.equal(got, T(n)), "world after errors", str(got))

# remove: collective, invalidates; a removed set is refused; a new one gets a fresh id
expect(hvd.remove_process_set(ab) is True and ab.process_set_id is None, "remove", "")
expect(hvd.remove_process_set(hvd.global_process_set) is False, "remove global", "")
try:
    hvd.allreduce(T(1), process_set=ab)
    fail("removed", "accepted")
except ValueError:
    pass
# the timeline (rank 0's) records ops on a set, its agreement phase included
import json, tempfile
path = os.path.join(tempfile.mkdtemp(), "timeline.json")
hvd.start_timeline(path)
if r in (0, 2):
    hvd.allreduce(T(1), name="ps.timeline", process_set=even)
hvd.stop_timeline()
if r == 0:
    spans = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    expect(any(e.get("args", {}).get("name") == "ps.timeline" for e in spans) and
           any(e["name"] == "NEGOTIATE" for e in spans), "timeline", str(spans)[:300])
tail = hvd.add_process_set([1, 2])
expect(tail.process_set_id == 4, "fresh id", str(tail.process_set_id))
if r in (1, 2):
    got = hvd.allreduce(T(r), op=hvd.Sum, process_set=tail)
    expect(torch.equal(got, T(3)), "tail", str(got))
hvd.barrier()
'''


@pytest.mark.timeout(90)
def test_process_sets_grid():
    run_world(3, GRID, timeout=80, env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}).assert_ok()


STATIC = r'''
import torch
import collectives.torch as hvd

sets = [hvd.ProcessSet([0]), hvd.ProcessSet([1])]
hvd.init(process_sets=sets)
r = hvd.rank()
expect([s.process_set_id for s in sets] == [1, 2], "ids", str([s.process_set_id for s in sets]))
mine = sets[r]
got = hvd.allreduce(torch.full((3,), float(r + 5)), op=hvd.Sum, process_set=mine)
expect(torch.equal(got, torch.full((3,), float(r + 5))), "own set", str(got))
expect(hvd.allgather(torch.tensor([float(r)]), process_set=mine).tolist() == [float(r)],
       "allgather", "")
try:  # static sets only: no dynamic flag
    hvd.remove_process_set(mine)
    fail("remove static", "accepted")
except ValueError as e:
    expect("HOROVOD_DYNAMIC_PROCESS_SETS" in str(e), "remove static", str(e))
hvd.shutdown()
hvd.init(process_sets="dynamic")
late = hvd.add_process_set([0, 1])  # every rank: the global set
expect(late is hvd.global_process_set, "every rank", repr(late))
'''


@pytest.mark.timeout(60)
def test_static_process_sets():
    run_world(2, STATIC, timeout=50).assert_ok()


DEAD = r'''
import os, time
import torch
import collectives.torch as hvd

hvd.init()
r = hvd.rank()
s = hvd.add_process_set([0, 1, 3])
hvd.barrier()
if r == 3:
    os._exit(0)
if r == 2:  # not a member: leaves after the others have failed
    expect(wait_for("failed 0", "failed 1"), "dead", "the members never failed")
    sys.exit(0)
start = time.monotonic()
try:
    for _ in range(3):
        hvd.allreduce(torch.ones(1 << 16), process_set=s)
    fail("dead", "no error")
except hvd.HorovodInternalError as exc:
    error_record(exc, start)
arrive(f"failed {r}")  # stay until every member has failed (a rank leaving is a failure too)
expect(wait_for("failed 0", "failed 1"), "dead", "the other member never failed")
'''


@pytest.mark.timeout(60)
def test_dead_member_named():
    res = run_world(4, DEAD, timeout=50, collective_timeout=20,
                    env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    for r in (0, 1):
        rec = res[r].one("error")
        assert rec["elapsed"] < 10, res.report()
        # the world's negotiation (every rank takes part in its rounds) fails too: the members
        # name rank 3, or rank 2 that broke its links on seeing rank 3 die
        assert "rank 3" in rec["message"] or "rank 2 closed" in rec["message"], res.report()
        assert res[r].returncode == 0 and not res[r].get("fail"), res.report()
