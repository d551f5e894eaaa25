"""A setting every rank must share, set differently on one rank (issue 37, section 4).

COLLECTIVES_SEGMENT_BYTES on one rank only made its pipelined messages "out
of step" with its peers', and the error guessed "counts per rank differ?".
Every rank must instead fail at start-up, naming the variable and each
rank's value.
"""
import pytest

from conftest import free_port, run_world

pytestmark = pytest.mark.timeout(90)

BODY = r"""
from collectives import MPI
t0 = time.monotonic()
try:
    comm = MPI.COMM_WORLD
    x = np.ones(1 << 20, np.float32)
    y = np.zeros_like(x)
    comm.Allreduce(x, y, algorithm="ring")
    comm.Bcast(x, root=0)
    emit("ran")
except Exception as exc:
    emit("error", type=type(exc).__name__, message=str(exc), elapsed=time.monotonic() - t0)
"""


def _rank_env(port: int, odd_rank: int, value: str):
    def env(rank: int, n: int) -> dict:
        e = {"COLLECTIVES_RANK": rank, "COLLECTIVES_SIZE": n, "COLLECTIVES_LOCAL_RANK": rank,
             "COLLECTIVES_LOCAL_SIZE": n, "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{port}"}
        if rank == odd_rank:
            e["COLLECTIVES_SEGMENT_BYTES"] = value
        return e
    return env


def test_segment_bytes_that_differ_on_one_rank_fail_at_start_naming_the_variable():
    res = run_world(3, BODY, timeout=60, collective_timeout=10.0,
                    env={"COLLECTIVES_TRANSPORT": "tcp"},
                    rank_env=_rank_env(free_port(), 2, "64K"))
    assert not res.timed_out, res.report()
    for r in range(3):
        got = res[r].get("error")
        assert got, res.report()
        msg = got[0]["message"]
        assert msg.startswith("COLLECTIVES_SEGMENT_BYTES differs between the ranks"), msg
        assert "COLLECTIVES_SEGMENT_BYTES=65536 on rank 2" in msg, msg
        assert "COLLECTIVES_SEGMENT_BYTES=auto on ranks 0, 1" in msg, msg
        assert got[0]["elapsed"] < 8.0, got


def test_the_same_segment_bytes_written_two_ways_is_the_same():
    def env(rank: int, n: int, port: int = free_port()) -> dict:
        e = _rank_env(port, -1, "")(rank, n)
        e["COLLECTIVES_SEGMENT_BYTES"] = "1M" if rank else "1048576"
        return e

    res = run_world(2, BODY, timeout=60, collective_timeout=10.0, rank_env=env)
    res.assert_ok()
    assert all(res[r].one("ran") is not None for r in range(2)), res.report()
