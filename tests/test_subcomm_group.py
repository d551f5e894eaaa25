"""_core.comm_create_group (issue 19, section 1): a subcommunicator made by its members alone
(MPI_Comm_create_group; what the torch backend's new_group uses): rank i is ranks[i], the
parent's links are shared (no new socket), non-members call nothing and go on with world
ops, bad arguments raise before anything is sent."""
import pytest

from conftest import run_world

BODY = r"""
from collectives import MPI, _core
w = MPI.COMM_WORLD
n, r = w.size, w.rank
w.Alltoall(np.arange(n, dtype=np.int64), np.empty(n, np.int64))  # every pair connected
fds, links = fd_count(), w._core.num_links
ranks = [2, 0]  # order as given: world rank 2 is group rank 0
if r in ranks:
    g = _core.comm_create_group(w._core, ranks, 12345)
    expect((g.rank, g.size) == (ranks.index(r), 2), "rank", f"{g.rank}/{g.size}")
    expect([_core.comm_world_rank(g, i) for i in range(2)] == ranks, "map", "")
    y = np.empty(1000, np.float64)
    g.allreduce(np.full(1000, r + 1.0), y)
    check("allreduce", y, np.full(1000, 4.0))
    b = np.full(5, r, np.int32)
    g.broadcast(b, 0)  # group rank 0 = world rank 2
    check("broadcast", b, np.full(5, 2, np.int32))
    # a second group over the same ranks with another tag: its own context
    h = _core.comm_create_group(w._core, ranks, 999)
    expect(_core.comm_context(h) != _core.comm_context(g), "contexts", "")
    _core.comm_free(h)
    _core.comm_free(g)
y = np.empty(3, np.int64)
w.Allreduce(np.full(3, r, np.int64), y)  # everyone, after the members' ops
check("world", y, np.full(3, n * (n - 1) // 2, np.int64))
expect(fd_count() == fds and w._core.num_links == links, "no new sockets",
       f"fds {fds} -> {fd_count()}, links {links} -> {w._core.num_links}")
for what, args in [("repeated", ([r, r], 1)), ("out of range", ([r, n], 1)),
                   ("not a member", ([(r + 1) % n], 1)), ("empty", ([], 1))]:
    try:
        _core.comm_create_group(w._core, *args)
        fail(what, "accepted")
    except (_core.CollectivesError, ValueError) as e:
        pass
try:
    _core.comm_create_group(w._core, [r], 2 ** 32)
    fail("tag", "accepted")
except OverflowError:
    pass
w.Barrier()
"""


@pytest.mark.timeout(60)
def test_create_group():
    run_world(3, BODY, timeout=50).assert_ok()
