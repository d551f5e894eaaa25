"""collectives-run inside cluster engines: Kubeflow's PET_* variables, Slurm, the MPI Operator.

- A Kubeflow TrainJob (torch runtime) or PyTorchJob runs the same command in
  every pod with torchrun's options as ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
  ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT``. Read as
  torchrun reads them, ``collectives-run python train.py`` in each pod starts
  that pod's processes as ranks ``node_rank * nproc + i`` of ``nnodes * nproc``,
  with the store of rank 0 at ``PET_MASTER_ADDR:PET_MASTER_PORT`` (the declared
  port; torch.distributed's own store, for scripts that use it, one above). The
  pods share no launcher, so the job secret must come from the job: a mounted
  Secret (``COLLECTIVES_JOB_SECRET_FILE``) or ``COLLECTIVES_JOB_SECRET``.
- In a Slurm batch script or allocation, without ``-H``/``--hostfile``, the
  hosts and their slots are the job's (``SLURM_JOB_NODELIST``,
  ``SLURM_TASKS_PER_NODE``), and the ranks on other nodes start through
  ``srun`` (one single-task step each, overlapping the job's resources) instead
  of ssh; their secret still travels on stdin.
- The MPI Operator's ``/etc/mpi/discover_hosts.sh`` prints one host name a line
  (its hostfile says ``host slots=N``); :func:`parse_discovery` reads those, and
  ``host:slots``, with the operator's slots per worker
  (``OMPI_MCA_orte_set_default_slots``) for hosts that name none.
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from ..rendezvous.env import expand_hostlist, format_addr

__all__ = ["NodePlan", "kubeflow_node", "place_on_node", "slurm_hosts", "through_srun",
           "parse_discovery", "script_command", "SRUN_OPTIONS"]

# Each remote rank is one srun step of one task on its node. --overlap: the steps share
# the job's CPUs (several ranks on a node, and the batch step's own); --kill-on-bad-exit:
# Slurm stops a step whose task fails; --export=ALL: the step keeps this environment (the
# rank's own variables are inside the command, as over ssh).
SRUN_OPTIONS = ("--nodes=1", "--ntasks=1", "--overlap", "--kill-on-bad-exit=1",
                "--export=ALL", "--unbuffered")


@dataclass(frozen=True)
class NodePlan:
    """This pod's share of a Kubeflow job: its processes and where they sit in the world."""

    nnodes: int
    node_rank: int
    nproc: int
    store_addr: str
    torch_addr: str


def script_command(command: Sequence[str]) -> list:
    """As torchrun, a command that is a Python script (``collectives-run train.py``, a
    TrainJob's command) runs with this interpreter; any other command runs as given."""
    command = list(command)
    if command and command[0].endswith(".py") and not os.access(command[0], os.X_OK):
        import sys

        return [sys.executable, *command]
    return command


def _positive(env: Mapping[str, str], name: str, minimum: int = 1) -> int:
    text = env.get(name, "").strip()
    if not text.isdigit() or int(text) < minimum:
        raise ValueError(f"{name}={text!r} is not an integer >= {minimum}")
    return int(text)


