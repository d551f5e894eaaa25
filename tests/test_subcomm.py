"""Subcommunicators (issue 19, sections 1-2): split/dup/free in the core (native/comm/subcomm.c)
and Comm.Split/Dup/Free, COMM_NULL in collectives.MPI.

A grid world per rank count splits the world several ways (halves, odd/even, one rank each,
UNDEFINED for some, reversed keys), runs buffer, pickle, rooted and point-to-point ops on
each subcommunicator against numpy references, interleaved with world collectives, splits a
split, dups and frees. Other worlds count descriptors (no new sockets), kill a member of a
subgroup (every survivor fails naming it in both numberings), break the calling order across
communicators (the header's context check names both), and pass bad arguments (errors before
any byte is sent).
"""
import pytest

from conftest import run_world

pytestmark = pytest.mark.timeout(120)

GRID = r"""
from collectives import MPI, _core
w = MPI.COMM_WORLD
n, r = w.size, w.rank

def members(colors, keys, color):
    return sorted((keys[i], i) for i in range(n) if colors[i] == color)

def exercise(name, colors, keys):
    color = colors[r]
    sub = w.Split(color, keys[r])
    if color == MPI.UNDEFINED:
        expect(sub is MPI.COMM_NULL and not sub, (name, "null"), repr(sub))
        w.Allreduce(np.full(4, r, np.int64), np.empty(4, np.int64))  # the members' world op
        w.Iallreduce(np.full(6, r, np.int64), np.empty(6, np.int64)).Wait()
        w.Barrier()
        return None
    group = [i for _, i in members(colors, keys, color)]
    m = len(group)
    me = group.index(r)
    expect((sub.Get_rank(), sub.Get_size(), sub.rank, sub.size) == (me, m, me, m),
           (name, "rank"), f"{sub.Get_rank()}/{sub.Get_size()} vs {me}/{m}")
    expect([_core.comm_world_rank(sub._core, i) for i in range(m)] == group, (name, "map"), "")
    # allreduce (buffer) vs numpy, then a world op in between
    x = (np.arange(1000, dtype=np.float64) + 3 * r)
    y = np.empty_like(x)
    sub.Allreduce(x, y, op=MPI.SUM)
    check((name, "Allreduce"), y, sum(np.arange(1000, dtype=np.float64) + 3 * g for g in group))
    wy = np.empty(4, np.int64)
    w.Allreduce(np.full(4, r, np.int64), wy)
    check((name, "world"), wy, np.full(4, n * (n - 1) // 2, np.int64))
    # bcast from the last sub rank, allgather, gather, reduce, alltoall
    b = np.arange(33, dtype=np.int32) * (r + 1) if me == m - 1 else np.zeros(33, np.int32)
    sub.Bcast(b, root=m - 1)
    check((name, "Bcast"), b, np.arange(33, dtype=np.int32) * (group[-1] + 1))
    ag = np.empty(m * 3, np.int64)
    sub.Allgather(np.full(3, r, np.int64), ag)
    check((name, "Allgather"), ag, np.repeat(np.array(group, np.int64), 3))
    g = np.empty(m * 2, np.float32) if me == 0 else None
    sub.Gather(np.full(2, r, np.float32), g, root=0)
    if me == 0:
        check((name, "Gather"), g, np.repeat(np.array(group, np.float32), 2))
    red = np.empty(5, np.int64) if me == 0 else None
    sub.Reduce(np.full(5, r + 1, np.int64), red, op=MPI.MAX, root=0)
    if me == 0:
        check((name, "Reduce"), red, np.full(5, max(group) + 1, np.int64))
    sc = np.empty(4, np.int32)
    sub.Scatter(np.arange(4 * m, dtype=np.int32) + 1000 * r if me == 0 else None, sc, root=0)
    check((name, "Scatter"), sc, np.arange(4 * me, 4 * me + 4, dtype=np.int32) + 1000 * group[0])
    rs = np.empty(3, np.float64)
    sub.Reduce_scatter_block(np.arange(3 * m, dtype=np.float64) * (r + 1), rs)
    check((name, "Reduce_scatter_block"), rs,
          np.arange(3 * me, 3 * me + 3, dtype=np.float64) * sum(q + 1 for q in group))
    a2a = np.empty(m, np.int64)
    sub.Alltoall(np.arange(m, dtype=np.int64) + 100 * r, a2a)
    check((name, "Alltoall"), a2a, np.array([100 * q + me for q in group], np.int64))
    # pickle forms
    expect(sub.allgather(("r", r)) == [("r", q) for q in group], (name, "allgather"), "")
    expect(sub.bcast({"from": r} if me == 0 else None, root=0) == {"from": group[0]},
           (name, "bcast"), "")
    # point-to-point ring in sub ranks, statuses in sub ranks, ANY_SOURCE
    right, left = (me + 1) % m, (me - 1) % m
    got = np.empty(7, np.int32)
    st = MPI.Status()
    sub.Sendrecv(np.full(7, r, np.int32), dest=right, sendtag=9, recvbuf=got, source=left,
                 recvtag=9, status=st)
    check((name, "Sendrecv"), got, np.full(7, group[left], np.int32))
    expect(st.Get_source() == left, (name, "status"), f"{st.Get_source()} != {left}")
    if m > 1:
        if me == 1:
            sub.send(("to0", r), dest=0, tag=4)
        if me == 0:
            st = MPI.Status()
            obj = sub.recv(source=MPI.ANY_SOURCE, tag=4, status=st)
            expect(obj == ("to0", group[1]) and st.Get_source() == 1, (name, "any source"),
                   f"{obj} {st.Get_source()}")
    # non-blocking: Isend/Irecv on the sub, Iallreduce on the sub queued with one on the world
    rb = np.empty(3, np.int64)
    reqs = [sub.Irecv(rb, source=left, tag=11), sub.Isend(np.full(3, r, np.int64), dest=right, tag=11)]
    MPI.Request.Waitall(reqs)
    check((name, "Irecv"), rb, np.full(3, group[left], np.int64))
    ys, yw = np.empty(6, np.int64), np.empty(6, np.int64)
    q1 = sub.Iallreduce(np.full(6, r, np.int64), ys)
    q2 = w.Iallreduce(np.full(6, r, np.int64), yw)
    q2.Wait()
    q1.Wait()
    check((name, "Iallreduce sub"), ys, np.full(6, sum(group), np.int64))
    check((name, "Iallreduce world"), yw, np.full(6, n * (n - 1) // 2, np.int64))
    # a barrier on the sub, then the world
    sub.Barrier()
    w.Barrier()
    return sub

# halves, odd/even with reversed keys, one rank each, UNDEFINED for the last rank
half = exercise("halves", [0 if i < n // 2 else 1 for i in range(n)], list(range(n)))
oe = exercise("oddeven", [i % 2 for i in range(n)], [-i for i in range(n)])
single = exercise("single", list(range(n)), [0] * n)
undef = exercise("undefined", [0] * (n - 1) + [MPI.UNDEFINED], [0] * n)

# interleaved: a world op between ops on two overlapping subs, in one order on every rank
x = np.full(10, r + 1, np.int64)
for k in range(3):
    for c in (half, w, oe):
        y = np.empty_like(x)
        c.Allreduce(x, y)
        grp = range(n) if c is w else [
            _core.comm_world_rank(c._core, i) for i in range(c.size)]
        check(("interleave", k, c.size), y, np.full(10, sum(g + 1 for g in grp), np.int64))

# the same pair, tag and source on two communicators: each receive gets its own message
dd = w.Dup()
if n > 1 and r == 0:
    dd.send("on dup", dest=1, tag=5)
    w.send("on world", dest=1, tag=5)
if n > 1 and r == 1:
    expect(w.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG) == "on world", "ctx world", "")
    expect(dd.recv(source=0, tag=5) == "on dup", "ctx dup", "")
dd.Free()

# nested split of a split, dup, free in order
nested = half.Split(half.rank % 2, half.rank)
hw = [_core.comm_world_rank(half._core, i) for i in range(half.size)]
got = nested.allgather(r)
expect(got == [hw[i] for i in range(half.size) if i % 2 == half.rank % 2], "nested", str(got))
d = oe.Dup()
expect((d.rank, d.size) == (oe.rank, oe.size), "dup rank", "")
expect(_core.comm_context(d._core) != _core.comm_context(oe._core), "dup context", "")
expect(d.allreduce(r) == oe.allreduce(r), "dup allreduce", "")
try:
    half.Free()
    fail("free parent", "freeing a communicator with a live split did not raise")
except MPI.Exception as exc:
    expect("free them first" in str(exc), "free parent", str(exc))
nested.Free()
d.Free()
for c in (half, oe, single, undef):
    if c is not None:
        c.Free()
w.Barrier()
emit("links", n=w._core.num_links)
"""


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_split_grid(n):
    run_world(n, GRID, timeout=90).assert_ok()


