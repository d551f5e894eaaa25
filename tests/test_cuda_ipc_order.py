"""CUDA IPC in stream order (issue 40, item 3) on the GPU emulated in host memory
(COLLECTIVES_CUDA_FAKE=1): each IPC record names an interprocess event recorded on
the writer's stream, the other side's stream waits on it, and no host waits for its
GPU inside a call (native/transport/cuda_ipc.c). The emulated GPU runs queued work
late and makes a stream that waits on another process's event stop until that
process's lane has run the record (native/cuda/fake.c), so a missing wait shows as
wrong values here. 4 KiB segments make every call many segments; exact values at 2
and 3 ranks for allreduce (ring, butterfly, tree), allgatherv, broadcast from every
root and reduce_scatter; one event per link and direction (COLLECTIVES_CUDA_IPC_SLOTS=1)
reuses an event for every record.
"""
import pytest

from conftest import free_port, run_world
from test_cuda_paths import BACKENDS, COMMON, _env

ORDER_BODY = COMMON + r"""
SEG = 4096  # COLLECTIVES_CUDA_SEGMENT_BYTES below
before = _core.cuda_stats(core)
cases = 0
for alg in ("ring", "butterfly", "tree"):
    for dtype, op in (("float32", "sum"), ("int32", "max"), ("float64", "avg")):
        esize = np.dtype(np_dtype(dtype)).itemsize
        count = 10 * n * SEG // esize + 5  # about 10 segments per chunk, uneven
        allreduce_case(alg, dtype, op, count, cases % 2 == 1, seed=cases)
        cases += 1
cases += others_case("float32", 6 * SEG // 4 + 3)
emit("order", cases=cases, **delta(before))
"""


def _run(n: int, backend: str, extra: dict, rank_extra=None):
    env = _env(backend, {"COLLECTIVES_CUDA_SEGMENT_BYTES": "4K", **extra})
    if rank_extra is None:
        return run_world(n, ORDER_BODY, timeout=120, env=env, collective_timeout=30)
    port = free_port()

    def rank_env(rank: int, size: int) -> dict:
        return {"COLLECTIVES_RANK": rank, "COLLECTIVES_SIZE": size, "COLLECTIVES_LOCAL_RANK": rank,
                "COLLECTIVES_LOCAL_SIZE": size, "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{port}",
                **rank_extra(rank)}
    return run_world(n, ORDER_BODY, timeout=120, env=env, collective_timeout=30,
                     rank_env=rank_env)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n,slots", [(2, "1"), (3, "2")])
def test_ipc_stream_order_many_segments_exact(n, slots, backend):
    """Exact values over many segments, every record ordered by an event, events
    reused (a ring of 1 or 2 per link), and not one host wait on the GPU inside a call."""
    res = _run(n, backend, {"COLLECTIVES_CUDA_IPC_SLOTS": slots}).assert_ok()
    for rr in res.ranks:
        got = rr.one("order")
        assert got["staged_pieces"] == 0 and got["small_calls"] == 0, got
        assert got["ipc_descs"] > 10 * got["cases"], got
        # every DESC and every ACK carries a signal; each link's first `slots` are new
        assert got["ipc_signals"] > got["ipc_descs"], got
        assert got["ipc_slot_reuses"] >= got["ipc_signals"] - int(slots) * (n - 1), got
        assert got["ipc_max_posted"] >= 2, got
        assert got["gpu_waits"] == 0, got


@pytest.mark.timeout(150)
def test_ipc_host_order_still_exact():
    """COLLECTIVES_CUDA_IPC_EVENTS=0: the host-ordered protocol (a round trip per
    segment), exact, with no event."""
    res = _run(2, "fake", {"COLLECTIVES_CUDA_IPC_EVENTS": "0"}).assert_ok()
    for rr in res.ranks:
        got = rr.one("order")
        assert got["ipc_descs"] > 10 * got["cases"] and got["ipc_signals"] == 0, got


@pytest.mark.timeout(150)
def test_ipc_order_mismatch_names_both_sides():
    """A rank ordering by events and one ordering on the host fail, naming the setting."""
    res = _run(2, "fake", {}, rank_extra=lambda r: {"COLLECTIVES_CUDA_IPC_EVENTS": str(r)})
    assert not res.timed_out, res.report()
    text = "\n".join(r.stdout + r.stderr for r in res.ranks)
    assert "COLLECTIVES_CUDA_IPC_EVENTS alike" in text, res.report()
    assert all(r.returncode != 0 or r.get("fail") for r in res.ranks), res.report()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("fault", ["nowait", "noack"])
def test_emulated_gpu_catches_a_missing_wait(fault):
    """With one wait skipped (test-only faults) some value is wrong: nowait, the reader's
    wait on the writer's event (reads run before the bytes are produced); noack, the
    writer's wait on the reader's event (the writer's next overwrite, or the caller's
    next use of its buffer, runs before the read). So the exact results above are
    the events' doing, not the emulation's timing. 3 ranks: at 2, a ring's ACK and
    its next DESC come from the same kernel, so either wait covers the other."""
    res = _run(3, "fake", {"COLLECTIVES_CUDA_IPC_FAULT": fault})
    assert not res.timed_out, res.report()
    assert any(r.get("fail") for r in res.ranks), res.report()
