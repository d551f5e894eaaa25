"""Issue 40's GPU paths on one GPU emulated in host memory (COLLECTIVES_CUDA_FAKE=1):
small messages staged whole through pinned memory onto the host path, and the
pipelined staged path over TCP with several segments in flight. The emulated
GPU runs queued work late (native/cuda/fake.c), so a path that reads a pinned
piece before its copy's ticket, or reuses a slot too early, gets stale bytes
here. Counters from collectives._core.cuda_stats show which path ran; they are
instrumentation of what the executor did, not timings. The same bodies run on
a real GPU (marker ``cuda``) from bench/gpu_check.sh.
"""
import pytest

import collectives
from conftest import run_world

# "fake": the emulated GPU (CI); "gpu": device 0 of a real one (bench/gpu_check.sh)
BACKENDS = ["fake", pytest.param("gpu", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not collectives.cuda_available(), reason="needs a CUDA build and a GPU")])]


def _env(backend: str, extra: dict) -> dict:
    env = dict(extra)
    if backend == "fake":
        env["COLLECTIVES_CUDA_FAKE"] = "1"
    return env

COMMON = r"""
from collectives import MPI, _core
comm = MPI.COMM_WORLD
core = comm._core
n, r = comm.size, comm.rank

def on_device(arr, dtype):
    d = _core.DeviceBuffer(arr.nbytes, dtype, 0)
    if arr.nbytes:
        d.copy_from(arr)
    return d

def fetch(d, count, dtype):
    out = np.empty(count, dtype=np_dtype(dtype))
    if count:
        d.copy_to(out)
    return out

def delta(before):
    now = _core.cuda_stats(core)
    return {k: now[k] - before[k] if not k.startswith(("staged_max", "ipc_max")) else now[k]
            for k in now}

def allreduce_case(alg, dtype, op, count, inplace, seed=0):
    case = dict(n=n, alg=alg, op=op, dtype=dtype, count=count, inplace=inplace)
    host = store(rank_values(op, dtype, count, r, seed), dtype)
    send = on_device(host, dtype)
    recv = send if inplace else on_device(np.zeros_like(host), dtype)
    guarded(case, core.allreduce, None if inplace else send, recv, op, alg, None, dtype)
    got = fetch(recv, count, dtype)
    check(case, got, expected_stored(op, dtype, count, n, seed), dtype)
    if not inplace:
        check(dict(case, what="input kept"), fetch(send, count, dtype), host, dtype)

def others_case(dtype, count):
    # allgatherv, broadcast (every root) and reduce_scatter_block on device buffers
    counts_v = [count + i for i in range(n)]
    mine = store(rank_values("sum", dtype, counts_v[r], r), dtype)
    out = on_device(np.zeros(sum(counts_v), np_dtype(dtype)), dtype)
    case = dict(what="allgatherv", dtype=dtype, count=count)
    guarded(case, core.allgatherv, on_device(mine, dtype), out, counts_v, None, None, dtype)
    want = np.concatenate([store(rank_values("sum", dtype, counts_v[i], i), dtype)
                           for i in range(n)])
    check(case, fetch(out, sum(counts_v), dtype), want, dtype)
    for root in range(n):
        b = store(rank_values("sum", dtype, count, root, root), dtype)
        dbuf = on_device(b if r == root else np.zeros_like(b), dtype)
        case = dict(what="broadcast", dtype=dtype, count=count, root=root)
        guarded(case, core.broadcast, dbuf, root, None, dtype)
        check(case, fetch(dbuf, count, dtype), b, dtype)
    full = store(rank_values("sum", dtype, count * n, r), dtype)
    rs = on_device(np.zeros(count, np_dtype(dtype)), dtype)
    case = dict(what="reduce_scatter", dtype=dtype, count=count)
    guarded(case, core.reduce_scatter_block, on_device(full, dtype), rs, "sum", None, dtype)
    check(case, fetch(rs, count, dtype),
          expected_stored("sum", dtype, count * n, n)[r * count:(r + 1) * count], dtype)
    return 2 + n
"""

