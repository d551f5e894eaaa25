"""Rooted collectives in the core (native/rooted.c) and their mpi4py names: Reduce (every
dtype and op, exact against closed forms), Gather/Gatherv and Scatter/Scatterv (every
dtype, uneven and zero counts, several roots, in place), at 1-8 ranks; then a rank whose
Gatherv count differs from the root's."""
import json

import pytest

from conftest import run_world

pytestmark = pytest.mark.timeout(120)

GRID = r"""
from collectives import MPI
from collectives import _core
comm = MPI.COMM_WORLD
core = comm._core
n, r = comm.size, comm.rank
ROOTS = sorted({0, n - 1, n // 2})

def dt(dtype):
    return "bfloat16" if dtype == "bfloat16" else None

def block(dtype, count, rank, salt=0):
    return store((np.arange(count) * 5 + rank * 11 + salt) % 97, dtype)

# --- reduce: every dtype x op x count, exact closed forms, two roots, in place at the root
for dtype in DTYPES:
    for op in OPS:
        for count in (0, 1, 13, 70_001):
            for root in ROOTS[:2]:
                send = store(rank_values(op, dtype, count, r), dtype)
                want = expected_stored(op, dtype, count, n)
                if r == root:
                    out = np.zeros(count, np_dtype(dtype))
                    _core.reduce(core, send, out, op, root, dtype=dt(dtype))
                    check(("reduce", dtype, op, count, root), out, want, dtype)
                    inplace = send.copy()
                    _core.reduce(core, None, inplace, op, root, dtype=dt(dtype))
                    check(("reduce in place", dtype, op, count, root), inplace, want, dtype)
                else:
                    before = send.copy()
                    _core.reduce(core, send, None, op, root, dtype=dt(dtype))
                    _core.reduce(core, send, None, op, root, dtype=dt(dtype))
                    check(("reduce keeps sendbuf", dtype, op, count), send, before, dtype)

# --- gatherv / scatterv: uneven counts with zeros, every dtype, every root in ROOTS
for dtype in DTYPES:
    for base in (0, 3, 40_000):
        counts = [(base + 7 * i) % (base + 5) if base else (i % 2) for i in range(n)]
        total = sum(counts)
        displs = list(np.cumsum([0] + counts[:-1]))
        for root in ROOTS:
            mine = block(dtype, counts[r], r)
            out = np.zeros(total, np_dtype(dtype)) if r == root else None
            _core.gatherv(core, mine, out, counts if r == root else None, None, root, dtype=dt(dtype))
            if r == root:
                want = np.concatenate([block(dtype, counts[i], i) for i in range(n)]) if total else np.zeros(0, np_dtype(dtype))
                check(("gatherv", dtype, base, root), out, want, dtype)
            # scatterv from the root's concatenation back
            src = np.concatenate([block(dtype, counts[i], i, 1) for i in range(n)]) if r == root else None
            got = np.zeros(counts[r], np_dtype(dtype))
            _core.scatterv(core, src, got, counts if r == root else None, None, root, dtype=dt(dtype))
            check(("scatterv", dtype, base, root), got, block(dtype, counts[r], r, 1), dtype)

# --- mpi4py names: Reduce, Gather, Gatherv (displs with gaps), Scatter, Scatterv, IN_PLACE
for root in ROOTS:
    x = np.arange(6, dtype=np.float64) + r
    res = np.zeros(6) if r == root else None
    comm.Reduce(x, res, op=MPI.SUM, root=root)
    if r == root:
        check(("Reduce", root), res, np.arange(6) * n + n * (n - 1) / 2)
    y = np.full(3, r, np.int32)
    comm.Reduce(MPI.IN_PLACE if r == root else y, y if r == root else None, op=MPI.MAX, root=root)
    if r == root:
        check(("Reduce IN_PLACE", root), y, np.full(3, n - 1, np.int32))
    g = np.zeros(2 * n, np.int64) if r == root else None
    comm.Gather(np.array([r, -r], np.int64), g, root=root)
    if r == root:
        check(("Gather", root), g, np.array([v for i in range(n) for v in (i, -i)], np.int64))
    g2 = np.arange(2 * n, dtype=np.int64) if r == root else None
    if r == root:
        g2[2 * r:2 * r + 2] = [r, -r]
        comm.Gather(MPI.IN_PLACE, [g2, MPI.LONG], root=root)
        check(("Gather IN_PLACE", root), g2, np.array([v for i in range(n) for v in (i, -i)], np.int64))
    else:
        comm.Gather([np.array([r, -r], np.int64), MPI.LONG], None, root=root)
    counts = [i + 1 for i in range(n)]
    W = n + 1
    displs = [W * i for i in range(n)]   # gaps stay untouched
    gv = np.full(W * n, -1, np.float32) if r == root else None
    comm.Gatherv(np.full(r + 1, r, np.float32), [gv, counts, displs, MPI.FLOAT] if r == root else None, root=root)
    if r == root:
        want = np.full(W * n, -1, np.float32)
        for i in range(n):
            want[W * i:W * i + i + 1] = i
        check(("Gatherv gaps", root), gv, want)
    s = np.arange(4 * n, dtype=np.float32) if r == root else None
    part = np.zeros(4, np.float32)
    comm.Scatter(s, part, root=root)
    check(("Scatter", root), part, np.arange(4 * r, 4 * r + 4, dtype=np.float32))
    if r == root:
        comm.Scatter(s, MPI.IN_PLACE, root=root)
    else:
        part = np.zeros(4, np.float32)
        comm.Scatter(None, part, root=root)
        check(("Scatter IN_PLACE others", root), part, np.arange(4 * r, 4 * r + 4, dtype=np.float32))
    sv = np.arange(W * n, dtype=np.int8) if r == root else None
    part = np.zeros(r + 1, np.int8)
    comm.Scatterv([sv, counts, displs, MPI.INT8_T] if r == root else None, part, root=root)
    check(("Scatterv gaps", root), part, np.arange(W * r, W * r + r + 1, dtype=np.int8))

# --- pickle gather/scatter still agree
for root in ROOTS:
    got = comm.gather({"r": r, "pad": "x" * (r * 300)}, root=root)
    want = [{"r": i, "pad": "x" * (i * 300)} for i in range(n)]
    expect(got == (want if r == root else None), "gather obj", repr(got)[:80])
    got = comm.scatter([("item", i, "y" * i) for i in range(n)] if r == root else None, root=root)
    expect(got == ("item", r, "y" * r), "scatter obj", repr(got))

# --- argument errors, before any byte is sent
for case, fn in [
    ("root out of range", lambda: comm.Reduce(np.zeros(2), np.zeros(2), root=n)),
    ("Gather uneven", lambda: comm.Gather(np.zeros(1), np.zeros(n + 1), root=r)),
    ("Gatherv counts", lambda: comm.Gatherv(np.zeros(1), [np.zeros(n), [1] * (n + 1)], root=r)),
    ("Scatterv short buffer", lambda: comm.Scatterv([np.zeros(1), [2] * n], np.zeros(2), root=r)),
]:
    try:
        fn()
        fail(case, "no error")
    except (ValueError, TypeError) as exc:
        emit("argerr", case=case, message=str(exc))
x = np.array([1], np.int32)
comm.Allreduce(MPI.IN_PLACE, x)
expect(int(x[0]) == n and not core.broken, "after argerr", "")
"""


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_rooted_grid(n):
    """Every rooted collective, dtype, op and count at n ranks against exact values."""
    res = run_world(n, GRID, timeout=110).assert_ok()
    for rk in res.ranks:
        cases = {rec["case"] for rec in rk.get("argerr")}
        assert cases == {"root out of range", "Gather uneven", "Gatherv counts",
                         "Scatterv short buffer"} or n == 1, rk.text()


FAIL = r"""
import json
from collectives import MPI
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
kind = json.loads(sys.argv[1])["kind"]
comm.Barrier()
t0 = time.monotonic()
try:
    if kind == "gatherv_count":
        mine = np.zeros(5 if r == 2 else 4, np.float32)
        out = np.zeros(4 * n, np.float32) if r == 0 else None
        comm.Gatherv(mine, [out, [4] * n] if r == 0 else None, root=0)
    emit("no_error")
except BaseException as exc:
    error_record(exc, t0)
"""


def test_gatherv_count_mismatch_names_both_sides():
    """A Gatherv block whose size the root does not expect fails at the root with both
    sides' sizes, naming the rank, instead of hanging or writing past the block; the
    senders' part succeeded (as in MPI, only the root sees it)."""
    res = run_world(3, FAIL, timeout=60, args=[json.dumps({"kind": "gatherv_count"})],
                    collective_timeout=5)
    assert not res.timed_out, res.report()
    e = res[0].one("error")
    for w in ("gatherv", "rank 2", "expected 16 bytes", "got 20 bytes"):
        assert w in e["message"], e
    assert e["elapsed"] < 4.5, e
    assert res[1].get("no_error") and res[2].get("no_error"), res.report()
