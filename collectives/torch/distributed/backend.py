"""The ``torch.distributed`` backend ``"collectives"``: a Python ProcessGroup over the core.

``import collectives.torch`` registers it; then
``torch.distributed.init_process_group(backend="collectives")`` (rank and
world size from the usual arguments or env) gives a process group that
DistributedDataParallel and ordinary training code can use: all_reduce
(sum, avg, min, max, product, band, bor, bxor), broadcast, all_gather,
all_gather_into_tensor, reduce_scatter_tensor, reduce, all_to_all(_single),
barrier here; send/recv, gather/scatter and the coalesced forms in
_ops.py (README: the table of what is there and what raises).

The communicator: for the default group, the ``collectives`` world when this
process was started by ``collectives-run`` (or ``collectives.init()`` already
ran) and the group is that world, unless a failure broke it; otherwise one
built through the torch store given to the backend (every rank publishes its
listening address there), as under torchrun. Every other group (new_group,
new_subgroups) builds one of its own the same way, over its members, so that
as on gloo a failure in one group leaves the others usable.

Every op has the group's timeout (init_process_group's) as its deadline.
allreduce is non-blocking (a core request; a thread per group waits for the
requests in order, and delivery threads complete the torch Futures that DDP's
reducer waits on: _work.py), except where torch says its caller waits at once
(a blocking dist.all_reduce of one contiguous CPU tensor with nothing queued
before it: it runs in the caller's thread). The other collectives run
synchronously and return completed work; the core orders them after the
queued allreduces.
"""
from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ._errors import GroupNotes, worded, wording_timeouts
from ._ops import MoreOps, _reduce_op, core_op
from .._context import as_buffer, check_tensor, wire_dtype
from ._work import Completer, Staged as _Staged, _Work, completed as _completed

__all__ = ["ProcessGroupCollectives", "register_backend", "BACKEND_NAME"]

BACKEND_NAME = "collectives"

# allreduce's fast path: torch's op (RedOpType's value: hashing and comparing the enum
# itself goes through pybind11, 2 us a call) -> the core's, and the dtypes whose numpy
# view the core reads as it is (bfloat16 needs a reinterpreting view, int16 and bool
# widening).
_SUM = dist.ReduceOp.SUM.value
_FAST_OPS = {dist.ReduceOp.SUM.value: "sum", dist.ReduceOp.AVG.value: "avg",
             dist.ReduceOp.MIN.value: "min", dist.ReduceOp.MAX.value: "max",
             dist.ReduceOp.PRODUCT.value: "prod"}
_FAST_DTYPES = frozenset({torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16,
                          torch.float32, torch.float64})
# whether torch's options say that the caller waits for the Work at once (opts.asyncOp
# False: dist.all_reduce without async_op; not in older torch)
_SYNC_OPTS = hasattr(dist.AllreduceOptions(), "asyncOp")


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True if two tensors' memory overlaps (one is a view into the other)."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


