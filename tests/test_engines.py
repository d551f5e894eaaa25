"""Each cluster engine's exact variables, in real processes (issue 35).

Every test starts processes carrying the variables the engine sets (Kubeflow
Trainer v2's PET_*, a PyTorchJob pod, Volcano, OpenMPI under the MPI Operator,
Slurm steps and batch scripts, an Indexed Job), and checks that they form the
world the engine describes, or fail at once with an error that names the
variables and says what to do: never a silently wrong world, never a wait for
ranks that cannot come.
"""
from __future__ import annotations

import base64
import os
import random
import socket
import subprocess
import sys
import time

import pytest

from collectives.rendezvous.env import derived_port, detect
from conftest import base_env, free_port, run_world

pytestmark = pytest.mark.timeout(120)

# Reports the world it formed and proves it with an allreduce.
_WORLD_BODY = """
import numpy as np
from collectives import MPI
c = MPI.COMM_WORLD
x = np.array([float(c.Get_rank() + 1)])
c.Allreduce(MPI.IN_PLACE, x)
emit('world', r=c.Get_rank(), n=c.Get_size(), total=float(x[0]))
"""


def _free_job_id(steps=1):
    """A job id whose derived ports (steps 0..steps-1) are free now: a derived port falls
    in 20000..39999, which overlaps the kernel's ephemeral ports on a busy machine."""
    from collectives.launcher.cli import _bindable

    while True:
        job = str(random.randrange(10 ** 6, 10 ** 7))
        if all(_bindable(derived_port(job, s)) for s in range(steps)):
            return job


def _formed(res, n):
    res.assert_ok()
    got = sorted((res[i].one("world")["r"], res[i].one("world")["n"]) for i in range(n))
    assert got == [(r, n) for r in range(n)], res.report()
    assert {res[i].one("world")["total"] for i in range(n)} == {n * (n + 1) / 2}, res.report()


def _failed_fast(res, *needles, within=20.0):
    assert not res.timed_out and res.elapsed < within, res.report()
    for r in res.ranks:
        assert r.returncode not in (0, None), res.report()
        for needle in needles:
            assert needle in r.stderr, f"{needle!r} not in the error\n{res.report()}"


# ------------------------------------------------------------------ Kubernetes


def test_trainer_v2_pet_variables_without_rank_form_one_world():
    """TrainJob (torch runtime) with `python train.py`: PET_* and no RANK. Before: every
    process was rank 0 of a 1-rank world."""
    port = free_port()

    def pet(rank, n):
        return {"PET_NNODES": n, "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": rank,
                "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port,
                "COLLECTIVES_DEBUG": "INFO"}

    res = run_world(2, _WORLD_BODY, rank_env=pet, timeout=60)
    _formed(res, 2)
    assert "world from kubeflow" in res[1].stderr, res.report()  # COLLECTIVES_DEBUG=INFO


def test_pytorchjob_with_processes_per_pod_but_no_torchrun_fails_at_once():
    """PyTorchJob, nprocPerNode 2, command `python train.py`: RANK is the pod index and
    WORLD_SIZE counts pods x 2. Before: the ranks waited 300 s for ranks never started."""
    def pod(rank, n):
        return {"RANK": rank, "WORLD_SIZE": 2 * n, "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": 29500 + rank, "PET_NNODES": n, "PET_NPROC_PER_NODE": 2,
                "PET_NODE_RANK": rank, "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": 29500}

    res = run_world(2, _WORLD_BODY, rank_env=pod, timeout=60)
    _failed_fast(res, "PET_NPROC_PER_NODE=2", "torchrun", "collectives-run")


