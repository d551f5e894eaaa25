"""DDP on the "collectives" backend when a peer dies mid-training: the survivor's
backward raises a RuntimeError naming the dead rank, as on gloo, within the
group's timeout. Before, the failed allreduce's Future carried the exception as
its *value* (Python's Future.set_exception), DDP's reducer read gradients out of
it, and the survivor died of a segmentation fault.
"""
import pytest

from conftest import free_port, run_world

DDP_FAIL_BODY = r'''
import os, time
import torch
import torch.nn as nn
import torch.distributed as dist
from datetime import timedelta
from torch.nn.parallel import DistributedDataParallel as DDP
import collectives.torch

r, n = int(os.environ["COLLECTIVES_RANK"]), int(os.environ["COLLECTIVES_SIZE"])
dist.init_process_group("collectives", init_method=f"tcp://127.0.0.1:{os.environ['TORCH_PORT']}",
                        rank=r, world_size=n, timeout=timedelta(seconds=5))
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(4):
    if r == n - 1 and step == 2:
        os._exit(0)
    loss = model(torch.randn(8, 32)).pow(2).mean()
    opt.zero_grad()
    t0 = time.monotonic()
    try:
        loss.backward()
    except Exception as exc:
        emit("backward", step=step, runtime=isinstance(exc, RuntimeError), message=str(exc),
             seconds=time.monotonic() - t0)
        break
    opt.step()
else:
    emit("backward", step=None)
'''


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 3])
def test_ddp_backward_raises_naming_a_dead_peer(n):
    pytest.importorskip("torch")
    res = run_world(n, DDP_FAIL_BODY, timeout=70, env={"TORCH_PORT": free_port()})
    assert not res.timed_out, res.report()
    for rank in range(n - 1):
        assert res[rank].returncode == 0, res.report()  # was -11 (SIGSEGV)
        got = res[rank].one("backward")
        assert got["step"] == 2 and got["runtime"], got
        assert f"rank {n - 1}" in got["message"] or "closed the connection" in got["message"], got
        assert got["seconds"] < 6, got
