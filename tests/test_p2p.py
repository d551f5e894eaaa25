"""Point-to-point messages in the core (native/p2p.c) and their mpi4py names.

One world per rank count runs a grid: every dtype and several counts (zero
included) through Isend/Irecv rings, blocking Send/Recv pairs, Sendrecv,
any-source gathers with statuses, per-tag ordering, messages crossing
collectives (set aside, or delivered into a receive posted before), Waitany/
Waitall/Testall, the pickle forms, and argument errors raised before any byte
is sent. Failure scenarios each get a world of their own (a failure breaks the
communicator): a peer dying under a receive, mismatched counts and dtypes, a
tag nobody sends.
"""
import json

import pytest

from conftest import run_world

pytestmark = pytest.mark.timeout(120)

GRID = r"""
from collectives import MPI
from collectives import _core
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
right, left = (r + 1) % n, (r - 1) % n
COUNTS = [0, 1, 7, 1000, 300_001]

def data(dtype, count, rank, salt):
    return store((np.arange(count) * 7 + rank * 13 + salt) % 100, dtype)

def dt(dtype):
    return "bfloat16" if dtype == "bfloat16" else None

# --- every dtype and count: Isend/Irecv ring, Irecv posted first
for d, dtype in enumerate(DTYPES):
    for c, count in enumerate(COUNTS):
        tag = 10 * d + c
        out = data(dtype, count, r, tag)
        inb = np.zeros(count, np_dtype(dtype))
        rr = _core.p2p_irecv(comm._core, inb, left, tag, dtype=dt(dtype))
        sr = _core.p2p_isend(comm._core, out, right, tag, dtype=dt(dtype))
        MPI.Request.Waitall([MPI.Request(rr, comm), MPI.Request(sr, comm)])
        check(("ring", dtype, count), inb, data(dtype, count, left, tag), dtype)
        expect(rr._status[:3] == (left, tag, count), ("ring status", dtype, count), repr(rr._status))

# --- blocking Send/Recv between pairs (even ranks send first), every dtype
for dtype in DTYPES:
    count = 513
    if n > 1 and not (n % 2 and r == n - 1):
        peer = r + 1 if r % 2 == 0 else r - 1
        got = np.zeros(count, np_dtype(dtype))
        if r % 2 == 0:
            _core.p2p_send(comm._core, data(dtype, count, r, 1), peer, 3, dtype=dt(dtype))
            _core.p2p_recv(comm._core, got, peer, 3, dtype=dt(dtype))
        else:
            _core.p2p_recv(comm._core, got, peer, 3, dtype=dt(dtype))
            _core.p2p_send(comm._core, data(dtype, count, r, 1), peer, 3, dtype=dt(dtype))
        check(("pair", dtype), got, data(dtype, count, peer, 1), dtype)

# --- both ranks send first (fits the link), then receive: MPI's eager case
msg = np.full(1000, r, np.int32)
comm.Send(msg, right, tag=4)
got = np.zeros(1000, np.int32)
comm.Recv(got, left, tag=4)
check("send first", got, np.full(1000, left, np.int32))

# --- Sendrecv both ways round the ring, with Status
for count in (0, 5, 200_000):
    st = MPI.Status()
    got = np.zeros(count, np.float64)
    comm.Sendrecv(np.full(count, r, np.float64), right, 5, got, left, 5, status=st)
    check(("sendrecv", count), got, np.full(count, left, np.float64))
    expect((st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE), st.Get_count()) ==
           (left, 5, count, 8 * count), ("sendrecv status", count), repr(st))
    got = np.zeros(count, np.float64)
    comm.Sendrecv([np.full(count, r, np.float64), MPI.DOUBLE], left, 6, [got, MPI.DOUBLE], right, 6)
    check(("sendrecv back", count), got, np.full(count, right, np.float64))

# --- PROC_NULL at the ends of a line (a halo exchange): nothing moves, the receive is empty
up = r + 1 if r + 1 < n else MPI.PROC_NULL
down = r - 1 if r > 0 else MPI.PROC_NULL
halo = np.full(4, -7, np.int32)
st = MPI.Status()
comm.Sendrecv(np.full(4, r, np.int32), up, 8, halo, down, 8, status=st)
if down == MPI.PROC_NULL:
    check("proc_null recv", halo, np.full(4, -7, np.int32))
    expect((st.Get_source(), st.Get_count()) == (MPI.PROC_NULL, 0), "proc_null status", repr(st))
else:
    check("halo", halo, np.full(4, down, np.int32))
comm.Send(np.zeros(3), MPI.PROC_NULL)
expect(comm.recv(source=MPI.PROC_NULL) is None, "proc_null obj", "mpi4py returns None")

# --- any source: rank 0 takes one message from everyone, statuses say who
if r == 0:
    seen = []
    for _ in range(n - 1):
        st = MPI.Status()
        b = np.zeros(3, np.int64)
        comm.Recv(b, MPI.ANY_SOURCE, 20, status=st)
        expect(st.Get_count(MPI.LONG) == int(b[2]), "any count", repr(st))
        seen.append((st.Get_source(), int(b[0])))
    expect(sorted(seen) == [(k, k) for k in range(1, n)], "any source", repr(seen))
else:
    comm.Send(np.array([r, 0, 3], np.int64), 0, tag=20)

# --- per-tag order: tags 1, 2, 1, 2 sent; the receiver takes tag 2 first
if n > 1:
    for i, tg in enumerate((1, 2, 1, 2)):
        comm.Send(np.array([i], np.int32), right, tag=30 + tg)
    order = []
    for tg in (2, 2, 1, 1):
        b = np.zeros(1, np.int32)
        comm.Recv(b, left, 30 + tg)
        order.append(int(b[0]))
    expect(order == [1, 3, 0, 2], "tag order", repr(order))
    # ANY_TAG takes them in arrival order
    for i in range(3):
        comm.Send(np.array([i], np.int32), right, tag=40 + (i * 5) % 3)
    order = []
    for i in range(3):
        st = MPI.Status()
        b = np.zeros(1, np.int32)
        comm.Recv(b, left, MPI.ANY_TAG, st)
        order.append((int(b[0]), st.Get_tag()))
    expect(order == [(i, 40 + (i * 5) % 3) for i in range(3)], "any tag order", repr(order))

# --- across collectives: sent before an Allreduce/Barrier, received after
# (set aside by the collective's executor, large ones too), and received into
# an Irecv posted before the collective
big = np.arange(1 << 18, dtype=np.float32) + r   # 1 MiB
pre = np.zeros(1 << 18, np.float32)
early = comm.Irecv(pre, left, tag=51)
comm.Send(np.full(7, r, np.int8), right, tag=50)
comm.Send(big, right, tag=51)
comm.Send(big, right, tag=51)
x = np.ones(1 << 16, np.float32)
comm.Allreduce(MPI.IN_PLACE, x)
check("allreduce between", x, np.full(1 << 16, n, np.float32))
comm.Barrier()
got = np.zeros(7, np.int8)
comm.Recv(got, left, 50)
check("kept small", got, np.full(7, left, np.int8))
early.Wait()
check("posted before", pre, np.arange(1 << 18, dtype=np.float32) + left)
got = np.zeros(1 << 18, np.float32)
comm.Recv(got, left, 51)
check("kept big", got, np.arange(1 << 18, dtype=np.float32) + left)
comm.Barrier()

# --- a ring of Isends larger than any link buffer (8 MiB), left half sent when every
# rank enters a collective: finishing them first must not wait rank on rank
huge = np.arange(1 << 21, dtype=np.float32) * (r + 1)
sreq = comm.Isend(huge, right, tag=52)
x = np.ones(3, np.float32)
comm.Allreduce(MPI.IN_PLACE, x)
check("allreduce after isend", x, np.full(3, n, np.float32))
got = np.zeros(1 << 21, np.float32)
comm.Recv(got, left, 52)
sreq.Wait()
check("huge ring", got, np.arange(1 << 21, dtype=np.float32) * (left + 1))

# --- Waitany / Testall
reqs = [comm.Irecv(np.zeros(4, np.int32), left, tag=60 + k) for k in range(3)]
expect(not MPI.Request.Testall(reqs), "testall before", "done before any send")
comm.Barrier()  # nobody sends before every rank's Testall
for k in (2, 0, 1):
    comm.Send(np.full(4, k, np.int32), right, tag=60 + k)
done = []
for _ in range(3):
    st = MPI.Status()
    i = MPI.Request.Waitany(reqs, st)
    expect(st.Get_tag() == 60 + i, "waitany status", f"{i} {st!r}")
    done.append(i)
expect(sorted(done) == [0, 1, 2], "waitany", repr(done))
expect(MPI.Request.Waitany(reqs) == MPI.UNDEFINED, "waitany none left", "")
expect(MPI.Request.Testall(reqs), "testall after", "")

# --- pickle forms
obj = {"rank": r, "payload": list(range(r + 3)), "s": "x" * (r * 1000)}
comm.send(obj, right, tag=70)
st = MPI.Status()
got = comm.recv(source=left, tag=70, status=st)
expect(got == {"rank": left, "payload": list(range(left + 3)), "s": "x" * (left * 1000)},
       "pickle send/recv", repr(got)[:80])
expect(st.Get_source() == left and st.Get_tag() == 70, "pickle status", repr(st))
req = comm.irecv(source=left, tag=71)
sreq = comm.isend(("t", r), right, tag=71)
expect(req.wait() == ("t", left), "irecv/isend", "")
sreq.wait()
expect(comm.sendrecv(r * 10, right, 72, source=left, recvtag=72) == left * 10, "sendrecv obj", "")
reqs = [comm.irecv(source=left, tag=73 + k) for k in range(2)]
for k in range(2):
    comm.isend([k, r], right, tag=73 + k).wait()
expect(MPI.Request.waitall(reqs) == [[0, left], [1, left]], "waitall objects", "")
flag, objs = MPI.Request.testall(reqs)  # inactive after waitall, as in mpi4py: no objects
expect(flag and objs == [None, None], "testall after waitall", repr(objs))
if r == 0:
    got = sorted(comm.recv(source=MPI.ANY_SOURCE, tag=74) for _ in range(n - 1))
    expect(got == list(range(1, n)), "pickle any source", repr(got))
else:
    comm.send(r, 0, tag=74)

# --- argument errors: raised before any byte is sent, communicator intact
for case, fn in [
    ("dest out of range", lambda: comm.Send(np.zeros(1), n)),
    ("negative dest", lambda: comm.Send(np.zeros(1), -1)),
    ("negative tag", lambda: comm.Send(np.zeros(1), right, tag=-5)),
    ("source out of range", lambda: comm.Recv(np.zeros(1), n + 3)),
    ("read-only recv", lambda: comm.Recv(np.frombuffer(bytes(8), np.uint8), left)),
]:
    try:
        fn()
        fail(case, "no error")
    except ValueError as exc:
        emit("argerr", case=case, message=str(exc))
    except BaseException as exc:
        fail(case, f"{type(exc).__name__}: {exc}")
x = np.array([r], np.int64)
comm.Allreduce(MPI.IN_PLACE, x)
expect(int(x[0]) == n * (n - 1) // 2 and not comm._core.broken, "after argerr", "")

# --- COMM_SELF: this rank alone, without a socket
me = MPI.COMM_SELF
expect(me is MPI.COMM_SELF and (me.Get_rank(), me.Get_size()) == (0, 1), "self ids", "")
v = np.arange(5, dtype=np.float32) + r
out = np.zeros(5, np.float32)
me.Allreduce(v, out)
check("self allreduce", out, v)
me.Send(v, 0, tag=3)
got = np.zeros(5, np.float32)
me.Recv(got, MPI.ANY_SOURCE, 3)
check("self send/recv", got, v)
expect(me.sendrecv({"r": r}, 0, source=0) == {"r": r}, "self sendrecv obj", "")
expect(me.bcast(("b", r)) == ("b", r) and me.allgather(r) == [r] and me.gather(r) == [r], "self objs", "")
g = np.zeros(5, np.float32)
me.Gather(v, g)
check("self gather", g, v)
me.Reduce(v, out, op=MPI.MAX)
check("self reduce", out, v)
expect(me.alltoall([r]) == [r], "self alltoall", "")
expect(me._core.num_links == 0, "self links", str(me._core.num_links))
emit("links", n=comm._core.num_links)
"""


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_p2p_grid(n):
    """Every pattern, dtype and count at n ranks against exact expected values."""
    res = run_world(n, GRID, timeout=100).assert_ok()
    for rk in res.ranks:
        assert len(rk.get("argerr")) == 5, rk.text()


