"""The cluster examples (examples/*.yaml, examples/slurm_job.sh) as the README gives them.

The Slurm batch script runs for real, with a stand-in srun that starts its tasks here
with the variables srun gives them. The Kubernetes manifests cannot run without a
cluster: each is read, its Secret checked mounted where COLLECTIVES_JOB_SECRET_FILE
points, and the variables its operator adds to each pod (as the operator sets them)
together with the manifest's own must form the job's world.
"""
from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys

import pytest
import yaml

from collectives.launcher import engines
from collectives.rendezvous.env import detect
from conftest import REPO, _LIVE, _kill, base_env

pytestmark = pytest.mark.timeout(120)
EXAMPLES = REPO / "examples"


def _load(name):
    return yaml.safe_load((EXAMPLES / name).read_text())


def _pods(doc):
    """Every pod spec in a manifest (the YAML anchors are resolved by the loader)."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "containers" in node and "volumes" in node:
                found.append(node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(doc)
    return found


def _env_of(container):
    return {e["name"]: str(e["value"]) for e in container.get("env", [])}


def _check_secret(pod, container):
    vol = next(v for v in pod["volumes"] if "secret" in v)
    assert vol["secret"]["secretName"] == "collectives-job-secret"
    assert vol["secret"]["defaultMode"] == 0o400  # not readable by others: no WARN
    mount = next(m for m in container["volumeMounts"] if m["name"] == vol["name"])
    return mount["mountPath"]


@pytest.mark.parametrize("name", ["pytorchjob.yaml", "mpijob.yaml", "jobset.yaml"])
def test_manifest_mounts_the_secret_where_the_ranks_read_it(name):
    doc = _load(name)
    pods = _pods(doc)
    assert pods, name
    secret_paths = set()
    for pod in pods:
        for c in pod["containers"]:
            if c.get("volumeMounts"):
                secret_paths.add(_check_secret(pod, c) + "/job-secret")
    wanted = {v for pod in pods for c in pod["containers"]
              for k, v in _env_of(c).items() if k == "COLLECTIVES_JOB_SECRET_FILE"}
    if name == "mpijob.yaml":  # mpirun -x passes it from the launcher to the ranks
        cmd = doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
        wanted = {a.split("=", 1)[1] for a in cmd["command"]
                  if a.startswith("COLLECTIVES_JOB_SECRET_FILE=")}
    assert wanted and wanted <= secret_paths, (wanted, secret_paths)


def test_pytorchjob_pods_form_the_world_on_the_declared_port():
    doc = _load("pytorchjob.yaml")
    specs = doc["spec"]["pytorchReplicaSpecs"]
    c = specs["Master"]["template"]["spec"]["containers"][0]
    port = c["ports"][0]["containerPort"]
    n = specs["Master"]["replicas"] + specs["Worker"]["replicas"]
    for rank in range(n):  # what the Training Operator sets in pod `rank`
        env = {**_env_of(c), "RANK": str(rank), "WORLD_SIZE": str(n), "MASTER_PORT": str(port),
               "MASTER_ADDR": "collectives-hello-master-0", "PET_NNODES": str(n),
               "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "collectives-hello-master-0",
               "PET_MASTER_PORT": str(port)}
        info = detect(env)
        assert (info.rank, info.size, info.store_port) == (rank, n, port)


def test_trainjob_pods_each_start_their_share_of_the_ranks():
    spec = _load("trainjob.yaml")["spec"]
    trainer = spec["trainer"]
    assert trainer["command"][0] == "collectives-run"
    nnodes, nproc = trainer["numNodes"], trainer["numProcPerNode"]
    _check_secret(spec["podSpecOverrides"][0], spec["podSpecOverrides"][0]["containers"][0])
    plans = [engines.kubeflow_node({  # the torch plugin's PET_* variables, pod `node`
        "PET_NNODES": str(nnodes), "PET_NPROC_PER_NODE": str(nproc), "PET_NODE_RANK": str(node),
        "PET_MASTER_ADDR": "collectives-hello-node-0-0.collectives-hello",
        "PET_MASTER_PORT": "29400"}, None) for node in range(nnodes)]
    assert [(p.node_rank, p.nproc, p.store_addr) for p in plans] == [
        (node, nproc, "collectives-hello-node-0-0.collectives-hello:29400")
        for node in range(nnodes)]


def test_mpijob_ranks_find_rank_0_on_the_first_worker():
    doc = _load("mpijob.yaml")
    argv = doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    passed = dict(a.split("=", 1) for a in argv if "=" in a and a.split("=")[0].isupper())
    n = int(argv[argv.index("-np") + 1])
    assert n == doc["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    for rank in range(n):  # what OpenMPI sets in a rank on worker `rank`
        info = detect({**passed, "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(n),
                       "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
                       "OMPI_MCA_ess_base_jobid": "1"})
        assert (info.rank, info.size, info.store_host) == (
            rank, n, "collectives-hello-worker-0.collectives-hello-worker")
    without = {k: v for k, v in passed.items() if not k.startswith("MASTER_")}
    with pytest.raises(ValueError, match="nothing names rank 0's host"):
        detect({**without, "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": str(n),
                "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
                "OMPI_MCA_ess_base_jobid": "1"})


def test_jobset_pods_take_their_completion_index_as_rank():
    doc = _load("jobset.yaml")
    rjob = doc["spec"]["replicatedJobs"][0]
    job = rjob["template"]["spec"]
    env = _env_of(job["template"]["spec"]["containers"][0])
    for index in range(job["completions"]):
        info = detect({**env, "JOB_COMPLETION_INDEX": str(index)})
        assert (info.rank, info.size, info.source) == (index, job["completions"], "indexed-job")
        # pod 0's DNS name under JobSet: <jobset>-<replicatedJob>-<job index>-<pod index>
        assert info.store_host == (f"{doc['metadata']['name']}-{rjob['name']}-0-0."
                                   f"{doc['metadata']['name']}")


_FAKE_SRUN = r'''#!{python}
# A stand-in for srun in a batch script: starts SLURM_NTASKS tasks of the command here,
# each with the variables srun gives a task of step 0, and returns the worst exit code.
import os, subprocess, sys
n = int(os.environ["SLURM_NTASKS"])
procs = []
for i in range(n):
    env = dict(os.environ, SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS=str(n),
               SLURM_STEP_NODELIST=os.environ["SLURM_JOB_NODELIST"],
               SLURM_STEP_TASKS_PER_NODE=str(n), SLURM_STEP_NUM_NODES="1",
               SLURM_PROCID=str(i), SLURM_LOCALID=str(i), SLURM_NODEID="0")
    procs.append(subprocess.Popen(sys.argv[1:], env=env))
sys.exit(max(p.wait() for p in procs))
'''


def test_slurm_batch_script_runs_and_python_without_srun_is_refused(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    srun = bindir / "srun"
    srun.write_text(_FAKE_SRUN.replace("{python}", sys.executable))
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    from test_engines import _free_job_id

    batch = {"SLURM_JOB_ID": _free_job_id(), "SLURM_JOB_NODELIST": socket.gethostname(),
             "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "4", "SLURM_JOB_NUM_NODES": "1",
             "SLURM_NNODES": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
             "SLURM_NODEID": "0", "SLURM_SUBMIT_DIR": str(REPO),
             "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    # python on PATH is the interpreter under test (the README's install). A wrapper, not
    # a symlink: a symlink outside the venv's bin/ loses the venv (no pyvenv.cfg beside it)
    wrapper = bindir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    for argv, ok in ((["bash", str(EXAMPLES / "slurm_job.sh")], True),
                     ([sys.executable, "examples/hello_allreduce.py"], False)):
        p = subprocess.Popen(argv, cwd=str(REPO), env=base_env(batch), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        _LIVE.add(p)
        try:
            out, _ = p.communicate(timeout=90)
        finally:
            _kill(p)
        if ok:
            assert p.returncode == 0 and "4 ranks: mean gradient 1.50" in out, out
        else:
            assert p.returncode != 0 and "srun python train.py" in out, out
