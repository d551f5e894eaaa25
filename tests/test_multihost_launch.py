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
