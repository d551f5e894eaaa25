"""The peers' workers for ``collectives-bench --compare``: our sweep through another library.

``python -m collectives.bench.peer_worker gloo|mpi|mpi-shm <bench options>``,
launched as collectives.bench.peers.command says, runs the same sweep as ours
(collectives.bench.driver.run_worker) with a backend over torch.distributed +
gloo or mpi4py; see collectives.bench.peers for how each peer is launched.
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Callable, Optional, Sequence

import numpy as np

from . import driver as bench
from .peers import REQUIREMENTS

__all__ = ["TorchGlooBackend", "Mpi4pyBackend", "main"]


class TorchGlooBackend(bench.Backend):
    """torch.distributed with the gloo backend, on CPU tensors over the numpy buffers."""

    name = "gloo"

    def __init__(self, init_method: str) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.rank = int(os.environ.get("COLLECTIVES_RANK", os.environ.get("RANK", "0")))
        self.size = int(os.environ.get("COLLECTIVES_SIZE", os.environ.get("WORLD_SIZE", "1")))
        dist.init_process_group("gloo", init_method=init_method, rank=self.rank,
                                world_size=self.size)
        R = dist.ReduceOp
        self.ops = {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX}

    def barrier(self) -> None:
        self.dist.barrier()

    def allreduce_f64(self, arr: np.ndarray, op: str) -> None:
        self.dist.all_reduce(self.torch.from_numpy(arr), op=self.ops[op])

    def call(self, coll: str, algo: str, op: str, send: Optional[np.ndarray], recv: np.ndarray,
             root: int) -> tuple[Optional[Callable[[], None]], np.ndarray]:
        d, t = self.dist, self.torch.from_numpy
        out = t(recv)
        if coll == "allreduce":
            if send is not None:
                return None, recv  # gloo's all_reduce is in place only
            return (lambda: d.all_reduce(out, op=self.ops[op])), recv
        if coll == "broadcast":
            return (lambda: d.broadcast(out, src=root)), recv
        block = recv.size // self.size  # allgather; reduce_scatter in place (recv = whole input)
        mine = slice(self.rank * block, (self.rank + 1) * block)
        if coll == "allgather":
            inp = out[mine] if send is None else t(send)
            return (lambda: d.all_gather_into_tensor(out, inp)), recv
        if send is None:  # reduce_scatter in place: the result lands in this rank's block
            dst = out[mine]
            return (lambda: d.reduce_scatter_tensor(dst, out, op=self.ops[op])), recv[mine]
        src = t(send)
        return (lambda: d.reduce_scatter_tensor(out, src, op=self.ops[op])), recv

    def finish(self) -> None:
        self.dist.destroy_process_group()


class Mpi4pyBackend(bench.CollectivesBackend):
    """mpi4py (OpenMPI), started by mpirun: the same calls as ours, mpi4py being the API we copy."""

    tolerate_errors = True

    def __init__(self, name: str) -> None:
        from mpi4py import MPI

        self._use(MPI)
        self.name = name

    def impls(self, algos: Sequence[str]) -> list[tuple[str, str]]:
        """One implementation: OpenMPI chooses its own algorithm."""
        return [(self.name, "")]

    def _allreduce_call(self, send: Any, recv: np.ndarray, mop: Any, algo: str) -> Callable[[], None]:
        """mpi4py's Allreduce, which has no algorithm keyword."""
        c = self.comm
        return lambda: c.Allreduce(send, recv, op=mop)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Worker entry: ``gloo --store-file F|--port P <bench options>`` or
    ``mpi|mpi-shm <bench options>``. gloo meets at a file store, or at a TCP store on
    port P of MASTER_ADDR (default 127.0.0.1; bench/netns.sh run sets it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in REQUIREMENTS:
        raise SystemExit(f"usage: python -m collectives.bench.peer_worker {{{','.join(REQUIREMENTS)}}} ...")
    peer, rest = argv[0], argv[1:]
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's renamed collectives
    init_method = ""
    if peer == "gloo":
        if len(rest) < 2 or rest[0] not in ("--store-file", "--port") or \
                (rest[0] == "--port" and not rest[1].isdigit()):
            raise SystemExit("gloo workers need --store-file FILE or --port PORT")
        if rest[0] == "--port":
            init_method = f"tcp://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{rest[1]}"
        else:
            init_method = "file://" + os.path.abspath(rest[1])
        rest = rest[2:]
    p = bench.build_parser()
    args = p.parse_args(rest)
    bench._check_args(p, args)
    args.algos = ["auto"]
    backend = TorchGlooBackend(init_method) if peer == "gloo" else Mpi4pyBackend(peer)  # type: ignore[arg-type]
    return bench.run_worker(args, backend)


if __name__ == "__main__":
    sys.exit(main())
