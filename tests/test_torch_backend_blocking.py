"""The torch.distributed backend's blocking all_reduce (issue 38, item 9), in one process.

torch says in AllreduceOptions.asyncOp whether its caller waits for the Work at once
(``dist.all_reduce`` without ``async_op``). Then a single contiguous CPU tensor is
reduced in the caller's thread by the core's blocking call, and the Work comes back
completed: no request queued, no thread started, no Future made unless asked for.
What must not change, checked here against a stub core (which call ran, what it raised)
and against gloo at one rank (what the Work says):

- the Work of a blocking call behaves as gloo's after its wait: completed, a success,
  no exception, its Future and result() holding the tensors;
- a blocking call behind queued async work is queued behind it (that work's results
  are written back first), and a queued one still runs on the core's request;
- the blocking call's errors are worded as a queued one's: a core timeout says
  gloo's "Timed out waiting 1000ms", other errors pass through unchanged;
- a script of blocking all_reduces starts none of the group's completion threads.
"""
from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not hasattr(dist.AllreduceOptions(), "asyncOp"),
                                 reason="this torch's options do not say asyncOp")]


def _opts(async_op: bool, op=None):
    opts = dist.AllreduceOptions()
    opts.asyncOp = async_op
    if op is not None:
        opts.reduceOp = op
    return opts


class _Request:
    """A core Request stand-in: Wait() returns once released, or raises `error`."""

    def __init__(self, error=None):
        self.released = threading.Event()
        self.error = error

    def Wait(self):
        assert self.released.wait(10), "never released"
        if self.error is not None:
            raise self.error


class _StubCore:
    """Records which of the core's allreduce calls ran; raises `error` from either."""

    def __init__(self, error=None):
        self.calls: list = []
        self.error = error

    def allreduce(self, sendbuf, recvbuf, op="sum", timeout=None, **_):
        self.calls.append(("allreduce", op, timeout))
        if self.error is not None:
            raise self.error

    def iallreduce(self, sendbuf, recvbuf, op="sum", timeout=None, **_):
        self.calls.append(("iallreduce", op, timeout))
        req = _Request(self.error)
        req.released.set()
        return req


def _group(core, timeout=None):
    from collectives.torch.distributed.backend import ProcessGroupCollectives
    return ProcessGroupCollectives(core, 0, 2, timeout=timeout)


def _timeout_error():
    from collectives._core import ERR_NAMES, CollectivesError
    code = {name: c for c, name in ERR_NAMES.items()}["TIMEOUT"]
    return CollectivesError(code, "rank 0: timed out after 1.0 s waiting for rank 1")


def test_blocking_call_runs_the_core_call_and_returns_completed_work():
    core = _StubCore()
    pg = _group(core, timeout=7.0)
    t = torch.ones(3)
    work = pg.allreduce([t], _opts(False, dist.ReduceOp.MAX))
    assert core.calls == [("allreduce", "max", 7.0)]
    assert work.is_completed() and work.is_success() and work.exception() is None
    assert work.wait() is True and work.wait(timeout=0.5) is True
    fut = work.get_future()
    assert fut.done() and fut.value()[0] is t and work.result()[0] is t
    # what torch's own async_op=True call and DDP take: still the queued request
    work = pg.allreduce([t], _opts(True))
    assert core.calls[-1] == ("iallreduce", "sum", 7.0)
    assert work.wait() and work.get_future().value()[0] is t
    pg.shutdown()


def test_blocking_call_behind_queued_work_is_queued_behind_it():
    """A pending async allreduce, then a blocking one: the second goes through the queue,
    so that the first's finish() (its copy back) runs before the second's completes."""
    core = _StubCore()
    pg = _group(core)
    held = _Request()
    core.iallreduce = lambda *a, **k: (core.calls.append(("iallreduce",)), held)[1]
    first = pg.allreduce([torch.ones(2)], _opts(True))
    t = torch.ones(2)
    second = pg.allreduce([t], _opts(False))  # queued: returns before the first completes
    assert core.calls == [("iallreduce",), ("iallreduce",)]
    assert not first.is_completed()
    held.released.set()
    assert second.wait() and first.wait() and second.result()[0] is t
    pg.shutdown()


@pytest.mark.parametrize("async_op", [False, True])
def test_errors_are_worded_alike_blocking_or_queued(async_op):
    from collectives._core import CollectivesError
    pg = _group(_StubCore(_timeout_error()), timeout=1.0)
    with pytest.raises(CollectivesError) as info:
        pg.allreduce([torch.ones(2)], _opts(async_op)).wait()
    text = str(info.value)
    assert text.startswith("collectives backend: allreduce: Timed out waiting 1000ms: "), text
    assert "rank 1" in text
    pg.shutdown()
    other = CollectivesError(1, "rank 0: something else")  # passes through as it is
    pg = _group(_StubCore(other), timeout=1.0)
    with pytest.raises(CollectivesError) as info:
        pg.allreduce([torch.ones(2)], _opts(async_op)).wait()
    assert info.value is other
    pg.shutdown()


@pytest.fixture
def one_rank(monkeypatch):
    """init_process_group at one rank in this process, with no launcher's variables."""
    import collectives.torch  # noqa: F401  registers the backend
    for var in ("COLLECTIVES_RANK", "COLLECTIVES_STORE_ADDR"):
        monkeypatch.delenv(var, raising=False)
    dist.init_process_group("collectives", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_blocking_all_reduce_starts_no_thread_and_matches_gloos_work(one_rank):
    before = {t.ident for t in threading.enumerate()}
    t = torch.arange(4, dtype=torch.float32)
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MIN, dist.ReduceOp.MAX,
               dist.ReduceOp.PRODUCT):
        for _ in range(50):
            dist.all_reduce(t, op=op)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
    started = [t.name for t in threading.enumerate() if t.ident not in before]
    assert not started, started
    gloo = dist.new_group([0], backend="gloo")
    for pg in (one_rank, gloo):
        x = torch.ones(2)
        work = pg.allreduce([x], _opts(False))
        work.wait()
        got = (work.is_completed(), work.is_success(), work.exception(),
               [v.tolist() for v in work.get_future().value()],
               [v.tolist() for v in work.result()])
        assert got == (True, True, None, [[1.0, 1.0]], [[1.0, 1.0]]), (pg, got)
    # an async_op=True call still queues: its Work completes once waited for
    work = dist.all_reduce(t, async_op=True)
    assert work.wait() and t.tolist() == [0.0, 1.0, 2.0, 3.0]