def test_p2p_grid_tcp():
    """The same grid with every link over TCP (the default is shared memory here)."""
    run_world(3, GRID, timeout=100, env={"COLLECTIVES_TRANSPORT": "tcp"}).assert_ok()


FAIL = r"""
import json
from collectives import MPI
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
S = json.loads(sys.argv[1])
kind = S["kind"]
comm.Barrier()
t0 = time.monotonic()
try:
    if kind == "dies":
        if r == 1:
            time.sleep(0.5)
            os._exit(3)
        comm.Recv(np.zeros(4), source=1, tag=0)
    elif kind == "dies_any":
        if r == 1:
            time.sleep(0.5)
            os._exit(3)
        comm.Recv(np.zeros(4), source=MPI.ANY_SOURCE, tag=0)
    elif kind == "count":
        if r == 0:
            comm.Send(np.arange(10, dtype=np.float32), 1, tag=2)
            comm.Barrier()
        else:
            comm.Recv(np.zeros(8, np.float32), 0, tag=2)
    elif kind == "dtype":
        if r == 0:
            comm.Send(np.arange(10, dtype=np.float32), 1, tag=2)
            comm.Barrier()
        else:
            comm.Recv(np.zeros(10, np.int32), 0, tag=2)
    elif kind == "tag":
        if r == 0:
            comm.Send(np.zeros(3), 1, tag=1)
            comm.Recv(np.zeros(1), 1, tag=9)  # released when rank 1 fails
        else:
            comm.Recv(np.zeros(3), 0, tag=99, timeout=1.5)
    elif kind == "tag_any":
        if r == 1:
            comm.Recv(np.zeros(3), MPI.ANY_SOURCE, tag=99, timeout=1.5)
        else:
            comm.Recv(np.zeros(1), 1, tag=9)
    elif kind == "full_wait":
        # COLLECTIVES_P2P_BUFFER_BYTES=1M: the second unexpected 600 kB message does not
        # fit, so it waits in the link, and the tag-2 message behind it is out of reach
        if r == 0:
            for _ in range(3):
                comm.Send(np.zeros(150_000, np.float32), 1, tag=1)
            comm.Send(np.zeros(1, np.float32), 1, tag=2)
            comm.Recv(np.zeros(1), 1, tag=9)  # released when rank 1 fails
        else:
            comm.Recv(np.zeros(1, np.float32), 0, tag=2, timeout=1.5)
    elif kind == "full_divert":
        # a 2 MB message nobody has posted a receive for, read by rank 1's Barrier
        if r == 0:
            comm.Send(np.zeros(500_000, np.float32), 1, tag=1)
        comm.Barrier()
    emit("no_error")
except BaseException as exc:
    error_record(exc, t0)
    t1 = time.monotonic()
    try:
        comm.Send(np.zeros(1), (r + 1) % n)
        emit("next_ok")
    except BaseException as exc2:
        emit("next", message=str(exc2), elapsed=time.monotonic() - t1)
"""


