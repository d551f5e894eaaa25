"""mpi4py's reduce/scan/exscan (objects), Scan/Exscan, Reduce_scatter with counts,
Sendrecv_replace and communicator names (collectives/MPI/_extras.py), at 1, 2, 3 and 5
ranks against numpy/Python references computed from rank-derived data; the argument
errors before anything is sent. What mpi4py returns for the same calls is the reference
for the edge cases (reduce is None off the root, exscan None at rank 0, Exscan leaves
rank 0's buffer as it was)."""
import pytest

from conftest import run_world

BODY = r"""
from collectives import MPI
comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size

def same(case, got, want):
    ok = (np.array_equal(got, want) if isinstance(want, np.ndarray) else got == want)
    expect(ok, case, f"got {got!r}, expected {want!r}")

# object forms
same("reduce sum", comm.reduce(r + 1, op=MPI.SUM, root=n - 1), sum(range(1, n + 1)) if r == n - 1 else None)
same("reduce max default root", comm.reduce([r], op=MPI.MAX), [n - 1] if r == 0 else None)
same("reduce lists in rank order", comm.reduce([r]), list(range(n)) if r == 0 else None)
same("scan", comm.scan(r + 1), sum(range(1, r + 2)))
same("scan strings in order", comm.scan(str(r), op=MPI.SUM), "".join(str(k) for k in range(r + 1)))
same("exscan", comm.exscan(r + 1), None if r == 0 else sum(range(1, r + 1)))
same("exscan prod", comm.exscan(r + 2, MPI.PROD), None if r == 0 else int(np.prod(range(2, r + 2))))
for bad, kind in [(lambda: comm.reduce(1, op=MPI.AVG), ValueError),
                  (lambda: comm.scan(1, op=max), TypeError),
                  (lambda: comm.reduce(1, root=n), ValueError)]:
    try:
        bad()
        expect(False, "object error", "accepted")
    except kind:
        pass

# Scan / Exscan on buffers, every reduction, a few dtypes, in place too
def x_of(k, dt, cnt):
    return ((np.arange(cnt) * (k + 3) + k) % 11 + 1).astype(dt)
for dt in (np.float32, np.float64, np.int32, np.int64, np.float16, np.int8):
    for cnt in (0, 1, 7, 1000):
        xs = [x_of(k, dt, cnt) for k in range(n)]
        for op, uf in ((MPI.SUM, np.add), (MPI.PROD, np.multiply), (MPI.MIN, np.minimum), (MPI.MAX, np.maximum)):
            acc = [xs[0].copy()]
            for k in range(1, n):
                acc.append(uf(acc[-1], xs[k]).astype(dt))
            out = np.full(cnt, 99, dt)
            comm.Scan(xs[r], out, op=op)
            same(f"Scan {dt.__name__} {cnt} {op}", out, acc[r])
            out = np.full(cnt, 99, dt)
            comm.Exscan(xs[r], out, op=op)
            same(f"Exscan {dt.__name__} {cnt} {op}", out, np.full(cnt, 99, dt) if r == 0 else acc[r - 1])
        inp = xs[r].copy()
        comm.Scan(MPI.IN_PLACE, inp)
        same(f"Scan in place {dt.__name__} {cnt}", inp, np.sum(np.stack(xs[:r + 1]), axis=0, dtype=dt) if cnt else inp)
spec = np.full(4, r + 1.0, np.float64)
comm.Scan([spec, MPI.DOUBLE], spec2 := np.zeros(4))
same("Scan spec", spec2, np.full(4, (r + 1) * (r + 2) / 2))

# Reduce_scatter with counts: unequal, zero for some rank, equal (the block path), in place
for counts in ([k + 1 for k in range(n)], [0] + [2] * (n - 1), [3] * n):
    total = sum(counts)
    xs = [np.arange(total, dtype=np.float32) * (k + 1) for k in range(n)]
    want = np.sum(np.stack(xs), axis=0)
    start = sum(counts[:r])
    out = np.full(counts[r], -1, np.float32)
    comm.Reduce_scatter(xs[r], out, counts, op=MPI.SUM)
    same(f"Reduce_scatter {counts}", out, want[start:start + counts[r]])
    buf = xs[r].copy()
    comm.Reduce_scatter(MPI.IN_PLACE, buf, counts)
    same(f"Reduce_scatter in place {counts}", buf[:counts[r]], want[start:start + counts[r]])
out = np.zeros(2, np.int64)
comm.Reduce_scatter(np.arange(2 * n, dtype=np.int64) + r, out, None, MPI.MAX)  # counts from recvbufs
same("Reduce_scatter no counts", out, np.arange(2 * r, 2 * r + 2, dtype=np.int64) + n - 1)
for bad in [lambda: comm.Reduce_scatter(np.zeros(5), np.zeros(1), [1] * (n + 1)),
            lambda: comm.Reduce_scatter(np.zeros(n + 1), np.zeros(1), [1] * n),
            lambda: comm.Reduce_scatter(np.zeros(n), np.zeros(1), [-1] + [1] * (n - 1)),
            lambda: comm.Scan(np.zeros(3), np.zeros(2)),
            lambda: comm.Scan(np.zeros(3), np.zeros(3), op=MPI.AVG)]:
    try:
        bad()
        expect(False, "buffer error", "accepted")
    except ValueError:
        pass

# Sendrecv_replace around the ring
right, left = (r + 1) % n, (r - 1) % n
buf = np.full(5, r, np.int32)
st = MPI.Status()
comm.Sendrecv_replace(buf, right, 7, left, 7, st)
same("Sendrecv_replace", buf, np.full(5, left, np.int32))
same("Sendrecv_replace status", (st.Get_source(), st.Get_tag()), (left, 7))

# a bad rank, tag or root: MPI.Exception as mpi4py raises, and still a ValueError
for case, bad in [("dest", lambda: comm.send(1, n + 5, 0)), ("tag", lambda: comm.recv(None, r, -5)),
                  ("Send dest", lambda: comm.Send(np.zeros(2), -3)),
                  ("gather root", lambda: comm.gather(1, root=n)),
                  ("reduce root", lambda: comm.reduce(1, root=-1)),
                  ("Bcast root", lambda: comm.Bcast(np.zeros(2), root=n))]:
    try:
        bad()
        expect(False, case, "accepted")
    except MPI.Exception as e:
        expect(isinstance(e, ValueError) and e.Get_error_code() == 1, case, repr(e))

# names
same("world name", comm.Get_name(), "MPI_COMM_WORLD")
same("self name", MPI.COMM_SELF.Get_name(), "MPI_COMM_SELF")
d = comm.Dup()
same("dup name", d.name, "")
d.Set_name("mine")
same("set name", (d.Get_name(), d.is_intra, d.Is_inter()), ("mine", True, False))
d.Free()
same("world after", comm.allreduce(1), n)
emit("ok")
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_extras_against_references(n):
    res = run_world(n, BODY, timeout=110)
    res.assert_ok()
    assert all(rr.one("ok") is not None for rr in res.ranks), res.report()
