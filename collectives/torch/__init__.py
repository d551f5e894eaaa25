"""Horovod's PyTorch API over collectives, and a ``torch.distributed`` backend.

``import collectives.torch as hvd`` in place of ``import horovod.torch as
hvd``; run with ``collectives-run -np N python train.py``. Importing also
registers the ``"collectives"`` backend for
``torch.distributed.init_process_group(backend="collectives")``.
This module only re-exports: ops in ``mpi_ops`` and ``gather_ops``, Horovod's
exception classes in ``exceptions``, helpers in ``functions``,
the optimizer in ``optimizer``, compression in ``compression``, the backend
in ``backend``, Horovod's elastic API in ``elastic`` (``hvd.elastic``).
"""
from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ModuleNotFoundError as _exc:  # say which extra brings it
    raise ModuleNotFoundError(f"collectives.torch needs PyTorch ({_exc}): install the torch "
                              f"build for your machine, then pip install 'collectives[torch]' "
                              f"(README, 'The two commands')", name="torch") from None

from .compression import Compression, Compressor, FP16Compressor, NoneCompressor
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters)
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .gather_ops import (allgather_async, alltoall, alltoall_async, grouped_allgather,
                         grouped_allgather_async, grouped_reducescatter,
                         grouped_reducescatter_async, reducescatter, reducescatter_async,
                         sparse_allreduce_async)
from .sync_batch_norm import SyncBatchNorm
from .timeline import start_timeline, stop_timeline
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .mpi_ops import (Adasum, Average, Handle, LayoutMismatch, Max, Min, Product, ReduceOp, Sum,
                      allgather, allreduce, allreduce_, allreduce_async,
                      allreduce_async_, barrier, broadcast, broadcast_,
                      broadcast_async, broadcast_async_, ccl_built, cross_rank, cross_size,
                      cuda_built, ddl_built, gloo_built, gloo_enabled, grouped_allreduce,
                      grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_, init,
                      is_initialized, join, local_rank, local_size, mpi_built, mpi_enabled,
                      mpi_threads_supported, nccl_built, poll, rank, rocm_built, shutdown, size,
                      sycl_built,
                      synchronize)
from .optimizer import DistributedOptimizer
from .dgc import DGC, DGCSGD, TopKCompressor
from .distributed.backend import ProcessGroupCollectives, register_backend
from . import elastic

register_backend()


def __getattr__(name: str):
    """Horovod names not provided (yet): NotImplementedError naming them (see _missing)."""
    from ..MPI import _missing

    raise _missing.missing("collectives.torch", name, _missing.HOROVOD_TORCH, "horovod.torch")


__all__ = [
    "Compression", "Compressor", "FP16Compressor", "NoneCompressor", "allgather_object",
    "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "Adasum", "Average",
    "Handle", "LayoutMismatch", "Max", "Min", "Product", "ReduceOp", "Sum", "allgather",
    "allgather_async", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "gloo_built", "gloo_enabled", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "init", "is_initialized", "join",
    "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "poll", "rank", "reducescatter", "reducescatter_async", "rocm_built",
    "sycl_built", "shutdown", "size", "synchronize", "DistributedOptimizer",
    "ProcessGroupCollectives",
    "register_backend", "DGC", "DGCSGD", "TopKCompressor", "HorovodInternalError",
    "HostsUpdatedInterrupt", "grouped_allgather", "grouped_allgather_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "sparse_allreduce_async",
    "ProcessSet", "add_process_set", "global_process_set", "remove_process_set",
    "SyncBatchNorm", "start_timeline", "stop_timeline", "elastic",
]
