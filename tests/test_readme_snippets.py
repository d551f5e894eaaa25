"""The README's Python snippets and the examples run (issue 38, item 8).

Every ```python block of README.md is classified by its first line: run at 2 ranks
(with a prelude that gives a fragment the names it leaves to the reader, said here),
or only compiled, with the reason (Ray's, which tests/test_ray.py runs in its own
form, and the schematic elastic one). A new block must be classified. The examples
run at 2 (or 3) ranks under collectives-run with small step counts.
"""
import importlib.util
import os
import re
import sys
import textwrap

import pytest

import _autoload
from conftest import REPO, free_port, run_world

pytestmark = pytest.mark.timeout(400)

TORCH_MODEL = ("import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(4, 2)\n"
               "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n")
# first line of the block -> (what it needs, prelude, extra rank variables, ranks)
RUN = {
    "import numpy as np": (None, "", {}, 2),
    "import collectives.torch as hvd            # was: import horovod.torch as hvd":
        ("torch", TORCH_MODEL, {}, 2),
    "import torch.distributed as dist": ("accelerate", "", {"torchrun": True}, 2),
    "import torch, collectives.ps.torch as pst":
        ("torch", TORCH_MODEL + "loss_fn = torch.nn.MSELoss()\n"
                                "loader = [(torch.randn(8, 4), torch.randn(8, 2))] * 3\n",
         {"COLLECTIVES_PS_SERVERS": "1"}, 3),
    "import collectives": (None, "def train(comm):\n    comm.Barrier()\n", {}, 2),
}
COMPILE_ONLY = {
    "import ray": "needs a Ray cluster: tests/test_ray.py runs RayExecutor",
    "import collectives.spark": "needs a Spark session: tests/test_spark.py runs spark.run",
    "ctx = collectives.ray.context()     # rank, size, world (re-form count + 1), new, state":
        "a fragment of a Ray function",
    "from ray.train import ScalingConfig": "needs Ray Train: tests/test_ray.py runs it",
    "import collectives.torch as hvd": "schematic (`...` for the model): "
                                       "examples/pytorch_elastic.py is the whole script",
}


def readme_blocks() -> list:
    """(first line, source) of every ```python block of the README."""
    text = (REPO / "README.md").read_text()
    blocks = []
    for m in re.finditer(r"^( *)```python\n(.*?)^ *```", text, re.S | re.M):
        source = textwrap.dedent(m.group(2))
        blocks.append((source.splitlines()[0].rstrip(), source))
    return blocks


def test_every_block_compiles_and_is_classified():
    blocks = readme_blocks()
    assert len(blocks) >= 8
    for first, source in blocks:
        compile(source, f"README.md: {first}", "exec")
        assert first in RUN or first in COMPILE_ONLY, f"classify the README block {first!r}"


@pytest.mark.parametrize("first", sorted(RUN))
def test_readme_block_runs(first, tmp_path):
    need, prelude, extra, n = RUN[first]
    if need and importlib.util.find_spec(need) is None:
        pytest.skip(f"needs {need}")
    found = [src for f, src in readme_blocks() if f == first]
    assert found, f"the README has no block starting {first!r} any more"
    extra = dict(extra)
    rank_env = None
    if extra.pop("torchrun", False):
        port = free_port()

        def rank_env(rank, size):
            return {"RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": rank,
                    "LOCAL_WORLD_SIZE": size, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        extra.update(_autoload.autoload_env(tmp_path))
    for source in found:
        res = run_world(n, prelude + source + "\nemit('ran')\n", rank_env=rank_env, env=extra,
                        timeout=180)
        res.assert_ok()
        assert all(res[r].one("ran") for r in range(n))


EXAMPLES = {
    "hello_allreduce.py": (None, ["-np", "2"], []),
    "pytorch_synthetic.py": ("torch", ["-np", "2"], ["--steps", "5"]),
    "pytorch_dgc.py": ("torch", ["-np", "2"], ["--epochs", "1", "--warmup-epochs", "1",
                                              "--steps-per-epoch", "5"]),
    "pytorch_ps.py": ("torch", ["-np", "3", "--servers", "1"], ["--steps", "10"]),
    "pytorch_elastic.py": ("torch", ["--elastic", "-np", "2", "--min-np", "2", "--max-np", "2"],
                           ["--epochs", "1", "--batches", "5"]),
    "ray_train.py": ("torch", ["-np", "2"], ["--no-ray", "--steps", "5"]),
    "jax_data_parallel.py": ("jax", ["-np", "2"], ["--steps", "5"]),
}


def test_every_example_is_run():
    have = sorted(p.name for p in (REPO / "examples").glob("*.py"))
    assert have == sorted(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs(name):
    import subprocess

    from conftest import RUN_CWD, base_env

    need, launcher, args = EXAMPLES[name]
    if need and importlib.util.find_spec(need) is None:
        pytest.skip(f"needs {need}")
    cmd = [sys.executable, "-m", "collectives.run", *launcher, sys.executable,
           str(REPO / "examples" / name), *args]
    res = subprocess.run(cmd, cwd=RUN_CWD, env=base_env(), capture_output=True, text=True,
                         timeout=300, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"


def test_ray_example_gives_its_workers_no_clone_path(monkeypatch):
    """Item 2: the Ray workers get the driver's PYTHONPATH as it is, never the clone."""
    spec = importlib.util.spec_from_file_location("ray_train_example",
                                                  REPO / "examples" / "ray_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert module.worker_env() == {}
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/x", "/opt/y"]))
    assert module.worker_env() == {"PYTHONPATH": "/opt/x:/opt/y"}


@pytest.mark.parametrize("front,extra", [("jax", "collectives[jax]"),
                                         ("torch", "collectives[torch]")])
def test_a_front_end_without_its_framework_names_the_extra(front, extra):
    """`import collectives.jax` where JAX is not installed says what to install."""
    import subprocess

    from conftest import RUN_CWD, base_env

    code = f"import sys; sys.modules[{front!r}] = None; import collectives.{front}"
    res = subprocess.run([sys.executable, "-c", code], cwd=RUN_CWD, env=base_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: collectives.") and extra in last, res.stderr
