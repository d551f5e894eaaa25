"""collectives-bench --frontend: the sweep through each API a script calls, checked
exactly (issue 38, item 9), and the `# measured` lines only with --verbose."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from collectives.bench.frontends import FRONTENDS
from conftest import RUN_CWD, base_env

pytestmark = pytest.mark.timeout(240)

IMPLS = {"mpi": ["collectives-auto"], "core": ["core-auto"], "torch": ["torch", "torch-floor"],
         "hvd": ["hvd"], "jax": ["jax"]}
NEEDS = {"torch": "torch", "hvd": "torch", "jax": "jax"}


def _bench(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "collectives.bench", *map(str, args)],
                          capture_output=True, text=True, env=base_env(), cwd=RUN_CWD,
                          timeout=200, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_allreduce_through_each_frontend_is_exact(frontend, tmp_path: Path):
    need = NEEDS.get(frontend)
    if need and importlib.util.find_spec(need) is None:
        pytest.skip(f"needs {need}")
    out = tmp_path / "rows.json"
    res = _bench("allreduce", "-np", "2", "-b", "8", "-e", "4K", "-f", "8", "--iters", "3",
                 "--warmup", "1", "--algo", "auto", "--check", "--frontend", frontend,
                 "--json", out)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "# Wrong values total   : 0 OK" in res.stdout, res.stdout
    rows = json.loads(out.read_text())
    got = sorted({r["impl"] for r in rows})
    assert got == sorted(IMPLS[frontend]), got
    for impl in IMPLS[frontend]:
        mine = [r for r in rows if r["impl"] == impl]
        assert sorted((r["size"], r["inplace"]) for r in mine) == \
            [(8, False), (8, True), (64, False), (64, True), (512, False), (512, True),
             (4096, False), (4096, True)], impl
        assert all(r["time_us"] > 0 for r in mine)
        if impl != "torch-floor":  # the floor moves nothing: nothing to check
            assert all(r["wrong"] == 0 for r in mine), mine


@pytest.mark.parametrize("frontend,coll", [("torch", "allgather"), ("torch", "broadcast"),
                                           ("torch", "reduce_scatter"), ("hvd", "allgather"),
                                           ("hvd", "broadcast"), ("jax", "allgather")])
def test_other_collectives_through_the_frontends_are_exact(frontend, coll):
    need = NEEDS.get(frontend)
    if need and importlib.util.find_spec(need) is None:
        pytest.skip(f"needs {need}")
    res = _bench(coll, "-np", "2", "-b", "64", "-e", "1K", "-f", "4", "--iters", "2",
                 "--warmup", "1", "--check", "--frontend", frontend)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "# Wrong values total   : 0 OK" in res.stdout, res.stdout


def test_measured_lines_only_with_verbose():
    quiet = _bench("allreduce", "-np", "2", "-b", "8", "-e", "64", "--iters", "2", "--warmup",
                   "1", "--algo", "ring")
    loud = _bench("allreduce", "-np", "2", "-b", "8", "-e", "64", "--iters", "2", "--warmup",
                  "1", "--algo", "ring", "--verbose")
    assert quiet.returncode == 0 and loud.returncode == 0, quiet.stderr + loud.stderr
    assert "# measured" not in quiet.stdout + quiet.stderr, quiet.stdout
    assert loud.stdout.count("# measured collectives-ring") == 2, loud.stdout
    for res in (quiet, loud):
        assert "# allreduce: collectives-ring, 2 ranks" in res.stdout


def test_device_cuda_takes_the_core_frontends_only():
    res = _bench("allreduce", "-np", "2", "--device", "cuda", "--frontend", "torch")
    assert res.returncode == 2 and "--frontend mpi or core only" in res.stderr, res.stderr
