"""collectives.ps: sync/backup/async/SSP on real ranks (servers are the last ranks)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import run_world
import _ps_model as M

PRELUDE = """
import numpy as np, collectives, collectives.ps as ps
import _ps_model as M
role = ps.init(num_servers=NSERVERS)
"""


def _run(n, servers, body, timeout=40.0, **kw):
    src = PRELUDE.replace("NSERVERS", str(servers)) + body
    return run_world(n, src, timeout=timeout, **kw)


SYNC = """
if role.is_server:
    reps = ps.serve(M.SHAPES, ps.SGD(lr=0.05, momentum=0.9, weight_decay=0.01), "sync")
    emit("reports", steps=[(r.step, r.contributors, r.dropped) for r in reps])
else:
    w = ps.worker(M.SHAPES)
    flat = w.start(M.initial() if role.index == 0 else None)
    n = role.num_workers
    for k in range(STEPS):
        flat = w.push_pull(M.grad(flat, k, slice(role.index, None, n)))
    emit("final", params=flat.tolist(), versions=w.versions)
    w.finish()
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n,servers", [(3, 1), (5, 2)])
def test_sync_equals_single_process_sgd(n, servers):
    steps = 15
    res = _run(n, servers, SYNC.replace("STEPS", str(steps))).assert_ok()
    want = M.sgd_reference(steps, 0.05, 0.9, 0.01)
    workers = n - servers
    for r in range(workers):
        rec = res[r].one("final")
        assert rec["versions"] == [steps] * servers
        np.testing.assert_allclose(np.array(rec["params"]), want, atol=1e-5, rtol=0)
    for r in range(workers, n):
        steps_seen = res[r].one("reports")["steps"]
        assert [s for s, _, _ in steps_seen] == list(range(steps))
        assert all(c == list(range(workers)) and d == [] for _, c, d in steps_seen)


BACKUP = """
import time
if role.is_server:
    got = []
    reps = ps.serve(M.SHAPES, ps.SGD(lr=0.05, momentum=0.9), "sync", backup_workers=1,
                    server=got.append)
    emit("reports", steps=[(r.step, r.contributors, r.dropped, r.staleness) for r in reps],
         params=got[0].params.tolist())
else:
    w = ps.worker(M.SHAPES)
    flat = w.start(M.initial() if role.index == 0 else None)
    n, pushed = role.num_workers, []
    for i in range(12):
        if role.index == n - 1:
            time.sleep(0.08)  # the straggler
        k = w.versions[0]
        pushed.append(k)
        flat = w.push_pull(M.grad(flat, k, slice(role.index, None, n)))
    emit("final", params=flat.tolist(), pushed=pushed)
    w.finish()
"""


@pytest.mark.timeout(90)
def test_backup_workers_never_apply_a_late_gradient_to_another_step():
    res = _run(4, 1, BACKUP).assert_ok()
    steps = res[3].one("reports")["steps"]
    assert [s for s, *_ in steps] == list(range(len(steps)))
    # Every push is accounted for exactly once: applied to its own step or dropped from it.
    for w in range(3):
        pushed = res[w].one("final")["pushed"]
        applied = [s for s, c, _, _ in steps if w in c]
        dropped = [s for s, _, d, _ in steps for x in d if x == w]
        assert sorted(applied + dropped) == sorted(pushed), (w, pushed, applied, dropped)
    assert any(d for _, _, d, _ in steps), "the straggler was never dropped: no backup at work"
    assert all(st == [0] * len(c) for _, c, _, st in steps)
    # The parameters are exactly those of replaying each step with its own contributors'
    # gradients at that step's parameters: a late gradient applied to a later step (computed
    # on older parameters, for another batch) would not match.
    want = M.replay([c for _, c, _, _ in steps], 0.05, 0.9, 3)
    got = np.array(res[3].one("reports")["params"])
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


