"""A torch rank forked from the warm server (tests/_zygote.py) is a process as a fresh one.

run_world forks torch ranks from two servers that imported torch already. These
tests check what a rank's script can see of that: its command line, __main__,
environment, working directory, session, its own random seeds and (between
neighbouring ranks) its own hash seed, and the exit code run_world reports for
an exit, an uncaught exception and a kill, each as Popen gives for a fresh rank.
"""
from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("torch")

import _zygote  # noqa: E402
from conftest import run_world  # noqa: E402

pytestmark = pytest.mark.timeout(120)

BODY = r'''
import json, os, random, sys
import numpy as np
import torch  # the server's
print("@@ " + json.dumps({
    "tag": "seen", "main": __name__, "argv": sys.argv[1:], "cwd": os.getcwd(),
    "world_dir": os.environ["WORLD_DIR"], "rank": int(os.environ["COLLECTIVES_RANK"]),
    "sid": os.getsid(0) == os.getpid(), "pid": os.getpid(), "ppid": os.getppid(),
    "random": random.random(), "np": float(np.random.random()),
    "hash": hash("collectives") & 0xFFFFFFFF, "torch": "torch" in sys.modules,
    "extra": os.environ.get("ZYGOTE_EXTRA"), "pytest_pid": os.environ.get("PYTEST_PID")}),
    flush=True)
how = sys.argv[1]
r = int(os.environ["COLLECTIVES_RANK"])
if how == "exit" and r == 1:
    sys.exit(3)
if how == "raise" and r == 2:
    raise ValueError("rank 2's own error")
if how == "kill" and r == 3:
    os.kill(os.getpid(), signal.SIGKILL)
'''


def _world(how: str):
    body = "import signal\n" + BODY
    return run_world(4, body, args=[how], env={"ZYGOTE_EXTRA": "yes",
                                               "PYTEST_PID": str(os.getpid())})


def test_forked_ranks_see_what_a_fresh_rank_sees():
    res = _world("plain")
    seen = [r.records[0] for r in res.ranks]
    assert [s["rank"] for s in seen] == [0, 1, 2, 3]
    for s in seen:
        assert s["main"] == "__main__" and s["argv"] == ["plain"] and s["extra"] == "yes"
        assert os.path.realpath(s["cwd"]) == os.path.realpath(s["world_dir"])
        assert s["sid"], "each rank leads a session of its own (start_new_session)"
        assert s["torch"]
    assert len({s["pid"] for s in seen}) == 4
    assert len({s["random"] for s in seen}) == 4, "each rank seeds random from the OS"
    assert len({s["np"] for s in seen}) == 4, "each rank seeds numpy's global RNG from the OS"
    if os.environ.get("COLLECTIVES_TEST_FORK", "1") != "0":
        assert all(s["ppid"] != os.getpid() for s in seen), "forked by the server"
        # neighbouring ranks come from different servers, so their hash seeds differ
        assert seen[0]["hash"] != seen[1]["hash"] and seen[2]["hash"] != seen[3]["hash"]


@pytest.mark.parametrize("how,rank,code", [("exit", 1, 3), ("raise", 2, 1),
                                           ("kill", 3, -signal.SIGKILL)])
def test_exit_codes_are_reported_as_popen_does(how, rank, code):
    res = _world(how)
    codes = [r.returncode for r in res.ranks]
    assert codes[rank] == code, codes
    assert all(c == 0 for i, c in enumerate(codes) if i != rank), codes
    if how == "raise":
        assert "ValueError: rank 2's own error" in res.ranks[2].stderr


def test_a_rank_with_other_import_settings_starts_fresh():
    """A variable read at import (here OMP_NUM_THREADS) that differs from the server's:
    the rank is a fresh interpreter, a child of the test process."""
    res = run_world(2, BODY, args=["plain"], env={"OMP_NUM_THREADS": "2"})
    assert all(r.records[0]["ppid"] == os.getpid() for r in res.ranks)
    assert _zygote._sensitive({"OMP_NUM_THREADS": "2", "HOME": "/x"}) == {"OMP_NUM_THREADS": "2"}
