"""collectives-run inside engines (collectives/launcher/engines.py): a Kubeflow pod's PET_*
variables, Slurm through srun, the MPI Operator's discovery script (issue 35)."""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap

import pytest

from collectives.launcher import engines
from collectives.launcher.cli import RankCommand, build_rank_commands
from conftest import RUN_CWD, _LIVE, _kill, base_env, free_port

pytestmark = pytest.mark.timeout(120)

_BODY = textwrap.dedent("""
    import json, os
    import numpy as np
    from collectives import MPI
    c = MPI.COMM_WORLD
    x = np.array([float(c.Get_rank() + 1)])
    c.Allreduce(MPI.IN_PLACE, x)
    print("@@", json.dumps({"r": c.Get_rank(), "n": c.Get_size(), "total": float(x[0]),
                            "torch": [os.environ.get("RANK"), os.environ.get("WORLD_SIZE")]}))
""")


def _records(text):
    return [json.loads(line.split("@@ ", 1)[1]) for line in text.splitlines() if "@@ " in line]


def _start(args, env, cwd):
    p = subprocess.Popen([sys.executable, "-m", "collectives.run", *args], env=env, cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    _LIVE.add(p)
    return p


def _finish(p, timeout=90):
    try:
        out, _ = p.communicate(timeout=timeout)
    finally:
        _kill(p)
    return p.returncode, out


def test_trainjob_pods_each_running_collectives_run_form_one_world(tmp_path):
    """A TrainJob of 2 nodes x 2 processes whose command is `collectives-run python
    train.py`: each pod's launcher reads PET_* as torchrun does."""
    script = tmp_path / "train.py"
    script.write_text(_BODY)
    secret = tmp_path / "job-secret"  # the mounted Kubernetes Secret
    secret.write_text("ab" * 32)
    secret.chmod(0o400)
    port = free_port(pair=True)
    pods = []
    for node in range(2):
        env = base_env({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": node,
                        "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port,
                        "COLLECTIVES_JOB_SECRET_FILE": secret, "COLLECTIVES_START_TIMEOUT": 30})
        # pod 1 as the TrainJob: `collectives-run train.py`, no python (as torchrun)
        command = [sys.executable, str(script)] if node == 0 else [str(script)]
        pods.append(_start(command, env, str(tmp_path)))
    outs = [_finish(p) for p in pods]
    for rc, out in outs:
        assert rc == 0, out
        assert "unauthenticated" not in out, out
    recs = sorted((r["r"], r["n"], r["total"], tuple(r["torch"]))
                  for _, out in outs for r in _records(out))
    assert recs == [(r, 4, 10.0, (str(r), "4")) for r in range(4)], outs
    # Each pod's launcher labels its ranks by their place in the job.
    assert "[2]<stdout>" in outs[1][1] and "[0]<stdout>" in outs[0][1], outs


def test_pet_variables_the_launcher_cannot_use_are_refused_before_any_start(tmp_path):
    env = base_env({"PET_NNODES": "1:4", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "x",
                    "PET_MASTER_PORT": "29500"})
    rc, out = _finish(_start([sys.executable, "-c", "print('started')"], env, str(tmp_path)))
    assert rc == 2 and "elastic range" in out and "started" not in out, out
    env = base_env({"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_MASTER_PORT": "29500"})
    rc, out = _finish(_start([sys.executable, "-c", "print('started')"], env, str(tmp_path)))
    assert rc == 2 and "PET_MASTER_ADDR is not" in out and "started" not in out, out


_FAKE_SRUN = """#!{python}
# A stand-in for Slurm's srun: records its arguments and runs the command here.
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_SRUN_LOG"], "a") as fh:
    fh.write(json.dumps(args) + "\\n")
command = [a for a in args if not a.startswith("--")]
os.execvp(command[0], command)
"""


def test_under_slurm_remote_ranks_start_through_srun(tmp_path):
    """collectives-run in an sbatch script of 2 nodes: the ranks on the other node are
    srun steps (a fake srun that records its arguments), not ssh."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    srun = bindir / "srun"
    srun.write_text(_FAKE_SRUN.format(python=sys.executable))
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    (bindir / "ssh").write_text("#!/bin/sh\necho ssh was used >&2\nexit 99\n")
    (bindir / "ssh").chmod(0o755)
    script = tmp_path / "train.py"
    script.write_text(_BODY)
    log = tmp_path / "srun.log"
    here = socket.gethostname()
    env = base_env({"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": f"{here},node-b",
                    "SLURM_TASKS_PER_NODE": "1,2", "SLURM_NTASKS": "3", "SLURM_PROCID": "0",
                    "SLURM_JOB_NUM_NODES": "2", "FAKE_SRUN_LOG": log,
                    "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"})
    rc, out = _finish(_start([sys.executable, str(script)], env, str(tmp_path)))
    assert rc == 0, out
    recs = sorted((r["r"], r["n"], r["total"]) for r in _records(out))
    assert recs == [(r, 3, 6.0) for r in range(3)], out
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 2, calls  # ranks 1 and 2, on node-b; rank 0 is local
    for call in calls:
        assert "--nodelist=node-b" in call and "--overlap" in call and "--ntasks=1" in call
        assert not any("COLLECTIVES_JOB_SECRET=" in a for a in call), call  # stdin only
    assert "ssh was used" not in out


def test_srun_rank_commands_keep_the_secret_on_stdin():
    ranks = build_rank_commands(["python", "t.py"], [("localhost", 1), ("node-b", 1)], 2,
                                "head:1234", cwd="/w", secret="s" * 64)
    out = engines.through_srun(ranks)
    assert out[0].argv == ["python", "t.py"]
    assert out[1].argv[:1 + len(engines.SRUN_OPTIONS)] == ["srun", *engines.SRUN_OPTIONS]
    assert out[1].argv[-4:-1] == ["--nodelist=node-b", "sh", "-c"]
    assert "s" * 64 not in " ".join(out[1].argv) and out[1].stdin_data == b"s" * 64 + b"\n"


def test_slurm_hosts():
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "gpu[01-03],cpu7",
           "SLURM_TASKS_PER_NODE": "4(x3),1"}
    assert engines.slurm_hosts(env) == [("gpu01", 4), ("gpu02", 4), ("gpu03", 4), ("cpu7", 1)]
    assert engines.slurm_hosts({}) is None
    inside_step = {**env, "SLURM_STEP_ID": "3", "SLURM_STEP_NUM_TASKS": "2"}
    assert engines.slurm_hosts(inside_step) is None
    with pytest.raises(ValueError, match="gives 2 nodes but SLURM_JOB_NODELIST has 4"):
        engines.slurm_hosts({**env, "SLURM_TASKS_PER_NODE": "4(x2)"})


def test_discovery_reads_the_mpi_operators_script_output():
    # What /etc/mpi/discover_hosts.sh prints (one `echo <pod>.<svc>.<ns>.svc` a worker),
    # with the operator's slots per worker in the launcher's environment.
    out = "job-worker-0.job-worker.default.svc\njob-worker-1.job-worker.default.svc\n"
    assert engines.parse_discovery(out, {"OMPI_MCA_orte_set_default_slots": "4"}) == [
        ("job-worker-0.job-worker.default.svc", 4), ("job-worker-1.job-worker.default.svc", 4)]
    assert engines.parse_discovery(out, {}) == [
        ("job-worker-0.job-worker.default.svc", 1), ("job-worker-1.job-worker.default.svc", 1)]
    mixed = "# hosts\nnode1:2\nnode2 slots=3 max_slots=3\n[fd00::1]:2\n\n"
    assert engines.parse_discovery(mixed, {}) == [("node1", 2), ("node2", 3), ("fd00::1", 2)]
    for bad in ("node1:x\n", "node1 slots=0\n", "node1 weight=3\n"):
        with pytest.raises(ValueError, match="line 1"):
            engines.parse_discovery(bad, {})
