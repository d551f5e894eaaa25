"""Arguments mpi4py would refuse are refused before any byte is sent, the same way in
every front end: a root that is not an integer rank, a None send buffer, and (as a
disagreement between ranks) an object broadcast whose ranks name different roots."""
import numpy as np
import pytest

from conftest import run_world

pytestmark = pytest.mark.timeout(60)


def test_a_root_is_an_integer_rank():
    from collectives import _core

    assert _core.check_root(np.int64(2), 4) == 2 and _core.check_root(0, 1) == 0
    for bad, kind in ((2 ** 40, ValueError), (-1, ValueError), (4, ValueError),
                      (1.5, TypeError), (1.0, TypeError), ("0", TypeError), (None, TypeError)):
        with pytest.raises(kind, match="root"):
            _core.check_root(bad, 4)


BODY = r"""
from collectives import MPI
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
b = np.full(4, r, np.float32)
for root in (2 ** 40, 1.5, -1, n, "0"):
    for name, call in (("Bcast", lambda: comm.Bcast(b, root=root)),
                       ("Ibcast", lambda: comm.Ibcast(b, root=root)),
                       ("bcast", lambda: comm.bcast("x", root=root)),
                       ("gather", lambda: comm.gather("x", root=root)),
                       ("scatter", lambda: comm.scatter(["x"] * n, root=root))):
        try:
            call()
            fail(f"{name} root={root!r}", "accepted")
        except (TypeError, ValueError) as exc:
            if "root" not in str(exc):
                fail(f"{name} root={root!r}", f"message does not name the root: {exc}")
check("Bcast data untouched", b, np.full(4, r, np.float32))
y = np.full(4, r, np.float32)
# (Allgather(None, buf) is mpi4py's in-place form: tests/test_mpi4py_suite_defects.py)
for name, call in (("Allreduce", lambda: comm.Allreduce(None, y)),
                   ("Iallreduce", lambda: comm.Iallreduce(None, y)),
                   ("Allgatherv", lambda: comm.Allgatherv(None, [np.empty(n, np.float32), [1] * n])),
                   ("Reduce_scatter_block", lambda: comm.Reduce_scatter_block(None, y[:1]))):
    try:
        call()
        fail(f"{name}(None, ...)", "ran in place")
    except TypeError as exc:
        if "IN_PLACE" not in str(exc):
            fail(f"{name}(None, ...)", str(exc))
check("None sendbuf left recvbuf alone", y, np.full(4, r, np.float32))
# Ranks that disagree on the root: every rank raises in the same call, and the
# communicator goes on (nothing moved).
try:
    got = comm.bcast(f"obj{r}", root=r % 2)
    emit("bcast", raised=False, got=got)
except MPI.Exception as exc:
    emit("bcast", raised=True, message=str(exc))
emit("after", value=comm.bcast(f"obj{r}", root=0), sum=comm.allreduce(r))
"""


@pytest.mark.parametrize("n", [2, 3])
def test_bad_roots_and_none_sendbuf_at_every_rank(n):
    res = run_world(n, BODY, timeout=50).assert_ok()
    for r in range(n):
        rec = res[r].one("bcast")
        assert rec["raised"], f"rank {r} returned {rec.get('got')!r} from a bcast with mixed roots"
        assert "disagree on the root" in rec["message"] and "rank 1: root 1" in rec["message"]
        after = res[r].one("after")
        assert after["value"] == "obj0" and after["sum"] == n * (n - 1) // 2


def test_torch_roots_are_checked_alike():
    torch = pytest.importorskip("torch")
    body = r"""
import torch
import collectives.torch as hvd
hvd.init()
t = torch.ones(3)
for root in (1.5, 2 ** 40, "0", -1):
    for name, call in (("broadcast", lambda: hvd.broadcast(t, root)),
                       ("broadcast_", lambda: hvd.broadcast_(t.clone(), root)),
                       ("broadcast_object", lambda: hvd.broadcast_object(1, root)),
                       ("broadcast_parameters", lambda: hvd.broadcast_parameters({"w": t.clone()}, root))):
        try:
            call()
            fail(f"{name} root={root!r}", "accepted")
        except (TypeError, ValueError) as exc:
            if "root_rank" not in str(exc):
                fail(f"{name} root={root!r}", str(exc))
emit("sum", value=float(hvd.allreduce(torch.ones(2), op=hvd.Sum)[0]))
"""
    res = run_world(2, body, timeout=50).assert_ok()
    assert [res[r].one("sum")["value"] for r in range(2)] == [2.0, 2.0]
