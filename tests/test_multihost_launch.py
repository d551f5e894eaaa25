"""collectives-run across hosts, tested as multi-host (issue 35): hosts are network
namespaces (tests/_netns.py) each running its own sshd (tests/_sshd.py); the launcher
runs on host 0 and starts every rank over ssh, the job secret on ssh's stdin."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from _netns import Cluster
from _sshd import SshHosts
from conftest import _LIVE, _kill, base_env, package_path, TESTS

pytestmark = pytest.mark.timeout(180)

_BODY = textwrap.dedent("""
    import json, os, socket
    import numpy as np
    from collectives import MPI
    c = MPI.COMM_WORLD
    x = np.full(1 << 16, float(c.Get_rank() + 1))
    c.Allreduce(MPI.IN_PLACE, x)
    print("@@", json.dumps({"r": c.Get_rank(), "n": c.Get_size(), "host": socket.gethostname(),
                            "total": float(x[0]),
                            "secret": len(os.environ.get("COLLECTIVES_JOB_SECRET", ""))}))
""")


def _records(text):
    return [json.loads(line.split("@@ ", 1)[1]) for line in text.splitlines() if "@@ " in line]


def test_collectives_run_over_ssh_across_two_hosts(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_BODY)
    with Cluster(hosts=2) as cluster, SshHosts(cluster, tmp_path) as hosts:
        env = base_env(hosts.env)
        spec = ",".join(f"{cluster.addr(h)}:2" for h in range(2))
        p = hosts.run_in(0, [sys.executable, "-m", "collectives.run", "-H", spec,
                             "--start-timeout", "30", "-x", "PYTHONPATH",
                             sys.executable, str(script)],
                         env=env, cwd=str(tmp_path), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        _LIVE.add(p)
        try:
            out, _ = p.communicate(timeout=150)
        finally:
            _kill(p)
        assert p.returncode == 0, out
        recs = sorted(_records(out), key=lambda r: r["r"])
        assert [(r["r"], r["n"], r["total"]) for r in recs] == [(r, 4, 10.0) for r in range(4)], out
        # ranks 0-1 on host 0, 2-3 on host 1: different hosts, as the namespaces say
        assert [r["host"] for r in recs] == [cluster.hostname(0)] * 2 + [cluster.hostname(1)] * 2
        # the secret came on ssh's stdin (never in argv), and every link proved it
        assert {r["secret"] for r in recs} == {64} and "unauthenticated" not in out, out


def _events(lines):
    out = []
    for line in lines:
        _, _, rest = line.partition(">:")
        rest = rest.strip()
        if rest.startswith("{"):
            try:
                out.append(json.loads(rest))
            except ValueError:
                pass
    return out


def test_elastic_across_hosts_a_host_joins_and_a_whole_host_dies(tmp_path):
    """--elastic over ssh on 3 hosts: the job starts on hosts 0 and 1, the discovery script
    then lists host 2 (the world grows to 3), then every process of host 1 is killed at
    once and the script stops listing it: hosts 0 and 2 go on and finish."""
    import threading
    import time

    hostsfile = tmp_path / "hosts"
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hostsfile}\n")
    script.chmod(0o755)
    with Cluster(hosts=3) as cluster, SshHosts(cluster, tmp_path) as hosts:
        hostsfile.write_text(f"{cluster.addr(0)}:1\n{cluster.addr(1)}:1\n")
        env = base_env({**hosts.env, "HOSTS_FILE": hostsfile, "TOTAL_STEPS": 400,
                        "STEP_SLEEP": 0.03, "COMMIT_EVERY": 2,
                        "ADD_HOST_AT": f"4:{cluster.addr(2)}:1", "COLLECTIVES_TIMEOUT": 30})
        exports = [a for name in ("PYTHONPATH", "HOSTS_FILE", "TOTAL_STEPS", "STEP_SLEEP",
                                  "COMMIT_EVERY", "ADD_HOST_AT", "COLLECTIVES_TIMEOUT")
                   for a in ("-x", name)]
        p = hosts.run_in(0, [sys.executable, "-m", "collectives.run", "--elastic", "-np", "2",
                             "--min-np", "1", "--max-np", "3", "--start-timeout", "30",
                             "--host-discovery-script", str(script),
                             "--discovery-interval", "0.2", *exports,
                             sys.executable, str(TESTS / "_elastic_train.py")],
                         env=env, cwd=str(tmp_path), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        _LIVE.add(p)
        lines: list = []
        reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")),
                                  daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 120
            while not any(e.get("ev") == "first_step" and e.get("size") == 3
                          for e in _events(list(lines))):
                assert p.poll() is None and time.monotonic() < deadline, "".join(lines)
                time.sleep(0.1)
            hostsfile.write_text(f"{cluster.addr(0)}:1\n{cluster.addr(2)}:1\n")
            hosts.kill_host(1)  # the whole host at once: its sshd, session and worker
            p.wait(timeout=120)
        finally:
            _kill(p)
        reader.join(5)
        text = "".join(lines)
        assert p.returncode == 0, text
        events = _events(lines)
        done = [e for e in events if e.get("ev") == "done"]
        assert len(done) == 2 and {e["size"] for e in done} == {2}, text
        assert done[0]["params"] == done[1]["params"], text
        # after the loss the survivors rolled back and re-formed a world of 2
        grew = max(i for i, e in enumerate(events) if e.get("size") == 3)
        assert any(e.get("ev") == "start" and e.get("size") == 2 for e in events[grew:]), text