def _hold(port):
    """A listener on 127.0.0.1:port: a port the job may not use (not declared)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(1)
    return s


@pytest.mark.parametrize("engine", ["pytorchjob", "volcano"])
def test_without_torchrun_the_store_takes_the_declared_master_port(engine):
    """A PyTorchJob or Volcano pod (no torchrun) declares MASTER_PORT and it is free; the
    port above it is not ours to take (here: held by someone else). Before: the store
    went to MASTER_PORT + 1."""
    port = free_port(pair=True)
    held = _hold(port + 1)
    try:
        def pod(rank, n):
            env = {"RANK": rank, "WORLD_SIZE": n, "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": port, "COLLECTIVES_START_TIMEOUT": "20"}
            if engine == "pytorchjob":
                env.update(PET_NNODES=n, PET_NPROC_PER_NODE=1, PET_NODE_RANK=rank,
                           PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=port)
            else:  # Volcano's pytorch plugin, with its svc plugin's variables
                env.update(VC_TASK_INDEX=rank, VC_WORKER_NUM=n, VC_WORKER_HOSTS="a,b")
            return env

        _formed(run_world(2, _WORLD_BODY, rank_env=pod, timeout=60), 2)
    finally:
        held.close()


def test_torchrun_keeps_master_port_plus_one():
    info = detect({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500",
                   "TORCHELASTIC_RUN_ID": "none", "PET_NNODES": "1",
                   "PET_NPROC_PER_NODE": "2"})
    assert (info.source, info.store_port) == ("torchrun", 29501)


def test_indexed_job_two_documented_lines():
    """An Indexed Job or JobSet: the manifest adds COLLECTIVES_SIZE and
    COLLECTIVES_STORE_ADDR; the rank is JOB_COMPLETION_INDEX."""
    port = free_port()
    res = run_world(2, _WORLD_BODY, timeout=60, rank_env=lambda r, n: {
        "JOB_COMPLETION_INDEX": r, "COLLECTIVES_SIZE": n,
        "COLLECTIVES_STORE_ADDR": f"localhost:{port}"})
    _formed(res, 2)


def test_indexed_job_without_the_two_lines_fails_at_once():
    res = run_world(2, _WORLD_BODY, timeout=60,
                    rank_env=lambda r, n: {"JOB_COMPLETION_INDEX": r})
    _failed_fast(res, "JOB_COMPLETION_INDEX=", "COLLECTIVES_SIZE and COLLECTIVES_STORE_ADDR")


# ----------------------------------------------------------------------- OpenMPI


def test_openmpi_across_hosts_without_master_addr_is_an_error_not_loopback():
    """mpirun under an MPIJob, ranks on two hosts, no MASTER_ADDR. Before: the store was
    127.0.0.1 on every host, and the job hung."""
    def rank_env(rank, n):
        return {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": n,
                "OMPI_COMM_WORLD_LOCAL_RANK": 0, "OMPI_COMM_WORLD_LOCAL_SIZE": 1,
                "OMPI_MCA_ess_base_jobid": "4242"}

    res = run_world(2, _WORLD_BODY, rank_env=rank_env, timeout=60)
    _failed_fast(res, "OMPI_COMM_WORLD_LOCAL_SIZE=1 of OMPI_COMM_WORLD_SIZE=2", "MASTER_ADDR")


def test_openmpi_under_the_mpi_operator_uses_the_hostfiles_first_host(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=1\nlocalhost slots=1\n")  # the operator's format
    job = _free_job_id()

    def rank_env(rank, n):
        return {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": n,
                "OMPI_COMM_WORLD_LOCAL_RANK": 0, "OMPI_COMM_WORLD_LOCAL_SIZE": 1,
                "OMPI_MCA_ess_base_jobid": job,
                "OMPI_MCA_orte_default_hostfile": str(hostfile)}

    _formed(run_world(2, _WORLD_BODY, rank_env=rank_env, timeout=60), 2)


# ------------------------------------------------------------------------- Slurm


def _srun_task(job, step, procid, ntasks, job_tasks=8, nodes="localhost"):
    """The variables of one task of `srun -n ntasks` (step `step`) in an sbatch job that
    asked for job_tasks tasks on other nodes too."""
    return {"SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": f"otherhost01,{nodes}",
            "SLURM_NTASKS": job_tasks, "SLURM_TASKS_PER_NODE": f"{job_tasks // 2}(x2)",
            "SLURM_JOB_NUM_NODES": 2, "SLURM_STEP_ID": step, "SLURM_STEP_NUM_TASKS": ntasks,
            "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_TASKS_PER_NODE": ntasks,
            "SLURM_STEP_NUM_NODES": 1, "SLURM_PROCID": procid, "SLURM_LOCALID": procid,
            "SLURM_NODEID": 0, "COLLECTIVES_START_TIMEOUT": "20"}


def test_slurm_step_variables_win_over_the_jobs():
    """`srun -n 2` inside a job of 8 tasks on two nodes. Before: the world had the job's 8
    ranks and its store on the job's first node."""
    job = _free_job_id()
    res = run_world(2, _WORLD_BODY, timeout=60,
                    rank_env=lambda r, n: _srun_task(job, 0, r, n))
    _formed(res, 2)