ASYNC1 = """
if role.is_server:
    reps = ps.serve(M.SHAPES, ps.SGD(lr=0.05, momentum=0.9, weight_decay=0.01), "async")
    emit("reports", staleness=[r.staleness for r in reps])
else:
    w = ps.worker(M.SHAPES)
    flat = w.start(M.initial())
    for k in range(15):
        flat = w.push_pull(M.grad(flat, k))
    emit("final", params=flat.tolist())
    w.finish()
"""


@pytest.mark.timeout(60)
def test_async_with_one_worker_equals_plain_sgd():
    res = _run(2, 1, ASYNC1).assert_ok()
    np.testing.assert_allclose(np.array(res[0].one("final")["params"]),
                               M.sgd_reference(15, 0.05, 0.9, 0.01), atol=1e-5, rtol=0)
    assert res[1].one("reports")["staleness"] == [[0]] * 15


SSP = """
import time
if role.is_server:
    reps = ps.serve(M.SHAPES, ps.SGD(lr=0.01), MODE, staleness=2)
    emit("reports", ahead=[r.ahead for r in reps], staleness=[r.staleness for r in reps],
         who=[r.contributors for r in reps])
else:
    w = ps.worker(M.SHAPES)
    flat = w.start(M.initial() if role.index == 0 else None)
    for i in range(12):
        if role.index == role.num_workers - 1:
            time.sleep(0.06)
        flat = w.push_pull(M.grad(flat, w.versions[0], slice(role.index, None, 3)))
    w.finish()
"""


@pytest.mark.timeout(90)
def test_ssp_never_lets_a_worker_run_more_than_s_ahead():
    rep = _run(4, 1, SSP.replace("MODE", '"ssp"')).assert_ok()[3].one("reports")
    ahead = [a for (a,) in rep["ahead"]]
    assert len(ahead) == 36
    assert max(ahead) == 2, ahead  # reached (the fast workers waited), never passed
    assert max(s for (s,) in rep["staleness"]) > 0  # updates were applied on arrival
    # Async under the same straggler runs further ahead: the bound above is SSP's doing.
    rep = _run(4, 1, SSP.replace("MODE", '"async"')).assert_ok()[3].one("reports")
    clocks, gaps = {0: 0, 1: 0, 2: 0}, []
    for (w,) in rep["who"]:
        gaps.append(clocks[w] - min(clocks[x] for x in clocks if clocks[x] < 12 or x == w))
        clocks[w] += 1
    assert max(gaps) > 2, gaps


LAUNCHED = """
import os, signal, sys
sys.path.insert(0, TESTS)
import numpy as np, collectives.ps as ps
import _ps_model as M
role = ps.init()  # the number of servers comes from COLLECTIVES_PS_SERVERS
if role.is_server:
    reps = ps.serve(M.SHAPES, ps.SGD(lr=0.05), "sync")
    print("server", role.index, "steps", len(reps), flush=True)
else:
    w = ps.worker(M.SHAPES)
    flat = w.start(M.initial() if role.index == 0 else None)
    for k in range(5):
        if k == 2 and role.index == int(os.environ.get("PS_DIE", "-1")):
            os.kill(os.getpid(), signal.SIGKILL)
        flat = w.push_pull(M.grad(flat, k, slice(role.index, None, role.num_workers)))
    print("worker", role.index, "of", role.num_workers, "done", flush=True)
    w.finish()
"""


