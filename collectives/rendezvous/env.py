"""Where this process sits in the job: rank, size, local rank and store address.

One rule: never a silently wrong world. Each engine's variables are read as
that engine sets them (the first dialect present wins), cross-checked, and
either form the world they describe or raise ValueError at once, naming the
variables and what to do. A 1-rank world only when no launcher variable
(:data:`LAUNCHER_VARS`) is set at all. ``COLLECTIVES_DEBUG=INFO`` logs the
dialect used and where the store address came from.

1. ``COLLECTIVES_RANK``/``COLLECTIVES_SIZE`` (+ ``COLLECTIVES_LOCAL_RANK``,
   ``COLLECTIVES_LOCAL_SIZE``, ``COLLECTIVES_STORE_ADDR``): collectives-run,
   our Ray and Spark integrations. An Indexed Job or JobSet adds two lines to
   its manifest, ``COLLECTIVES_SIZE`` and ``COLLECTIVES_STORE_ADDR``, and the
   rank is ``JOB_COMPLETION_INDEX``.
2. ``RANK``/``WORLD_SIZE`` (+ ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
   ``MASTER_ADDR``, ``MASTER_PORT``). Under torchrun (``TORCHELASTIC_RUN_ID``)
   the agent's own store holds ``MASTER_PORT``, so ours takes
   ``MASTER_PORT + 1``; set by a PyTorchJob or Volcano pod without torchrun,
   ``MASTER_PORT`` is the declared, free port and ours takes it. A PyTorchJob
   pod whose ``WORLD_SIZE`` counts several processes per pod (``PET_NNODES``,
   ``PET_NPROC_PER_NODE``) but that torchrun did not start raises: its other
   processes were never started.
3. Kubeflow Trainer v2 (``PET_NNODES``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``,
   ``PET_MASTER_PORT``, no ``RANK``): one process per node, the store at
   ``PET_MASTER_ADDR:PET_MASTER_PORT``; more than one per node raises (torchrun
   or collectives-run must start them).
4. OpenMPI: ``OMPI_COMM_WORLD_RANK`` (+ ``_SIZE``, ``_LOCAL_RANK``,
   ``_LOCAL_SIZE``). The store is at ``MASTER_ADDR:MASTER_PORT`` when set; else
   on the first host of mpirun's hostfile (the MPI Operator's
   ``/etc/mpi/hostfile``) or, when every rank is on this host, 127.0.0.1, at a
   port derived from the job id; a multi-host job with neither raises.
5. Slurm steps: ``SLURM_PROCID`` with the step's own ``SLURM_STEP_NUM_TASKS``,
   ``SLURM_STEP_NODELIST`` and ``SLURM_STEP_TASKS_PER_NODE`` (never the job's
   ``SLURM_NTASKS``); the store on the step's first node at a port derived from
   ``SLURM_JOB_ID`` and ``SLURM_STEP_ID``, unless ``MASTER_ADDR``/``MASTER_PORT``.
   A batch script (no step) of a job that asks for more than one task raises.
6. Nothing: a single process (rank 0 of 1, no store).

``COLLECTIVES_STORE_ADDR`` ("host:port", IPv6 as "[::1]:port") overrides the
store address whatever the source. Nothing here opens a connection except
:func:`advertise_address`, which only connects a UDP socket (sends nothing).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
import struct
import zlib
from dataclasses import dataclass, field
from typing import Mapping, Optional

__all__ = [
    "WorldInfo",
    "detect",
    "parse_addr",
    "format_addr",
    "expand_hostlist",
    "derived_port",
    "LAUNCHER_VARS",
    "interface_address",
    "advertise_address",
]

# Ports derived from a job id fall in 20000..39999: above the registered
# services most clusters run. The range overlaps Linux's ephemeral ports
# (32768+), so a collision is possible but rare, and it fails loudly (the
# store cannot bind) rather than silently.
_PORT_BASE = 20000
_PORT_SPAN = 20000

_SIOCGIFADDR = 0x8915  # Linux ioctl: IPv4 address of an interface


@dataclass(frozen=True)
class WorldInfo:
    """Rank, size, placement and store address of this process.

    ``store_host``/``store_port`` are None only when ``size == 1``.
    ``source`` is one of "collectives", "indexed-job", "torchrun", "env",
    "pytorchjob", "volcano", "kubeflow", "openmpi", "slurm", "slurm-batch",
    "single"; ``store_var`` names the variables the store address came from
    (start-up errors name it).
    """

    rank: int
    size: int
    local_rank: Optional[int]
    local_size: Optional[int]
    store_host: Optional[str]
    store_port: Optional[int]
    source: str
    store_var: str = field(default="", compare=False)


# ---------------------------------------------------------------- addresses


def parse_addr(text: str) -> tuple[str, int]:
    """Split "host:port", "1.2.3.4:port" or "[v6addr]:port" into (host, port).

    Raises:
        ValueError: if the text has no port, the port is not an integer in
            1..65535, or an IPv6 address is not in brackets.
    """
    text = text.strip()
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or not text[close + 1 :].startswith(":"):
            raise ValueError(f"bad address {text!r}: expected '[ipv6]:port'")
        host, port_text = text[1:close], text[close + 2 :]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"bad address {text!r}: expected 'host:port'")
        if ":" in host:
            raise ValueError(
                f"bad address {text!r}: write IPv6 addresses as '[addr]:port'"
            )
    if not host:
        raise ValueError(f"bad address {text!r}: empty host")
    return host, _parse_port(port_text, f"address {text!r}")


def format_addr(host: str, port: int) -> str:
    """Join host and port, bracketing IPv6 literals: ("::1", 80) -> "[::1]:80"."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def _parse_port(text: str, what: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise ValueError(f"bad port {text!r} in {what}: not an integer") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad port {port} in {what}: must be in 1..65535")
    return port


