"""The peers of ``collectives-bench --compare``: torch.distributed + gloo, and mpi4py.

The driver (collectives.bench.driver) asks :func:`missing` whether a peer can
run and builds its launch line with :func:`command`; each worker process runs
``python -m collectives.bench.peer_worker gloo|mpi <bench options> --worker-json F``:
the same sweep as ours (collectives.bench.driver.sweep) through the peer's library
(collectives/bench/peer_worker.py). This module imports neither.

- ``gloo``: launched with ``collectives-run`` (rank and size from
  ``COLLECTIVES_RANK``/``COLLECTIVES_SIZE``), ``init_process_group("gloo",
  init_method="file://...")`` on a store file in the run's folder (``--port P``
  instead: a TCP store at MASTER_ADDR:P, as bench/netns.sh uses); CPU tensors
  sharing the numpy buffers. gloo's all_reduce and broadcast work in place
  only: out-of-place allreduce is reported as not supported ("-"), broadcast
  is the same call in both columns (as ours).
- ``mpi``: mpi4py under ``mpirun`` with OpenMPI's TCP transport on loopback.
- ``mpi-shm``: mpi4py under ``mpirun`` with OpenMPI's defaults (shared memory).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from typing import Optional, Sequence

__all__ = ["REQUIREMENTS", "MPIRUN_TCP", "missing", "command"]

# peer -> (Python module it imports, program it is launched with, or None)
REQUIREMENTS: dict[str, tuple[str, Optional[str]]] = {
    "gloo": ("torch", None),
    "mpi": ("mpi4py", "mpirun"),
    "mpi-shm": ("mpi4py", "mpirun"),
}
MPIRUN_BASE = ["--allow-run-as-root", "--oversubscribe"]
MPIRUN_TCP = ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"]


def missing(peer: str) -> Optional[str]:
    """Why peer cannot run here (a module or program not installed), or None if it can."""
    module, program = REQUIREMENTS[peer]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"Python module {module!r} is not installed (pip install {module})"
    if program and shutil.which(program) is None:
        return f"{program!r} is not on PATH (install OpenMPI)"
    return None


def command(peer: str, nranks: int, args: Sequence[str], json_path: str) -> list[str]:
    """The command line that runs peer's workers on nranks ranks (ending with the JSON path)."""
    worker = [sys.executable, "-m", "collectives.bench.peer_worker"]
    if peer == "gloo":
        # Rendezvous through a file beside the results, not a port picked here:
        # a port free now can be taken by another job's rank before gloo binds it.
        store = os.path.splitext(json_path)[0] + ".store"
        return [sys.executable, "-m", "collectives.run", "-np", str(nranks), *worker,
                "gloo", "--store-file", store, *args, "--worker-json", json_path]
    mca = MPIRUN_TCP if peer == "mpi" else []
    return ["mpirun", "-np", str(nranks), *MPIRUN_BASE, *mca, "-x", "PYTHONPATH",
            *worker, peer, *args, "--worker-json", json_path]
