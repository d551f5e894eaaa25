"""collectives.ps under faults and bad input: a dead worker is dropped, a dead server names
itself to every worker, a malformed push is refused on the sender."""
from __future__ import annotations

import numpy as np
import pytest

from test_ps import _run
import _ps_model as M

WORKER_DIES = """
import os, signal
if role.is_server:
    reps = ps.serve(M.SHAPES, ps.SGD(lr=0.05), "sync")
    emit("reports", who=[r.contributors for r in reps])
else:
    w = ps.worker(M.SHAPES)
    flat = w.start(M.initial() if role.index == 0 else None)
    for k in range(10):
        if role.index == 1 and k == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        flat = w.push_pull(M.grad(flat, k, slice(role.index, None, 3)))
    emit("final", versions=w.versions)
    w.finish()
"""


@pytest.mark.timeout(60)
def test_a_dead_worker_is_dropped_and_training_goes_on():
    res = _run(5, 2, WORKER_DIES)
    assert not res.timed_out, res.report()
    assert res[1].returncode == -9, res.report()
    for r in (0, 2, 3, 4):
        assert res[r].returncode == 0, res.report()
    for r in (0, 2):
        assert res[r].one("final")["versions"] == [10, 10]
    for r in (3, 4):
        who = res[r].one("reports")["who"]
        assert who == [[0, 1, 2]] * 3 + [[0, 2]] * 7, who
        assert "dropping worker 1" in res[r].stderr


SERVER_DIES = """
import os, signal, time
def die(report):
    if report.step == 4:
        os.kill(os.getpid(), signal.SIGKILL)
if role.is_server:
    ps.serve(M.SHAPES, ps.SGD(lr=0.05), "sync", on_step=die if role.index == 1 else None)
else:
    w = ps.worker(M.SHAPES)
    flat = w.start(M.initial() if role.index == 0 else None)
    try:
        for k in range(20):
            flat = w.push_pull(M.grad(flat, k, slice(role.index, None, 2)))
    except ps.PSError as exc:
        emit("error", text=str(exc), at=time.monotonic())
        raise SystemExit(3)
"""


@pytest.mark.timeout(60)
def test_a_dead_server_fails_every_worker_naming_it():
    res = _run(4, 2, SERVER_DIES, env={"COLLECTIVES_TIMEOUT": "20"})
    assert not res.timed_out, res.report()
    assert res[3].returncode == -9, res.report()
    for r in (0, 1):
        assert res[r].returncode == 3, res.report()
        assert "parameter server 1 (rank 3) failed" in res[r].one("error")["text"]
    assert res.elapsed < 15, res.report()  # well within COLLECTIVES_TIMEOUT: not by timeout
    assert res[2].returncode == 0, res.report()  # the other server saw its workers go


BAD_INPUT = """
from collectives.ps import _wire as W
if role.is_server:
    got = []
    ps.serve(M.SHAPES, ps.SGD(lr=0.5), "sync", server=got.append)
    emit("server", params=got[0].params.tolist(), version=got[0].version)
else:
    w = ps.worker(M.SHAPES)
    flat = w.start(M.initial()).copy()
    errors = []
    for bad in (np.zeros(M.TOTAL - 1, np.float32), np.zeros((5, 5), np.float32),
                np.zeros(M.TOTAL, np.float64)):
        try:
            w.push_pull(bad)
        except (TypeError, ValueError) as exc:
            errors.append(type(exc).__name__ + ": " + str(exc))
    # Messages that bypass the checks above: the server refuses them, changes nothing.
    g = np.ones(M.TOTAL, np.float32)
    forged = [W.message(W.PUSH, 0, 0, 0, w.layout.hash, g[:-3]),          # short shard
              W.message(W.PUSH, 0, 0, 0, w.layout.hash, g.astype(np.float64)),  # size as f64
              W.message(W.PUSH, 0, 0, 0, 12345, g),                       # another layout
              W.message(W.PUSH, 0, 0, 7, w.layout.hash, g),               # another worker
              W.message(W.PUSH, 5, 0, 0, w.layout.hash, g)]               # a future step
    for msg in forged:
        try:
            w._exchange(0, msg, True)
        except ps.PSError as exc:
            errors.append("PSError: " + str(exc))
    after = w.push_pull(np.full(M.TOTAL, 2.0, np.float32))
    emit("worker", errors=errors, params=after.tolist())
    w.finish()
"""


@pytest.mark.timeout(60)
def test_bad_shard_size_or_dtype_is_an_error_on_the_sender_never_a_corrupted_parameter():
    res = _run(2, 1, BAD_INPUT).assert_ok()
    errors = res[0].one("worker")["errors"]
    assert len(errors) == 8, errors
    assert errors[0].startswith("ValueError") and "24 elements" in errors[0]
    assert errors[1].startswith("ValueError")
    assert errors[2].startswith("TypeError") and "float64" in errors[2]
    assert all(e.startswith("PSError: parameter server 0: rejected") for e in errors[3:5])
    assert "layout" in errors[5] and "worker 7" in errors[6] and "version 5" in errors[7]
    want = M.initial() - np.float32(0.5) * np.float32(2.0)  # only the one good push applied
    np.testing.assert_allclose(res[0].one("worker")["params"], want, atol=1e-6)
    assert res[1].one("server")["version"] == 1


NO_INIT = """
import os, signal
if role.is_server:
    ps.serve(M.SHAPES, ps.SGD(lr=0.05), "sync")
else:
    w = ps.worker(M.SHAPES)
    if role.index == 0:
        os.kill(os.getpid(), signal.SIGKILL)  # before sending the initial values
    try:
        w.start(None)
    except ps.PSError as exc:
        emit("error", text=str(exc))
"""


@pytest.mark.timeout(60)
def test_workers_fail_at_once_when_worker_0_dies_before_sending_the_initial_model():
    res = _run(3, 1, NO_INIT, env={"COLLECTIVES_TIMEOUT": "30"})
    assert not res.timed_out and res.elapsed < 20, res.report()
    assert "worker 0 left before sending the initial parameters" in res[1].one("error")["text"]
    assert res[2].returncode == 0, res.report()