@pytest.mark.timeout(150)
def test_split_grid_8():
    run_world(8, GRID, timeout=140).assert_ok()


SOCKETS = r"""
from collectives import MPI, _core
w = MPI.COMM_WORLD
n, r = w.size, w.rank
# Connect every pair first (alltoall is a pairwise exchange), then count.
w.Alltoall(np.arange(n, dtype=np.int64), np.empty(n, np.int64))
before, links = fd_count(), w._core.num_links
subs = [w.Split(r % 2, r), w.Split(r // 2, -r), w.Dup()]
subs.append(subs[0].Split(0, 0))
for s in subs:
    y = np.empty(50_000, np.float32)
    s.Allreduce(np.ones(50_000, np.float32), y)
    check(("sum", s.size), y, np.full(50_000, s.size, np.float32))
    s.Alltoall(np.arange(s.size, dtype=np.int64), np.empty(s.size, np.int64))
    s.allgather(r)
    if s.size > 1:
        s.sendrecv(r, dest=(s.rank + 1) % s.size, source=(s.rank - 1) % s.size)
expect(fd_count() == before, "fds", f"{before} -> {fd_count()}")
expect(w._core.num_links == links == n - 1, "links", f"{links} -> {w._core.num_links}")
for s in reversed(subs):
    s.Free()
expect(fd_count() == before, "fds after free", f"{before} -> {fd_count()}")
w.Barrier()
"""


