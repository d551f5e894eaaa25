"""Allreduce over real processes on loopback: every algorithm x op x dtype x count x in-place.

One launch per world size runs the whole grid in a loop inside the workers
(STYLE rule 30); expected values are exact closed forms of rank-derived small
integers (rule 31); every rank's results are hashed and compared across ranks.
bfloat16 goes through the core Communicator (collectives.MPI has no datatype
for it); everything else through collectives.MPI.
"""
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import run_world

GRID_BODY = r"""
import itertools
from collectives import MPI
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
OPMAP = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.AVG}
LARGE_BYTES = int(sys.argv[1])
counts = sorted({0, 1, max(n - 1, 0), n + 1, 1000, 4097})
cases = 0
for ai, alg in enumerate(ALGORITHMS):
    for di, dtype in enumerate(DTYPES):
        esize = np.dtype(np_dtype(dtype)).itemsize
        for oi, op in enumerate(OPS):
            cl = list(counts)
            # the large count: for sum always, for one other op per (alg, dtype)
            if LARGE_BYTES and (op == "sum" or oi == 1 + (ai + di) % 4):
                cl.append(LARGE_BYTES // esize + 3)
            for count in cl:
                is_large = count > 5000
                # large counts: one of in-place / not per (alg, dtype, op), alternating
                for inplace in ([(ai + di + oi) % 2 == 1] if is_large else (False, True)):
                    case = dict(n=n, alg=alg, op=op, dtype=dtype, count=count, inplace=inplace)
                    send = store(rank_values(op, dtype, count, r), dtype)
                    recv = np.full(count, 0x5A, dtype=np_dtype(dtype)) if count else \
                        np.empty(0, dtype=np_dtype(dtype))
                    if inplace:
                        recv[...] = send
                    if dtype == "bfloat16":
                        guarded(case, comm._core.allreduce, None if inplace else send, recv, op,
                                alg, None, "bfloat16")
                    elif inplace:
                        guarded(case, comm.Allreduce, MPI.IN_PLACE, recv, OPMAP[op], algorithm=alg)
                    else:
                        guarded(case, comm.Allreduce, send, recv, OPMAP[op], algorithm=alg)
                    check(case, recv, expected_stored(op, dtype, count, n), dtype)
                    if not inplace:
                        check(dict(case, what="sendbuf unchanged"), send,
                              store(rank_values(op, dtype, count, r), dtype), dtype)
                    record_hash(case, recv)
                    cases += 1
verify_hashes(comm)
emit("cases", count=cases)
"""


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8])
def test_allreduce_grid(n):
    large = 1 << 18 if n == 7 else 1 << 20
    res = run_world(n, GRID_BODY, args=[str(large)], timeout=140).assert_ok()
    assert all(rr.one("cases")["count"] > 1500 for rr in res.ranks)


BIG_BODY = r"""
from collectives import MPI
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
count = 64 * 1024 * 1024 // 4
buf = (np.arange(count, dtype=np.int64) % 7 + r).astype(np.float32)
t0 = time.monotonic()
comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
dt = time.monotonic() - t0
case = dict(n=n, count=count, what="64 MiB float32 in place")
exp = (n * (np.arange(count, dtype=np.int64) % 7) + n * (n - 1) // 2).astype(np.float32)
check(case, buf, exp, "float32")
record_hash(case, buf)
verify_hashes(comm)
emit("time", seconds=dt)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 4])
def test_allreduce_64mib(n):
    res = run_world(n, BIG_BODY, timeout=110).assert_ok()
    print("64 MiB allreduce on", n, "ranks:", [rr.one("time")["seconds"] for rr in res.ranks])


MANY_BODY = r"""
from collectives import MPI
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
buf = np.empty(4, dtype=np.int32)
bad = 0
t0 = time.monotonic()
for k in range(10000):
    buf[:] = (k % 1000) + r
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    if buf[0] != n * (k % 1000) + n * (n - 1) // 2 or buf[3] != buf[0]:
        bad += 1
        if bad < 5:
            fail(dict(k=k), f"got {buf.tolist()}")
emit("time", seconds=time.monotonic() - t0)
"""


@pytest.mark.timeout(90)
def test_ten_thousand_small_allreduces():
    res = run_world(3, MANY_BODY, timeout=80).assert_ok()
    secs = max(rr.one("time")["seconds"] for rr in res.ranks)
    assert secs < 30, f"10,000 small allreduces on 3 ranks took {secs:.1f} s"


EXTRAS_BODY = r"""
from collectives import MPI
comm = MPI.COMM_WORLD
core = comm._core
n, r = comm.size, comm.rank

# --- pipelining: tiny and odd segment sizes through the core
for alg in ALGORITHMS:
    for seg in (0, 4096, 4100, 1 << 16, 1 << 20):
        for dtype, count in (("float32", 300_001), ("int8", 70_000), ("bfloat16", 50_003),
                             ("float64", 4097), ("int64", 1)):
            for op in ("sum", "max"):
                case = dict(n=n, alg=alg, seg=seg, dtype=dtype, count=count, op=op)
                send = store(rank_values(op, dtype, count, r), dtype)
                recv = np.zeros(count, dtype=np_dtype(dtype))
                guarded(case, core.allreduce, send, recv, op, alg, None, dtype, seg)
                check(case, recv, expected_stored(op, dtype, count, n), dtype)
                record_hash(case, recv)

