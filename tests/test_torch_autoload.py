"""`dist.init_process_group("collectives")` works without `import collectives.torch`
(issue 38, item 4): the package declares torch's ``torch.backends`` entry point, which
torch calls at the end of ``import torch``.

The entry point a started process sees: tests/_autoload.py.
"""
import importlib.util
import subprocess
import sys

import pytest

import _autoload
from conftest import base_env, free_port, run_world

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="needs torch")]


@pytest.fixture
def autoload_env(tmp_path):
    """Extra environment that gives a started process the installed entry point."""
    return _autoload.autoload_env(tmp_path)


def test_the_entry_point_names_a_function_that_exists():
    module, _, name = _autoload.declared().partition(":")
    assert callable(getattr(importlib.import_module(module), name))


def test_init_process_group_without_importing_collectives_torch(autoload_env):
    body = """
        import sys
        import torch, torch.distributed as dist
        expect("collectives.torch" not in sys.modules, "not imported", "collectives.torch")
        dist.init_process_group("collectives")
        t = torch.full((4,), float(dist.get_rank() + 1))
        dist.all_reduce(t)
        expect(t.tolist() == [3.0] * 4, "sum", str(t))
        expect(dist.get_backend() == "collectives", "backend", dist.get_backend())
        dist.destroy_process_group()
        emit("ok")
    """
    port = free_port()

    def torchrun(rank, n):
        return {"RANK": rank, "WORLD_SIZE": n, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": n,
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    res = run_world(2, body, rank_env=torchrun, env=autoload_env, timeout=90).assert_ok()
    assert all(res[r].one("ok") is not None for r in range(2))


def test_the_entry_point_is_cheap_and_never_raises(autoload_env):
    """What it adds to `import torch` (measured in a fresh interpreter), and a torch
    without torch.distributed's plugins table does not break its import."""
    code = """
import os, time
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
import torch, torch.distributed as dist
t = time.perf_counter()
import collectives
collectives._register_torch_backend()
took = time.perf_counter() - t
assert "COLLECTIVES" in dist.Backend._plugins
assert "collectives.torch" not in __import__("sys").modules
saved = dist.Backend.register_backend
dist.Backend.register_backend = None   # a torch whose API differs: no exception
del dist.Backend._plugins["COLLECTIVES"]
collectives._register_torch_backend()
dist.Backend.register_backend = saved
print(f"{took * 1e3:.1f}")
"""
    env = base_env(autoload_env)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert float(res.stdout.split()[-1]) < 100.0, res.stdout  # ms; measured: 1.2-4.7 ms
