"""torchrun elastic (issue 23 section 3): after a worker fails, torchrun restarts the
group and the "collectives" backend re-forms from the new round's store (torch keys it
by /worker/attempt_<n>), with no key or link of the failed round, and trains right."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from conftest import base_env, free_port, package_path, RUN_CWD  # noqa: E402

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    import collectives.torch  # registers the backend

    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("collectives")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(6):
        x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
        if restart == 0 and rank == 1 and step == 2:
            sys.exit(1)  # the first round loses a worker mid-training
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    probe = torch.full((3,), float(rank + 1))
    dist.all_reduce(probe)
    with open(os.path.join(os.environ["OUTDIR"], f"rank{rank}.json"), "w") as f:
        json.dump({"restart": restart, "size": size, "probe": probe.tolist(),
                   "weight": model.weight.detach().flatten().tolist(),
                   "bias": model.bias.detach().tolist()}, f)
    dist.destroy_process_group()
""")


def _expected(size: int = 2, steps: int = 6):
    """The same training in one process: gradients averaged over the ranks' batches."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gens = [torch.Generator().manual_seed(100 + r) for r in range(size)]
    for _ in range(steps):
        grads = []
        for g in gens:
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = sum(gr[i] for gr in grads) / size
        opt.step()
    return model.weight.detach().flatten().tolist(), model.bias.detach().tolist()


@pytest.mark.timeout(120)
def test_torchrun_restart_reforms_the_collectives_backend(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = base_env({"OUTDIR": str(tmp_path), "COLLECTIVES_JOB_SECRET": "torchrun-elastic-secret-0123456789"})
    env["PYTHONPATH"] = os.pathsep.join(package_path() + [env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
           "--nproc-per-node=2", "--max-restarts=2", "--monitor-interval=0.1",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(script)]
    proc = subprocess.Popen(cmd, env=env, cwd=str(RUN_CWD), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=100)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-6000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    weight, bias = _expected()
    for res in results:
        assert res["restart"] == 1 and res["size"] == 2, (res, text[-3000:])
        assert res["probe"] == [3.0, 3.0, 3.0], res
        assert res["weight"] == pytest.approx(weight, abs=1e-5), (res, weight)
        assert res["bias"] == pytest.approx(bias, abs=1e-5), (res, bias)
