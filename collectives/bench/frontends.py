"""The bench through each front end: what a script pays per call (``--frontend``).

``mpi`` (the default) times ``collectives.MPI``'s buffer calls; ``core`` the native
communicator under it, with no Python front end; ``torch`` the torch.distributed
backend "collectives" through ``dist.all_reduce`` & co. on tensors that share the
bench's numpy buffers; ``hvd`` Horovod's API (``collectives.torch``); ``jax``
``collectives.jax`` inside ``jax.jit``. Each is timed as the table's other rows are
(warm-up, a barrier before each call, the slowest rank, the median).

Out of place, a front end whose call has no output buffer (``dist.all_reduce`` and
``hvd.allreduce_`` reduce in place, ``hvd.allreduce`` and JAX return a new tensor)
does what a script would: copy the input into the output first (torch), or copy
the result into the output (hvd, jax). In place is the bare call.

``torch`` also times the floor of any backend registered the way this one is: a
backend "floor" whose ProcessGroup returns completed work without moving a byte
(row ``torch-floor``): what torch's Python dispatch, the ProcessGroup call and the
Work cost by themselves.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .sweep import Backend, CollectivesBackend, result_view

__all__ = ["FRONTENDS", "make_backend", "CoreBackend", "TorchBackend", "HvdBackend",
           "JaxBackend"]

FRONTENDS = ("mpi", "core", "torch", "hvd", "jax")


class CoreBackend(CollectivesBackend):
    """The native communicator (``collectives._core``) itself, under collectives.MPI."""

    name = "core"

    def _allreduce_call(self, send: Any, recv: np.ndarray, mop: Any, algo: str) -> Callable[[], None]:
        """The core's blocking allreduce, with the MPI layer's argument parsing skipped."""
        core, algorithm = self.comm._core, algo or "auto"
        src = None if send is self.MPI.IN_PLACE else send
        op = {self.MPI.SUM: "sum", self.MPI.PROD: "prod", self.MPI.MIN: "min",
              self.MPI.MAX: "max"}[mop]
        return lambda: core.allreduce(src, recv, op=op, algorithm=algorithm)

    def impls(self, algos: Sequence[str]) -> list[tuple[str, str]]:
        """One row per requested algorithm, named core-<algorithm>."""
        return [(f"core-{a}", a) for a in algos]

    def call(self, coll: str, algo: str, op: str, send: Optional[np.ndarray], recv: np.ndarray,
             root: int) -> tuple[Optional[Callable[[], None]], np.ndarray]:
        """Allreduce on the core; the other collectives as the MPI layer runs them."""
        if coll == "allreduce":
            s = self.MPI.IN_PLACE if send is None else send
            return self._allreduce_call(s, recv, self.ops[op], algo), recv
        return super().call(coll, algo, op, send, recv, root)


def _register_floor(dist: Any) -> None:
    """The backend "floor": a ProcessGroup registered as "collectives" is, whose
    collectives complete at once without communicating."""
    if "FLOOR" in getattr(dist.Backend, "_plugins", {}):
        return
    import torch
    from torch.futures import Future

    # torch's own completed Work, the cheapest a Python backend can return
    work_from = torch._C._distributed_c10d._create_work_from_future

    class FloorGroup(dist.ProcessGroup):
        """Every collective returns completed work; nothing moves."""

        def __init__(self, rank: int, size: int) -> None:
            super().__init__(rank, size)

        def getBackendName(self) -> str:
            return "floor"

        def _done(self, tensors: Any) -> Any:
            fut = Future()
            fut.set_result(tensors)
            return work_from(fut)

        def allreduce(self, tensors: Any, opts: Any = None) -> Any:
            return self._done(tensors)

        def barrier(self, opts: Any = None) -> Any:
            return self._done([])

    def create(prefix_store: Any, rank: int, size: int, timeout: Any) -> Any:
        return FloorGroup(rank, size)

    dist.Backend.register_backend("floor", create, devices=["cpu"])


class _WorldComm:
    """The torch front ends' world communicator, for local_rank: made on first use."""

    _comm: Any = None

    @property
    def comm(self) -> Any:
        """The world communicator (for local_rank)."""
        if self._comm is None:
            from .. import MPI

            self._comm = MPI.COMM_WORLD
        return self._comm


