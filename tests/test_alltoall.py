"""alltoall(v) in the core (native/alltoall.c, pairwise exchange) and mpi4py's Alltoall,
Alltoallv and pickle alltoall: every dtype, even, uneven and zero blocks, gaps, in place,
at 1-8 ranks; a pair that disagrees on a block's size fails naming both sizes."""
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

def dt(dtype):
    return "bfloat16" if dtype == "bfloat16" else None

def block(dtype, count, src, dst, salt=0):
    return store((np.arange(count) * 3 + src * 17 + dst * 5 + salt) % 89, dtype)

# --- Alltoall-shaped (every block the same size), every dtype
for dtype in DTYPES:
    for k in (0, 1, 7, 20_000):
        send = np.concatenate([block(dtype, k, r, j) for j in range(n)])
        recv = np.zeros(k * n, np_dtype(dtype))
        _core.alltoallv(core, send, recv, [k] * n, [k] * n, dtype=dt(dtype))
        want = np.concatenate([block(dtype, k, i, r) for i in range(n)])
        check(("alltoall", dtype, k), recv, want, dtype)
        inplace = send.copy()
        _core.alltoallv(core, None, inplace, [k] * n, [k] * n, dtype=dt(dtype))
        check(("alltoall in place", dtype, k), inplace, want, dtype)

# --- alltoallv: uneven counts with zeros, receive side with gaps
def cnt(i, j, big):
    return ((i * 3 + j * 5) % 7) * big

for dtype in ("int8", "bfloat16", "float64"):
    for big in (1, 3000):
        scounts = [cnt(r, j, big) for j in range(n)]
        rcounts = [cnt(i, r, big) for i in range(n)]
        send = np.concatenate([block(dtype, scounts[j], r, j, 1) for j in range(n)])
        rdispls = [sum(rcounts[:i]) + 2 * i for i in range(n)]
        recv = np.full(sum(rcounts) + 2 * n, 77, np_dtype(dtype))
        _core.alltoallv(core, send, recv, scounts, rcounts, None, rdispls, dtype=dt(dtype))
        for i in range(n):
            check(("alltoallv", dtype, big, i), recv[rdispls[i]:rdispls[i] + rcounts[i]],
                  block(dtype, rcounts[i], i, r, 1), dtype)
            expect((recv[rdispls[i] + rcounts[i]:rdispls[i] + rcounts[i] + 2] == 77).all(),
                   ("alltoallv gap", dtype, big, i), "a gap was written")

# --- mpi4py names
s = np.arange(4 * n, dtype=np.int32) + 100 * r
out = np.zeros(4 * n, np.int32)
comm.Alltoall(s, out)
check("Alltoall", out, np.concatenate([np.arange(4 * r, 4 * r + 4, dtype=np.int32) + 100 * i for i in range(n)]))
s2 = s.copy()
comm.Alltoall(MPI.IN_PLACE, [s2, MPI.INT])
check("Alltoall IN_PLACE", s2, out)
sc = [j + 1 for j in range(n)]
rc = [r + 1] * n
sv = np.concatenate([np.full(j + 1, 10 * r + j, np.float32) for j in range(n)])
rv = np.zeros(sum(rc), np.float32)
comm.Alltoallv([sv, sc, MPI.FLOAT], [rv, rc, MPI.FLOAT])
check("Alltoallv", rv, np.concatenate([np.full(r + 1, 10 * i + r, np.float32) for i in range(n)]))
got = comm.alltoall([{"from": r, "to": j, "pad": "z" * (r * j)} for j in range(n)])
expect(got == [{"from": i, "to": r, "pad": "z" * (i * r)} for i in range(n)], "alltoall obj", repr(got)[:80])
if n > 1:
    try:
        comm.Alltoall(np.zeros(n + 1), np.zeros(n + 1))
        fail("uneven", "no error")
    except ValueError as exc:
        emit("argerr", message=str(exc))
x = np.array([1], np.int32)
comm.Allreduce(MPI.IN_PLACE, x)
expect(int(x[0]) == n and not core.broken, "after argerr", "")
"""


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_alltoall_grid(n):
    """Every dtype and block layout at n ranks against exact per-pair values."""
    run_world(n, GRID, timeout=110).assert_ok()


FAIL = r"""
from collectives import MPI, _core
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
comm.Barrier()
t0 = time.monotonic()
try:
    rc = [2] * n
    if r == 1:
        rc[2] = 3          # rank 1 expects 3 elements from rank 2, which sends 2
    _core.alltoallv(comm._core, np.zeros(2 * n, np.float32), np.zeros(sum(rc), np.float32),
                    [2] * n, rc)
    emit("no_error")
except BaseException as exc:
    error_record(exc, t0)
"""


def test_alltoallv_size_mismatch_names_both_sides():
    """A pair that disagrees on a block's size fails at the receiver with both sizes."""
    res = run_world(3, FAIL, timeout=60, collective_timeout=5)
    assert not res.timed_out, res.report()
    e = res[1].one("error")
    for w in ("alltoallv", "rank 2", "expected 12 bytes", "got 8 bytes"):
        assert w in e["message"], e
    assert e["elapsed"] < 4.5, e