def derived_port(job_id: str, step: int = 0) -> int:
    """A port in 20000..39999 computed from a job id, the same on every rank; steps of one
    job get consecutive ports, so concurrent steps never share one."""
    return _PORT_BASE + (zlib.crc32(job_id.encode()) + step) % _PORT_SPAN


# ------------------------------------------------------------ slurm hostlist


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside [...]."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"bad hostlist {text!r}: unbalanced ']'")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"bad hostlist {text!r}: unbalanced '['")
    parts.append(text[start:])
    return [p for p in (s.strip() for s in parts) if p]


def _expand_range_set(body: str, whole: str) -> list[str]:
    """"01-03,07" -> ["01", "02", "03", "07"], keeping zero padding."""
    out: list[str] = []
    for item in body.split(","):
        lo, sep, hi = item.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad hostlist {whole!r}: bad range {item!r}")
        if not sep:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"bad hostlist {whole!r}: descending range {item!r}")
        width = len(lo)  # Slurm pads to the width of the lower bound
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm hostlist: "node[01-03,07],gpu3" -> node01..node03, node07, gpu3.

    Several bracket groups in one name expand as a product, in Slurm's order
    ("r[1-2]n[1-2]" -> r1n1, r1n2, r2n1, r2n2).
    """
    hosts: list[str] = []
    for part in _split_top_level(text):
        names = [""]
        rest = part
        while rest:
            open_ = rest.find("[")
            if open_ < 0:
                names = [n + rest for n in names]
                break
            close = rest.find("]", open_)
            prefix, body, rest = rest[:open_], rest[open_ + 1 : close], rest[close + 1 :]
            names = [n + prefix + v for n in names for v in _expand_range_set(body, text)]
        hosts.extend(names)
    return hosts


def _simple_tasks_per_node(text: str) -> Optional[int]:
    """"4" or "4(x3)" or "4,4" -> 4; uneven lists like "2(x3),1" -> None."""
    counts = set()
    for item in text.split(","):
        item = item.strip()
        base = item.split("(", 1)[0]
        if not base.isdigit():
            return None
        counts.add(int(base))
    return counts.pop() if len(counts) == 1 else None


# -------------------------------------------------------------- env readers

_BYTES = re.compile(r"(\d+)(?:([kmg])(?:i?b)?|b)?", re.IGNORECASE)


def byte_size(name: str, text: str) -> int:
    """Variable `name`'s byte count as the core reads it: digits with an optional K, M or G
    (binary: "4M", "512k", "4MiB", "65536"); ValueError naming the variable otherwise."""
    m = _BYTES.fullmatch(text.strip())
    if not m:
        raise ValueError(f"{name}={text!r} is not a number of bytes (like 4M, 512K or 65536)")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[(m.group(2) or "").lower()]


def _int_var(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    text = env.get(name)
    if text is None:
        raise ValueError(f"{name} is not set")
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{name}={text!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


def _opt_int_var(env: Mapping[str, str], name: str, minimum: int = 0) -> Optional[int]:
    return _int_var(env, name, minimum) if env.get(name, "").strip() else None


def _master_addr(env: Mapping[str, str], port_offset: int = 0,
                 prefix: str = "") -> Optional[tuple[str, int]]:
    """{prefix}MASTER_ADDR/{prefix}MASTER_PORT (+ port_offset) as a store address, or None
    when both are unset; ValueError naming the one that is missing or bad."""
    a_var, p_var = f"{prefix}MASTER_ADDR", f"{prefix}MASTER_PORT"
    host = env.get(a_var, "").strip()
    port_text = env.get(p_var, "").strip()
    if not host and not port_text:
        return None
    if not host or not port_text:
        missing, given = (a_var, p_var) if not host else (p_var, a_var)
        raise ValueError(f"{given} is set but {missing} is not: the store address needs both")
    port = _parse_port(port_text, p_var) + port_offset
    if port > 65535:
        raise ValueError(f"{p_var}={port_text} leaves no room for port {p_var}+1")
    return host.strip("[]"), port


def _check(info: WorldInfo, rank_var: str, size_var: str, local_vars: tuple[str, str],
           store_var: str) -> WorldInfo:
    if info.size < 1:
        raise ValueError(f"{size_var}={info.size} must be >= 1")
    if info.rank >= info.size:
        raise ValueError(f"{rank_var}={info.rank} must be < {size_var}={info.size}")
    if info.local_rank is not None and info.local_size is not None:
        if info.local_rank >= info.local_size:
            raise ValueError(
                f"{local_vars[0]}={info.local_rank} must be < "
                f"{local_vars[1]}={info.local_size}"
            )
    if info.size > 1 and (info.store_host is None or info.store_port is None):
        raise ValueError(
            f"{store_var} is not set: a job of {info.size} processes needs a store "
            "address (set COLLECTIVES_STORE_ADDR=host:port)"
        )
    return info


# Variables whose presence says a launcher or a cluster engine started this process. When
# one is set and no dialect below forms a world from them, detect() raises instead of
# falling back to a 1-rank world (a job of N processes each training alone).
LAUNCHER_VARS = (
    "RANK", "WORLD_SIZE", "PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK",
    "SLURM_PROCID", "SLURM_JOB_ID", "VC_TASK_INDEX", "VK_TASK_INDEX", "JOB_COMPLETION_INDEX",
)
# Where the MPI Operator (and mpirun's users) name the hostfile; the first host runs rank 0.
_HOSTFILE_VARS = ("OMPI_MCA_orte_default_hostfile", "OMPI_MCA_rmaps_default_hostfile",
                  "PRTE_MCA_prte_default_hostfile")
_OMPI_JOB_VARS = ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid")
_SLURM_BATCH_STEP = "4294967294"  # SLURM_BATCH_SCRIPT: the step id of the batch script
_LAUNCH_HINT = ("start the processes with torchrun (`torchrun --nnodes=$PET_NNODES "
                "--nproc-per-node=N train.py`) or collectives-run (`collectives-run python "
                "train.py`), which read these variables and start the processes of each node")


def _info_log(message: str, environ: Mapping[str, str]) -> None:
    """An INFO line on stderr as the core writes them, when COLLECTIVES_DEBUG=INFO and
    COLLECTIVES_DEBUG_SUBSYS (default ALL) includes INIT."""
    if environ.get("COLLECTIVES_DEBUG", "").strip().upper() != "INFO":
        return
    subsys = environ.get("COLLECTIVES_DEBUG_SUBSYS", "ALL").upper().split(",")
    if "ALL" not in subsys and "INIT" not in subsys:
        return
    import sys
    sys.stderr.write(f"{socket.gethostname()}:{os.getpid()} [-1] COLLECTIVES INFO env.py "
                     f"{message}\n")
    sys.stderr.flush()


class _Reader:
    """What one dialect read: the pieces of a WorldInfo and the variables they came from."""

    def __init__(self, env: Mapping[str, str], override: Optional[tuple[str, int]]) -> None:
        self.env = env
        self.override = override

    def world(self, rank: int, size: int, local_rank: Optional[int], local_size: Optional[int],
              store: Optional[tuple[str, int]], source: str, names: tuple, store_var: str,
              detail: str = "") -> WorldInfo:
        if self.override is not None:
            store, store_var = self.override, "COLLECTIVES_STORE_ADDR"
        host, port = store if store else (None, None)
        info = WorldInfo(rank, size, local_rank, local_size, host, port, source, store_var)
        info = _check(info, names[0], names[1], (names[2], names[3]), store_var)
        where = f", store {format_addr(host, port)} from {store_var}" if host else ""
        _info_log(f"world from {source} ({', '.join(n for n in names if n in self.env)}): "
                  f"rank {rank} of {size}{where}{'; ' + detail if detail else ''}", self.env)
        return info


def _ours(r: _Reader) -> Optional[WorldInfo]:
    env = r.env
    if "COLLECTIVES_RANK" not in env and "COLLECTIVES_SIZE" not in env:
        return None
    names = ("COLLECTIVES_RANK", "COLLECTIVES_SIZE", "COLLECTIVES_LOCAL_RANK",
             "COLLECTIVES_LOCAL_SIZE")
    source = "collectives"
    if "COLLECTIVES_RANK" not in env and "JOB_COMPLETION_INDEX" in env:
        # An Indexed Job or a JobSet: the pod's completion index is its rank, and the
        # manifest adds COLLECTIVES_SIZE and COLLECTIVES_STORE_ADDR (examples/jobset.yaml).
        names = ("JOB_COMPLETION_INDEX",) + names[1:]
        source = "indexed-job"
    info = r.world(_int_var(env, names[0]), _int_var(env, names[1], 1),
                   _opt_int_var(env, names[2]), _opt_int_var(env, names[3], 1), None, source,
                   names, "COLLECTIVES_STORE_ADDR")
    return info


def _pet_nnodes(env: Mapping[str, str]) -> int:
    text = env["PET_NNODES"].strip()
    lo, sep, hi = text.partition(":")
    if sep and lo.strip() != hi.strip():
        raise ValueError(f"PET_NNODES={text!r} asks for an elastic range of nodes, which only "
                         f"torchrun's agent can form: {_LAUNCH_HINT}")
    return _int_var({"PET_NNODES": lo}, "PET_NNODES", 1)


def _pet_nproc(env: Mapping[str, str]) -> Optional[int]:
    """PET_NPROC_PER_NODE as a number; None when unset or a word (auto, cpu, gpu)."""
    text = env.get("PET_NPROC_PER_NODE", "").strip()
    return _int_var(env, "PET_NPROC_PER_NODE", 1) if text.isdigit() else None


def _env_dialect(r: _Reader) -> Optional[WorldInfo]:
    """RANK/WORLD_SIZE: torchrun's workers, or a PyTorchJob or Volcano pod (no torchrun)."""
    env = r.env
    if "RANK" not in env and "WORLD_SIZE" not in env:
        return None
    if "RANK" not in env or "WORLD_SIZE" not in env:
        if "SLURM_PROCID" in env or "OMPI_COMM_WORLD_RANK" in env:
            return None  # WORLD_SIZE exported in a Slurm/mpirun script: checked there
        given, missing = ("RANK", "WORLD_SIZE") if "RANK" in env else ("WORLD_SIZE", "RANK")
        raise ValueError(f"{given} is set but {missing} is not: set both (torchrun does), "
                         f"or neither")
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    rank, size = _int_var(env, "RANK"), _int_var(env, "WORLD_SIZE", 1)
    if "TORCHELASTIC_RUN_ID" in env:
        # torchrun's agent already listens on MASTER_PORT with its own store.
        return r.world(rank, size, _opt_int_var(env, "LOCAL_RANK"),
                       _opt_int_var(env, "LOCAL_WORLD_SIZE", 1),
                       None if r.override else _master_addr(env, port_offset=1), "torchrun",
                       names, "MASTER_ADDR/MASTER_PORT (+1: torchrun's store holds MASTER_PORT)")
    source = "env"
    if "PET_NNODES" in env:
        # A PyTorchJob pod run without torchrun: RANK is the pod's index and WORLD_SIZE
        # counts pods x PET_NPROC_PER_NODE, so with more than one process per pod the
        # world can never fill.
        source = "pytorchjob"
        nnodes, nproc = _pet_nnodes(env), _pet_nproc(env)
        if size != nnodes or (nproc or 1) != 1:
            raise ValueError(
                f"WORLD_SIZE={size} counts the processes of {nnodes} pods (PET_NNODES="
                f"{env['PET_NNODES'].strip()}, PET_NPROC_PER_NODE="
                f"{env.get('PET_NPROC_PER_NODE', '(unset)')}), but this process was not "
                f"started by torchrun: RANK={rank} is its pod's index, and the other "
                f"processes of its pod were never started; {_LAUNCH_HINT}")
        if "PET_NODE_RANK" in env and _int_var(env, "PET_NODE_RANK") != rank:
            raise ValueError(f"RANK={rank} and PET_NODE_RANK={env['PET_NODE_RANK']} disagree "
                             f"on this pod's index")
    elif "VC_TASK_INDEX" in env or "VK_TASK_INDEX" in env:
        source = "volcano"
    # No torchrun agent: the declared MASTER_PORT is free, and the store takes it.
    return r.world(rank, size, _opt_int_var(env, "LOCAL_RANK"),
                   _opt_int_var(env, "LOCAL_WORLD_SIZE", 1),
                   None if r.override else _master_addr(env), source, names,
                   "MASTER_ADDR/MASTER_PORT")