SMALL_BODY = COMMON + r"""
LIMIT = 16384  # COLLECTIVES_CUDA_SMALL_BYTES's default
before = _core.cuda_stats(core)
calls = 0
for alg in ALGORITHMS:
    for dtype in DTYPES:
        esize = np.dtype(np_dtype(dtype)).itemsize
        for op in OPS:
            for count in sorted({1, n + 1, 37, LIMIT // esize}):
                for inplace in (False, True):
                    allreduce_case(alg, dtype, op, count, inplace)
                    calls += 1
for dtype in ("float32", "int8", "bfloat16"):
    calls += others_case(dtype, 5)
# allgatherv in place (this rank's block already in recvbuf), and a queued allreduce
counts_v = [3 + i for i in range(n)]
displs = [sum(counts_v[:i]) for i in range(n)]
full = np.zeros(sum(counts_v), np.float32)
full[displs[r]:displs[r] + counts_v[r]] = rank_values("sum", "float32", counts_v[r], r)
out = on_device(full, "float32")
guarded(dict(what="allgatherv in place"), core.allgatherv, None, out, counts_v, None, None,
        "float32")
want = np.concatenate([store(rank_values("sum", "float32", counts_v[i], i), "float32")
                       for i in range(n)])
check(dict(what="allgatherv in place"), fetch(out, sum(counts_v), "float32"), want, "float32")
d = on_device(store(rank_values("sum", "float64", 100, r), "float64"), "float64")
req = core.iallreduce(None, d, "sum", "auto", None, "float64")
req.Wait()
check(dict(what="iallreduce"), fetch(d, 100, "float64"), expected_stored("sum", "float64", 100, n),
      "float64")
calls += 2
small = delta(before)
emit("small", calls=calls, **small)
# one element over the limit: the device executor runs it
before = _core.cuda_stats(core)
allreduce_case("auto", "float32", "sum", LIMIT // 4 + 1, False)
emit("above", **delta(before))
verify_hashes(comm)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n,path", [(2, "ipc"), (2, "tcp"), (3, "shm"), (3, "tcp"),
                                    (4, "shm"), (4, "tcp")])
def test_small_gpu_messages_take_the_host_path(n, path, backend):
    """Up to COLLECTIVES_CUDA_SMALL_BYTES, every collective on GPU buffers is one
    copy to pinned memory, the host collective, one copy back: exact results at
    every dtype, op and algorithm, in place and not, and not one schedule run by
    the device executor (no segment, no CUDA IPC record); one element more and
    the executor runs it."""
    env = _env(backend, {"ipc": {}, "shm": {"COLLECTIVES_CUDA_IPC": "0"},
                         "tcp": {"COLLECTIVES_TRANSPORT": "tcp"}}[path])
    res = run_world(n, SMALL_BODY, timeout=280, env=env, collective_timeout=60).assert_ok()
    for rr in res.ranks:
        small, above = rr.one("small"), rr.one("above")
        assert small["calls"] > 900, small
        assert small["small_calls"] == small["calls"], small
        assert small["device_runs"] == 0 and small["ipc_descs"] == 0, small
        assert small["staged_pieces"] == 0, small
        assert above["small_calls"] == 0 and above["device_runs"] >= 1, above


PIPE_BODY = COMMON + r"""
before = _core.cuda_stats(core)
cases = 0
for alg in ALGORITHMS:
    for dtype in ("float32", "int8", "bfloat16", "float64"):
        esize = np.dtype(np_dtype(dtype)).itemsize
        for op in ("sum", "min", "avg"):
            count = (3 << 20) // 2 // esize + 7   # 1.5 MiB: many 64 KiB segments
            allreduce_case(alg, dtype, op, count, cases % 2 == 1, seed=cases)
            cases += 1
for dtype in ("float32", "int8"):
    cases += others_case(dtype, (1 << 18) + 3)
emit("pipe", cases=cases, **delta(before))
verify_hashes(comm)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_pipelined_tcp_path_keeps_segments_in_flight(n, backend):
    """GPU buffers between ranks that reach each other over TCP, 64 KiB segments:
    exact results for every algorithm and collective, while on some link at least
    2 pieces were staged ahead of the socket and 2 were on the GPU at once."""
    env = _env(backend, {"COLLECTIVES_TRANSPORT": "tcp", "COLLECTIVES_CUDA_SEGMENT_BYTES": "64K"})
    res = run_world(n, PIPE_BODY, timeout=280, env=env, collective_timeout=60).assert_ok()
    for rr in res.ranks:
        got = rr.one("pipe")
        assert got["small_calls"] == 0 and got["ipc_descs"] == 0, got
        assert got["device_runs"] >= got["cases"], got
        assert got["staged_pieces"] > 20 * got["cases"], got
        assert got["staged_max_ahead"] >= 2, got
        assert got["staged_max_apply"] >= 2, got


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [2, 3])
def test_ipc_path_keeps_segments_in_flight(n, backend):
    """Same-host GPU buffers over CUDA IPC, 64 KiB segments: exact results, and a link
    had DESCs of at least 2 segments posted before the first of them was acknowledged
    (stream order: tests/test_cuda_ipc_order.py checks the events)."""
    env = _env(backend, {"COLLECTIVES_CUDA_SEGMENT_BYTES": "64K"})
    res = run_world(n, PIPE_BODY, timeout=280, env=env, collective_timeout=60).assert_ok()
    for rr in res.ranks:
        got = rr.one("pipe")
        assert got["small_calls"] == 0 and got["staged_pieces"] == 0, got
        assert got["ipc_descs"] > 20 * got["cases"], got
        assert got["ipc_max_posted"] >= 2, got


