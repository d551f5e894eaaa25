"""Allgather, Allgatherv, Bcast, Reduce_scatter_block and Barrier over real processes.

One launch per world size runs every case in a loop inside the workers; values
are exact, and results are hashed and compared across ranks.
"""
import pytest

from conftest import run_world

BODY = r"""
from collectives import MPI
comm = MPI.COMM_WORLD
core = comm._core
n, r = comm.size, comm.rank
OPMAP = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.AVG}

def data(dtype, count, rank, salt=0):
    # distinct per rank and position, exact in every dtype
    v = (np.arange(count, dtype=np.int64) * 3 + rank * 11 + salt) % 61 - (30 if dtype in SIGNED else 0)
    return store(v, dtype)

# ---------------------------------------------------------------- Allgather
for dtype in DTYPES:
    for block in (0, 1, n + 1, 1000, 70_001):
        for inplace in (False, True):
            case = dict(coll="Allgather", n=n, dtype=dtype, block=block, inplace=inplace)
            mine = data(dtype, block, r)
            recv = np.full(n * block, 7, dtype=np_dtype(dtype))
            if inplace:
                recv[r * block:(r + 1) * block] = mine
            if dtype == "bfloat16":
                guarded(case, core.allgatherv, None if inplace else mine, recv, [block] * n, None,
                        None, "bfloat16")
            else:
                guarded(case, comm.Allgather, MPI.IN_PLACE if inplace else mine, recv)
            exp = np.concatenate([data(dtype, block, k) for k in range(n)]) if block else recv[:0]
            check(case, recv, exp, dtype)
            record_hash(case, recv)

# --------------------------------------------------------------- Allgatherv
patterns = {
    "mod3": [k % 3 for k in range(n)],                 # includes zero counts
    "varied": [(k * 37 + 5) % 101 for k in range(n)],
    "one_big": [100_003 if k == n - 1 else 0 for k in range(n)],
    "zeros": [0] * n,
}
for pname, counts in patterns.items():
    for dtype in ("int8", "int32", "float16", "float64"):
        for layout in ("packed", "reversed_gaps"):
            for inplace in (False, True):
                if layout == "packed":
                    displs = list(np.cumsum([0] + counts[:-1]).astype(int))
                    total = sum(counts)
                else:  # blocks in reverse rank order with a 2-element gap before each
                    displs, pos = [0] * n, 0
                    for k in reversed(range(n)):
                        pos += 2
                        displs[k] = pos
                        pos += counts[k]
                    total = pos + 1
                case = dict(coll="Allgatherv", n=n, pattern=pname, dtype=dtype, layout=layout,
                            inplace=inplace)
                sentinel = store(np.full(total, 9), dtype)
                recv = sentinel.copy()
                mine = data(dtype, counts[r], r, salt=1)
                if inplace:
                    recv[displs[r]:displs[r] + counts[r]] = mine
                spec = [recv, counts, displs] if layout != "packed" or inplace else [recv, counts]
                guarded(case, comm.Allgatherv, MPI.IN_PLACE if inplace else mine, spec)
                exp = sentinel.copy()
                for k in range(n):
                    exp[displs[k]:displs[k] + counts[k]] = data(dtype, counts[k], k, salt=1)
                check(case, recv, exp, dtype)
                record_hash(case, recv)

# -------------------------------------------------------------------- Bcast
for root in range(n):
    for dtype, count in (("int32", 0), ("int32", 10), ("float64", 1000), ("uint8", 70_000),
                         ("float32", 300_001), ("int8", 65_537)):
        case = dict(coll="Bcast", n=n, root=root, dtype=dtype, count=count)
        buf = data(dtype, count, root, salt=2) if r == root else \
            np.full(count, 3, dtype=np_dtype(dtype))
        guarded(case, comm.Bcast, buf, root)
        check(case, buf, data(dtype, count, root, salt=2), dtype)
        record_hash(case, buf)
    case = dict(coll="Bcast bf16", n=n, root=root)
    buf = data("bfloat16", 40_000, root) if r == root else np.zeros(40_000, np.uint16)
    guarded(case, core.broadcast, buf, root, None, "bfloat16")
    check(case, buf, data("bfloat16", 40_000, root), "bfloat16")

# ------------------------------------------------------- Reduce_scatter_block
for dtype in DTYPES:
    for op in OPS:
        for block in (0, 1, 1000, 4097, 40_000 if op == "sum" else 3):
            for inplace in (False, True):
                case = dict(coll="Reduce_scatter_block", n=n, dtype=dtype, op=op, block=block,
                            inplace=inplace)
                send = store(rank_values(op, dtype, n * block, r), dtype)
                exp = expected_stored(op, dtype, n * block, n)[r * block:(r + 1) * block]
                if inplace:
                    recv = send.copy()
                    if dtype == "bfloat16":
                        guarded(case, core.reduce_scatter_block, None, recv, op, None, "bfloat16")
                    else:
                        guarded(case, comm.Reduce_scatter_block, MPI.IN_PLACE, recv, OPMAP[op])
                    got = recv[:block]
                else:
                    recv = np.zeros(block, dtype=np_dtype(dtype))
                    if dtype == "bfloat16":
                        guarded(case, core.reduce_scatter_block, send, recv, op, None, "bfloat16")
                    else:
                        guarded(case, comm.Reduce_scatter_block, send, recv, OPMAP[op])
                    got = recv
                check(case, got, exp, dtype)

# ------------------------------------------------------------------ Barrier
for sleeper in sorted({0, n - 1}):
    comm.Barrier()
    if r == sleeper:
        time.sleep(0.5)
        entered = time.time()
        comm.Barrier()
        emit("barrier", sleeper=sleeper, entered=entered)
    else:
        t0 = time.monotonic()
        comm.Barrier()
        left, waited = time.time(), time.monotonic() - t0
        emit("barrier", sleeper=sleeper, left=left, waited=waited)
verify_hashes(comm)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8])
def test_collectives_grid(n):
    res = run_world(n, BODY, timeout=110).assert_ok()
    for sleeper in sorted({0, n - 1}):
        recs = {rr.rank: [x for x in rr.get("barrier") if x["sleeper"] == sleeper][0]
                for rr in res.ranks}
        entered = recs[sleeper]["entered"]
        for rank, rec in recs.items():
            if rank == sleeper:
                continue
            assert rec["left"] >= entered - 0.005, \
                f"rank {rank} left the barrier before rank {sleeper} entered it: {recs}"
            assert rec["waited"] >= 0.4, f"rank {rank} waited only {rec['waited']:.3f} s: {recs}"


NONBLOCKING_BODY = r"""
from collectives import MPI
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
# Every non-blocking collective at once, in the same order on every rank; the
# progress thread runs them in submission order, and a blocking call made
# meanwhile waits for them.
for rnd in range(3):
    big = 70_000 * (rnd + 1)
    ar = np.full(big, r + 1, dtype=np.float32)
    bc = np.arange(big, dtype=np.int32) if r == n - 1 else np.zeros(big, np.int32)
    ag = np.zeros(n * 5, dtype=np.int64)
    counts = [k + rnd for k in range(n)]
    agv = np.zeros(sum(counts), dtype=np.float64)
    mine = np.full(counts[r], float(r), dtype=np.float64)
    rs_in = np.repeat(np.arange(n, dtype=np.float32), 3) + r
    rs = np.zeros(3, dtype=np.float32)
    reqs = [comm.Iallreduce(MPI.IN_PLACE, ar),
            comm.Ibcast(bc, root=n - 1),
            comm.Iallgather(np.full(5, r, dtype=np.int64), ag),
            comm.Iallgatherv(mine, [agv, counts]),
            comm.Ireduce_scatter_block(rs_in, rs, op=MPI.SUM),
            comm.Ibarrier()]
    blocking = np.array([r], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, blocking)          # waits for the queue
    MPI.Request.Waitall(reqs)
    assert all(q.Test() for q in reqs)
    case = dict(rnd=rnd)
    check(dict(case, c="Iallreduce"), ar, np.full(big, n * (n + 1) / 2, np.float32), "float32")
    check(dict(case, c="Ibcast"), bc, np.arange(big, dtype=np.int32), "int32")
    check(dict(case, c="Iallgather"), ag, np.repeat(np.arange(n, dtype=np.int64), 5), "int64")
    check(dict(case, c="Iallgatherv"), agv,
          np.concatenate([np.full(c, float(k)) for k, c in enumerate(counts)]), "float64")
    check(dict(case, c="Ireduce_scatter_block"), rs,
          np.full(3, n * r + n * (n - 1) / 2, np.float32), "float32")
    check(dict(case, c="blocking"), blocking, np.array([n * (n - 1) // 2]), "int64")
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [1, 3, 4])
def test_nonblocking_collectives(n):
    run_world(n, NONBLOCKING_BODY, timeout=80).assert_ok()