# --- Iallreduce: several outstanding, completed by Wait and by Test
OPMAP = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.AVG}
for rnd in range(3):
    reqs = []
    for k, (alg, op, dtype, count) in enumerate([
            ("ring", "sum", "float32", 100_000), ("tree", "max", "int32", 4097),
            ("butterfly", "min", "int8", n + 1), ("auto", "prod", "float64", 1000),
            ("ring", "avg", "float16", 33), ("auto", "sum", "int64", 0),
            ("tree", "sum", "uint8", 1), ("butterfly", "avg", "float32", 65_537)]):
        case = dict(n=n, rnd=rnd, k=k, alg=alg, op=op, dtype=dtype, count=count, what="Iallreduce")
        send = store(rank_values(op, dtype, count, r, seed=k), dtype)
        inplace = (k + rnd) % 2 == 0
        recv = send.copy() if inplace else np.zeros(count, dtype=np_dtype(dtype))
        req = guarded(case, comm.Iallreduce, MPI.IN_PLACE if inplace else send, recv, OPMAP[op],
                      algorithm=alg)
        reqs.append((case, req, recv, op, dtype, count, k))
    for j, (case, req, recv, op, dtype, count, k) in enumerate(reqs):
        if j % 2:
            deadline = time.monotonic() + 20
            while not guarded(case, req.Test):
                if time.monotonic() > deadline:
                    fail(case, "Test() never returned True")
                    break
                time.sleep(0.001)
            expect(req.Test() is True, case, "Test() after completion must stay True")
        else:
            guarded(case, req.Wait)
            req.Wait()  # a second Wait is a no-op
        check(case, recv, expected_stored(op, dtype, count, n, seed=k), dtype)
        record_hash(case, recv)
    MPI.Request.Waitall([])

# bfloat16 iallreduce through the core
send = store(rank_values("sum", "bfloat16", 5000, r), "bfloat16")
recv = np.zeros_like(send)
req = core.iallreduce(send, recv, "sum", "ring", None, "bfloat16")
req.Wait()
check(dict(what="core iallreduce bf16"), recv, expected_stored("sum", "bfloat16", 5000, n), "bfloat16")

