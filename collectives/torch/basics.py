"""Horovod's basics: init/shutdown, ranks and sizes, build flags, and the reduction ops.

Split from ``mpi_ops`` (which re-exports everything here) to keep files to
one concept each.
"""
from __future__ import annotations

from typing import Any, Optional

import collectives

from ._context import HOLDER, TorchContext, current

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "mpi_threads_supported", "mpi_enabled", "mpi_built",
    "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "sycl_built", "ReduceOp", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "resolve_op",
]


# ----------------------------------------------------------------- lifecycle

def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the world (``collectives.init()``) and set up the Horovod state.

    Args:
        comm: None (the launcher's world); a ``collectives.MPI.Comm`` to use
            instead. Lists of ranks (Horovod's sub-communicators) are not supported.
        process_sets: None; a list of ProcessSets (or rank lists) to register now, the
            same on every rank; or "dynamic" (allow add_process_set later, as
            HOROVOD_DYNAMIC_PROCESS_SETS=1). See process_sets.
    """
    if comm is not None and not hasattr(comm, "_core"):
        raise NotImplementedError("collectives.torch.init: comm must be a collectives.MPI.Comm")
    from .process_sets import register_initial

    from . import _knobs

    _knobs.apply_mapped()  # HOROVOD_* checked, and mapped onto ours before the rendezvous
    with HOLDER.lock:
        if HOLDER.context is not None and (comm is None or HOLDER.context.world is comm):
            register_initial(HOLDER.context, process_sets)
            return
        world = comm if comm is not None else collectives.init()
        HOLDER.context = TorchContext(world)
        from ..rendezvous import world as _world

        _world.add_finalize_hook(_leave_with_the_world)
    from ._fusion import run_fused

    HOLDER.context.lane.fuse = run_fused  # allreduces agreed together run as one (_fusion)
    HOLDER.context.lane.fusion_bytes = HOLDER.context.fusion_threshold
    from ._autotune import attach

    # HOROVOD_AUTOTUNE: rank 0 tunes fusion and cycle for every rank (_autotune)
    attach(HOLDER.context.lane, HOLDER.context.rank, HOLDER.context.size)
    register_initial(HOLDER.context, process_sets)
    from .timeline import timeline_from_env

    timeline_from_env()  # COLLECTIVES_TIMELINE / HOROVOD_TIMELINE


def shutdown() -> None:
    """Run what every rank queued, close Horovod's links and the world, forget the state."""
    ctx = HOLDER.context
    if ctx is not None:
        from .timeline import stop_timeline

        from ._knobs import collective_timeout

        # with every rank: ops every rank queued before shutdown() still run (_negotiate)
        ended = ctx.lane.stop(collective_timeout() + 10.0)
        stop_timeline()  # written now, before the world goes
        if not ended:  # its thread is still in a collective: closing the links under it
            with HOLDER.lock:  # would free what it uses; the world is left to the exit
                HOLDER.context = None
            return
        ctx.close()
    with HOLDER.lock:
        HOLDER.context = None
    collectives.finalize()


def _leave_with_the_world() -> None:
    """collectives.finalize() without hvd.shutdown() (at exit: a script that raised, or
    one that never calls shutdown, as Horovod allows): Horovod's links close with the
    world's, so that the other ranks learn at once that this rank left, as they would of
    the world's links, instead of when this process is gone (after a slow teardown: torch
    and JAX take seconds). The negotiating thread leaves after its current round
    (bounded); if it is still in a collective then, its links are left to the exit."""
    ctx = HOLDER.context
    if ctx is None:
        return
    if ctx.lane.abandon(_LEAVE_S):
        ctx.close()
    with HOLDER.lock:
        HOLDER.context = None


_LEAVE_S = 2.0  # what finalize waits for the negotiating thread's current round


def is_initialized() -> bool:
    """True between init() and shutdown()."""
    return HOLDER.context is not None


def size() -> int:
    """Number of ranks."""
    return current().size


def rank() -> int:
    """This process's rank."""
    return current().rank


def local_size() -> int:
    """Number of ranks on this host."""
    return current().local_size


def local_rank() -> int:
    """This process's rank among the ranks on this host."""
    return current().local_rank


def cross_size() -> int:
    """Number of hosts."""
    return current().cross_size


def cross_rank() -> int:
    """Index of this host (hosts numbered in order of their lowest rank)."""
    return current().cross_rank


def mpi_threads_supported() -> bool:
    """False: there is no MPI underneath."""
    return False


def mpi_enabled() -> bool:
    """False: there is no MPI underneath."""
    return False


def mpi_built() -> bool:
    """False: there is no MPI underneath."""
    return False


def gloo_enabled() -> bool:
    """False: the core is not Gloo."""
    return False


def gloo_built() -> bool:
    """False: the core is not Gloo."""
    return False


def nccl_built() -> bool:
    """False: no NCCL (GPU buffers are not supported yet)."""
    return False


def ddl_built() -> bool:
    """False."""
    return False


def ccl_built() -> bool:
    """False."""
    return False


def cuda_built() -> bool:
    """True if the core was built with CUDA (see collectives.cuda_built)."""
    return collectives.cuda_built()


def rocm_built() -> bool:
    """False."""
    return False


def sycl_built() -> bool:
    """False: no SYCL/oneCCL GPU support (the name of Intel's build of Horovod)."""
    return False


# ---------------------------------------------------------------------- ops

class ReduceOp:
    """A reduction: Average, Sum, Min, Max, Product; Adasum (allreduce only, see adasum)."""

    def __init__(self, name: str, core: Optional[str]) -> None:
        self.name = name
        self.core = core

    def __repr__(self) -> str:
        return f"<collectives.torch.{self.name}>"


Average = ReduceOp("Average", "avg")
Sum = ReduceOp("Sum", "sum")
Adasum = ReduceOp("Adasum", None)
Min = ReduceOp("Min", "min")
Max = ReduceOp("Max", "max")
Product = ReduceOp("Product", "prod")


def resolve_op(average: Optional[bool], op: Optional[ReduceOp], default: ReduceOp = Average
               ) -> ReduceOp:
    """Horovod's rule: `average` (deprecated) or `op`, not both; default Average."""
    if average is not None and op is not None:
        raise ValueError("specify either op or the deprecated average, not both")
    if op is None:
        op = default if average is None else (Average if average else Sum)
    if not isinstance(op, ReduceOp):
        raise TypeError(f"op must be one of Average, Sum, Min, Max, Product; got {op!r}")
    if op.core is None:
        raise NotImplementedError(f"collectives.torch: {op.name} is not supported")
    return op