def _kubeflow(r: _Reader) -> Optional[WorldInfo]:
    """Kubeflow Trainer v2 (torch runtime) runs the command with torchrun's PET_* options
    and no RANK: one process per pod is right only when PET_NPROC_PER_NODE says so."""
    env = r.env
    if "PET_NNODES" not in env:
        return None
    nnodes, nproc = _pet_nnodes(env), _pet_nproc(env)
    if nproc is not None and nproc > 1:
        raise ValueError(
            f"PET_NPROC_PER_NODE={nproc} asks for {nproc} processes on each of PET_NNODES="
            f"{nnodes} nodes, but this process was started alone, without torchrun (no "
            f"RANK is set); {_LAUNCH_HINT}")
    if "PET_NODE_RANK" not in env:
        raise ValueError("PET_NNODES is set but PET_NODE_RANK is not: which node this is "
                         "is unknown")
    store = None if r.override else _master_addr(env, prefix="PET_")
    detail = ("one process per node" if nproc else
              f"PET_NPROC_PER_NODE={env.get('PET_NPROC_PER_NODE', '(unset)')}: one process "
              f"per node, the one started")
    return r.world(_int_var(env, "PET_NODE_RANK"), nnodes, 0, 1, store, "kubeflow",
                   ("PET_NODE_RANK", "PET_NNODES", "", "PET_NPROC_PER_NODE"),
                   "PET_MASTER_ADDR/PET_MASTER_PORT", detail)


