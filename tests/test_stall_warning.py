"""A blocking collective that waits without progress warns, naming the ranks it waits for.

COLLECTIVES_STALL_WARN (base/stall.c): rank 0 enters an allreduce that
rank 1 joins only after rank 0's warning has appeared in rank 0's stderr
(read from the world's directory: no sleep, no timing assertion): the
first call, which waits in setting up the link, then once on the
small-allreduce fast path (two ranks over shared memory) and once on the
schedule executor (a 4 MiB ring); every call then completes with the right
sums, so a warning never fails a call.
"""
from __future__ import annotations

import socket

import pytest

_BODY = """
import os
import time

import numpy as np

from collectives import MPI

comm = MPI.COMM_WORLD
r = comm.Get_rank()
err0 = os.path.join(os.environ["WORLD_DIR"], "err0")


def warnings_of_rank0(what: str = "has moved nothing for") -> int:
    try:
        with open(err0, errors="replace") as f:
            return f.read().count(what)
    except OSError:
        return 0


def wait_for_warning(case, what: str = "has moved nothing for") -> None:
    seen, end = warnings_of_rank0(what), time.monotonic() + 20
    while warnings_of_rank0(what) <= seen and time.monotonic() < end:
        time.sleep(0.02)
    expect(warnings_of_rank0(what) > seen, case, "rank 0 did not warn within 20 s")


x = np.ones(4, dtype=np.float32)
if r == 1:  # rank 0 dials rank 1 and waits for its answer, which comes once rank 1 calls
    wait_for_warning("link", "setting up the link to rank 1")
comm.Allreduce(MPI.IN_PLACE, x)  # the link exists from here on (the fast path needs it)
for count in (4, 1 << 20):  # 16 B: fast path; 4 MiB: the schedule
    buf = np.full(count, r + 1, dtype=np.float32)
    if r == 1:
        wait_for_warning(count)
    comm.Allreduce(MPI.IN_PLACE, buf)
    expect(bool((buf == 3).all()), count, f"sum {buf[:4]}")
"""


@pytest.mark.timeout(60)
def test_stall_warning_names_the_rank_not_arrived(world) -> None:
    """Rank 0 warns about rank 1 (by rank and host) in each of three waits; every call completes."""
    res = world(2, _BODY, env={"COLLECTIVES_STALL_WARN": "0.3"}, collective_timeout=40,
                timeout=50).assert_ok()
    lines = [ln for ln in res[0].stderr.splitlines() if "has moved nothing for" in ln]
    assert len(lines) >= 2, res.report()
    host = socket.gethostname()
    for line in lines:
        assert "COLLECTIVES WARN" in line and "allreduce #" in line, line
        assert f"waiting for rank 1 on {host}" in line, line
        assert "(its timeout)" in line and "COLLECTIVES_STALL_WARN" in line, line
    assert any("has not arrived: nothing of this call from it yet" in ln for ln in lines), lines
    link = [ln for ln in res[0].stderr.splitlines() if "setting up the link" in ln]
    assert link and all(f"setting up the link to rank 1 on {host} has waited" in ln and
                        "it has not answered" in ln for ln in link), res.report()
    assert "has moved nothing" not in res[1].stderr, res.report()
