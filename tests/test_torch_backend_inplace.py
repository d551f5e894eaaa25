"""In-place all_gather_into_tensor (the input a slice of the output) and
reduce_scatter_tensor (the output a slice of the input) on the backend, as on gloo.

They used to be refused by one rank only ("sendbuf and recvbuf overlap"), which left
the other waiting for it (found by collectives-bench --frontend torch).
"""
import importlib.util

import pytest

from conftest import run_world

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="needs torch")]

BODY = """
import os, torch, torch.distributed as dist
import collectives.torch
results = {}
for backend in ("gloo", "collectives"):
    os.environ["MASTER_PORT"] = str(int(os.environ["BASE_PORT"]) + (backend == "gloo"))
    dist.init_process_group(backend, rank=RANK, world_size=SIZE)
    out = torch.zeros(3 * SIZE)
    inp = out.narrow(0, 3 * RANK, 3)
    inp.copy_(torch.arange(3.0) + 10 * RANK)
    dist.all_gather_into_tensor(out, inp)
    full = torch.arange(3.0 * SIZE) * (RANK + 1)
    mine = full.narrow(0, 3 * RANK, 3)
    dist.reduce_scatter_tensor(mine, full)
    results[backend] = (out.tolist(), mine.tolist())
    dist.destroy_process_group()
expect(results["gloo"] == results["collectives"], "as gloo", str(results))
emit("ok", got=results["collectives"])
"""


@pytest.mark.parametrize("n", [2, 3])
def test_in_place_gather_and_scatter_as_gloo(n):
    from conftest import free_port

    res = run_world(n, "RANK = int(os.environ['COLLECTIVES_RANK']); "
                       "SIZE = int(os.environ['COLLECTIVES_SIZE'])\n" + BODY,
                    env={"MASTER_ADDR": "127.0.0.1", "BASE_PORT": free_port(pair=True)},
                    timeout=100).assert_ok()
    got = res[0].one("ok")["got"]
    assert got[0] == [float(i % 3 + 10 * (i // 3)) for i in range(3 * n)]
    # rank 0's block of the sum over ranks of arange * (rank + 1)
    assert got[1] == [float(i * n * (n + 1) // 2) for i in range(3)]
