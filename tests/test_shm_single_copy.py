"""Single copy over shared memory (transport/shm_cma.c, schedule/single_copy.c).

From COLLECTIVES_SHM_SINGLE_COPY bytes up a shared-memory message is a
descriptor the receiver follows with process_vm_readv. These worlds set the
threshold low (4 KiB) so that many messages of every collective take that
path, next to others that stay on the ring, and check every element. The
test-only COLLECTIVES_SHM_CMA_FAULT proves which path a call took: with
``overlong`` every descriptor claims 4 KiB more than its message, which the
receiver must refuse naming the sender, so a collective that raises it went
by descriptor and one that does not went through the ring. Reducing
collectives (allreduce, reduce_scatter) stay on the ring by design; the grid
runs them anyway, beside the copying ones, at the same sizes.
"""
from __future__ import annotations

import re

import pytest

from conftest import run_world

SC_ENV = {"COLLECTIVES_TRANSPORT": "shm", "COLLECTIVES_SHM_SINGLE_COPY": "4096"}

GRID = r"""
import numpy as np
from collectives import MPI
comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
OPS = {"sum": (MPI.SUM, lambda xs: sum(xs[1:], xs[0])), "max": (MPI.MAX, lambda xs: np.maximum.reduce(xs))}

def data(k, cnt, dt, salt):
    return ((np.arange(cnt, dtype=np.int64) * (k + 3) + salt) % 61).astype(dt)

def view(cnt, dt, off):
    # a buffer starting `off` elements into a larger one (not page-aligned)
    return np.zeros(cnt + off + 5, dt)[off:off + cnt]

case = 0
# element counts whose per-message bytes fall around the 4096-byte threshold
# (a ring allreduce message is about count/n elements) and far above it
for cnt in [1000, 1023 * n, 1024 * n, 1025 * n, 4096, 30001, 262147]:
    for dt in [np.float32, np.float64, np.int32, np.int8, np.float16]:
        for off in [0, 3]:
            case += 1
            salt = case
            mine = data(r, cnt, dt, salt)
            xs = [data(k, cnt, dt, salt) for k in range(n)]
            for opname, (op, ref) in OPS.items():
                want = ref(xs)
                for alg in ["ring", "tree", "butterfly"]:
                    out = view(cnt, dt, off)
                    comm.Allreduce(mine, out, op=op, algorithm=alg)
                    expect(np.array_equal(out, want), (cnt, str(dt), off, opname, alg), "allreduce")
                    inp = view(cnt, dt, off)
                    inp[:] = mine
                    comm.Allreduce(MPI.IN_PLACE, inp, op=op, algorithm=alg)
                    expect(np.array_equal(inp, want), (cnt, str(dt), off, opname, alg), "in-place")
            g = view(cnt * n, dt, off)
            comm.Allgather(mine, g)
            expect(np.array_equal(g, np.concatenate(xs)), (cnt, str(dt), off), "allgather")
            for root in range(n):
                b = view(cnt, dt, off)
                if r == root:
                    b[:] = mine
                comm.Bcast(b, root=root)
                expect(np.array_equal(b, xs[root]), (cnt, str(dt), off, root), "bcast")
            full = [data(k, cnt * n, dt, salt) for k in range(n)]
            rs = view(cnt, dt, off)
            comm.Reduce_scatter_block(full[r], rs, op=MPI.SUM)
            want = sum(full[1:], full[0])[r * cnt:(r + 1) * cnt]
            expect(np.array_equal(rs, want), (cnt, str(dt), off), "reduce_scatter")
emit("cases", n=case)
"""


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_single_copy_results_are_exact(n):
    res = run_world(n, GRID, env=SC_ENV, timeout=140)
    res.assert_ok()
    for rr in res.ranks:
        assert rr.one("cases")["n"] == 70