class TorchBackend(_WorldComm, Backend):
    """The torch.distributed backend "collectives", as a DDP or torchrun script calls it."""

    name = "torch"

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        from ..rendezvous import env as _env
        from ..torch.distributed.backend import register_backend

        register_backend()
        _register_floor(dist)
        self.torch, self.dist = torch, dist
        info = _env.detect()
        self.rank, self.size = info.rank, info.size
        if not dist.is_initialized():
            # collectives-run gives torchrun's variables; a plain world gets the store's
            # host and the next port.
            os.environ.setdefault("MASTER_ADDR", info.store_host or "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str((info.store_port or 29400) + 2))
            dist.init_process_group("collectives", rank=self.rank, world_size=self.size)
        self.floor = dist.new_group(list(range(self.size)), backend="floor")
        R = dist.ReduceOp
        self.ops = {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX}

    def impls(self, algos: Sequence[str]) -> list[tuple[str, str]]:
        """The backend, and the do-nothing floor."""
        return [("torch", ""), ("torch-floor", "floor")]

    def barrier(self) -> None:
        """dist.barrier."""
        self.dist.barrier()

    def allreduce_f64(self, arr: np.ndarray, op: str) -> None:
        """In-place all_reduce of float64 timings."""
        self.dist.all_reduce(self.torch.from_numpy(arr), op=self.ops[op])

    def call(self, coll: str, algo: str, op: str, send: Optional[np.ndarray], recv: np.ndarray,
             root: int) -> tuple[Optional[Callable[[], None]], np.ndarray]:
        """dist.all_reduce (in place; out of place copies the input in first),
        all_gather_into_tensor, broadcast, reduce_scatter_tensor."""
        d, T = self.dist, self.torch.from_numpy
        r, rop = T(recv), self.ops[op]
        group = self.floor if algo == "floor" else None
        if coll == "allreduce":
            out = None if algo == "floor" else recv  # the floor computes nothing to check
            if send is None:
                return (lambda: d.all_reduce(r, op=rop, group=group)), out
            s = T(send)
            return (lambda: (r.copy_(s), d.all_reduce(r, op=rop, group=group))), out
        if algo == "floor":
            return None, recv
        if coll == "allgather":  # in place: the input is this rank's slice of the output
            k = r.numel() // self.size
            s = T(send) if send is not None else r.narrow(0, self.rank * k, k)
            return (lambda: d.all_gather_into_tensor(r, s)), recv
        if coll == "broadcast":
            return (lambda: d.broadcast(r, root)), recv
        if send is None:
            return None, recv
        s = T(send)
        return (lambda: d.reduce_scatter_tensor(r, s, op=rop)), result_view(coll, send, recv,
                                                                           self.size)

    def finish(self) -> None:
        """Destroy the process groups."""
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


class HvdBackend(_WorldComm, Backend):
    """Horovod's API (``import collectives.torch as hvd``)."""

    name = "hvd"

    def __init__(self) -> None:
        import torch

        import collectives.torch as hvd

        hvd.init()
        self.torch, self.hvd = torch, hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        self.ops = {"sum": hvd.Sum, "prod": hvd.Product, "min": hvd.Min, "max": hvd.Max}

    def barrier(self) -> None:
        """hvd.barrier."""
        self.hvd.barrier()

    def allreduce_f64(self, arr: np.ndarray, op: str) -> None:
        """In-place allreduce_ of float64 timings."""
        self.hvd.allreduce_(self.torch.from_numpy(arr), op=self.ops[op], name="bench.f64")

    def call(self, coll: str, algo: str, op: str, send: Optional[np.ndarray], recv: np.ndarray,
             root: int) -> tuple[Optional[Callable[[], None]], np.ndarray]:
        """hvd.allreduce_ in place, hvd.allreduce (result copied out) out of place;
        allgather and broadcast_; reducescatter out of place."""
        h, T = self.hvd, self.torch.from_numpy
        r, hop = T(recv), self.ops[op]
        if coll == "allreduce":
            if send is None:
                return (lambda: h.allreduce_(r, op=hop, name="bench")), recv
            s = T(send)
            return (lambda: r.copy_(h.allreduce(s, op=hop, name="bench"))), recv
        if coll == "broadcast":
            return (lambda: h.broadcast_(r, root, name="bench")), recv
        if send is None:
            return None, recv
        s = T(send)
        if coll == "allgather":
            return (lambda: r.copy_(h.allgather(s, name="bench"))), recv
        out = result_view(coll, send, recv, self.size)
        o = T(out)
        return (lambda: o.copy_(h.reducescatter(s, op=hop, name="bench"))), out


class JaxBackend(Backend):
    """``collectives.jax`` inside ``jax.jit``, as a jitted training step calls it."""

    name = "jax"

    def __init__(self) -> None:
        import jax

        import collectives.jax as cj
        from .. import MPI

        self.jax, self.cj, self.comm = jax, cj, MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._jits: dict = {}

    def barrier(self) -> None:
        """The world's Barrier (what the other rows use too)."""
        self.comm.Barrier()

    def allreduce_f64(self, arr: np.ndarray, op: str) -> None:
        """In-place Allreduce of float64 timings (through collectives.MPI)."""
        from .. import MPI

        self.comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM if op == "sum" else MPI.MAX)

    def _jit(self, coll: str, op: str, root: int) -> Any:
        key = (coll, op, root)
        if key not in self._jits:
            cj = self.cj
            if coll == "allreduce":
                fn = lambda x: cj.allreduce(x, op=op)  # noqa: E731
            elif coll == "allgather":
                fn = lambda x: cj.allgather(x, tiled=True)  # noqa: E731
            else:
                fn = lambda x: cj.broadcast(x, root=root)  # noqa: E731
            self._jits[key] = self.jax.jit(fn)
        return self._jits[key]

    def call(self, coll: str, algo: str, op: str, send: Optional[np.ndarray], recv: np.ndarray,
             root: int) -> tuple[Optional[Callable[[], None]], np.ndarray]:
        """The jitted collective on a device array made once from the input; its
        result copied into the output (np.asarray of a CPU array is a view)."""
        if coll == "reduce_scatter" or (coll == "allgather" and send is None):
            return None, recv
        fn = self._jit(coll, op, root)
        x = self.jax.device_put(send if send is not None else recv.copy())

        def run() -> None:
            np.copyto(recv, np.asarray(fn(x)))
        return run, recv


def make_backend(frontend: str) -> Backend:
    """The sweep's Backend for a --frontend name."""
    return {"mpi": CollectivesBackend, "core": CoreBackend, "torch": TorchBackend,
            "hvd": HvdBackend, "jax": JaxBackend}[frontend]()
