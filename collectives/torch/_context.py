"""The state of ``collectives.torch``: one context object holding Horovod's communicators.

Everything the Horovod API needs between calls (the communicator, the node
layout, the fusion threshold, the per-call agreement of arguments across
ranks) hangs off one ``TorchContext``. The module keeps a single
reference to it (``current()``); handles keep their own buffers alive, so
there is no module-level map of handles (STYLE rule 26).
"""
from __future__ import annotations

import contextlib
import os
import socket
import threading
from typing import Any, Iterator, Optional

import torch

import collectives
from collectives.rendezvous.env import byte_size

from ._agree import Agreement, LayoutMismatch

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
    if type(tensor) is torch.Tensor and tensor.is_cpu and not tensor.is_sparse and \
            not tensor.is_complex():
        return  # the common case, in a few attribute reads (each call pays this)
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
    t = tensor.detach() if tensor.requires_grad else tensor
    if t.is_cpu:
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy(), "bfloat16"
        return t.numpy(), None
    if t.device.type == "cuda":
        # The typestr only carries the width: the dtype name says what it is.
        name = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
                torch.float64: "float64", torch.int8: "int8", torch.uint8: "uint8",
                torch.int32: "int32", torch.int64: "int64"}[t.dtype]
        return CudaTensorView(t), name
    return t.numpy(), None  # another device: numpy() says what it cannot do


class TorchContext:
    """Horovod's communicator and what the Horovod API derives from it.

    Every operation of the Horovod API (the negotiation's rounds and the data
    movement) runs on a root communicator with links of its own over the world's
    ranks (``rendezvous.links.own_links``), never on the world's links: the user's
    thread may issue collectives there (MPI.COMM_WORLD, torch.distributed, JAX) in
    any interleaving with the negotiating thread's, which on shared links would
    meet in a different order on each rank.

    Args:
        comm: the world ``collectives.MPI.Comm`` from ``collectives.init()`` (or the
            communicator passed to ``hvd.init(comm=...)``).
    """

    def __init__(self, comm: Any) -> None:
        from collectives.rendezvous.links import own_links

        self.world = comm
        # a collective on comm, at the same point on every rank (hvd.init's). The rounds and
        # the data share these links (the negotiating thread alone uses them, in one order):
        # a second communicator for the rounds, so that a round does not wait behind the
        # data queued on the progress thread, measured no faster within this host's noise
        # (bench/README.md) and cost one more link set-up per init
        self.core = self.control = own_links(comm._core)
        try:
            # the same front-end class over Horovod's own links (pickled-object calls)
            self.comm = type(comm)._from_core(self.core, comm.local_rank, comm.local_size)
        except BaseException:
            self.close()
            raise
        self.rank: int = comm.rank
        self.size: int = comm.size
        self.local_rank: int = comm.local_rank
        self.local_size: int = comm.local_size
        self.fusion_threshold: int = fusion_threshold()
        self.lock = threading.RLock()
        self.agreement = Agreement(self.core, self.rank, self.size)
        self.lane = _negotiator(self.control, self.core, self.rank, self.size)  # (_negotiate)
        self.timeline: Any = None  # a timeline.Timeline while one records (rank 0)
        self.process_sets: dict = {}  # id -> registered process set (see process_sets)
        self.next_process_set_id = 1
        # host ids ("hostname/boot id") as own_links set them: no message needed
        hosts = [h.split("/")[0] for h in self.core.host_ids()] if self.size > 1 else \
            [socket.gethostname()]
        order = list(dict.fromkeys(hosts))
        self.cross_rank: int = order.index(hosts[self.rank])
        self.cross_size: int = len(order)
        if self.size > 1:  # from here on only the negotiating thread uses these links
            self.lane.start()

    def close(self) -> None:
        """Free the process sets' communicators and close Horovod's two communicators
        (after the negotiating thread ended: it uses them)."""
        from .. import _core

        for pset in list(getattr(self, "process_sets", {}).values()):
            view = getattr(pset, "view", None)
            sub = getattr(view, "core", None)
            if sub is not None and sub is not self.core and not sub.closed:
                try:
                    _core.comm_free(sub)
                except Exception:  # noqa: BLE001 -- closing the root below frees it anyway
                    pass
        if self.control is not self.core:
            self.control.close()
        self.core.close()

    # -- agreement ------------------------------------------------------------
    def check_now(self, key: Any, what: str) -> None:
        """Raise LayoutMismatch on every rank unless every rank passed an equal `key`
        (compared on every call, never cached; see _agree)."""
        if self.size > 1:
            self.agreement.agree(what, key if isinstance(key, str) else repr(key))


def _negotiator(control: Any, core: Any, rank: int, size: int) -> Any:
    """The world's Negotiator, configured from HOROVOD_* (see _knobs): rounds on control,
    data on core."""
    from . import _knobs
    from ._plan import serve_plan
    from ._negotiate import Negotiator
    warn, expire = _knobs.stall_times(_knobs.collective_timeout())
    lane = Negotiator(control, rank, size, _knobs.cycle_time_s(), _knobs.cache_capacity(), warn,
                      expire, lambda plan: serve_plan(core, plan), data=core)
    lane.turn_state = _lane_state
    return lane


@contextlib.contextmanager
def _lane_state() -> Iterator[None]:
    """A waiting thread runs rounds (and the ops they run) in the state the negotiating
    thread has: no process set active (an op binds its own), autograd on, no inference
    mode and no autocast, whatever the waiting caller set around its call."""
    before = ACTIVE.view
    ACTIVE.view = None
    try:
        if torch.is_grad_enabled() and not torch.is_inference_mode_enabled() and \
                not torch.is_autocast_enabled("cpu"):
            yield  # the usual case: the state is the thread's already (entering costs ~20 us)
        else:
            with torch.inference_mode(False), torch.enable_grad(), \
                    torch.autocast("cpu", enabled=False):
                yield
    finally:
        ACTIVE.view = before


class _Holder:
    """The one module-level reference: the current context, or None before init()."""

    def __init__(self) -> None:
        self.context: Optional[TorchContext] = None
        self.lock = threading.Lock()


HOLDER = _Holder()


class _Active(threading.local):
    """The process set an operation on this thread runs in (see process_sets); None: the
    world."""

    view: Any = None


ACTIVE = _Active()


def current() -> Any:
    """The initialized context (the active process set's while an operation on one runs);
    ValueError (as Horovod) if init() was not called."""
    ctx = HOLDER.context
    if ctx is None:
        raise ValueError("collectives.torch has not been initialized; call hvd.init() first")
    view = ACTIVE.view
    if view is not None and view.parent is ctx:
        return view
    return ctx
