"""Shared fixtures: run a real world of N processes on loopback.

``run_world(n, body)`` writes ``body`` (Python source, dedented) into a script
that starts with ``from _worker import *`` and runs it as n ranks, each a
process of its own session with the ``COLLECTIVES_*`` variables set (or any
other environment the test gives, e.g. torchrun's). Every process gets a hard
deadline; whatever happens (success, failure, pytest-timeout, KeyboardInterrupt)
every process started here is killed before run_world returns or raises.

One launch runs a whole grid of cases in a loop inside the workers: starting
python + numpy costs ~0.3 s a process on a 2-core machine.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import pytest

import _zygote  # noqa: E402 -- tests/ is on sys.path (rootdir conftest)
import collectives
# A port for a store rank 0 binds later, outside the kernel's ephemeral range (the
# tests import it from here).
from collectives.launcher.cli import free_port  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
# The suite tests whichever collectives Python imports: the checkout (built in
# place, or installed editable) or an installed wheel, as CI does. Against an
# install, no process it starts may see the checkout's collectives/ (without
# its native module it would shadow the real package): ranks get no checkout on
# PYTHONPATH and commands run with `-m` start in tests/, not in the checkout.
PACKAGE_ROOT = Path(collectives.__file__).resolve().parents[1]
FROM_SOURCE = PACKAGE_ROOT == REPO
RUN_CWD = REPO if FROM_SOURCE else TESTS


def package_path() -> list:
    """What PYTHONPATH needs for a started process to import the collectives under test."""
    return [str(REPO)] if FROM_SOURCE else []


def pytest_configure(config):
    """Refuse to run a misconfigured suite instead of skipping whole parts of it.

    COLLECTIVES_TEST_INSTALLED=1: the suite must import an installed collectives,
    not the checkout (and, testing an install, the processes the tests start run
    in tests/). COLLECTIVES_TEST_REQUIRE=torch,jax: those frameworks must
    import, so that their adapters' tests run rather than skip.
    """
    if os.environ.get("COLLECTIVES_TEST_INSTALLED") == "1" and FROM_SOURCE:
        raise pytest.UsageError(f"COLLECTIVES_TEST_INSTALLED=1 but collectives is imported from "
                                f"the checkout {REPO}; run pytest (not python -m pytest) with the "
                                f"package installed, or unset it")
    if not FROM_SOURCE:
        # Every process the tests start inherits this: none starts in the checkout.
        os.chdir(TESTS)
    for name in filter(None, os.environ.get("COLLECTIVES_TEST_REQUIRE", "").split(",")):
        try:
            __import__(name.strip())
        except ImportError as exc:
            raise pytest.UsageError(f"COLLECTIVES_TEST_REQUIRE names {name.strip()!r}, which does "
                                    f"not import ({exc}): install it (pip install "
                                    f"'collectives[all]') or drop it from the variable") from None

_LIVE: set = set()  # Popen objects not yet reaped, killed by the autouse fixture


def base_env(extra: Optional[Mapping[str, str]] = None) -> dict:
    """The test process's environment minus every rendezvous variable, plus PYTHONPATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COLLECTIVES_", "OMPI_", "SLURM_", "PMI_", "PET_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                         "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(package_path() + [str(TESTS)] +
                                        ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    # COLLECTIVES_TEST_ENV="COLLECTIVES_NSOCKS=4,COLLECTIVES_TRANSPORT=tcp": run
    # every started process under those settings (a test's own env still wins).
    for item in filter(None, os.environ.get("COLLECTIVES_TEST_ENV", "").split(",")):
        name, _, value = item.partition("=")
        env[name.strip()] = value.strip()
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


