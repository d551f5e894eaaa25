"""Ranks whose hosts differ in load still agree on every wire schedule.

Each rank enters a UTS namespace of its own host name (so ranks 0-1 are "host
a" and ranks 2-3 "host b", reached over TCP), and host a's ranks share one CPU
while host b's have two: host a is oversubscribed, host b is not. The
automatic segment size used to follow the rank's own host (1 MiB on host a,
512 KiB on host b), so a ring, a chain broadcast or an allgather of ~1 MiB or
more failed "out of step" between the two; it must follow what every rank
sees alike.
"""
import os
import subprocess
import sys

import pytest

from conftest import free_port, run_world

pytestmark = pytest.mark.timeout(90)

CLONE_NEWUTS = 0x04000000


def _can_make_uts_namespaces() -> bool:
    # In a child process (not a fork of this one, which may run JAX's threads):
    # the test process keeps its own namespace.
    if os.geteuid() != 0:
        return False
    probe = "import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare(%d) != 0)" % CLONE_NEWUTS
    return subprocess.run([sys.executable, "-c", probe], timeout=30).returncode == 0


BODY = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
r = int(os.environ["COLLECTIVES_RANK"])
host = b"host-a" if r < 2 else b"host-b"
assert libc.unshare(0x04000000) == 0, ctypes.get_errno()
assert libc.sethostname(host, len(host)) == 0, ctypes.get_errno()
cpus = sorted(os.sched_getaffinity(0))
os.sched_setaffinity(0, cpus[:1] if r < 2 else cpus[:2])  # host a: 2 ranks on 1 CPU
from collectives import MPI
comm = MPI.COMM_WORLD
n = comm.size
emit("host", oversubscribed=comm.local_size > len(os.sched_getaffinity(0)))
emit("segment", bytes=comm._core.segment_bytes)
for nbytes in (1 << 20, 16 << 20):
    count = nbytes // 4
    for alg in ("ring", "tree", "butterfly"):
        x = np.full(count, r + 1, np.float32)
        comm.Allreduce(MPI.IN_PLACE, x, algorithm=alg)
        check(f"allreduce {alg} {nbytes}", x, np.full(count, n * (n + 1) / 2, np.float32))
    b = np.full(count, r, np.float32)
    comm.Bcast(b, root=2)
    check(f"bcast {nbytes}", b, np.full(count, 2, np.float32))
    g = np.empty(count * n, np.float32)
    comm.Allgather(np.full(count, r, np.float32), g)
    check(f"allgather {nbytes}", g, np.repeat(np.arange(n, dtype=np.float32), count))
    rs = np.empty(count // n, np.float32)
    comm.Reduce_scatter_block(np.ones(count, np.float32), rs)
    check(f"reduce_scatter {nbytes}", rs, np.full(count // n, n, np.float32))
emit("all_sizes")
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to make one host "
                                                              "oversubscribed and the other not")
def test_oversubscribed_and_idle_hosts_run_every_collective_at_16_mib():
    if not _can_make_uts_namespaces():
        pytest.skip("needs root and UTS namespaces (unshare) to give ranks different hosts")
    port = free_port()
    # No COLLECTIVES_LOCAL_*: each rank learns its host's ranks from the host ids.
    res = run_world(4, BODY, timeout=80, env={"COLLECTIVES_TRANSPORT": "tcp"},
                    rank_env=lambda r, n: {"COLLECTIVES_RANK": r, "COLLECTIVES_SIZE": n,
                                           "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{port}"})
    for r in range(4):
        host_oversubscribed = r < 2
        assert res[r].one("host")["oversubscribed"] == host_oversubscribed, res.report()
    res.assert_ok()
    segments = {res[r].one("segment")["bytes"] for r in range(4)}
    assert len(segments) == 1, f"ranks picked different segment sizes: {segments}"
    for r in range(4):
        res[r].one("all_sizes")
