"""Blocking point-to-point waits hear abort notices (issue 37, section 2).

A rank whose communicator breaks tells the ranks it has no link with by an
abort notice on their listeners. A rank blocked in Recv from such a rank (no
link yet: it waits for that rank to dial) used to serve its listener, read
the notice and wait on to its deadline; it must fail at once, naming the rank
and where its failure began. No barrier first: the ranks must have no link.
"""
import pytest

from conftest import run_world

pytestmark = pytest.mark.timeout(120)

BODY = r"""
from collectives import MPI
comm = MPI.COMM_WORLD
r = comm.rank
t0 = time.monotonic()
try:
    if r == 0:    # times out on rank 1 and breaks; it never dialed rank 2
        comm.Recv(np.zeros(1), 1, tag=99, timeout=1.0)
    elif r == 1:
        comm.Recv(np.zeros(1), 0, tag=98)
    else:         # waits for rank 0, the lower rank, to dial it
        comm.Recv(np.zeros(4), 0, tag=5)
    emit("no_error")
except MPI.Exception as exc:
    emit("error", message=str(exc), elapsed=time.monotonic() - t0)
"""


def test_recv_from_a_peer_that_broke_without_a_link_fails_at_once():
    res = run_world(3, BODY, timeout=90, collective_timeout=30.0)
    assert not res.timed_out, res.report()
    got = res[2].get("error")
    assert got, res.report()
    e = got[0]
    assert "rank 0 failed and broke the communicator" in e["message"], e
    assert "recv from rank 1" in e["message"] and "timed out" in e["message"], e
    assert e["elapsed"] < 6.0, e