@dataclass
class RankResult:
    """One rank's outcome: exit code (None if killed at the deadline), output, records."""

    rank: int
    returncode: Optional[int]
    stdout: str
    stderr: str
    records: list = field(default_factory=list)

    def get(self, tag: str) -> list:
        """The records this rank emitted with this tag (see _worker.emit)."""
        return [r for r in self.records if r.get("tag") == tag]

    def one(self, tag: str) -> dict:
        """The single record with this tag (fails the test otherwise)."""
        got = self.get(tag)
        assert len(got) == 1, f"rank {self.rank}: expected one {tag!r} record, got {got}\n{self.text()}"
        return got[0]

    def text(self, limit: int = 4000) -> str:
        """Output for failure messages (tails)."""
        return (f"--- rank {self.rank} rc={self.returncode}\n[stdout]\n{self.stdout[-limit:]}"
                f"\n[stderr]\n{self.stderr[-limit:]}")


@dataclass
class WorldResult:
    """Every rank's result, plus whether the deadline killed the world."""

    ranks: list
    timed_out: bool
    elapsed: float
    launcher_rc: Optional[int] = None
    launcher_output: str = ""

    def __getitem__(self, rank: int) -> RankResult:
        return self.ranks[rank]

    def report(self, limit: int = 4000) -> str:
        """All ranks' outputs (tails of `limit` characters), for assertion messages."""
        head = f"timed_out={self.timed_out} elapsed={self.elapsed:.1f}s"
        if self.launcher_rc is not None:
            head += f" launcher_rc={self.launcher_rc}\n{self.launcher_output[-6000:]}"
        return head + "\n" + "\n".join(r.text(limit) for r in self.ranks)

    def assert_ok(self) -> "WorldResult":
        """Every rank exited 0 within the deadline and reported no FAIL."""
        bad = [r for r in self.ranks if r.returncode != 0 or r.get("fail")]
        if self.timed_out or bad or (self.launcher_rc not in (None, 0)):
            pytest.fail("world failed: " + self.report(), pytrace=False)
        return self


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    _LIVE.discard(proc)


def _parse_records(stdout: str) -> list:
    out = []
    for line in stdout.splitlines():
        if line.startswith("@@ "):
            try:
                out.append(json.loads(line[3:]))
            except ValueError:
                out.append({"tag": "unparsable", "line": line})
    return out


def write_script(body: str, directory: str) -> str:
    """Write a worker script: the _worker prelude, the dedented body, finish()."""
    path = os.path.join(directory, "worker_body.py")
    with open(path, "w") as fh:
        fh.write("import sys\nsys.path.insert(0, %r)\nfrom _worker import *\n" % str(TESTS))
        fh.write(textwrap.dedent(body).strip("\n") + "\n")
        fh.write("finish()\n")
    return path


