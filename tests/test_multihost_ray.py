"""A Ray cluster whose nodes sit in different hosts (network namespaces, tests/_netns.py):
`ray start --head` on host 0, `ray start --address` on host 1, and a RayExecutor that
spreads its workers over both nodes forms its world across them (issue 35)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("ray")

from _netns import Cluster  # noqa: E402
from _sshd import SshHosts  # noqa: E402  (run_in, kill_host: processes inside a host)
from conftest import _LIVE, _kill, base_env  # noqa: E402

pytestmark = pytest.mark.timeout(300)

_DRIVER = textwrap.dedent("""
    import json, socket, sys
    import ray
    from collectives.ray import RayExecutor

    def work():
        import numpy as np
        from collectives import MPI
        c = MPI.COMM_WORLD
        x = np.array([float(c.Get_rank() + 1)])
        c.Allreduce(MPI.IN_PLACE, x)
        return c.Get_rank(), c.Get_size(), float(x[0]), socket.gethostname()

    ray.init(address=sys.argv[1], log_to_driver=False)
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_hosts=2,
                     num_workers_per_host=1)
    try:
        ex.start()
        print("@@", json.dumps(ex.run(work)), flush=True)
    finally:
        ex.shutdown()
        ray.shutdown()
""")


def _ray(hosts, h, args, env, log):
    p = hosts.run_in(h, [shutil.which("ray") or os.path.join(os.path.dirname(sys.executable),
                                                             "ray"), *args],
                     env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        p.wait(timeout=180)
    except subprocess.TimeoutExpired:
        _kill(p)  # never after it returned: the Ray daemons it left share its group
        raise
    assert p.returncode == 0, log.name


def test_ray_nodes_on_two_hosts_form_one_world(tmp_path):
    import tempfile

    short = tempfile.mkdtemp(prefix="r35")  # Ray's socket paths must stay under 107 bytes
    try:
        _two_hosts(tmp_path, short)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def _two_hosts(tmp_path, short):
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    with Cluster(hosts=2) as cluster, SshHosts(cluster, tmp_path) as hosts:
        head = f"{cluster.addr(0)}:6379"
        # HOME of its own: nothing a Ray elsewhere on this machine left in ~/.ray (an
        # auth token) applies to this cluster
        env = base_env({"RAY_USAGE_STATS_ENABLED": "0", "COLLECTIVES_TIMEOUT": "60",
                        "HOME": str(tmp_path)})
        with open(tmp_path / "ray.log", "w") as log:
            _ray(hosts, 0, ["start", "--head", "--node-ip-address", cluster.addr(0),
                            "--port", "6379", "--num-cpus", "1", "--include-dashboard=false",
                            "--temp-dir", short, "--disable-usage-stats"],
                 env, log)
            _ray(hosts, 1, ["start", "--address", head, "--node-ip-address", cluster.addr(1),
                            "--num-cpus", "1", "--disable-usage-stats"], env, log)
        p = hosts.run_in(0, [sys.executable, str(driver), head], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _LIVE.add(p)
        try:
            out, _ = p.communicate(timeout=240)
        finally:
            _kill(p)
        assert p.returncode == 0, out + (tmp_path / "ray.log").read_text()[-3000:]
        results = json.loads(next(l for l in out.splitlines() if l.startswith("@@ "))[3:])
        assert [r[:3] for r in results] == [[0, 2, 3.0], [1, 2, 3.0]], out
        # one worker per host: ranks on the two namespace hosts
        assert sorted(r[3] for r in results) == [cluster.hostname(0), cluster.hostname(1)], out
