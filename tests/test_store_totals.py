"""The store's limits hold in total, not only per connection (issue 37, section 4).

The store lives in rank 0, so what its clients make it hold is taken from
rank 0: 1,010 authenticated connections took the descriptors rank 0's own
links needed (under the usual limit of 1024), and 24 unfinished 16 MiB frames
added 384 MiB to it. Here a process that knows the secret does both, from
outside the store's process; the job must go on, and the store's memory must
stay bounded.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from collectives.rendezvous import store as _store
from conftest import TESTS, base_env, free_port, run_world
from test_store_hardening import _StoreProcess, _works, SECRET

pytestmark = pytest.mark.timeout(150)

BODY = r"""
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))  # the usual limit
from collectives import MPI
from collectives.rendezvous.store import StoreClient
comm = MPI.COMM_WORLD  # rendezvous only: no link yet
if comm.rank == 1:
    # One who knows the secret opens 1,010 connections to the store and holds them.
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host, port = os.environ["COLLECTIVES_STORE_ADDR"].rsplit(":", 1)
    held, refused = [], 0
    while len(held) + refused < 1010 and refused < 20:
        try:
            held.append(StoreClient(host, int(port), timeout=0.2,
                                    secret=os.environ["COLLECTIVES_JOB_SECRET"].encode()))
        except (ConnectionError, TimeoutError, OSError):
            refused += 1
    emit("held", n=len(held), refused=refused)
    arrive("held")
else:
    wait_for("held", timeout=90)
# Now every link opens (rank 0 needs descriptors for them), and the store still serves.
x = np.full(1 << 16, comm.rank + 1.0)
y = np.zeros_like(x)
comm.Allreduce(x, y)
expect(float(y[0]) == 10.0, "allreduce", f"got {y[0]}")
got = comm.alltoall([comm.rank * 10 + j for j in range(comm.size)])
expect(got == [j * 10 + comm.rank for j in range(comm.size)], "alltoall", repr(got))
emit("ok")
"""


def test_a_thousand_authenticated_connections_do_not_break_the_job():
    port = free_port()

    def env(rank: int, n: int) -> dict:
        return {"COLLECTIVES_RANK": rank, "COLLECTIVES_SIZE": n, "COLLECTIVES_LOCAL_RANK": rank,
                "COLLECTIVES_LOCAL_SIZE": n, "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{port}",
                "COLLECTIVES_JOB_SECRET": SECRET, "COLLECTIVES_TRANSPORT": "tcp"}

    res = run_world(4, BODY, timeout=120, rank_env=env, collective_timeout=15.0)
    assert not res.timed_out, res.report()
    res.assert_ok()
    assert all(res[r].one("ok") is not None for r in range(4)), res.report()
    held = res[1].one("held")
    assert held["n"] <= 512, res.report()  # half of rank 0's 1024 descriptors at most


def test_unfinished_frames_are_bounded_in_total():
    store = _StoreProcess(nofile=4096)
    try:
        base = store.rss_mib()
        sender = subprocess.Popen(
            [sys.executable, str(TESTS / "_store_flood.py"), "frames", "127.0.0.1",
             str(store.port), SECRET, "24", "15"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=base_env())
        try:
            assert json.loads(sender.stdout.readline())["sent"] == 24
            grown = store.rss_mib() - base
            _works(store.port)
            sender.stdin.write(b"\n")
            sender.stdin.flush()
            cut = json.loads(sender.stdout.readline())["cut"]
        finally:
            if sender.poll() is None:
                sender.kill()
            sender.wait()
    finally:
        stderr = store.close()
    limit = _store.MAX_BUFFERED / (1 << 20)
    assert grown < limit + 48, (grown, stderr[-2000:])  # was 24 x 15 = 360 MiB
    assert cut >= 24 - limit // 15, (cut, stderr[-2000:])
    assert "buffered for all connections" in stderr