WHOLE_BODY = COMMON + r"""
before = _core.cuda_stats(core)
calls = 0
for dtype in ("float32", "int32", "bfloat16"):
    nd = np_dtype(dtype)
    for count in (5, 200003):
        for root in range(n):
            for inplace in (False, True):
                case = dict(what="reduce", dtype=dtype, count=count, root=root, inplace=inplace)
                mine = store(rank_values("sum", dtype, count, r), dtype)
                send = on_device(mine, dtype)
                recv = on_device(np.zeros(count, nd), dtype)
                if inplace and r == root:
                    guarded(case, _core.reduce, core, None, send, "sum", root, None, dtype)
                    recv = send
                else:
                    guarded(case, _core.reduce, core, send, recv, "sum", root, None, dtype)
                if r == root:
                    check(case, fetch(recv, count, dtype), expected_stored("sum", dtype, count, n),
                          dtype)
                counts = [count + i for i in range(n)]
                displs = [sum(counts[:i]) + 3 * i for i in range(n)]   # gaps between blocks
                total = displs[-1] + counts[-1]
                blocks = [store(rank_values("sum", dtype, counts[i], i, root), dtype)
                          for i in range(n)]
                case = dict(what="gatherv", dtype=dtype, count=count, root=root, inplace=inplace)
                out_host = np.zeros(total, nd)
                if inplace and r == root:
                    out_host[displs[r]:displs[r] + counts[r]] = blocks[r]
                    out = on_device(out_host, dtype)
                    guarded(case, _core.gatherv, core, None, out, counts, displs, root, None, dtype)
                else:
                    out = on_device(out_host, dtype)
                    guarded(case, _core.gatherv, core, on_device(blocks[r], dtype), out, counts,
                            displs, root, None, dtype)
                if r == root:
                    got = fetch(out, total, dtype)
                    for i in range(n):
                        check(dict(case, block=i), got[displs[i]:displs[i] + counts[i]], blocks[i],
                              dtype)
                case = dict(what="scatterv", dtype=dtype, count=count, root=root, inplace=inplace)
                src_host = np.zeros(total, nd)
                for i in range(n):
                    src_host[displs[i]:displs[i] + counts[i]] = blocks[i]
                src = on_device(src_host, dtype)
                if inplace and r == root:
                    guarded(case, _core.scatterv, core, src, None, counts, displs, root, None, dtype)
                    got = fetch(src, total, dtype)[displs[r]:displs[r] + counts[r]]
                else:
                    mineb = on_device(np.zeros(counts[r], nd), dtype)
                    guarded(case, _core.scatterv, core, src if r == root else None, mineb, counts,
                            displs, root, None, dtype)
                    got = fetch(mineb, counts[r], dtype)
                check(case, got, blocks[r], dtype)
                calls += 3
        # alltoallv: rank r sends (count + r + j) elements to rank j
        sc = [count + r + j for j in range(n)]
        rc = [count + j + r for j in range(n)]
        sd = [sum(sc[:j]) for j in range(n)]
        rd = [sum(rc[:j]) for j in range(n)]
        sendh = np.concatenate([store(rank_values("sum", dtype, sc[j], r, j), dtype)
                                for j in range(n)])
        recv = on_device(np.zeros(sum(rc), nd), dtype)
        case = dict(what="alltoallv", dtype=dtype, count=count)
        guarded(case, _core.alltoallv, core, on_device(sendh, dtype), recv, sc, rc, sd, rd, None,
                dtype)
        want = np.concatenate([store(rank_values("sum", dtype, rc[j], j, r), dtype)
                               for j in range(n)])
        check(case, fetch(recv, sum(rc), dtype), want, dtype)
        calls += 1
emit("whole", calls=calls, **delta(before))
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n,path", [(2, "shm"), (3, "tcp")])
def test_rooted_and_alltoall_on_gpu_buffers_are_staged_whole(n, path, backend):
    """reduce, gatherv, scatterv (every root, in place and not) and alltoallv on GPU
    buffers: exact results, every call staged whole (no device schedule)."""
    env = _env(backend, {"shm": {}, "tcp": {"COLLECTIVES_TRANSPORT": "tcp"}}[path])
    res = run_world(n, WHOLE_BODY, timeout=280, env=env, collective_timeout=60).assert_ok()
    for rr in res.ranks:
        got = rr.one("whole")
        assert got["calls"] > 30 and got["whole_calls"] == got["calls"], got
        assert got["device_runs"] == 0 and got["small_calls"] == 0, got


def test_cuda_stats_are_zero_before_a_gpu_call():
    comm = collectives._core.Communicator(0, 1)
    try:
        assert set(collectives._core.cuda_stats(comm).values()) == {0}
    finally:
        comm.close()