def _gpu_count(env: Mapping[str, str]) -> int:
    """NVIDIA GPUs this pod sees, as torchrun's 'gpu' counts them, without loading CUDA."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def _nproc(env: Mapping[str, str], np: Optional[int]) -> int:
    """Processes per node: -np, else PET_NPROC_PER_NODE as torchrun reads it (a number;
    'gpu': the GPUs; 'cpu': the CPUs; 'auto': the GPUs if any, else the CPUs)."""
    if np is not None:
        return np
    text = env.get("PET_NPROC_PER_NODE", "").strip().lower() or "1"
    if text.isdigit() and int(text) > 0:
        return int(text)
    cpus = os.cpu_count() or 1
    gpus = _gpu_count(env)
    if text == "gpu":
        if not gpus:
            raise ValueError("PET_NPROC_PER_NODE=gpu but this pod sees no GPU")
        return gpus
    if text in ("cpu", "auto"):
        return gpus if text == "auto" and gpus else cpus
    raise ValueError(f"PET_NPROC_PER_NODE={text!r} is not a number, 'gpu', 'cpu' or 'auto'")


def kubeflow_node(env: Mapping[str, str], np: Optional[int]) -> Optional[NodePlan]:
    """This pod's plan from PET_* (None when PET_NNODES is unset).

    Raises:
        ValueError: naming the variable that is missing or bad; an elastic range of
            nodes (min:max), which needs torchrun's agent.
    """
    if "PET_NNODES" not in env:
        return None
    nnodes_text = env["PET_NNODES"].strip()
    lo, sep, hi = nnodes_text.partition(":")
    if sep and lo != hi:
        raise ValueError(f"PET_NNODES={nnodes_text!r} is an elastic range; collectives-run "
                         f"--elastic (or torchrun) handles elastic jobs, a fixed PET_NNODES here")
    nnodes = _positive({"PET_NNODES": lo}, "PET_NNODES")
    for name in ("PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"):
        if not env.get(name, "").strip():
            raise ValueError(f"PET_NNODES is set but {name} is not: the job's pods cannot "
                             f"agree where rank 0 is")
    node_rank = _positive(env, "PET_NODE_RANK", 0)
    if node_rank >= nnodes:
        raise ValueError(f"PET_NODE_RANK={node_rank} must be < PET_NNODES={nnodes}")
    port = _positive(env, "PET_MASTER_PORT")
    if port >= 65535:
        raise ValueError(f"PET_MASTER_PORT={port} leaves no port above it for torch's store")
    host = env["PET_MASTER_ADDR"].strip().strip("[]")
    nproc = _nproc(env, np)
    return NodePlan(nnodes, node_rank, nproc, format_addr(host, port),
                    format_addr(host, port + 1))


def place_on_node(ranks: Sequence, plan: NodePlan) -> list:
    """Turn the RankCommands of this pod's nproc local processes into ranks
    node_rank * nproc + i of the whole job (their variables and their labels)."""
    size = plan.nnodes * plan.nproc
    out = []
    for rc in ranks:
        rank = plan.node_rank * plan.nproc + rc.rank
        rc.rank = rank
        rc.env["COLLECTIVES_RANK"] = str(rank)
        rc.env["COLLECTIVES_SIZE"] = str(size)
        if "RANK" in rc.env:
            rc.env.update(RANK=str(rank), WORLD_SIZE=str(size), GROUP_RANK=str(plan.node_rank))
        out.append(rc)
    return out


def _tasks_per_node(text: str, count: int) -> list:
    """Slurm's "2(x3),1" -> [2, 2, 2, 1], checked against the number of nodes."""
    out: list = []
    for item in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not m:
            raise ValueError(f"SLURM_TASKS_PER_NODE={text!r}: cannot read {item!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    if len(out) != count:
        raise ValueError(f"SLURM_TASKS_PER_NODE={text!r} gives {len(out)} nodes but "
                         f"SLURM_JOB_NODELIST has {count}")
    return out


def slurm_hosts(env: Mapping[str, str]) -> Optional[list]:
    """[(node, tasks)] of the Slurm job this batch script or allocation belongs to; None
    outside Slurm, or inside a step (srun collectives-run: each task would launch)."""
    if not env.get("SLURM_JOB_ID") or "SLURM_STEP_NUM_TASKS" in env and \
            env.get("SLURM_STEP_ID", "").strip() not in ("", "4294967294"):
        return None
    nodes_text = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    if not nodes_text.strip():
        raise ValueError("SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not")
    nodes = expand_hostlist(nodes_text)
    per_node = env.get("SLURM_TASKS_PER_NODE", "").strip()
    slots = _tasks_per_node(per_node, len(nodes)) if per_node else [1] * len(nodes)
    return list(zip(nodes, slots))


def through_srun(ranks: Sequence) -> list:
    """Start the remote ranks through srun instead of ssh: the same watcher script (the
    secret on its stdin, stopped when stdin closes), as a one-task step on its node."""
    for rc in ranks:
        if rc.local:
            continue
        remote = shlex.split(rc.argv[-1])  # ["sh", "-c", script] (cli.build_rank_commands)
        if remote[:2] != ["sh", "-c"] or len(remote) != 3:
            raise ValueError(f"rank {rc.rank}: unexpected remote command {rc.argv[-1]!r}")
        rc.argv = ["srun", *SRUN_OPTIONS, f"--nodelist={rc.host}", *remote]
    return list(ranks)


def parse_discovery(text: str, env: Optional[Mapping[str, str]] = None) -> list:
    """Hosts from a discovery script's output: ``host``, ``host:slots`` or
    ``host slots=N`` lines ('#' comments). A host without slots gets the MPI
    Operator's slots per worker (``OMPI_MCA_orte_set_default_slots``), else 1.

    Raises:
        ValueError: naming the line that cannot be read.
    """
    env = os.environ if env is None else env
    default_text = env.get("OMPI_MCA_orte_set_default_slots", "").strip()
    default = int(default_text) if default_text.isdigit() and int(default_text) > 0 else 1
    hosts: list = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        host, slots = words[0], None
        if host.startswith("[") and "]:" in host:
            host, slots = host[1:host.index("]")], host[host.index("]:") + 2:]
        elif host.count(":") == 1:
            host, slots = host.split(":")
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key == "slots":
                slots = value
            elif key not in ("max_slots", "max-slots"):
                raise ValueError(f"discovery output line {lineno}: cannot read {raw.strip()!r}")
        if slots is not None and (not slots.isdigit() or int(slots) < 1):
            raise ValueError(f"discovery output line {lineno}: bad slot count in {raw.strip()!r}")
        hosts.append((host.strip("[]"), int(slots) if slots is not None else default))
    return hosts