def _first_hostfile_host(env: Mapping[str, str]) -> Optional[tuple[str, str]]:
    """(the first host of the hostfile mpirun was given, the variable naming it)."""
    for var in _HOSTFILE_VARS:
        path = env.get(var, "").strip()
        if not path:
            continue
        try:
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    words = line.split("#", 1)[0].split()
                    if words:
                        return words[0].split(":", 1)[0] if words[0].count(":") == 1 \
                            else words[0], var
        except OSError:
            continue
    return None


def _openmpi(r: _Reader) -> Optional[WorldInfo]:
    env = r.env
    if "OMPI_COMM_WORLD_RANK" not in env:
        return None
    names = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
             "OMPI_COMM_WORLD_LOCAL_SIZE")
    rank, size = _int_var(env, names[0]), _int_var(env, names[1], 1)
    local_rank, local_size = _opt_int_var(env, names[2]), _opt_int_var(env, names[3], 1)
    _cross_check_world_size(env, size, names[1])
    store, store_var = None, "MASTER_ADDR/MASTER_PORT"
    if not r.override:
        store = _master_addr(env)
    if store is None and not r.override:
        job = next((env[k] for k in _OMPI_JOB_VARS if env.get(k)), None)
        first = _first_hostfile_host(env)
        if job is not None and first is not None:
            store, store_var = (first[0], derived_port(job)), f"{first[1]} (first host)"
        elif job is not None and local_size == size:
            # Every rank on this host: loopback reaches rank 0.
            store, store_var = ("127.0.0.1", derived_port(job)), "OMPI_COMM_WORLD_LOCAL_SIZE"
        elif size > 1:
            spread = (f"OMPI_COMM_WORLD_LOCAL_SIZE={local_size} of OMPI_COMM_WORLD_SIZE={size}: "
                      f"the job spans hosts" if local_size is not None else
                      "OMPI_COMM_WORLD_LOCAL_SIZE is not set")
            raise ValueError(
                f"mpirun started this process ({spread}) but nothing names rank 0's host: "
                f"pass the store address to every rank, e.g. `mpirun -x MASTER_ADDR=<first "
                f"host> -x MASTER_PORT=29500 ...` or -x COLLECTIVES_STORE_ADDR=host:port "
                f"(see examples/mpijob.yaml)")
    return r.world(rank, size, local_rank, local_size, store, "openmpi", names, store_var)