class ProcessGroupCollectives(MoreOps, dist.ProcessGroup):
    """A torch.distributed process group whose collectives run in the collectives core.

    Args:
        core: a ``collectives._core.Communicator`` for this group.
        rank: this process's rank in the group.
        size: the group size.
        owns_core: close the communicator when the group shuts down.
        timeout: every op's deadline in seconds (None: the core's, COLLECTIVES_TIMEOUT).
    """

    def __init__(self, core: Any, rank: int, size: int, owns_core: bool = False,
                 timeout: Optional[float] = None) -> None:
        super().__init__(rank, size)
        self._core = core
        self._rank = rank
        self._size = size
        self._owns_core = owns_core
        self._timeout = timeout
        self._completer = Completer(timeout)
        self._notes: Optional[GroupNotes] = None  # explains this group's errors

    def _set_notes(self, notes: GroupNotes) -> None:
        """How this group's errors are explained and labelled (_errors.GroupNotes)."""
        self._notes = notes
        self._completer.notes = notes

    # -- identity ----------------------------------------------------------------
    def getBackendName(self) -> str:
        """The backend's name, "collectives"."""
        return BACKEND_NAME

    def size(self) -> int:
        """The group size."""
        return self._size

    def rank(self) -> int:
        """This process's rank in the group."""
        return self._rank

    @property
    def group_name(self) -> str:
        """torch's name for this group (set when torch creates it)."""
        name = getattr(self, "_group_name", None)
        if name is None:
            raise RuntimeError("ProcessGroup name not set")
        return name

    def __repr__(self) -> str:
        return f"<ProcessGroupCollectives rank {self._rank} of {self._size}>"

    # -- allreduce -------------------------------------------------------------------
    def allreduce(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> _Work:
        """Reduce each tensor in place across ranks (non-blocking, unless torch's caller
        waits for the Work at once: see the module's doc)."""
        if len(tensors) == 1:
            # The common case in few steps (a small allreduce's time is mostly this
            # method's, bench/README.md "Through the frameworks"): one contiguous CPU
            # tensor of a dtype the core reduces, an op the core has.
            t = tensors[0]
            op = _FAST_OPS.get(opts.reduceOp.op.value if opts is not None else _SUM)
            if op is not None and t.dtype in _FAST_DTYPES and t.is_cpu \
                    and t.layout == torch.strided and t.is_contiguous() \
                    and (op != "avg" or t.dtype.is_floating_point):
                view = t.detach().numpy() if t.requires_grad else t.numpy()  # (detach: 0.5 us)
                if _SYNC_OPTS and opts is not None and not opts.asyncOp \
                        and self._completer.idle():
                    # torch's blocking call (dist.all_reduce without async_op) waits for
                    # the Work as soon as it has it: run the allreduce here, and return
                    # completed work, as the other synchronous collectives do
                    self._blocking_allreduce(view, op)
                    return _completed(tensors, "allreduce")
                request = self._core.iallreduce(None, view, op=op, timeout=self._timeout)
                return self._completer.submit_work(request, lambda: tensors, view, "allreduce")
        tensors = list(tensors)
        if len(tensors) == 1 and tensors[0].is_sparse:  # as gloo: gather and add (SUM only)
            from ._more import sparse_allreduce
            from ._ops import op_name
            sparse_allreduce(self, tensors[0], op_name(_reduce_op(opts)))
            return _completed(tensors, "allreduce")
        if len(tensors) != 1:
            return self.allreduce_coalesced(tensors, opts)
        op = core_op(_reduce_op(opts), tensors[0].dtype)
        if op in ("BAND", "BOR", "BXOR"):
            tensors[0].detach().copy_(self._bitwise(tensors[0], op))
            return _completed(tensors, "allreduce")
        staged = _Staged(tensors[0], "allreduce tensor")
        request = self._core.iallreduce(None, staged.view, op=op, dtype=staged.dtype,
                                        timeout=self._timeout)

        def finish() -> list:
            staged.copy_out()
            return tensors

        return self._completer.submit_work(request, finish, staged, "allreduce", like=tensors)

    def _blocking_allreduce(self, view: np.ndarray, op: str) -> None:
        """The core's blocking allreduce in place, raising its errors as a queued one's
        Work would (_errors.worded: gloo's wording of a timeout, the group's notes)."""
        try:
            self._core.allreduce(None, view, op=op, timeout=self._timeout)
        except Exception as exc:
            new = worded(exc, "allreduce", self._timeout, self._notes)
            if new is exc:
                raise
            raise new from exc

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> _Work:
        """Reduce a list of tensors in place with one fused allreduce per dtype."""
        tensors = list(tensors)
        groups: dict = {}
        for t in tensors:
            check_tensor(t, "allreduce tensor")
            op = core_op(_reduce_op(opts), t.dtype)
            if op in ("BAND", "BOR", "BXOR"):
                for u in tensors:
                    self.allreduce([u], opts).wait()
                return _completed(tensors, "allreduce_coalesced")
            groups.setdefault(wire_dtype(t.dtype), []).append(t)
        requests = []
        for wdt, ts in groups.items():
            flat = torch.cat([t.detach().reshape(-1).to(wdt) for t in ts])
            view, dt = as_buffer(flat)
            requests.append((self._core.iallreduce(None, view, op=op, dtype=dt,
                                                   timeout=self._timeout), flat, ts))
        last = None
        for i, (request, flat, ts) in enumerate(requests):
            def finish(flat: torch.Tensor = flat, ts: list = ts) -> list:
                pos = 0
                for t in ts:
                    t.detach().copy_(flat[pos:pos + t.numel()].view(t.shape))
                    pos += t.numel()
                return tensors
            last = self._completer.submit(request, finish, flat, like=tensors)
        return _Work(last, "allreduce_coalesced") if last is not None else _completed(tensors)

    # -- broadcast, all_gather, barrier: in flight when the caller waits later ------------
    def _in_flight(self, opts: Any) -> bool:
        """Whether to queue the op on the group's progress thread rather than run it here:
        when torch's caller waits for the Work later (async_op=True), so that such ops on
        different groups, issued in different orders on different ranks, complete, as on
        gloo's worker threads. A caller that waits at once gets it run in its thread."""
        return self._size > 1 and _SYNC_OPTS and opts is not None and bool(opts.asyncOp)

    def broadcast(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> _Work:
        """Copy root's tensor(s) into every rank's."""
        root = opts.rootRank if opts is not None else 0
        tensors = list(tensors)
        if self._in_flight(opts):
            last = None
            for t in tensors:
                staged = _Staged(t, "broadcast tensor", copy_in=self._rank == root)
                request = self._core.ibroadcast(staged.view, root, self._timeout, staged.dtype)

                def finish(staged: _Staged = staged) -> list:
                    staged.copy_out()
                    return tensors
                last = self._completer.submit(request, finish, staged, "broadcast", like=tensors)
            return _Work(last, "broadcast") if last is not None else _completed(tensors)
        for t in tensors:
            staged = _Staged(t, "broadcast tensor", copy_in=self._rank == root)
            if self._size > 1:
                self._core.broadcast(staged.view, root, self._timeout, staged.dtype)
            staged.copy_out()
        return _completed(tensors)

    def _gather_flat(self, output: torch.Tensor, input: torch.Tensor, in_flight: bool = False
                     ) -> Any:
        """output (n * input.numel() elements, contiguous in rank order) = every rank's input.
        in_flight: start it on the progress thread instead; returns (request, finish, keep):
        finish() writes the result into output once the request is done, and keep holds the
        buffers the request uses until then."""
        if output.numel() != input.numel() * self._size:
            raise ValueError(f"all_gather: output has {output.numel()} elements, expected "
                             f"{self._size} x {input.numel()}")
        if output.dtype != input.dtype:
            raise TypeError(f"all_gather: output is {output.dtype} but input is {input.dtype}")
        if _overlap(input, output):  # in place (input is a slice of output), as gloo takes it
            input = input.clone()
        src = _Staged(input, "all_gather input")
        dst = _Staged(output, "all_gather output", copy_in=False)
        counts = [input.numel()] * self._size
        if in_flight:
            request = self._core.iallgatherv(src.view, dst.view, counts, None, self._timeout,
                                             dst.dtype)

            return request, dst.copy_out, (src, dst)
        self._core.allgatherv(src.view, dst.view, counts, None, self._timeout, dst.dtype)
        dst.copy_out()
        return None

    def allgather(self, output_lists: Sequence[Sequence[torch.Tensor]],
                  inputs: Sequence[torch.Tensor], opts: Any = None) -> _Work:
        """output_lists[0][i] = rank i's inputs[0]."""
        result = [list(o) for o in output_lists]
        in_flight = self._in_flight(opts)
        last = None
        for outs, inp in zip(output_lists, inputs):
            if len(outs) != self._size:
                raise ValueError(f"all_gather: {len(outs)} output tensors for {self._size} ranks")
            flat = torch.empty((self._size,) + tuple(inp.shape), dtype=inp.dtype, device=inp.device)
            if in_flight:
                request, done, keep = self._gather_flat(flat, inp, True)

                def finish(done: Callable[[], None] = done, flat: torch.Tensor = flat,
                           outs: Sequence[torch.Tensor] = outs) -> list:
                    done()
                    for i, o in enumerate(outs):
                        o.detach().copy_(flat[i])
                    return result
                last = self._completer.submit(request, finish, (keep, flat), "all_gather",
                                              like=outs)
                continue
            self._gather_flat(flat, inp)
            for i, o in enumerate(outs):
                o.detach().copy_(flat[i])
        return _Work(last, "all_gather") if last is not None else _completed(result)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
                          ) -> _Work:
        """output = every rank's input concatenated along dim 0 (all_gather_into_tensor)."""
        if self._in_flight(opts):
            request, done, keep = self._gather_flat(output, input, True)

            def finish() -> list:
                done()
                return [output]
            return self._completer.submit_work(request, finish, keep, "all_gather",
                                               like=[output])
        self._gather_flat(output, input)
        return _completed([output])

    _allgather_base = all_gather_single

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
                              ) -> _Work:
        """output = this rank's block of op over every rank's input (reduce_scatter_tensor)."""
        op = core_op(_reduce_op(opts), input.dtype, "reduce_scatter")
        if input.numel() != output.numel() * self._size:
            raise ValueError(f"reduce_scatter: input has {input.numel()} elements, expected "
                             f"{self._size} x {output.numel()}")
        if op in ("BAND", "BOR", "BXOR"):
            whole = self._bitwise(input.reshape(-1), op)
            block = whole[self._rank * output.numel():(self._rank + 1) * output.numel()]
            output.detach().copy_(block.view(output.shape))
            return _completed([output], "reduce_scatter")
        if _overlap(input, output):  # output a slice of input, as gloo takes it
            input = input.clone()
        src = _Staged(input, "reduce_scatter input")
        dst = _Staged(output, "reduce_scatter output", copy_in=False)
        if self._size > 1:
            self._core.reduce_scatter_block(src.view, dst.view, op, self._timeout, dst.dtype)
        else:
            dst.buf.copy_(src.buf.reshape(dst.buf.shape))
        dst.copy_out()
        return _completed([output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs: Sequence[torch.Tensor],
                       input_lists: Sequence[Sequence[torch.Tensor]], opts: Any = None) -> _Work:
        """outputs[0] = op over ranks of input_lists[0][rank]."""
        for out, ins in zip(outputs, input_lists):
            flat = torch.cat([t.detach().reshape(-1) for t in ins])
            self.reduce_scatter_single(out, flat, opts)
        return _completed(list(outputs))

    def reduce(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> _Work:
        """Root's tensor = op over ranks; other ranks' tensors are left unchanged."""
        root = self._root(opts, "reduce")
        for t in tensors:
            op = core_op(_reduce_op(opts), t.dtype, "reduce")
            if op in ("BAND", "BOR", "BXOR"):
                result = self._bitwise(t, op)
                if self._rank == root:
                    t.detach().copy_(result)
                continue
            staged = _Staged(t, "reduce tensor")
            if self._size > 1 and self._rank == root:
                self._core.allreduce(None, staged.view, op=op, dtype=staged.dtype,
                                     timeout=self._timeout)
                staged.copy_out()
            elif self._size > 1:  # an allreduce whose result this rank drops
                scratch = as_buffer(torch.empty_like(staged.buf))[0]
                self._core.allreduce(staged.view, scratch, op=op, dtype=staged.dtype,
                                     timeout=self._timeout)
        return _completed(list(tensors))

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: Sequence[int], input_split_sizes: Sequence[int],
                      opts: Any = None) -> _Work:
        """all_to_all_single: rows of input go to ranks by input_split_sizes (the core's
        alltoallv; a sender and receiver that disagree on a block's size fail naming it)."""
        from collectives import _core
        n = self._size
        if input.dtype != output.dtype:
            raise TypeError(f"all_to_all: output is {output.dtype} but input is {input.dtype}")
        in_rows = self._splits(input, input_split_sizes, "input")
        out_rows = self._splits(output, output_split_sizes, "output")
        row_in = int(np.prod(input.shape[1:])) if input.dim() > 1 else 1
        row_out = int(np.prod(output.shape[1:])) if output.dim() > 1 else 1
        if row_in != row_out:
            raise ValueError(f"all_to_all: input rows of {row_in} elements, output rows of "
                             f"{row_out}")
        src = _Staged(input, "all_to_all input")
        dst = _Staged(output, "all_to_all output", copy_in=False)
        if n == 1:
            dst.buf.copy_(src.buf.reshape(dst.buf.shape))
        else:
            _core.alltoallv(self._core, src.view, dst.view, [k * row_in for k in in_rows],
                            [k * row_out for k in out_rows], None, None, self._timeout,
                            dst.dtype)
        dst.copy_out()
        return _completed([output], "all_to_all")

    def _splits(self, t: torch.Tensor, sizes: Sequence[int], what: str) -> list:
        """Rows per rank along dim 0: sizes, or an even split when empty (as torch)."""
        d0 = t.shape[0] if t.dim() else 1
        if not len(sizes):
            if d0 % self._size:
                raise ValueError(f"all_to_all: {what} of {d0} rows does not split evenly over "
                                 f"{self._size} ranks")
            return [d0 // self._size] * self._size
        sizes = [int(k) for k in sizes]
        if len(sizes) != self._size or min(sizes) < 0 or sum(sizes) != d0:
            raise ValueError(f"all_to_all: {what}_split_sizes {sizes} for {d0} rows and "
                             f"{self._size} ranks")
        return sizes

    def barrier(self, opts: Any = None) -> _Work:
        """Return once every rank has entered the barrier."""
        if self._in_flight(opts):
            return self._completer.submit_work(self._core.ibarrier(self._timeout), lambda: [],
                                               None, "barrier")
        if self._size > 1:
            self._core.barrier(self._timeout)
        return _completed([], "barrier")

    def shutdown(self) -> None:
        """Stop the completion thread; close the communicator if this group created it."""
        self._completer.stop()
        monitor = getattr(self, "_monitor", None)
        if monitor is not None and not monitor.closed:
            monitor.close()
        if self._owns_core:
            self._core.close()

    def abort(self) -> None:
        """Same as shutdown."""
        self.shutdown()


# the ops that run in the caller's thread raise their timeouts worded as gloo's (the
# queued and point-to-point ones word theirs where they fail: _work.py)
for _name, _what in (("broadcast", "broadcast"), ("allgather", "all_gather"),
                     ("all_gather_single", "all_gather_into_tensor"),
                     ("_allgather_base", "all_gather_into_tensor"),
                     ("reduce_scatter_single", "reduce_scatter_tensor"),
                     ("_reduce_scatter_base", "reduce_scatter_tensor"),
                     ("reduce_scatter", "reduce_scatter"), ("reduce", "reduce"),
                     ("alltoall_base", "all_to_all_single"), ("barrier", "barrier"),
                     ("gather", "gather"), ("scatter", "scatter"), ("alltoall", "all_to_all"),
                     ("allgather_coalesced", "all_gather_coalesced"),
                     ("allgather_into_tensor_coalesced", "allgather_into_tensor_coalesced"),
                     ("reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_coalesced")):
    setattr(ProcessGroupCollectives, _name,
            wording_timeouts(getattr(ProcessGroupCollectives, _name), _what))
del _name, _what


def _communicator(store: Any, rank: int, size: int, timeout: timedelta
                  ) -> tuple[Any, Optional[str]]:
    """(core communicator, its key prefix in store) of a default group: the collectives
    world if it is this group (prefix None: not owned), else one of its own through the
    store."""
    import collectives
    from collectives.rendezvous import world as _world

    if _world.is_initialized() or os.environ.get("COLLECTIVES_STORE_ADDR") or \
            os.environ.get("COLLECTIVES_RANK") is not None:
        world = collectives.init()
        # a world that a failure broke is not reused: a group made again after
        # destroy_process_group gets new links through torch's store
        if world.rank == rank and world.size == size and not world._core.broken:
            return world._core, None
    return _own_communicator(store, rank, size, bind=True)


def _own_communicator(store: Any, rank: int, size: int, bind: bool) -> tuple[Any, str]:
    """A root communicator of this group's own, built through torch's store: its own
    listener, links (made on first use), lock and progress thread, so that a failure
    in it (a timeout, a dead member) breaks no other group, as gloo's contexts do.

    Store traffic per rank: one add (the round's prefix), one set (its address), one
    wait and one multi_get for every member's address (a get each where the store has no
    multi_get), and the comm id. bind: pin the process as the host policy says (the
    default group only: a sub-group must not move the process to another CPU).
    Returns (communicator, the prefix of its keys in store).
    """
    from collectives.rendezvous import auth as _auth, env as _env, world as _world
    from collectives import config
    from collectives._core import Communicator

    config.check_env()
    if size == 1:
        return Communicator(0, 1), ""
    # torch's store trusts the network (anyone can read or overwrite it), so
    # what is in it is only a hint: every link proves the job secret itself
    # (native/wire.h), and a rank that finds an impostor at a peer's address
    # fails naming it instead of talking to it.
    secret = _auth.job_secret(rank)
    ns = _round_prefix(store, size)
    if rank == 0:
        store.set(f"{ns}comm_id", os.urandom(16).hex())
    comm_id = bytes.fromhex(store.get(f"{ns}comm_id").decode())
    master, port = _store_address(store)
    host = _env.advertise_address(master, port)
    core = Communicator(rank, size, host, comm_id)
    try:
        core.set_link_key(_auth.link_key(secret))
        hosts, host_cpus = _world.exchange_addresses(
            core, rank, size, host, lambda key, value: store.set(f"{ns}{key}", value),
            _addresses_reader(store, ns, size))
        _world.apply_host_policy(core, *_world.local_place(hosts, rank), host_cpus, bind=bind)
    except BaseException:
        core.close()
        raise
    return core, ns


def _addresses_reader(store: Any, ns: str, size: int) -> Any:
    """get(key) -> bytes for exchange_addresses: every member's "addr/<rank>" comes from one
    wait and one multi_get (one round trip, not size), other keys one get each."""
    cache: dict = {}

    def get(key: str) -> bytes:
        if key in cache:
            return cache.pop(key)
        if key.startswith("addr/") and hasattr(store, "multi_get"):
            keys = [f"{ns}addr/{peer}" for peer in range(size)]
            store.wait(keys)
            for peer, value in enumerate(store.multi_get(keys)):
                cache[f"addr/{peer}"] = bytes(value)
            return cache.pop(key)
        return bytes(store.get(f"{ns}{key}"))

    return get


def _round_prefix(store: Any, size: int) -> str:
    """This formation's own key prefix in torch's store, so that no key of an earlier one
    is read. torchrun's agent keeps one store for all its rounds and hands the workers
    of every round the same unprefixed one, so after a restart the failed round's keys
    are still there: the prefix names the restart (TORCHELASTIC_RESTART_COUNT, which a
    failed round increments) and, within it, the formation (an atomic count of the ranks
    that arrived, divided by the group size: a round of the same restart that re-forms
    after a membership change comes whole, so the count stays in step)."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    arrived = store.add(f"collectives/{restart}/arrivals", 1)
    return f"collectives/{restart}.{(arrived - 1) // size}/"


def _store_address(store: Any) -> tuple[Optional[str], Optional[int]]:
    """Where torch's TCPStore listens (through PrefixStores), else MASTER_ADDR/PORT, else None.

    Used to pick the local interface that routes towards the other ranks.
    """
    inner = store
    for _ in range(8):
        if hasattr(inner, "host") and hasattr(inner, "port"):
            return str(inner.host), int(inner.port)
        nxt = getattr(inner, "underlying_store", None)
        if nxt is None:
            break
        inner = nxt
    master = os.environ.get("MASTER_ADDR") or None
    port = int(os.environ.get("MASTER_PORT", "0") or 0) or None
    return master, port


def _op_timeout(timeout: Optional[timedelta]) -> Optional[float]:
    """The group's deadline for each op, in seconds: init_process_group's timeout, as gloo's.

    torch passes its default (30 minutes) when the script gives none; then an
    explicit COLLECTIVES_TIMEOUT (collectives-run, tests) wins and None leaves
    the core's default in place.
    """
    if timeout is None:
        return None
    from torch.distributed.constants import default_pg_timeout
    if timeout == default_pg_timeout and os.environ.get("COLLECTIVES_TIMEOUT"):
        return None
    secs = timeout.total_seconds()
    return secs if secs > 0 else None


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> ProcessGroupCollectives:
    """The creator torch calls for init_process_group / new_group with this backend."""
    core, ns = _communicator(store, rank, size, timeout)
    pg = ProcessGroupCollectives(core, rank, size, owns_core=ns is not None,
                                 timeout=_op_timeout(timeout))
    if ns:
        pg._set_notes(GroupNotes(core, "", store, ns, rank, size))
    return pg


def _create_group(opts: Any, backend_options: Any = None) -> ProcessGroupCollectives:
    """The creator torch calls (extended API) for init_process_group and every new group.

    The default group (torch passes no ranks for it) is the collectives world when this
    process has one for it, else a communicator built through torch's store. Every other
    group (new_group, new_subgroups) gets a root communicator of its own over its members,
    built through the group's store (torch creates the backend on members only; the others
    get GroupMember.NON_GROUP_MEMBER from torch): as gloo's groups, it shares no link,
    queue or lock with another group, so ops on different groups may be issued in
    different orders on different ranks, and a timeout or a dead member in one group
    leaves the others usable. Its errors end naming the global ranks of its members.
    """
    ranks = [int(r) for r in opts.global_ranks_in_group]
    if ranks:
        rank, size = opts.group_rank, opts.group_size
        core, ns = _own_communicator(opts.store, rank, size, bind=False)
        pg = ProcessGroupCollectives(core, rank, size, owns_core=True,
                                     timeout=_op_timeout(opts.timeout))
        label = "" if ranks == list(range(size)) else \
            (f"[torch group {opts.group_id}: this is its rank {rank} of {size} (global rank "
             f"{ranks[rank]}); its ranks 0..{size - 1} are global ranks "
             f"{','.join(map(str, ranks))}]")
        pg._set_notes(GroupNotes(core, label, opts.store, ns, rank, size, ranks))
    else:
        pg = _create(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    # torch uses a Python ProcessGroup as the group itself and names only the ones it
    # wraps: without its name, destroy_process_group(group) fails ("name not set")
    pg._group_name = str(opts.group_id)
    return pg


def register_backend() -> None:
    """Register "collectives" with torch.distributed (idempotent) for CPU and CUDA
    tensors (a build without CUDA rejects the latter with a TypeError naming it)."""
    if not dist.is_available():
        return
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_group, extended_api=True,
                                  devices=["cpu", "cuda"])
