"""Pickles from peers in a job without a secret load as plain data only (issue 37, section 4).

Without a job secret anyone who can reach a rank's port can pose as a peer
(test_security.py shows the links of a job with one refuse that), so the
object collectives must not run what a peer's pickle names. Here rank 0
stands in for such a peer: the pickle it sends would create a file when
loaded. Rank 1 must refuse it, saying how to give the job a secret, and load
plain data (containers, numpy arrays, torch tensors, an optimizer's state)
as before; with a secret, or COLLECTIVES_PICKLE=any, pickles load as mpi4py
loads them.
"""
from __future__ import annotations

import collections
import os
import pickle

import numpy as np
import pytest

from collectives.rendezvous import safe_pickle
from conftest import run_world

pytestmark = pytest.mark.timeout(120)


class _Runs:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_plain_data_loads_and_code_does_not(monkeypatch, tmp_path):
    monkeypatch.delenv("COLLECTIVES_JOB_SECRET", raising=False)
    monkeypatch.delenv("COLLECTIVES_JOB_SECRET_FILE", raising=False)
    monkeypatch.delenv("COLLECTIVES_PICKLE", raising=False)
    plain = {"a": [1, 2.5, "s", b"b", None, True], "t": (1, frozenset({2})),
             "od": collections.OrderedDict(x=1), "arr": np.arange(6, dtype=np.float32).reshape(2, 3),
             "scalar": np.int64(7)}
    got = safe_pickle.loads(pickle.dumps(plain, pickle.HIGHEST_PROTOCOL))
    assert np.array_equal(got.pop("arr"), plain.pop("arr")) and got == plain
    target = tmp_path / "ran"
    for evil in (_Runs(str(target)), np.array([_Runs(str(target))], dtype=object), print):
        with pytest.raises(safe_pickle.UnsafePickleError, match="COLLECTIVES_JOB_SECRET"):
            safe_pickle.loads(pickle.dumps(evil, pickle.HIGHEST_PROTOCOL))
    assert not target.exists()
    monkeypatch.setenv("COLLECTIVES_JOB_SECRET", "x" * 32)
    assert not safe_pickle.restricted()
    monkeypatch.setenv("COLLECTIVES_PICKLE", "plain")
    assert safe_pickle.restricted()


BODY = r"""
import collections, pickle
from collectives import MPI
comm = MPI.COMM_WORLD
target = os.path.join(os.environ["WORLD_DIR"], "ran")

class Runs:  # what a peer that is not the job's would send
    def __reduce__(self):
        return (os.makedirs, (target, 0o777, True))

r = comm.rank
for name, call in [("bcast", lambda: comm.bcast(Runs() if r == 0 else None, root=0)),
                   ("allgather", lambda: comm.allgather(Runs() if r == 0 else 1)),
                   ("recv", lambda: comm.send(Runs(), 1, tag=3) if r == 0 else comm.recv(source=0, tag=3))]:
    try:
        call()
        emit("loaded", what=name, ran=os.path.exists(target))
    except Exception as exc:
        emit("refused", what=name, type=type(exc).__name__, message=str(exc),
             ran=os.path.exists(target))
    comm.Barrier()
plain = comm.bcast({"w": np.arange(4.0), "od": collections.OrderedDict(a=(1, "x"))}, root=0)
emit("plain", ok=plain["w"].tolist() == [0, 1, 2, 3] and plain["od"] == {"a": (1, "x")})
"""


def test_an_unauthenticated_job_does_not_run_a_peers_pickle():
    res = run_world(2, BODY, timeout=90)
    assert not res.timed_out, res.report()
    for what in ("bcast", "allgather", "recv"):
        got = [x for x in res[1].get("refused") if x["what"] == what]
        assert got and "COLLECTIVES_JOB_SECRET" in got[0]["message"], res.report()
        assert not got[0]["ran"], res.report()
    assert res[1].one("plain")["ok"], res.report()


@pytest.mark.parametrize("env", [{"COLLECTIVES_JOB_SECRET": "pickle-test-secret-0123456789ab"},
                                 {"COLLECTIVES_PICKLE": "any"}])
def test_an_authenticated_job_loads_pickles_as_mpi4py_does(env):
    res = run_world(2, BODY, timeout=90, env=env)
    assert not res.timed_out, res.report()
    assert [x["what"] for x in res[1].get("loaded")] == ["bcast", "allgather", "recv"], \
        res.report()