def _run_fail(n, scenario, timeout_s=5.0, env=None):
    return run_world(n, FAIL, timeout=60, args=[json.dumps(scenario)],
                     collective_timeout=timeout_s, env=env)


def _err(rk):
    got = rk.get("error")
    assert got, rk.text()
    return got[0]


@pytest.mark.parametrize("kind", ["dies", "dies_any"])
def test_peer_dies_in_recv(kind):
    """A rank blocked in Recv from a peer that exits fails fast, naming it."""
    res = _run_fail(3, {"kind": kind})
    assert not res.timed_out, res.report()
    e = _err(res[0])
    assert "rank 1" in e["message"] and e["elapsed"] < 4.0, e
    assert res[1].returncode == 3


@pytest.mark.parametrize("kind,words", [
    ("count", ["count mismatch", "rank 0 sent 10", "holds 8"]),
    ("dtype", ["dtype mismatch", "rank 0 sent 10 float32", "takes int32"]),
])
def test_mismatch_names_both_sides(kind, words):
    """A message larger than the receive, or of another dtype, fails the receive with both
    sides' values; the sender learns it at its next call."""
    res = _run_fail(2, {"kind": kind})
    assert not res.timed_out, res.report()
    e = _err(res[1])
    for w in words:
        assert w in e["message"], e
    assert res[0].get("error") or res[0].get("next"), res.report()