def test_slurm_concurrent_steps_of_one_job_get_their_own_ports():
    """`srun -n 2 ... & srun -n 2 ... &` in one job: two 2-rank worlds at once on one node.
    Before: both steps derived the same port from the job id."""
    job = _free_job_id(steps=2)
    assert derived_port(job, 0) != derived_port(job, 1)
    body = _WORLD_BODY + "emit('step', step=os.environ['SLURM_STEP_ID'])\n"
    res = run_world(4, "import os\n" + body, timeout=60,
                    rank_env=lambda r, n: _srun_task(job, r // 2, r % 2, 2))
    res.assert_ok()
    for i in range(4):
        assert (res[i].one("world")["r"], res[i].one("world")["n"]) == (i % 2, 2), res.report()
        assert res[i].one("world")["total"] == 3.0, res.report()


def test_python_in_an_sbatch_script_without_srun_fails_at_once():
    """`python train.py` in the batch script of a 4-task job: one process runs. Before: it
    waited for 3 ranks that never start."""
    batch = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NTASKS": "4",
             "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2",
             "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
             "SLURM_CPUS_ON_NODE": "2"}
    res = run_world(1, _WORLD_BODY, timeout=60, rank_env=lambda r, n: batch)
    _failed_fast(res, "SLURM_NTASKS=4", "srun python train.py")


# ----------------------------------------------------------------- start-up


def test_rank_1_first_rank_0_five_seconds_later():
    """Pods start in any order: the worker before the master."""
    port = free_port()
    body = ("import os, time\nif os.environ['PET_NODE_RANK'] == '0':\n    time.sleep(5)\n"
            + _WORLD_BODY)

    def pet(rank, n):
        return {"PET_NNODES": n, "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": rank,
                "PET_MASTER_ADDR": "localhost", "PET_MASTER_PORT": port,
                "COLLECTIVES_START_TIMEOUT": "30"}

    res = run_world(2, body, rank_env=pet, timeout=60)
    _formed(res, 2)
    assert res.elapsed >= 5.0


def test_an_address_that_never_resolves_names_its_variable():
    def pet(rank, n):
        return {"PET_NNODES": 2, "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": rank + 1,
                "PET_MASTER_ADDR": "master-0.never-resolves.invalid", "PET_MASTER_PORT": 29500,
                "COLLECTIVES_START_TIMEOUT": "3"}

    t0 = time.monotonic()
    res = run_world(1, _WORLD_BODY, rank_env=pet, timeout=60)
    # within: 3 s of retries, plus a start on a busy machine and a resolver's own timeouts
    _failed_fast(res, "PET_MASTER_ADDR/PET_MASTER_PORT", "does not resolve",
                 "rank 0 and the ranks that reached no store were not seen", within=45)
    assert time.monotonic() - t0 >= 3.0


def test_rank_0_whose_own_name_never_resolves_names_its_variable():
    res = run_world(1, _WORLD_BODY, timeout=40, rank_env=lambda r, n: {
        "RANK": 0, "WORLD_SIZE": 2, "MASTER_ADDR": "me.never-resolves.invalid",
        "MASTER_PORT": 29500, "COLLECTIVES_START_TIMEOUT": "2"})
    _failed_fast(res, "MASTER_ADDR/MASTER_PORT", "did not resolve within 2 s")


# ------------------------------------------------------- the secret as a k8s Secret


def test_k8s_secret_helper_mounted_as_a_file_authenticates_a_job(tmp_path):
    out = [subprocess.run([sys.executable, "-m", "collectives.launcher.k8s_secret",
                           "collectives-job-secret", "-n", "ml"], capture_output=True,
                          text=True, env=base_env(), timeout=60, check=True).stdout
           for _ in range(2)]
    assert out[0] != out[1]  # a fresh key each time
    lines = out[0].splitlines()
    assert lines[:4] == ["apiVersion: v1", "kind: Secret", "metadata:",
                         "  name: collectives-job-secret"] and "  namespace: ml" in lines
    key = base64.b64decode(lines[-1].split(": ", 1)[1]).decode()
    assert len(key) == 64 and int(key, 16) >= 0
    # Mounted as Kubernetes does with defaultMode 0400: a file holding the key.
    path = tmp_path / "job-secret"
    path.write_text(key)
    path.chmod(0o400)
    res = run_world(2, _WORLD_BODY, timeout=60,
                    env={"COLLECTIVES_JOB_SECRET_FILE": str(path)})
    _formed(res, 2)
    assert "unauthenticated" not in res[0].stderr + res[1].stderr, res.report()
    bad = subprocess.run([sys.executable, "-m", "collectives.launcher.k8s_secret", "Bad_Name"],
                         capture_output=True, text=True, env=base_env(), timeout=60)
    assert bad.returncode == 2 and "not a Kubernetes object name" in bad.stderr
