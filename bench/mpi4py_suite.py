"""Run mpi4py's own test suite against collectives.MPI through a package that only renames
(``mpi4py.MPI`` *is* ``collectives.MPI``); see bench/README.md for the counts.

    python bench/mpi4py_suite.py [--np 1,2,3] [--files test_comm,test_op] [--file-timeout 300]
                                 [--collective-timeout 20] [--cache DIR] [--out DIR]
                                 [--reference] [--failures]

mpi4py's tests are not part of this repository: the runner downloads mpi4py 4.1.2's source
distribution from the package index with pip (once, into --cache), unpacks its ``test/``
folder into a temporary directory, and runs each file as one ``collectives-run -np N`` job
per world size, with a deadline per job. Every rank runs the file's unittest cases in order
(as mpi4py's ``test/main.py`` does) and writes each test's start and outcome to a file as
it goes, so a rank that dies or a job that hangs is seen test by test. A test passes only if
it passed on every rank; it is an error (or failure) if it was one on any rank; "crash" is a
test some rank started and never finished because the rank died, "hang" one left unfinished
when the job hit its deadline, "lost" one no rank reached.

``--reference`` runs the same files under ``mpiexec`` with the real mpi4py, in the Python
``--reference-python`` names (default: this one; ``pip install mpi4py`` there, with Open MPI
installed), and
prints its counts in the columns on the right. Without it the totals the issue recorded for
mpi4py 4.1.2 + Open MPI are printed under the table.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

VERSION = "4.1.2"
FILES = ["test_cco_buf", "test_cco_obj", "test_cco_vec", "test_cco_nb_buf", "test_p2p_buf",
         "test_p2p_obj", "test_comm", "test_request", "test_status", "test_op",
         "test_exceptions"]
# mpi4py 4.1.2 + Open MPI at 1, 2 and 3 ranks over FILES, as issue 39 recorded them.
REFERENCE_TOTAL = {"runs": 1734, "passed": 1602, "skipped": 132}
KINDS = ("passed", "failed", "errors", "skipped", "crash", "hang", "lost")

SHIM = '''"""Renaming shim for mpi4py's tests: ``mpi4py.MPI`` is ``collectives.MPI``; no behaviour."""
import sys

from collectives import MPI