def _cross_check_world_size(env: Mapping[str, str], size: int, size_var: str) -> None:
    if "WORLD_SIZE" in env and "RANK" not in env and _int_var(env, "WORLD_SIZE", 1) != size:
        raise ValueError(f"WORLD_SIZE={env['WORLD_SIZE']} and {size_var}={size} disagree on "
                         f"the number of processes: unset WORLD_SIZE or make it {size}")


def _slurm(r: _Reader) -> Optional[WorldInfo]:
    env = r.env
    if "SLURM_PROCID" not in env and "SLURM_JOB_ID" not in env:
        return None
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "")).strip()
    if "SLURM_STEP_NUM_TASKS" not in env or step == _SLURM_BATCH_STEP or \
            "SLURM_PROCID" not in env:
        # The batch script (or an salloc shell): one process, whatever the job asked for.
        wanted = [(v, env[v]) for v in ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_JOB_NUM_NODES",
                                        "SLURM_NNODES")
                  if env.get(v, "").strip().isdigit() and int(env[v]) > 1]
        if wanted:
            asked = ", ".join(f"{k}={v}" for k, v in wanted)
            raise ValueError(
                f"this process runs in Slurm job {job or '?'}'s batch script or allocation, "
                f"not in a step started by srun (SLURM_STEP_NUM_TASKS is not set), so it is "
                f"the only process, but the job asks for more ({asked}): start the ranks "
                f"with `srun python train.py` (or `collectives-run python train.py`, which "
                f"uses srun)")
        return r.world(0, 1, 0, 1, None, "slurm-batch", ("SLURM_PROCID", "SLURM_NTASKS", "",
                                                          ""), "", "a batch step of one task")
    names = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
             "SLURM_STEP_TASKS_PER_NODE")
    size = _int_var(env, "SLURM_STEP_NUM_TASKS", 1)
    _cross_check_world_size(env, size, "SLURM_STEP_NUM_TASKS")
    store, store_var = (None, "") if r.override else (_master_addr(env), "MASTER_ADDR/MASTER_PORT")
    if store is None and not r.override:
        nodes = env.get("SLURM_STEP_NODELIST", "").strip()
        if not nodes or not job:
            missing = "SLURM_STEP_NODELIST" if not nodes else "SLURM_JOB_ID"
            raise ValueError(f"{missing} is not set: the store address of a Slurm step comes "
                             f"from SLURM_STEP_NODELIST and SLURM_JOB_ID (or set "
                             f"COLLECTIVES_STORE_ADDR)")
        try:
            first = expand_hostlist(nodes)[0]
        except (ValueError, IndexError) as exc:
            raise ValueError(f"SLURM_STEP_NODELIST: {exc}") from None
        # Rank 0 of a step runs on its first node; the step id keeps concurrent steps of
        # one job (srun ... & srun ... &) on different ports.
        store = (first, derived_port(job, int(step) if step.isdigit() else 0))
        store_var = "SLURM_STEP_NODELIST (first node), SLURM_JOB_ID and SLURM_STEP_ID"
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE", "")
    return r.world(_int_var(env, "SLURM_PROCID"), size, _opt_int_var(env, "SLURM_LOCALID"),
                   _simple_tasks_per_node(per_node) if per_node else None, store, "slurm",
                   names, store_var)


