"""The small-allreduce fast path over shared memory (schedule/fast.c).

Small allreduces at a power-of-two rank count over existing shared-memory
links run butterfly's full exchange without building a schedule. Point-to-
point traffic sends every later call through the general path, which is how
these tests get both paths in one world: the same cases before and after a
Send/Recv must give the same bits, and the TUNE log shows which path ran
each call.
"""
from __future__ import annotations

import re

import pytest

from conftest import run_world

BOTH = r"""
import numpy as np
from collectives import MPI
comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
comm.Barrier()  # every link exists: from here small allreduces take the fast path

def data(k, q, dt, opname, cnt):
    rng = np.random.default_rng(1000 * k + q)
    if dt.startswith("float"):
        return rng.standard_normal(cnt).astype(dt)
    return rng.integers(1, 4 if opname == "prod" else 100, cnt).astype(dt)

def cases():
    k = 0
    for dt in MPI_DTYPES:
        for opname, op in OPS.items():
            for cnt in [1, 3, 64, 4096 // np.dtype(dt).itemsize]:
                for inplace in [False, True]:
                    k += 1
                    yield k, dt, opname, op, data(k, r, dt, opname, cnt), inplace

def run_all():
    out = {}
    for k, dt, opname, op, x, inplace in cases():
        if inplace:
            y = x.copy()
            comm.Allreduce(MPI.IN_PLACE, y, op=op)
        else:
            y = np.empty_like(x)
            comm.Allreduce(x, y, op=op)
        out[k] = y
    return out

fast = run_all()
ncalls = len(fast)
# point-to-point traffic: every later call takes the general path
if r % 2 == 0:
    comm.Send(np.arange(4.0), dest=r + 1)
else:
    comm.Recv(np.empty(4), source=r - 1)
general = run_all()
for k in fast:
    expect(fast[k].tobytes() == general[k].tobytes(), k, "fast path differs from the general path")
REF = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
with np.errstate(over="ignore"):
    for k, dt, opname, op, x, inplace in cases():
        xs = [data(k, q, dt, opname, len(x)) for q in range(n)]
        want = xs[0]
        for q in range(1, n):
            want = REF[opname](want, xs[q]).astype(dt)
        if not dt.startswith("float") or opname in ("min", "max"):
            expect(np.array_equal(fast[k], want), (k, dt, opname), "fast path result")
        else:
            expect(np.allclose(fast[k], want, rtol=1e-2, atol=1e-2), (k, dt, opname), "fast path result")
emit("calls", n=ncalls)
"""


def _paths(stderr):
    fast = len(re.findall(r"allreduce #\d+ \d+ bytes on \d+ ranks: butterfly, fast path", stderr))
    general = len(re.findall(r"allreduce #\d+ \d+ bytes on \d+ ranks: butterfly\n", stderr))
    return fast, general


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 4])
def test_fast_path_gives_the_general_paths_bits(n):
    res = run_world(n, BOTH, env={"COLLECTIVES_TRANSPORT": "shm", "COLLECTIVES_DEBUG": "INFO",
                                  "COLLECTIVES_DEBUG_SUBSYS": "TUNE"}, timeout=80)
    res.assert_ok()
    for rr in res.ranks:
        calls = rr.one("calls")["n"]
        fast, general = _paths(rr.stderr)
        assert (fast, general) == (calls, calls), (fast, general, calls)


MISMATCH = r"""
import numpy as np
from collectives import MPI
comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
comm.Barrier()
x = np.ones(2, np.float32)
comm.Allreduce(MPI.IN_PLACE, x)  # a good call on the fast path first
expect(x[0] == n, "good", "first call")
kind = KIND
try:
    if kind == "count":
        y = np.ones(3 if r == n - 1 else 2, np.float32)
        comm.Allreduce(MPI.IN_PLACE, y)
    elif kind == "dtype":
        y = np.ones(2, np.float64 if r == n - 1 else np.float32)
        comm.Allreduce(MPI.IN_PLACE, y)
    else:
        comm.Allreduce(MPI.IN_PLACE, np.ones(2, np.float32), op=MPI.MAX if r == n - 1 else MPI.SUM)
    emit("outcome", error=None)
except MPI.Exception as e:
    emit("outcome", error=str(e))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind,pattern", [
    ("count", r"count mismatch in allreduce #\d+: this rank has \d+ elements, rank \d+ has \d+"),
    ("dtype", r"dtype mismatch in allreduce #\d+: this rank has \w+, rank \d+ has \w+"),
    ("op", r"op mismatch in allreduce #\d+: this rank has \w+, rank \d+ has \w+"),
])
def test_fast_path_names_disagreements(kind, pattern):
    res = run_world(4, MISMATCH.replace("KIND", repr(kind)), timeout=50, collective_timeout=10,
                    env={"COLLECTIVES_TRANSPORT": "shm", "COLLECTIVES_DEBUG": "INFO",
                         "COLLECTIVES_DEBUG_SUBSYS": "TUNE"})
    assert not res.timed_out, res.report()
    assert not any(rr.get("fail") for rr in res.ranks), res.report()
    errors = [rr.one("outcome")["error"] for rr in res.ranks]
    assert all(errors), res.report()
    # rank 3's partner at the first level (rank 2) and rank 3 itself name each other
    named = [e for e in errors if re.search(pattern, e)]
    assert len(named) >= 2, errors
    assert any("rank 3" in e for e in named if e.startswith("rank 2:")), errors
    # the good call ran on the fast path on every rank
    for rr in res.ranks:
        assert _paths(rr.stderr)[0] >= 1, rr.text()


DEATH = r"""
import os, time, numpy as np
from collectives import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
x = np.ones(1, np.float64)
comm.Allreduce(MPI.IN_PLACE, x)
if comm.rank == 1:
    time.sleep(0.5)
    os._exit(3)
t0 = time.monotonic()
try:
    comm.Allreduce(MPI.IN_PLACE, x)
    emit("outcome", error=None)
except MPI.Exception as e:
    emit("outcome", error=str(e), elapsed=time.monotonic() - t0)
"""


@pytest.mark.timeout(60)
def test_fast_path_names_a_dead_peer():
    res = run_world(2, DEATH, env={"COLLECTIVES_TRANSPORT": "shm"}, timeout=50, collective_timeout=20)
    assert not res.timed_out, res.report()
    assert res[1].returncode == 3, res.report()
    out = res[0].one("outcome")
    assert out["error"] and re.search(r"\brank 1\b", out["error"]), res.report()
    assert out["elapsed"] < 10, res.report()