@pytest.mark.timeout(60)
def test_launcher_servers_flag(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from conftest import RUN_CWD, TESTS, _LIVE, _kill, base_env

    script = tmp_path / "train.py"
    script.write_text(LAUNCHED.replace("TESTS", repr(str(TESTS))))
    cmd = [sys.executable, "-m", "collectives.run", "-np", "4", "--servers", "2",
           sys.executable, str(script)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         env=base_env({"COLLECTIVES_TIMEOUT": "30"}), cwd=str(RUN_CWD),
                         start_new_session=True)
    _LIVE.add(p)
    try:
        out, _ = p.communicate(timeout=45)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
        _kill(p)
    text = out.decode()
    assert p.returncode == 0, text
    for line in ("[0]<stdout>:worker 0 of 2 done", "[1]<stdout>:worker 1 of 2 done",
                 "[2]<stdout>:server 0 steps 5", "[3]<stdout>:server 1 steps 5"):
        assert line in text, text
    # A worker that dies stops no one under --servers: the servers drop it, the job goes on
    # and ends with the dead worker's code.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         env=base_env({"COLLECTIVES_TIMEOUT": "30", "PS_DIE": "1"}),
                         cwd=str(RUN_CWD), start_new_session=True)
    _LIVE.add(p)
    try:
        out, _ = p.communicate(timeout=45)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
        _kill(p)
    text = out.decode()
    assert p.returncode == 128 + 9, text
    for line in ("[0]<stdout>:worker 0 of 2 done", "[2]<stdout>:server 0 steps 5",
                 "[3]<stdout>:server 1 steps 5", "rank 1 was killed by signal 9 (SIGKILL); "
                 "the job goes on without it"):
        assert line in text, text
    bad = subprocess.run(cmd[:5] + ["--servers", "4"] + cmd[7:], capture_output=True, text=True,
                         env=base_env(), cwd=str(RUN_CWD), timeout=30)
    assert bad.returncode == 2 and "--servers 4: need 1 <= servers < -np (4)" in bad.stderr


def test_init_refuses_a_world_without_workers():
    res = run_world(2, "import collectives.ps as ps\n"
                       "try:\n    ps.init(num_servers=2)\n"
                       "except ValueError as e:\n    emit('err', text=str(e))\n", timeout=30)
    res.assert_ok()
    assert all("2 servers in a world of 2 ranks" in res[r].one("err")["text"] for r in (0, 1))


@pytest.mark.timeout(60)
def test_roles_from_the_environment_under_torchrun_variables():
    from conftest import free_port

    port = free_port(pair=True)  # torchrun: our store on MASTER_PORT + 1
    torchrun = lambda rank, n: {"RANK": rank, "WORLD_SIZE": n, "LOCAL_RANK": rank,  # noqa: E731
                                "LOCAL_WORLD_SIZE": n, "MASTER_ADDR": "127.0.0.1",
                                "MASTER_PORT": port, "TORCHELASTIC_RUN_ID": "none"}
    body = """
import collectives.ps as ps
role = ps.init()
emit("role", server=role.is_server, index=role.index, servers=role.server_ranks)
if role.is_server:
    ps.serve([(4,)], ps.Adam(lr=0.1), "async")
else:
    w = ps.worker([(4,)])
    w.start(np.ones(4, np.float32))
    w.push_pull(np.ones(4, np.float32))
    w.finish()
"""
    res = run_world(3, body, rank_env=torchrun, env={"COLLECTIVES_PS_SERVERS": "1"},
                    timeout=40).assert_ok()
    roles = [(res[r].one("role")["server"], res[r].one("role")["index"]) for r in range(3)]
    assert roles == [(False, 0), (False, 1), (True, 0)]
    assert res[0].one("role")["servers"] == [2]


def test_server_keeps_a_bounded_number_of_reports():
    """A long job's reports stay bounded (the newest kept); no ranks needed: no link is used."""
    import collectives.ps as ps

    srv = ps.Server({0: None}, ps.Layout([(3,)], 1), 0, ps.SGD(lr=1.0), "async", keep_reports=4)
    srv.set_params(np.zeros(3, np.float32))
    with srv.cv:
        for k in range(10):
            srv._push(0, k, np.ones(3, np.float32))
    assert [r.step for r in srv.reports] == [6, 7, 8, 9] and sorted(srv.by_step) == [6, 7, 8, 9]
    np.testing.assert_array_equal(srv.params, -10 * np.ones(3, np.float32))
    assert srv.snapshot[64:].view("<f4").tolist() == [-10.0] * 3