@pytest.mark.parametrize("kind,rank,peer", [("tag", 1, "rank 0"), ("tag_any", 1, "any rank")])
def test_tag_nobody_sends_times_out(kind, rank, peer):
    """A receive for a tag nobody sends times out at its deadline, naming the peer and tag;
    the others fail fast after it."""
    res = _run_fail(3 if kind == "tag_any" else 2, {"kind": kind})
    assert not res.timed_out, res.report()
    e = _err(res[rank])
    assert "timed out" in e["message"] and peer in e["message"] and "tag 99" in e["message"], e
    assert 1.4 < e["elapsed"] < 4.0, e
    other = _err(res[0])
    assert "rank 1" in other["message"], other


def test_unexpected_messages_are_bounded():
    """Messages that arrive before their receive are kept up to COLLECTIVES_P2P_BUFFER_BYTES:
    past it they wait in the link (a receive behind them times out, saying why), and one
    that a collective would have to set aside fails it, naming the sender and the limit."""
    env = {"COLLECTIVES_P2P_BUFFER_BYTES": "1M"}
    res = _run_fail(2, {"kind": "full_wait"}, env=env)
    assert not res.timed_out, res.report()
    e = _err(res[1])
    assert "timed out" in e["message"] and "COLLECTIVES_P2P_BUFFER_BYTES" in e["message"], e
    res = _run_fail(2, {"kind": "full_divert"}, env=env)
    assert not res.timed_out, res.report()
    e = _err(res[1])
    for w in ("rank 0 sent a 2000000-byte point-to-point message", "COLLECTIVES_P2P_BUFFER_BYTES"):
        assert w in e["message"], e
    assert e["elapsed"] < 4.0, e