_DIALECTS = (_ours, _env_dialect, _kubeflow, _openmpi, _slurm)


def detect(environ: Optional[Mapping[str, str]] = None) -> WorldInfo:
    """Read rank, size, local rank and store address from the environment.

    Args:
        environ: the variables to read; ``os.environ`` when None.

    Returns:
        A :class:`WorldInfo` from the first dialect present (see module doc); a
        1-rank world only when no launcher variable (:data:`LAUNCHER_VARS`) is set.

    Raises:
        ValueError: naming the variables, when a value is not an integer, a rank
            is not below its size, variables disagree, a launcher's variables
            lack what completes them, or they describe processes that were never
            started (and saying how to start them).
    """
    env = os.environ if environ is None else environ
    override = None
    if env.get("COLLECTIVES_STORE_ADDR", "").strip():
        try:
            override = parse_addr(env["COLLECTIVES_STORE_ADDR"])
        except ValueError as exc:
            raise ValueError(f"COLLECTIVES_STORE_ADDR: {exc}") from None
    reader = _Reader(env, override)
    for dialect in _DIALECTS:
        info = dialect(reader)
        if info is not None:
            return info
    present = [v for v in LAUNCHER_VARS if v in env]
    if present:
        shown = ", ".join(f"{v}={env[v]}" for v in present)
        raise ValueError(
            f"{shown} {'is' if len(present) == 1 else 'are'} set, so a launcher started this "
            f"process, but not the variables that say its rank, the job's size and rank 0's "
            f"address: start it with collectives-run, torchrun, srun or mpirun, or set "
            f"COLLECTIVES_RANK, COLLECTIVES_SIZE and COLLECTIVES_STORE_ADDR (an Indexed Job "
            f"or JobSet: COLLECTIVES_SIZE and COLLECTIVES_STORE_ADDR; the rank is "
            f"JOB_COMPLETION_INDEX)")
    _info_log("world of 1: no launcher variable is set", env)
    return WorldInfo(0, 1, 0, 1, None, None, "single")