# a blocking collective after outstanding requests still works
x = np.full(3, r, dtype=np.int64)
comm.Allreduce(MPI.IN_PLACE, x)
check(dict(what="after requests"), x, np.full(3, n * (n - 1) // 2, dtype=np.int64))
verify_hashes(comm)
"""


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [1, 3, 4, 5])
def test_allreduce_segments_and_iallreduce(n):
    run_world(n, EXTRAS_BODY, timeout=140).assert_ok()


ONE_BODY = r"""
import json
from collectives import MPI
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
spec = json.loads(sys.argv[1])
for rep, inplace in enumerate((False, True)):
    alg, op, dtype, count = spec["alg"], spec["op"], spec["dtype"], spec["count"]
    case = dict(spec, n=n, inplace=inplace)
    send = store(rank_values(op, dtype, count, r, seed=spec["seed"]), dtype)
    recv = send.copy() if inplace else np.zeros(count, dtype=np_dtype(dtype))
    guarded(case, comm._core.allreduce, None if inplace else send, recv, op, alg, None, dtype,
            spec["seg"])
    check(case, recv, expected_stored(op, dtype, count, n, seed=spec["seed"]), dtype)
    record_hash(case, recv)
verify_hashes(comm)
"""


@pytest.mark.timeout(200)
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(1, 6), count=st.integers(0, 70_000),
       alg=st.sampled_from(["ring", "tree", "butterfly", "auto"]),
       op=st.sampled_from(["sum", "prod", "min", "max", "avg"]),
       dtype=st.sampled_from(["int8", "uint8", "int32", "int64", "float16", "bfloat16",
                              "float32", "float64"]),
       seed=st.integers(0, 6), seg=st.sampled_from([0, 4096, 12345, 1 << 16]))
def test_allreduce_random_cases(n, count, alg, op, dtype, seed, seg):
    import json

    spec = dict(alg=alg, op=op, dtype=dtype, count=count, seed=seed, seg=seg)
    run_world(n, ONE_BODY, args=[json.dumps(spec)], timeout=30).assert_ok()


BUFFERS_BODY = r"""
import os
if sys.argv[1] == "one-core":  # both ranks may only use one CPU, as under taskset -c 0
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
from collectives import MPI
comm = MPI.COMM_WORLD
x = np.full(1 << 18, comm.rank + 1, np.float32)
comm.Allreduce(MPI.IN_PLACE, x)
check(dict(cores=sys.argv[1]), x, np.full_like(x, comm.size * (comm.size + 1) // 2))
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("cores,setting,expect", [
    ("all", None, "socket buffers 4194304 B"),
    ("one-core", None, "socket buffers autotuned"),
    ("one-core", "1M", "socket buffers 1048576 B"),
    ("all", "0", "socket buffers autotuned"),
])
def test_tcp_link_buffers_follow_the_hosts_load(cores, setting, expect):
    """COLLECTIVES_SOCKET_BUFFER=auto (the default): fixed 4 MiB buffers while each rank has
    a core, the kernel's autotuning when the host runs more ranks than cores; a value set
    by the user wins either way. The NET log names what each TCP link got."""
    env = {"COLLECTIVES_TRANSPORT": "tcp", "COLLECTIVES_DEBUG": "INFO",
           "COLLECTIVES_DEBUG_SUBSYS": "NET"}
    if setting is not None:
        env["COLLECTIVES_SOCKET_BUFFER"] = setting
    res = run_world(2, BUFFERS_BODY, args=[cores], env=env, timeout=60).assert_ok()
    for rr in res.ranks:
        links = [line for line in rr.stderr.splitlines() if " via tcp " in line]
        assert len(links) == 1 and expect in links[0], rr.stderr


SEGMENT_BODY = r"""
import os
if sys.argv[1] == "one-core":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
from collectives import MPI
comm = MPI.COMM_WORLD
x = np.full(3 << 20, comm.rank + 1, np.float32)  # 12 MiB: several segments per ring chunk
comm.Allreduce(MPI.IN_PLACE, x)
check(dict(cores=sys.argv[1]), x, np.full_like(x, comm.size * (comm.size + 1) // 2))
emit("segment", bytes=comm._core.segment_bytes)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("cores,env,expect", [
    ("all", {"COLLECTIVES_TRANSPORT": "tcp"}, 512 << 10),
    ("one-core", {"COLLECTIVES_TRANSPORT": "tcp"}, 1 << 20),
    ("one-core", {}, 512 << 10),  # shared memory pipelines better in small segments
    ("one-core", {"COLLECTIVES_TRANSPORT": "tcp", "COLLECTIVES_SEGMENT_BYTES": "256K"}, 256 << 10),
])
def test_segment_size_follows_the_hosts_load(cores, env, expect):
    """COLLECTIVES_SEGMENT_BYTES=auto (the default): 512 KiB, and 1 MiB when the host runs
    more ranks than cores and peers are reached over TCP; a value set by the user wins."""
    res = run_world(2, SEGMENT_BODY, args=[cores], env=env, timeout=60).assert_ok()
    for rr in res.ranks:
        assert rr.one("segment")["bytes"] == expect, rr.text()


BIND_BODY = r"""
import os, threading
cpus = sorted(os.sched_getaffinity(0))[:2]
os.sched_setaffinity(0, set(cpus))  # a host of two CPUs, whatever this machine has
stop = threading.Event()
pool = threading.Thread(target=stop.wait)  # a thread started before init, as a BLAS pool's
pool.start()
from collectives import MPI
comm = MPI.COMM_WORLD
x = np.full(1 << 16, comm.rank + 1, np.float32)
comm.Allreduce(MPI.IN_PLACE, x)
check(dict(bind=os.environ.get("COLLECTIVES_BIND")), x, np.full_like(x, comm.size * (comm.size + 1) // 2))
emit("mask", cpus=cpus, main=sorted(os.sched_getaffinity(0)),
     pool=sorted(os.sched_getaffinity(pool.native_id)))
stop.set()
pool.join()
"""


@pytest.mark.timeout(90)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="binding needs two CPUs")
@pytest.mark.parametrize("n,setting,bound", [
    (3, None, True),      # auto, more ranks than CPUs: local rank i on the i-th CPU
    (2, None, False),     # auto, a CPU per rank: left to the scheduler
    (2, "core", True),
    (3, "none", False),
])
def test_ranks_are_bound_to_cpus_when_the_host_is_oversubscribed(n, setting, bound):
    """COLLECTIVES_BIND=auto (the default) pins each rank, every thread of it, to one CPU
    of its mask when the host runs more ranks than CPUs; core always; none never."""
    env = {"COLLECTIVES_TRANSPORT": "tcp"}
    if setting is not None:
        env["COLLECTIVES_BIND"] = setting
    res = run_world(n, BIND_BODY, env=env, timeout=60).assert_ok()
    for rr in res.ranks:
        got = rr.one("mask")
        want = [got["cpus"][rr.rank % 2]] if bound else got["cpus"]
        assert got["main"] == want and got["pool"] == want, (rr.rank, got)


@pytest.mark.timeout(90)
def test_rank_zero_keeps_the_store_until_every_rank_has_joined():
    """Rank 0 hosts the store; when it leaves right after init, the others may still be
    reading addresses from it. It waits for them (each rank that was slow failed with
    'lost the store' before)."""
    for _ in range(3):
        run_world(4, "from collectives import MPI\nMPI.COMM_WORLD\n", timeout=60).assert_ok()