# Each collective at a size whose messages are above the threshold, under the
# overlong fault: the call must fail on a receiver, naming the sender and both
# lengths; a small call before it (all messages below 4096 bytes) must not.
FAULT = r"""
import re, numpy as np
from collectives import MPI
comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
small = np.ones(256, np.float32)
comm.Allreduce(MPI.IN_PLACE, small)
expect(small[0] == n, "small", "small allreduce")
kind = ARGS[0]
m = (1 << 18) // n
big = np.ones(m * n, np.float32)
try:
    if kind == "allreduce":
        comm.Allreduce(MPI.IN_PLACE, big)
    elif kind == "allgather":
        comm.Allgather(big[:m], np.empty(m * n, np.float32))
    elif kind == "bcast":
        comm.Bcast(big, root=n - 1)
    else:
        comm.Reduce_scatter_block(big, np.empty(m, np.float32))
    emit("outcome", error=None)
except MPI.Exception as e:
    emit("outcome", error=str(e))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["allgather", "bcast"])
def test_descriptor_longer_than_the_receive_is_refused(kind):
    res = run_world(3, FAULT.replace("ARGS[0]", repr(kind)), timeout=50,
                    env={**SC_ENV, "COLLECTIVES_SHM_CMA_FAULT": "overlong"}, collective_timeout=10)
    assert not res.timed_out, res.report()
    errors = [rr.one("outcome")["error"] for rr in res.ranks]
    first = [e for e in errors if e and "single-copy descriptor names" in e]
    assert first, res.report()
    m = re.search(r"rank (\d+): rank (\d+)'s single-copy descriptor names (\d+) bytes, the receive "
                  r"posted for it expects (\d+)", first[0])
    assert m and m.group(1) != m.group(2) and int(m.group(3)) == int(m.group(4)) + 4096, first[0]
    # every rank fails (the others because the communicator broke), none hangs
    assert all(errors), res.report()
    assert not any(rr.get("fail") for rr in res.ranks), res.report()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["allreduce", "reduce_scatter"])
def test_reducing_collectives_stay_on_the_ring(kind):
    """Reduced messages are not sent by descriptor (schedule/single_copy.c says
    why): the overlong fault, which breaks every descriptor, changes nothing."""
    res = run_world(3, FAULT.replace("ARGS[0]", repr(kind)), timeout=50,
                    env={**SC_ENV, "COLLECTIVES_SHM_CMA_FAULT": "overlong"}, collective_timeout=10)
    res.assert_ok()
    assert [rr.one("outcome")["error"] for rr in res.ranks] == [None] * 3, res.report()


PLAIN = r"""
import numpy as np
from collectives import MPI
comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
for cnt in [1000, 70000, 1 << 18]:
    a = np.arange(cnt, dtype=np.float32) + r
    out = np.empty_like(a)
    comm.Allreduce(a, out)
    expect(np.array_equal(out, n * np.arange(cnt, dtype=np.float32) + n * (n - 1) / 2), cnt, "allreduce")
    g = np.empty(cnt * n, np.float32)
    comm.Allgather(a, g)
    expect(np.array_equal(g[cnt:2 * cnt], np.arange(cnt, dtype=np.float32) + 1), cnt, "allgather")
emit("plain")
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["refused", "off"])
def test_without_single_copy_the_ring_carries_everything(how):
    """A refused probe (ptrace not permitted, simulated) warns once per process with
    the fix and uses the ring; COLLECTIVES_SHM_SINGLE_COPY=0 never probes nor warns.
    Either way no descriptor is sent: the overlong fault, which would break any
    descriptor, changes nothing."""
    env = {**SC_ENV, "COLLECTIVES_SHM_CMA_FAULT": "refuse" if how == "refused" else "overlong"}
    if how == "off":
        env["COLLECTIVES_SHM_SINGLE_COPY"] = "0"
    res = run_world(3, PLAIN, env=env, timeout=50)
    res.assert_ok()
    for rr in res.ranks:
        rr.one("plain")
        warned = rr.stderr.count("cannot read rank")
        if how == "refused":
            assert warned == 1, rr.text()
            assert "ptrace_scope=0" in rr.stderr and "SYS_PTRACE" in rr.stderr, rr.text()
        else:
            assert warned == 0, rr.text()


DEATH = r"""
import os, threading, time, numpy as np
from collectives import MPI
comm = MPI.COMM_WORLD
r = comm.rank
comm.Barrier()
big = np.ones(1 << 20, np.float32)
if r == victim and victim == 1:
    # the root: posts its descriptor, waits for the ack that never comes, and
    # dies while it waits
    threading.Timer(1.0, lambda: os._exit(3)).start()
    comm.Bcast(big, root=1)
    os._exit(4)
if r == victim:  # the receiver dies without reading the root's descriptor
    time.sleep(1.0)
    os._exit(3)
if victim == 1:
    time.sleep(2.0)  # the victim is dead by now; its descriptor waits in the ring
t0 = time.monotonic()
try:
    comm.Bcast(big, root=1)
    emit("outcome", error=None)
except MPI.Exception as e:
    emit("outcome", error=str(e), elapsed=time.monotonic() - t0)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("victim", [1, 0])
def test_peer_dying_around_a_single_copy_transfer_is_named(victim):
    """victim 1: the sender dies with its descriptor unread; the receiver's read
    fails (or the death shows first) and names it. victim 0: the receiver dies
    while the sender waits for its ack; the sender names it. Nothing hangs."""
    body = "victim = %d\n" % victim + DEATH
    res = run_world(2, body, env=SC_ENV, timeout=50, collective_timeout=20)
    assert not res.timed_out, res.report()
    other = 1 - victim
    assert res[victim].returncode == 3, res.report()
    out = res[other].one("outcome")
    assert out["error"] and re.search(rf"\brank {victim}\b", out["error"]), res.report()
    assert out["elapsed"] < 10, res.report()