# --------------------------------------------------------------- interfaces


def _ipv4_of(ifname: str) -> Optional[str]:
    """IPv4 address of an interface via SIOCGIFADDR; None if it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            req = struct.pack("256s", ifname.encode()[:15])
            res = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, req)
        except OSError as exc:
            if exc.errno in (errno.EADDRNOTAVAIL, errno.ENODEV):
                return None
            raise
    return socket.inet_ntoa(res[20:24])  # struct ifreq: name[16], sockaddr_in


def _ipv6_of(ifname: str) -> Optional[str]:
    """An IPv6 address of an interface from /proc/net/if_inet6.

    Link-local addresses (scope 0x20) are returned, with "%ifname", only when
    the interface has nothing else.
    """
    global_addrs, link_local = [], []
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) < 6 or fields[5] != ifname:
                    continue
                raw = bytes.fromhex(fields[0])
                addr = socket.inet_ntop(socket.AF_INET6, raw)
                if int(fields[3], 16) == 0x20:
                    link_local.append(f"{addr}%{ifname}")
                else:
                    global_addrs.append(addr)
    except FileNotFoundError:
        return None
    if global_addrs:
        return global_addrs[0]
    return link_local[0] if link_local else None


def interface_address(ifname: str, family: Optional[int] = None) -> str:
    """The address of network interface ``ifname`` ("lo" -> "127.0.0.1").

    Args:
        ifname: interface name as in ``ip link``.
        family: ``socket.AF_INET`` or ``socket.AF_INET6``; None tries IPv4
            then IPv6.

    Raises:
        ValueError: the interface does not exist (the message lists the known
            ones) or has no address of the requested family.
    """
    known = [name for _, name in socket.if_nameindex()]
    if ifname not in known:
        raise ValueError(
            f"unknown network interface {ifname!r} (COLLECTIVES_IFNAME); "
            f"this host has: {', '.join(known)}"
        )
    if family not in (None, socket.AF_INET, socket.AF_INET6):
        raise ValueError(f"unsupported address family {family!r}")
    addr = None
    if family in (None, socket.AF_INET):
        addr = _ipv4_of(ifname)
    if addr is None and family in (None, socket.AF_INET6):
        addr = _ipv6_of(ifname)
    if addr is None:
        kind = {socket.AF_INET: "IPv4 ", socket.AF_INET6: "IPv6 "}.get(family, "")
        raise ValueError(f"network interface {ifname!r} has no {kind}address")
    return addr


def _family_of(host: str, port: int) -> int:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except socket.gaierror:
        return socket.AF_INET6 if ":" in host else socket.AF_INET
    return infos[0][0]


def advertise_address(store_host: Optional[str], store_port: Optional[int],
                      ifname: Optional[str] = None,
                      environ: Optional[Mapping[str, str]] = None) -> str:
    """The local address that peers should use to reach this process.

    The address of ``ifname`` (or of ``COLLECTIVES_IFNAME``) when given;
    otherwise the local address the kernel would route from towards the store
    (a UDP socket is connected, no packet is sent); otherwise 127.0.0.1, or
    ::1 when the store is IPv6.
    """
    env = os.environ if environ is None else environ
    ifname = ifname or env.get("COLLECTIVES_IFNAME", "").strip() or None
    family = _family_of(store_host, store_port or 1) if store_host else socket.AF_INET
    if ifname:
        try:
            return interface_address(ifname, family)
        except ValueError:
            return interface_address(ifname)  # other family rather than nothing
    loopback = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    if not store_host:
        return loopback
    try:
        infos = socket.getaddrinfo(store_host, store_port or 1, type=socket.SOCK_DGRAM)
    except socket.gaierror:
        return loopback
    for fam, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(fam, kind, proto) as sock:
                sock.connect(sockaddr)  # UDP: picks a route, sends nothing
                return sock.getsockname()[0]
        except OSError:
            continue
    return loopback
