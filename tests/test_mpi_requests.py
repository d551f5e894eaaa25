"""collectives.MPI.Request against mpi4py's documented semantics (issue 19, section 2).

A request whose completion a call reported is inactive, as MPI_REQUEST_NULL is
in mpi4py: ``bool(req)`` is False, waiting on or testing it returns at once
with an empty status and no object, Waitany/Testany/Waitsome/Testsome skip it
and answer UNDEFINED / None when nothing is active. Get_status reports
completion without making the request inactive. Every case runs over real
sockets at 2 and 3 ranks (a ring, and messages a rank sends itself).
"""
import pytest

from conftest import run_world

BODY = r"""
from collectives import MPI
comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
right, left = (r + 1) % n, (r - 1) % n

def same(case, got, want):
    expect(got == want, case, f"got {got!r}, expected {want!r}")

# a completed request is inactive
req = comm.isend({"r": r}, right, 1)
same("isend active", bool(req), True)
got = comm.recv(None, left, 1)
same("recv", got, {"r": left})
req.Wait()
same("isend inactive after Wait", bool(req), False)
st = MPI.Status()
same("Wait on inactive", req.Wait(st), True)
same("inactive status", (st.Get_source(), st.Get_tag(), st.Get_count()), (MPI.ANY_SOURCE, MPI.ANY_TAG, 0))
same("Test on inactive", req.Test(), True)
same("wait on inactive", req.wait(), None)
same("test on inactive", req.test(), (True, None))

# irecv: test() reports the object once, then the request is inactive
rq = comm.irecv(None, left, 2)
comm.send([r, "x"], right, 2)
flag, obj = rq.test()
while not flag:
    flag, obj = rq.test()
same("irecv object", obj, [left, "x"])
same("irecv inactive", bool(rq), False)
same("irecv object not again", rq.wait(), None)

# Get_status: completion seen, the request stays active, wait() still gives the object
rq = comm.irecv(None, left, 3)
comm.send("gs", right, 3)
st = MPI.Status()
while not rq.Get_status(st):
    pass
same("Get_status source", (st.Get_source(), st.Get_tag()), (left, 3))
same("Get_status keeps it active", bool(rq), True)
same("object after Get_status", rq.wait(), "gs")

# waitany / testany skip inactive requests; UNDEFINED when none is active
reqs = [comm.irecv(None, r, t) for t in (11, 12, 13)]
idx, flag, obj = MPI.Request.testany(reqs)
same("testany none done", (idx, flag, obj), (MPI.UNDEFINED, False, None))
for t in (12, 11, 13):
    comm.send(t * 10, r, t)
    i, o = MPI.Request.waitany(reqs)
    same(f"waitany tag {t}", (i, o), (t - 11, t * 10))
    same(f"waitany {t} inactive", bool(reqs[i]), False)
same("waitany none active", MPI.Request.waitany(reqs), (MPI.UNDEFINED, None))
same("Waitany none active", MPI.Request.Waitany(reqs), MPI.UNDEFINED)
same("testany none active", MPI.Request.testany(reqs), (MPI.UNDEFINED, True, None))
same("Testany none active", MPI.Request.Testany(reqs), (MPI.UNDEFINED, True))
same("Testall all inactive", MPI.Request.Testall(reqs), True)

# Testsome / Waitsome: indices of what completed, None when nothing is active
reqs = [comm.irecv(None, r, t) for t in (21, 22, 23)]
same("Testsome none done", MPI.Request.Testsome(reqs), [])
comm.send("a", r, 21)
comm.send("c", r, 23)
got, objs = [], []
while len(got) < 2:
    idx, ob = MPI.Request.testsome(reqs)
    got += idx
    objs += ob
same("testsome", (sorted(got), sorted(objs)), ([0, 2], ["a", "c"]))
comm.send("b", r, 22)
same("Waitsome", MPI.Request.Waitsome(reqs), [1])
same("Waitsome none active", MPI.Request.Waitsome(reqs), None)
same("testsome none active", MPI.Request.testsome(reqs), (None, None))

# a ring through waitall, then the requests are inactive
rr = comm.irecv(None, left, 31)
sr = comm.isend(r * 100, right, 31)
same("waitall", MPI.Request.waitall([sr, rr]), [None, left * 100])
same("waitall inactive", (bool(sr), bool(rr)), (False, False))

# a buffer request: Irecv + Waitsome with statuses
buf = np.zeros(4, np.int32)
rb = comm.Irecv(buf, left, 41)
comm.Send(np.full(4, r, np.int32), right, 41)
sts = [MPI.Status()]
same("Waitsome buffer", MPI.Request.Waitsome([rb], sts), [0])
same("Waitsome status", (sts[0].Get_source(), sts[0].Get_tag(), sts[0].Get_count(MPI.INT)), (left, 41, 4))
same("Irecv data", buf.tolist(), [left] * 4)
comm.Barrier()
emit("ok")
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 3])
def test_requests_follow_mpi4py_semantics(n):
    res = run_world(n, BODY, timeout=80)
    res.assert_ok()
    assert all(rr.one("ok") is not None for rr in res.ranks), res.report()
