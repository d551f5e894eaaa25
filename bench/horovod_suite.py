"""Run Horovod's own PyTorch test file against collectives.torch, through a shim that only
renames (``horovod.torch`` *is* ``collectives.torch``); see bench/README.md for the counts.

    python bench/horovod_suite.py PATH/TO/test_torch.py [--np 2] [--per-test] [-k EXPR]
                                  [--test-timeout 120] [--out DIR]

Horovod's file is not part of this repository: take test/parallel/test_torch.py from
horovod/horovod (v0.28). The ranks run in Horovod's gloo mode: HOROVOD_RANK, _SIZE,
_LOCAL_RANK and _LOCAL_SIZE are exported as ``horovodrun --gloo`` exports them, so every
test ends with ``hvd.barrier(); hvd.shutdown()`` as in Horovod's CI. ``--per-test`` runs
each test in its own job (fresh processes), so that one test that leaves the ranks out of
step cannot fail the ones after it. A test counts as passed only if it passed on every rank.
Run it from the repository root with the package importable (built in place, or installed).
"""
from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter

SHIM_PKG = '"""Renaming shim for Horovod\'s tests: no behaviour here."""\n'
SHIM_TORCH = '''"""Renaming shim: ``horovod.torch`` is ``collectives.torch`` (one module object)."""
import sys

import collectives.torch

sys.modules[__name__] = collectives.torch
'''
# The three helpers test_torch.py imports from Horovod's test/utils/common.py, with its semantics.
COMMON = '''import contextlib, os, shutil, tempfile


def mpi_env_rank_and_size():
    for rank_var, size_var in (("PMI_RANK", "PMI_SIZE"),
                               ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        rank, size = os.environ.get(rank_var), os.environ.get(size_var)
        if rank is not None and size is not None:
            return int(rank), int(size)
    return 0, 1


def skip_or_fail_gpu_test(test, message):
    if int(os.environ.get("HOROVOD_TEST_GPU", 0)):
        test.fail(message)
    else:
        test.skipTest(message)


@contextlib.contextmanager
def temppath():
    path = tempfile.mktemp()
    try:
        yield path
    finally:
        if os.path.isfile(path):
            os.remove(path)
        elif os.path.exists(path):
            shutil.rmtree(path)
'''
RANK = '''import os, subprocess, sys
env = dict(os.environ)
for k in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE"):
    env["HOROVOD_" + k] = env["COLLECTIVES_" + k]
out = os.path.join(sys.argv[1], "%s.rank%s" % (sys.argv[2], env["COLLECTIVES_RANK"]))
with open(out + ".log", "w") as f:
    rc = subprocess.call([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
                          "--junitxml=" + out + ".xml"] + sys.argv[3:],
                         stdout=f, stderr=subprocess.STDOUT, env=env,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    f.write("pytest rc=%d\\n" % rc)
'''  # exits 0 whatever pytest says: the launcher would stop the other ranks on a failure


def test_ids(path: str) -> list:
    """(test name, pytest node id) of the file's TestCase test methods, in file order."""
    tree = ast.parse(open(path).read())
    return [(f.name, f"test_torch.py::{c.name}::{f.name}") for c in tree.body
            if isinstance(c, ast.ClassDef) for f in c.body
            if isinstance(f, ast.FunctionDef) and f.name.startswith("test")]


def run_job(cmd: list, env: dict, timeout: float) -> None:
    """One collectives-run job; on timeout its whole process group is killed."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.wait()


def outcomes(xml_path: str) -> dict:
    """{test name: passed | skipped | failed} from one rank's JUnit XML (a teardown error
    fails the test too); {} if the rank wrote none (it died or hung)."""
    try:
        cases = ET.parse(xml_path).getroot().iter("testcase")
    except (OSError, ET.ParseError):
        return {}
    got: dict = {}
    for c in cases:
        kids = {k.tag for k in c}
        v = ("failed" if kids & {"failure", "error"} else
             "skipped" if "skipped" in kids else "passed")
        if got.get(c.get("name")) in (None, "passed"):
            got[c.get("name")] = v
    return got


def main() -> int:
    """Set up the shim next to a copy of the file, run it, print the counts."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("test_file")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--per-test", action="store_true")
    ap.add_argument("-k", default=None, help="pytest -k expression")
    ap.add_argument("--test-timeout", type=int, default=120, help="per test (pytest-timeout)")
    ap.add_argument("--collective-timeout", type=int, default=30)
    ap.add_argument("--out", default=None, help="keep the work dir and logs here")
    a = ap.parse_args()
    root = a.out or tempfile.mkdtemp(prefix="hvd-suite-")
    par = os.path.join(root, "test", "parallel")
    for d in ("test/parallel", "test/utils", "shim/horovod/torch", "logs"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    shutil.copy(a.test_file, os.path.join(par, "test_torch.py"))
    files = {"shim/horovod/__init__.py": SHIM_PKG, "shim/horovod/torch/__init__.py": SHIM_TORCH,
             "test/utils/common.py": COMMON, "test/parallel/_rank.py": RANK}
    for rel, text in files.items():
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), os.path.join(root, "shim"),
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    logs = os.path.join(root, "logs")
    ids = test_ids(a.test_file)
    jobs = ids if a.per_test else [("all", "test_torch.py")]
    for tag, sel in jobs:
        extra = ["-k", a.k] if a.k else []
        cmd = [sys.executable, "-m", "collectives.run", "-np", str(a.np), "--timeout",
               str(a.collective_timeout), sys.executable, os.path.join(par, "_rank.py"), logs,
               tag, f"--timeout={a.test_timeout}", *extra, sel]
        run_job(cmd, env, a.test_timeout * (1 if a.per_test else len(ids)) + 120)
    results: dict = {}
    for tag, _ in jobs:
        per_rank = [outcomes(os.path.join(logs, f"{tag}.rank{r}.xml")) for r in range(a.np)]
        names = [tag] if a.per_test else sorted(set().union(*per_rank))
        if a.per_test and a.k and all(not got for got in per_rank):
            continue  # deselected by -k
        for name in names:  # passed (or skipped) only if so on every rank
            kinds = {got.get(name, "failed") for got in per_rank}
            results[name] = kinds.pop() if len(kinds) == 1 else "failed"
    print(dict(Counter(results.values())), f"({len(results)} tests, {a.np} ranks, logs in {logs})")
    for name, v in sorted(results.items()):
        if v != "passed":
            print(f"  {v:8} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
