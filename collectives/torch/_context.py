"""The state of ``collectives.torch``: one context object holding the world communicator.

Everything the Horovod API needs between calls (the communicator, the node
layout, the fusion threshold, which tensor layouts were already verified
across ranks) hangs off one ``TorchContext``. The module keeps a single
reference to it (``current()``); handles keep their own buffers alive, so
there is no module-level map of handles (STYLE rule 26).
"""
from __future__ import annotations

import hashlib
import os
import socket
import threading
from typing import Any, Iterable, Optional

import numpy as np
import torch

import collectives
from collectives._env import byte_size

# torch dtype -> the core's dtype name (what travels on the wire unchanged)
CORE_DTYPES = {
    torch.int8: "int8", torch.uint8: "uint8", torch.int32: "int32", torch.int64: "int64",
    torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
    torch.float64: "float64",
}
# dtypes the core lacks, carried in a wider one (one conversion copy each way)
WIDENED = {torch.int16: torch.int32, torch.bool: torch.uint8}

FUSION_ENV = "COLLECTIVES_FUSION_THRESHOLD"
DEFAULT_FUSION_BYTES = 128 * 1024 * 1024


def fusion_threshold() -> int:
    """Bytes per fusion buffer: COLLECTIVES_FUSION_THRESHOLD (default 128 MiB, 0 = no fusion)."""
    text = os.environ.get(FUSION_ENV, "").strip()
    return byte_size(FUSION_ENV, text) if text else DEFAULT_FUSION_BYTES


def wire_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of `dtype` is carried in; TypeError for dtypes the core cannot carry."""
    if dtype in CORE_DTYPES:
        return dtype
    if dtype in WIDENED:
        return WIDENED[dtype]
    raise TypeError(f"collectives.torch: tensors of dtype {dtype} are not supported; supported: "
                    f"{', '.join(str(d) for d in list(CORE_DTYPES) + list(WIDENED))}")


def check_tensor(tensor: Any, what: str = "tensor") -> None:
    """TypeError unless `tensor` is a CPU tensor, or a CUDA tensor with a CUDA build and GPU."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type == "cuda":
        if not collectives.cuda_available():
            why = "no GPU is usable" if collectives.cuda_built() else \
                "this build of collectives has no CUDA support (nvcc was not found)"
            raise TypeError(f"{what} is on {tensor.device} but {why}: move it with .cpu()")
    elif tensor.device.type != "cpu":
        raise TypeError(f"{what} is on {tensor.device}; collectives.torch takes CPU and CUDA "
                        "tensors")
    if tensor.is_sparse:
        raise TypeError(f"{what} is sparse; convert it with .to_dense()")
    if tensor.is_complex():
        raise TypeError(f"{what} is complex; pass torch.view_as_real(t) instead")


class CudaTensorView:
    """A contiguous CUDA tensor as the core reads it: its memory, and torch's
    current stream on its device, so the collective runs after the work
    queued there (the GPU ordering contract; see collectives' cuda.h)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor  # kept alive with the request
        with torch.cuda.device(tensor.device):
            handle = torch.cuda.current_stream().cuda_stream
        # __cuda_array_interface__ spells the legacy default stream 1, not 0.
        self.stream = handle or 1

    @property
    def __cuda_array_interface__(self) -> dict:
        t = self.tensor
        typestr = {1: "|u1", 2: "<i2", 4: "<i4", 8: "<i8"}[t.element_size()]
        return {"shape": (t.numel(),), "typestr": typestr, "data": (t.data_ptr(), False),
                "strides": None, "version": 3, "stream": self.stream}


def as_buffer(tensor: torch.Tensor) -> tuple[Any, Optional[str]]:
    """A zero-copy view of a contiguous tensor, and the dtype name to pass the core."""
    t = tensor.detach()
    if t.device.type == "cuda":
        # The typestr only carries the width: the dtype name says what it is.
        name = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
                torch.float64: "float64", torch.int8: "int8", torch.uint8: "uint8",
                torch.int32: "int32", torch.int64: "int64"}[t.dtype]
        return CudaTensorView(t), name
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), "bfloat16"
    return t.numpy(), None


def layout_hash(items: Iterable[Any]) -> int:
    """A 62-bit digest of a layout description (names, shapes, dtypes)."""
    digest = hashlib.blake2b(repr(tuple(items)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 62) - 1)


class LayoutMismatch(ValueError):
    """Ranks submitted different tensors (names, shapes or dtypes) to the same collective."""


class TorchContext:
    """The world communicator and what the Horovod API derives from it.

    Args:
        comm: the world ``collectives.MPI.Comm`` from ``collectives.init()``.
    """

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.core = comm._core
        self.rank: int = comm.rank
        self.size: int = comm.size
        self.local_rank: int = comm.local_rank
        self.local_size: int = comm.local_size
        self.fusion_threshold: int = fusion_threshold()
        self.lock = threading.RLock()
        self._verified: set = set()
        hosts = comm.allgather(socket.gethostname()) if self.size > 1 else [socket.gethostname()]
        order = list(dict.fromkeys(hosts))
        self.cross_rank: int = order.index(hosts[self.rank])
        self.cross_size: int = len(order)

    # -- layout checks --------------------------------------------------------
    def needs_check(self, key: Any) -> bool:
        """True the first time this rank sees `key` (then it is remembered)."""
        with self.lock:
            if key in self._verified:
                return False
            self._verified.add(key)
            return True

    def start_check(self, key: Any, what: str) -> Optional["LayoutCheck"]:
        """Queue a cross-rank comparison of `key` (first time only); None if already verified.

        The check is a 2-element int64 allreduce MAX of (h, -h): every rank
        holds the same values iff max(h) == min(h). It is queued on the core's
        progress thread before the data it guards, so it costs no extra wait.
        """
        if self.size == 1 or not self.needs_check(key):
            return None
        h = layout_hash(key)
        buf = np.array([h, -h], dtype=np.int64)
        return LayoutCheck(self.core.iallreduce(None, buf, op="max"), buf, h, what, self.rank)

    def check_now(self, key: Any, what: str) -> None:
        """Blocking form of start_check: raise LayoutMismatch at once if ranks differ."""
        check = self.start_check(key, what)
        if check is not None:
            check.wait()


class LayoutCheck:
    """A queued layout comparison; wait() raises LayoutMismatch if the ranks differ."""

    def __init__(self, request: Any, buf: np.ndarray, mine: int, what: str, rank: int) -> None:
        self.request = request
        self.buf = buf
        self.mine = mine
        self.what = what
        self.rank = rank

    def test(self) -> bool:
        """True once the comparison has completed."""
        return bool(self.request.Test())

    def wait(self) -> None:
        """Wait for the comparison; raise LayoutMismatch naming the operation if ranks differ."""
        self.request.Wait()
        hi, lo = int(self.buf[0]), -int(self.buf[1])
        if hi != lo:
            raise LayoutMismatch(
                f"{self.what}: ranks submitted different tensors (name, shape or dtype) to the "
                f"same collective; layout hashes range over [{lo:#x}, {hi:#x}], rank {self.rank} "
                f"has {self.mine:#x}")


class _Holder:
    """The one module-level reference: the current context, or None before init()."""

    def __init__(self) -> None:
        self.context: Optional[TorchContext] = None
        self.lock = threading.Lock()


HOLDER = _Holder()


def current() -> TorchContext:
    """The initialized context; ValueError (as Horovod) if init() was not called."""
    ctx = HOLDER.context
    if ctx is None:
        raise ValueError("collectives.torch has not been initialized; call hvd.init() first")
    return ctx