@pytest.mark.timeout(60)
def test_no_new_sockets():
    run_world(4, SOCKETS, timeout=50).assert_ok()


DEAD = r"""
import os, time
from collectives import MPI
w = MPI.COMM_WORLD
r = w.rank
sub = w.Split(0 if r != 1 else 1, r)      # ranks 0, 2, 3: world rank 2 is sub rank 1
w.Barrier()
if r == 2:
    os._exit(0)
if r == 1:  # not a member: leaves after the members have failed
    expect(wait_for("failed 0", "failed 3"), "dead", "the members never failed")
    sys.exit(0)
start = time.monotonic()
try:
    sub.Allreduce(np.ones(1 << 16, np.float32), np.empty(1 << 16, np.float32))
    sub.Allreduce(np.ones(4, np.float32), np.empty(4, np.float32))
    fail("dead", "no error")
except MPI.Exception as exc:
    error_record(exc, start)
arrive(f"failed {r}")
expect(w._core.broken and sub._core.broken, "broken", "world and sub both broken")
"""


@pytest.mark.timeout(60)
def test_dead_peer_in_subgroup_named():
    res = run_world(4, DEAD, timeout=50, collective_timeout=20)
    for r in (0, 3):
        rec = res[r].one("error")
        assert rec["mpi"] and rec["elapsed"] < 10, res.report()
        msg = rec["message"]
        # the text names the dead rank (world 2 or sub 1) and gives the numbering
        assert "subcommunicator" in msg and "world ranks 0,2,3" in msg, msg
        assert "rank 2" in msg, msg  # world numbering (the cause found in the store)
        assert res[r].returncode == 0 and not res[r].get("fail"), res.report()