sys.modules[__name__ + ".MPI"] = MPI
__version__ = "%s"
''' % VERSION

# One rank: run one test file's cases in order, logging "start"/outcome lines as they happen.
RANK = r'''import json, os, sys, unittest
out_dir, module = sys.argv[1], sys.argv[2]
rank = os.environ.get("COLLECTIVES_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
log = open(os.path.join(out_dir, "%s.rank%s.jsonl" % (module, rank)), "w", buffering=1)


def note(test, what, text=""):
    log.write(json.dumps({"test": test.id().split(".", 1)[-1], "what": what,
                          "text": text[-2000:]}) + "\n")


class Result(unittest.TestResult):
    def startTest(self, test):
        super().startTest(test)
        note(test, "start")

    def addSuccess(self, test):
        note(test, "passed")

    def addFailure(self, test, err):
        note(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        note(test, "errors", self._exc_info_to_string(err, test))

    def addSubTest(self, test, subtest, err):  # a failed subtest fails its test
        if err is not None:
            what = "failed" if issubclass(err[0], test.failureException) else "errors"
            note(test, what, self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        note(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        note(test, "passed")

    def addUnexpectedSuccess(self, test):
        note(test, "failed", "unexpected success")


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    suite = unittest.defaultTestLoader.loadTestsFromName(module)
except Exception:  # the file did not load: one error, as unittest's own runner counts it
    import traceback
    for what in ("plan", "start"):
        log.write(json.dumps({"test": module + " (import)", "what": what, "text": ""}) + "\n")
    log.write(json.dumps({"test": module + " (import)", "what": "errors",
                          "text": traceback.format_exc()}) + "\n")
    suite = unittest.TestSuite()


def cases(s):
    for t in s:
        if isinstance(t, unittest.TestSuite):
            yield from cases(t)
        else:
            yield t


for t in cases(suite):
    note(t, "plan")
suite.run(Result())
log.write(json.dumps({"test": "", "what": "end", "text": ""}) + "\n")
log.close()
'''


def sdist(cache: str) -> str:
    """mpi4py's source distribution, downloaded with pip into cache once."""
    os.makedirs(cache, exist_ok=True)
    found = glob.glob(os.path.join(cache, f"mpi4py-{VERSION}.tar.gz"))
    if found:
        return found[0]
    # --no-binary for mpi4py only (its build dependencies may be wheels) and no build
    # isolation: pip only reads the metadata, nothing is built.
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                    "mpi4py", "--no-build-isolation", f"mpi4py=={VERSION}", "-d", cache],
                   check=True, stdout=subprocess.DEVNULL)
    return os.path.join(cache, f"mpi4py-{VERSION}.tar.gz")


def unpack(path: str, root: str) -> str:
    """mpi4py's test/ folder from the sdist, under root/test, with the rank driver."""
    with tarfile.open(path) as tar:
        members = [m for m in tar.getmembers() if "/test/" in m.name and m.isfile()]
        for m in members:
            m.name = "test/" + m.name.split("/test/", 1)[1]
        tar.extractall(root, members=members, filter="data")
    with open(os.path.join(root, "test", "_rank.py"), "w") as f:
        f.write(RANK)
    os.makedirs(os.path.join(root, "shim", "mpi4py"))
    with open(os.path.join(root, "shim", "mpi4py", "__init__.py"), "w") as f:
        f.write(SHIM)
    return os.path.join(root, "test")


def run_job(cmd: list, env: dict, timeout: float) -> bool:
    """One job in its own process group; False (and the group killed) past the deadline."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        p.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.wait()
        return False


def merge(logs: list, finished: bool) -> dict:
    """{test: outcome} over the ranks' logs (see the module docstring); {"?": ...} for a file
    that never reached its first test on any rank."""
    per_rank, order = [], []
    for path in logs:
        got, ended = {}, False
        try:
            with open(path) as f:
                for line in f:
                    rec = json.loads(line)
                    if rec["what"] == "end":
                        ended = True
                    elif rec["what"] == "plan":
                        if rec["test"] not in order:
                            order.append(rec["test"])
                    elif rec["what"] == "start":
                        got.setdefault(rec["test"], None)
                        if rec["test"] not in order:
                            order.append(rec["test"])
                    else:
                        got[rec["test"]] = (rec["what"], rec["text"])
        except (OSError, ValueError):
            pass
        per_rank.append((got, ended))
    out = {}
    for test in order:
        kinds = []
        for got, ended in per_rank:
            if test not in got:
                kinds.append("lost" if finished or ended else "hang")
            elif got[test] is None:
                kinds.append("hang" if not finished else "crash")
            else:
                kinds.append(got[test][0])
        for k in ("crash", "hang", "errors", "failed", "lost", "skipped", "passed"):
            if k in kinds:
                text = next((g[test][1] for g, _ in per_rank
                             if g.get(test) and g[test][0] == k), "")
                out[test] = (k, text)
                break
    return out


def run_file(test_dir: str, module: str, n: int, env: dict, args: argparse.Namespace,
             reference: bool) -> dict:
    logs = os.path.join(test_dir, "logs", ("ref" if reference else "ours") + f"-np{n}")
    os.makedirs(logs, exist_ok=True)
    python = args.reference_python if reference else sys.executable
    rank = [python, os.path.join(test_dir, "_rank.py"), logs, module]
    if reference:
        cmd = ["mpiexec", "--oversubscribe", "--allow-run-as-root", "-n", str(n), *rank]
    else:
        cmd = [sys.executable, "-m", "collectives.launcher.cli", "-np", str(n), "--timeout",
               str(args.collective_timeout), *rank]
    finished = run_job(cmd, env, args.file_timeout)
    return merge([os.path.join(logs, f"{module}.rank{r}.jsonl") for r in range(n)], finished)


def counts(results: dict) -> dict:
    c = dict.fromkeys(KINDS, 0)
    for kind, _ in results.values():
        c[kind] += 1
    return c


def main() -> int:
    """Fetch the suite, run every file at every size, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", default="1,2,3", help="world sizes, comma-separated")
    ap.add_argument("--files", default=",".join(FILES), help="test modules, comma-separated")
    ap.add_argument("--file-timeout", type=float, default=300.0, help="seconds per job")
    ap.add_argument("--collective-timeout", type=float, default=20.0,
                    help="COLLECTIVES_TIMEOUT for our jobs")
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/collectives-mpi4py"))
    ap.add_argument("--out", default=None, help="keep the work dir and logs here")
    ap.add_argument("--reference", action="store_true",
                    help="also run the real mpi4py under mpiexec (needs mpi4py importable)")
    ap.add_argument("--reference-python", default=sys.executable,
                    help="the Python that has the real mpi4py (default: this one)")
    ap.add_argument("--failures", action="store_true", help="print each test not passed")
    ap.add_argument("--json", default=None, help="write every outcome to this file")
    a = ap.parse_args()
    root = a.out or tempfile.mkdtemp(prefix="mpi4py-suite-")
    test_dir = unpack(sdist(a.cache), root)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ours_env = dict(os.environ)
    ours_env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(root, "shim"), repo, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    ref_env = dict(os.environ)
    ref_env.pop("PYTHONPATH", None)
    sizes = [int(s) for s in a.np.split(",")]
    modules = a.files.split(",")
    table, dump = [], {}
    for module in modules:
        for n in sizes:
            t0 = time.monotonic()
            ours = run_file(test_dir, module, n, ours_env, a, False)
            secs = time.monotonic() - t0
            ref = run_file(test_dir, module, n, ref_env, a, True) if a.reference else None
            table.append((module, n, counts(ours), counts(ref) if ref is not None else None,
                          secs))
            dump[f"{module} np{n}"] = {t: k for t, (k, _) in ours.items()}
            row = table[-1]
            print(f"{module:18} np={n} " + " ".join(f"{k}={row[2][k]}" for k in KINDS)
                  + f" ({secs:.0f} s)", file=sys.stderr, flush=True)
            if a.failures:
                for test, (kind, text) in ours.items():
                    if kind != "passed" and kind != "skipped":
                        last = text.strip().splitlines()[-1:] if text else [""]
                        print(f"    np={n} {kind:7} {test}: {last[0][:200]}", file=sys.stderr)
    print_table(table, a.reference)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dump, f, indent=1, sort_keys=True)
    if not a.out:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def print_table(table: list, reference: bool) -> None:
    head = "| file | np | " + " | ".join(KINDS) + " |"
    if reference:
        head += " mpi4py passed | mpi4py failed+errors | mpi4py skipped |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    total = dict.fromkeys(KINDS, 0)
    ref_total = {"passed": 0, "bad": 0, "skipped": 0}
    for module, n, c, ref, _ in table:
        line = f"| {module} | {n} | " + " | ".join(str(c[k]) for k in KINDS) + " |"
        for k in KINDS:
            total[k] += c[k]
        if ref is not None:
            bad = sum(ref[k] for k in KINDS if k not in ("passed", "skipped"))
            line += f" {ref['passed']} | {bad} | {ref['skipped']} |"
            ref_total["passed"] += ref["passed"]
            ref_total["bad"] += bad
            ref_total["skipped"] += ref["skipped"]
        print(line)
    line = "| **total** | | " + " | ".join(str(total[k]) for k in KINDS) + " |"
    if reference:
        line += f" {ref_total['passed']} | {ref_total['bad']} | {ref_total['skipped']} |"
    print(line)
    print(f"\n{sum(total.values())} test runs; mpi4py {VERSION} + Open MPI over the default "
          f"files at 1, 2 and 3 ranks (issue 39): {REFERENCE_TOTAL['runs']} runs, "
          f"{REFERENCE_TOTAL['passed']} passed, {REFERENCE_TOTAL['skipped']} skipped")


if __name__ == "__main__":
    sys.exit(main())