def run_world(n: int, body: Optional[str] = None, *, script: Optional[str] = None,
              timeout: float = 60.0, env: Optional[Mapping[str, str]] = None,
              rank_env: Optional[Callable[[int, int], Mapping[str, str]]] = None,
              collective_timeout: Optional[float] = 30.0, args: Sequence[str] = (),
              launcher: bool = False,
              prefix: Optional[Callable[[int], Sequence[str]]] = None) -> WorldResult:
    """Run `body` (source) or `script` (path) as n ranks on loopback; see the module doc.

    env: extra variables for every rank. rank_env(rank, n): this rank's
    rendezvous variables (default: the COLLECTIVES_* set with a free store
    port). collective_timeout: COLLECTIVES_TIMEOUT unless env sets it.
    launcher=True starts the job through ``python -m collectives.run -np n``
    instead and splits its prefixed output per rank (exit codes per rank are
    then unknown: every rank gets the launcher's code). Every rank gets
    WORLD_DIR, a directory of this world's own, where _worker.arrive and
    wait_for let a rank wait for another to get somewhere (not a sleep).
    prefix(rank): command words that start rank's process (each execs the
    next, so the process killed is the rank: e.g. entering a network
    namespace, tests/_netns.py).
    """
    extra = dict(env or {})
    if collective_timeout is not None:
        extra.setdefault("COLLECTIVES_TIMEOUT", f"{collective_timeout:g}")
    with tempfile.TemporaryDirectory(prefix="collw") as tmp:
        extra.setdefault("WORLD_DIR", tmp)  # this world's own directory (_worker.arrive)
        path = script or write_script(body, tmp)
        cmd = [sys.executable, path, *args]
        start = time.monotonic()
        if launcher:
            return _run_launcher(n, cmd, tmp, timeout, extra, start)
        store_port = free_port()
        procs, files = [], []
        fresh_env = base_env({})  # what a fresh rank inherits (the forking servers' too)
        try:
            for rank in range(n):
                if rank_env is None:
                    renv = {"COLLECTIVES_RANK": rank, "COLLECTIVES_SIZE": n,
                            "COLLECTIVES_LOCAL_RANK": rank, "COLLECTIVES_LOCAL_SIZE": n,
                            "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{store_port}"}
                else:
                    renv = rank_env(rank, n)
                penv = base_env({**extra, **renv})
                out = open(os.path.join(tmp, f"out{rank}"), "w+b")
                err = open(os.path.join(tmp, f"err{rank}"), "w+b")
                files.append((out, err))
                p = None if prefix else _zygote.start(rank, cmd[1:], penv, tmp, out.name,
                                                      err.name, fresh_env)
                if p is None:
                    p = subprocess.Popen([*(prefix(rank) if prefix else ()), *cmd], stdout=out,
                                         stderr=err, stdin=subprocess.DEVNULL, env=penv, cwd=tmp,
                                         start_new_session=True)
                _LIVE.add(p)
                procs.append(p)
            deadline = start + timeout
            timed_out = False
            for p in procs:
                left = deadline - time.monotonic()
                try:
                    p.wait(timeout=max(left, 0.01))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    break
        finally:
            for p in procs:
                if p.poll() is None:
                    _kill(p)
                else:
                    _LIVE.discard(p)
        ranks = []
        for rank, (p, (out, err)) in enumerate(zip(procs, files)):
            out.seek(0)
            err.seek(0)
            so = out.read().decode("utf-8", "replace")
            se = err.read().decode("utf-8", "replace")
            out.close()
            err.close()
            rc = None if (timed_out and p.returncode is not None and p.returncode < 0
                          and p.returncode == -signal.SIGKILL) else p.returncode
            ranks.append(RankResult(rank, rc, so, se, _parse_records(so)))
        return WorldResult(ranks, timed_out, time.monotonic() - start)


def _run_launcher(n, cmd, tmp, timeout, extra, start) -> WorldResult:
    full = [sys.executable, "-m", "collectives.run", "-np", str(n), *cmd]
    outf = open(os.path.join(tmp, "launcher.out"), "w+b")
    p = subprocess.Popen(full, stdout=outf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         env=base_env(extra), cwd=str(RUN_CWD), start_new_session=True)
    _LIVE.add(p)
    timed_out = False
    try:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        if p.poll() is None:
            # the launcher forwards SIGTERM to its ranks; give it a moment, then kill the group
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=3)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            _kill(p)
        _LIVE.discard(p)
    outf.seek(0)
    text = outf.read().decode("utf-8", "replace")
    outf.close()
    per = {r: ([], []) for r in range(n)}
    for line in text.splitlines():
        if line.startswith("[") and "]<" in line:
            head, _, rest = line.partition(">:")
            try:
                rank = int(head[1:head.index("]")])
            except ValueError:
                continue
            stream = head[head.index("]<") + 2:]
            if rank in per:
                per[rank][0 if stream == "stdout" else 1].append(rest[1:] if rest.startswith(" ") else rest)
    ranks = []
    for r in range(n):
        so, se = "\n".join(per[r][0]), "\n".join(per[r][1])
        ranks.append(RankResult(r, p.returncode, so, se, _parse_records(so)))
    return WorldResult(ranks, timed_out, time.monotonic() - start, p.returncode, text)


@pytest.fixture(autouse=True)
def _kill_leftovers():
    """Whatever a test did, no process it started outlives it."""
    yield
    for p in list(_LIVE):
        _kill(p)


@pytest.fixture
def world():
    """The run_world function (fixture form)."""
    return run_world


def pytest_unconfigure(config):
    """End the forking server of torch ranks (tests/_zygote.py)."""
    _zygote.stop()