ORDER = r"""
import time
from collectives import MPI, _core
w = MPI.COMM_WORLD
r = w.rank
d = w.Dup()
start = time.monotonic()
try:
    # the ranks disagree on which communicator comes first
    (d if r == 0 else w).Allreduce(np.ones(8, np.int32), np.empty(8, np.int32))
    fail("order", "no error")
except MPI.Exception as exc:
    error_record(exc, start, ctx=_core.comm_context(d._core))
"""


@pytest.mark.timeout(60)
def test_context_in_header_keeps_communicators_apart():
    res = run_world(2, ORDER, timeout=50, collective_timeout=15)
    recs = [res[r].one("error") for r in (0, 1)]
    assert all(rec["mpi"] and rec["elapsed"] < 10 for rec in recs), res.report()
    # the rank that read the other's header names both contexts (the other may see the
    # connection close first)
    assert any("context" in rec["message"] and f"0x{rec['ctx']:08x}" in rec["message"]
               and "0x00000000" in rec["message"] for rec in recs), res.report()


BAD = r"""
from collectives import MPI, _core
w = MPI.COMM_WORLD
r = w.rank
for args, exc in [(("a", 0), TypeError), ((0, 1.5), TypeError), ((-5, 0), ValueError),
                  ((1 << 40, 0), OverflowError), ((0, None), TypeError)]:
    try:
        w.Split(*args)
        fail(("bad", args), "no error")
    except exc:
        pass
    except Exception as e:
        fail(("bad", args), f"{type(e).__name__}: {e}")
# nothing was sent: the world's next collective still agrees
expect(w.allreduce(r) == sum(range(w.size)), "after bad args", "")
# COMM_SELF: split and dup locally (one rank, nothing sent)
me = MPI.COMM_SELF.Dup()
expect((me.rank, me.size, me.allreduce(r + 1)) == (0, 1, r + 1), "self dup", "")
expect(MPI.COMM_SELF.Split(MPI.UNDEFINED, 0) is MPI.COMM_NULL, "self undefined", "")
one = MPI.COMM_SELF.Split(3, 0)
y = np.empty(4)
one.Allreduce(np.full(4, 2.0), y)
check("self split", y, np.full(4, 2.0))
one.Free()
me.Free()
# a receive still posted: Free is refused (it would complete on freed memory)
d2 = w.Dup()
req = d2.Irecv(np.empty(1, np.int64), source=0, tag=77)
try:
    d2.Free()
    fail("free pending", "no error")
except MPI.Exception as e:
    expect("still posted" in str(e), "free pending", str(e))
w.Barrier()
if r == 0:
    d2.Send(np.ones(1, np.int64), dest=0, tag=77)
    req.Wait()
    d2.Free()
try:
    MPI.COMM_NULL.Allreduce(np.ones(1), np.empty(1))
    fail("null", "no error")
except MPI.Exception as e:
    expect("COMM_NULL" in str(e), "null", str(e))
# closing (not Free) a parent under a live child: the child keeps working on the shared
# links while the root lives, and fails clearly once the root is closed; nothing crashes
d = w.Dup()
s = d.Split(0, 0)
d._core.close()
expect(s.allreduce(r) == sum(range(w.size)), "child of closed dup", "")
w.Barrier()
w._core.close()
try:
    s.Allreduce(np.ones(2), np.empty(2))
    fail("zombie", "no error")
except MPI.Exception as e:
    expect("closed" in str(e), "zombie", str(e))
s.Free()
"""


@pytest.mark.timeout(60)
def test_bad_arguments_before_any_byte():
    run_world(3, BAD, timeout=50).assert_ok()
