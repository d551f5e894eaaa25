"""The README's and bench/README's ``python -m ...`` commands work as written from the
clone's root after the README's install (issue 38, item 1).

From the root of a clone, ``python -m`` puts the clone first on sys.path, and its
``collectives/`` has no built ``_core``: the package must then defer to the installed
one. Testing an install (COLLECTIVES_TEST_INSTALLED=1, CI) the commands run from
the checkout itself. Testing the checkout (built in place), they run from a copy of
the clone without any built extension, with the checkout standing in for the
installed package (on PYTHONPATH, after the clone's root as site-packages would be).
"""
import os
import re
import subprocess
import sys

import pytest

import _clone
from conftest import FROM_SOURCE, REPO

pytestmark = pytest.mark.timeout(300)

DOCS = ["README.md", "bench/README.md"]
# Run as the docs write them (a bare `python -m collectives.run` gets a job to run).
RUN = {
    "python -m collectives.config": "collectives_timeout",
    "python -m collectives.run": None,
    "python -m pytest -q tests/test_ray.py": None,
    "python -m pytest -m cuda tests/test_cuda.py tests/test_cuda_hw.py": None,
    "python -m collectives.bench allgather -np 3 -b 1K -e 64M --check": "0 ok",
    "python -m collectives.launcher.k8s_secret collectives-job-secret": "kind: secret",
    "python -m collectives.torch._knobs": "horovod_cycle_time",
}
# Commands that need what the suite cannot give (network namespaces, a Horovod
# checkout, minutes of training): their module must start from the clone's root,
# which is what failed (`--help`).
START_ONLY = {"collectives.bench", "collectives.bench.peer_worker", "collectives.run", "pytest",
              "collectives.launcher.k8s_secret", "venv"}  # kubectl, a reference venv: not here


def doc_commands() -> list:
    """Every `python -m ...` command of the docs (code spans and indented command lines)."""
    found = []
    for doc in DOCS:
        text = (REPO / doc).read_text()
        for span in re.findall(r"`([^`\n]*python -m [^`\n]*)`", text):
            found.append(span)
        for line in text.splitlines():
            m = re.search(r"(?:^\s{4}|^#\s+|^|^bench/\S+ run \d+ |^exec .*?)(\S*=\S+ )*(python -m .*)",
                          line)
            if m and "`" not in line:
                found.append(m.group(2).split("  #")[0].rstrip(" \\"))
    return sorted({c[c.index("python -m"):].strip() for c in found})


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """(root, env): where a user who cloned and installed stands, and their environment."""
    return _clone.user_clone(tmp_path_factory)


PYTHON_FLAGS = _clone.PYTHON_FLAGS


def _run(cmd: str, root, env, timeout: float = 240) -> subprocess.CompletedProcess:
    argv = cmd.split()
    argv[:1] = [sys.executable] + PYTHON_FLAGS
    return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_every_doc_command_is_covered():
    """A new `python -m` command in the docs is run here, or its module started."""
    commands = doc_commands()
    assert len(commands) >= 6, commands
    for cmd in commands:
        module = cmd.split()[2]
        assert cmd in RUN or module in START_ONLY, f"{cmd!r}: add it to RUN or START_ONLY"


@pytest.mark.parametrize("cmd", sorted(RUN))
def test_command_runs_from_the_clone_root(cmd, clone):
    root, env = clone
    if cmd == "python -m collectives.run":
        cmd += " -np 2 python examples/hello_allreduce.py"
    if cmd.endswith("tests/test_ray.py"):
        # with Ray installed, its quick tests only (the file is minutes of cluster starts)
        cmd += " -k bad_arguments_raise"
    res = _run(cmd, root, env)
    out = res.stdout + res.stderr
    # pytest's 5: nothing collected, as when a module skips itself (no Ray installed)
    ok = (0, 5) if "pytest" in cmd and " skipped" in res.stdout else (0,)
    assert res.returncode in ok, f"{cmd} from {root}: rc={res.returncode}\n{out[-4000:]}"
    assert "No module named 'collectives._core'" not in out
    want = RUN.get(cmd.split(" -np 2")[0].split(" -k ")[0])
    if want:
        assert want in out.lower(), out[-2000:]
    if "pytest" in cmd:
        assert re.search(r"\d+ (passed|skipped|deselected)", out), out[-2000:]


@pytest.mark.parametrize("module", sorted(START_ONLY))
def test_module_starts_from_the_clone_root(module, clone):
    root, env = clone
    res = _run(f"python -m {module} --help", root, env, timeout=120)
    out = res.stdout + res.stderr
    # A usage text is the answer (peer_worker prints its usage and exits 1).
    assert res.returncode in (0, 1, 2) and "usage" in out.lower() and "Traceback (most recent call last)" not in out, \
        f"python -m {module} --help from {root}: rc={res.returncode}\n{out[-3000:]}"


def test_the_clone_defers_to_the_installed_package(clone):
    """From the clone's root `import collectives` is the installed package, whole."""
    root, env = clone
    code = ("import collectives, collectives.config as c; "
            "print(collectives.__file__); print(c.__file__); print(collectives.cuda_built())")
    res = subprocess.run([sys.executable, *PYTHON_FLAGS, "-c", code], cwd=root, env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    init, config, _ = res.stdout.split("\n")[:3]
    installed = os.path.dirname(init)
    assert os.path.dirname(config) == installed
    if FROM_SOURCE:
        assert installed == str(REPO / "collectives"), res.stdout
