"""The timeline: start_timeline/stop_timeline and COLLECTIVES_TIMELINE / HOROVOD_TIMELINE
write a Chrome-trace JSON (rank 0) that parses and lists every operation with its phases."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from conftest import run_world  # noqa: E402

BODY = r'''
import os, sys, time
import torch
import collectives.torch as hvd

hvd.init()
r = hvd.rank()
path = sys.argv[1]
if os.environ.get("VIA_API"):
    hvd.start_timeline(path)
hvd.allreduce(torch.ones(1000), name="grad.w")
h = hvd.allgather_async(torch.ones(2, 3) * r, name="feat")
time.sleep(0.3)  # nobody waits for it: the negotiating thread runs it (its own row)
hvd.synchronize(h)
hvd.broadcast(torch.ones(4), 0)
hvd.reducescatter(torch.ones(4, 2))
hvd.barrier()
if os.environ.get("VIA_API"):
    hvd.stop_timeline()
    hvd.allreduce(torch.ones(3), name="after.stop")  # not recorded
hvd.shutdown()
emit("exists", value=os.path.exists(path))
'''


def _check_trace(path):
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    for e in spans:
        assert {"name", "ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0, e
    names = {e["name"] for e in spans}
    assert {"allreduce", "allgather_async", "broadcast", "reducescatter", "barrier",
            "NEGOTIATE", "QUEUE", "RUN", "WAIT"} <= names, names
    assert any(e.get("args", {}).get("name") == "grad.w" for e in spans)
    assert any(e.get("args", {}).get("op") == "allgather feat" for e in spans if e["name"] == "RUN")
    # blocking calls run their round in the caller's thread; the async allgather nobody
    # waited for ran on the negotiating thread
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert set(threads.values()) >= {"MainThread", "collectives-torch-lane"}, threads
    assert any(threads.get(e["tid"]) == "collectives-torch-lane" for e in spans
               if e["name"] == "RUN" and e.get("args", {}).get("op") == "allgather feat"), spans
    assert any(threads.get(e["tid"]) == "MainThread" for e in spans
               if e["name"] == "RUN" and e.get("args", {}).get("op") == "allreduce grad.w"), spans
    return spans


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["api", "COLLECTIVES_TIMELINE", "HOROVOD_TIMELINE"])
def test_timeline_is_a_chrome_trace_of_every_op(tmp_path, how):
    path = str(tmp_path / "timeline.json")
    env = {"VIA_API": "1"} if how == "api" else {how: path}
    res = run_world(2, BODY, launcher=True, timeout=50, env=env, args=[path]).assert_ok()
    assert res[0].one("exists")["value"]
    spans = _check_trace(path)
    if how == "api":
        assert not any(e.get("args", {}).get("name") == "after.stop" for e in spans)
