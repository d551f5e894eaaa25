"""The torch.distributed backend's point-to-point, rooted and coalesced ops, and its reduce ops.

``MoreOps`` is a mixin of ``ProcessGroupCollectives`` (backend.py): send,
recv (also from any source), isend/irecv (through ``send``/``recv``, as torch
calls them), gather, scatter (and so torch's gather_object and
scatter_object_list), alltoall (the list form), allgather_coalesced,
allgather_into_tensor_coalesced and reduce_scatter_tensor_coalesced. What the
backend still lacks raises NotImplementedError naming the op and the backend,
where torch's base class would say "No backend type associated with device
type cpu".

Reduce ops: SUM, AVG (floating point), MIN, MAX and PRODUCT run in the core;
BAND, BOR and BXOR (integers and bool, as gloo) have no core kernel, so they
gather every rank's tensor and reduce locally, in rank order (the same result
on every rank; n times the traffic of an allreduce). PREMUL_SUM is NCCL's
only, as on gloo.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import torch
import torch.distributed as dist

from ._work import P2PWork, Staged, _Work, completed

_CORE_OPS = {"SUM": "sum", "AVG": "avg", "MIN": "min", "MAX": "max", "PRODUCT": "prod"}
_BITWISE: dict = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
                  "BXOR": torch.bitwise_xor}


class _OpTypeError(TypeError, RuntimeError):
    """A reduce op that does not apply to the tensor's dtype (a RuntimeError, as gloo's)."""


def op_name(op: Any) -> str:
    """A torch ReduceOp's name ("BAND"), not its object address."""
    for name, member in dist.ReduceOp.RedOpType.__members__.items():
        try:
            if op == member:
                return name
        except TypeError:
            break
    return str(op)


def core_op(op: Any, dtype: Any = None, what: str = "allreduce") -> str:
    """The core's name for a torch ReduceOp ("sum"), or "BAND"/"BOR"/"BXOR" (reduced locally).

    Raises NotImplementedError (a RuntimeError) naming an op the backend does not
    have, and a TypeError that is also a RuntimeError for an op that does not
    apply to dtype (as gloo: BAND on floats, AVG on integers).
    """
    name = op_name(op)
    if name in _BITWISE:
        if dtype is not None and (dtype.is_floating_point or dtype.is_complex):
            raise _OpTypeError(f"collectives backend: {what}: cannot use ReduceOp.{name} with "
                               f"non-integral dtype {dtype}")
        return name
    if name not in _CORE_OPS:
        raise NotImplementedError(
            f"ReduceOp.{name} is not supported by backend collectives ({what}); supported: "
            "SUM, AVG, MIN, MAX, PRODUCT, BAND, BOR, BXOR")
    if name == "AVG" and dtype is not None and not dtype.is_floating_point:
        raise _OpTypeError(f"collectives backend: {what}: ReduceOp.AVG of {dtype} (integer) "
                           "tensors; use a floating-point dtype")
    return _CORE_OPS[name]


def _reduce_op(opts: Any) -> Any:
    return opts.reduceOp if opts is not None else dist.ReduceOp.SUM


def _check_tag(tag: int) -> int:
    tag = int(tag)
    if not 0 <= tag <= 2**31 - 1:
        raise ValueError(f"collectives backend: tag {tag} out of range [0, 2**31 - 1]")
    return tag


class MoreOps:
    """Point-to-point, rooted and coalesced ops of ProcessGroupCollectives (a mixin)."""

    _core: Any
    _rank: int
    _size: int
    _timeout: Any
    _notes: Any

    # -- point-to-point ------------------------------------------------------------------
    def _peer(self, peer: int, what: str) -> int:
        peer = int(peer)
        if not 0 <= peer < self._size:
            raise ValueError(f"collectives backend: {what}: rank {peer} out of range for "
                             f"{self._size} ranks")
        if peer == self._rank:
            raise ValueError(f"collectives backend: {what}: rank {peer} is this rank")
        return peer

    def send(self, tensors: Sequence[torch.Tensor], dstRank: int, tag: int = 0) -> _Work:
        """Start sending tensors[0] to dstRank with tag; wait() on the Work completes it."""
        from collectives import _core
        if len(tensors) != 1:
            raise ValueError(f"collectives backend: send takes one tensor, got {len(tensors)}")
        dst = self._peer(dstRank, "send")
        staged = Staged(tensors[0], "send tensor")
        request = _core.p2p_isend(self._core, staged.view, dst, _check_tag(tag), self._timeout,
                                  staged.dtype)
        return P2PWork(request, lambda _status: list(tensors), f"send to rank {dst}", staged,
                       self._timeout, self._notes)

    def _recv(self, tensors: Sequence[torch.Tensor], src: int, tag: int, what: str) -> _Work:
        from collectives import _core
        if len(tensors) != 1:
            raise ValueError(f"collectives backend: recv takes one tensor, got {len(tensors)}")
        staged = Staged(tensors[0], "recv tensor", copy_in=False)
        if not staged.direct:  # a shorter message leaves the rest of the tensor as it was
            staged.buf.copy_(tensors[0].detach())
        request = _core.p2p_irecv(self._core, staged.view, src, _check_tag(tag), self._timeout,
                                  staged.dtype)

        def finish(_status: Any) -> list:
            staged.copy_out()
            return list(tensors)

        return P2PWork(request, finish, what, staged, self._timeout, self._notes)

    def recv(self, tensors: Sequence[torch.Tensor], srcRank: int, tag: int = 0) -> _Work:
        """Start receiving a message from srcRank with tag into tensors[0]."""
        src = self._peer(srcRank, "recv")
        return self._recv(tensors, src, tag, f"recv from rank {src}")

    def recv_anysource(self, tensors: Sequence[torch.Tensor], tag: int = 0) -> _Work:
        """Start receiving a message from any rank; the Work's _source_rank() says which."""
        from collectives import _core
        return self._recv(tensors, _core.ANY_SOURCE, tag, "recv from any source")

    # -- rooted ---------------------------------------------------------------------------
    def _root(self, opts: Any, what: str) -> int:
        root = int(opts.rootRank) if opts is not None else 0
        if not 0 <= root < self._size:
            raise ValueError(f"collectives backend: {what}: root {root} out of range for "
                             f"{self._size} ranks")
        return root

    def gather(self, output_tensors: Sequence[Sequence[torch.Tensor]],
               input_tensors: Sequence[torch.Tensor], opts: Any = None) -> _Work:
        """The root's output_tensors[0][i] = rank i's input_tensors[0]."""
        from collectives import _core
        root = self._root(opts, "gather")
        if len(input_tensors) != 1:
            raise ValueError("collectives backend: gather takes one input tensor")
        inp = input_tensors[0]
        src = Staged(inp, "gather input")
        outs: list = []
        if self._rank == root:
            if len(output_tensors) != 1 or len(output_tensors[0]) != self._size:
                raise ValueError(f"collectives backend: gather: the root needs one list of "
                                 f"{self._size} output tensors")
            outs = list(output_tensors[0])
            for o in outs:
                if o.dtype != inp.dtype or o.numel() != inp.numel():
                    raise ValueError(f"collectives backend: gather: output {o.dtype}"
                                     f"{tuple(o.shape)} does not match input {inp.dtype}"
                                     f"{tuple(inp.shape)}")
        elif len(output_tensors) and any(len(o) for o in output_tensors):
            raise ValueError("collectives backend: gather: output tensors on a non-root rank")
        flat = torch.empty((self._size * inp.numel(),), dtype=src.buf.dtype) \
            if self._rank == root else None
        dst = Staged(flat, "gather output", copy_in=False) if flat is not None else None
        _core.gatherv(self._core, src.view, dst.view if dst else None,
                      [inp.numel()] * self._size, None, root, self._timeout, src.dtype)
        for i, o in enumerate(outs):
            o.detach().copy_(flat[i * inp.numel():(i + 1) * inp.numel()].view(o.shape))
        return completed([list(x) for x in output_tensors], "gather")

    def scatter(self, output_tensors: Sequence[torch.Tensor],
                input_tensors: Sequence[Sequence[torch.Tensor]], opts: Any = None) -> _Work:
        """output_tensors[0] = the root's input_tensors[0][rank]."""
        from collectives import _core
        root = self._root(opts, "scatter")
        if len(output_tensors) != 1:
            raise ValueError("collectives backend: scatter takes one output tensor")
        out = output_tensors[0]
        dst = Staged(out, "scatter output", copy_in=False)
        src = None
        if self._rank == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self._size:
                raise ValueError(f"collectives backend: scatter: the root needs one list of "
                                 f"{self._size} input tensors")
            for t in input_tensors[0]:
                if t.dtype != out.dtype or t.numel() != out.numel():
                    raise ValueError(f"collectives backend: scatter: input {t.dtype}"
                                     f"{tuple(t.shape)} does not match output {out.dtype}"
                                     f"{tuple(out.shape)}")
            src = Staged(torch.cat([t.detach().reshape(-1).to(dst.buf.dtype)
                                    for t in input_tensors[0]]), "scatter input")
        elif len(input_tensors) and any(len(i) for i in input_tensors):
            raise ValueError("collectives backend: scatter: input tensors on a non-root rank")
        _core.scatterv(self._core, src.view if src else None, dst.view,
                       [out.numel()] * self._size, None, root, self._timeout, dst.dtype)
        dst.copy_out()
        return completed(list(output_tensors), "scatter")

    # -- lists of tensors ---------------------------------------------------------------------
    def alltoall(self, output_tensors: Sequence[torch.Tensor],
                 input_tensors: Sequence[torch.Tensor], opts: Any = None) -> _Work:
        """output_tensors[i] = rank i's input_tensors[rank] (all_to_all)."""
        n = self._size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"collectives backend: all_to_all needs {n} input and {n} output "
                             "tensors")
        dtypes = {t.dtype for t in list(output_tensors) + list(input_tensors)}
        if len(dtypes) != 1:
            raise TypeError(f"collectives backend: all_to_all tensors of several dtypes {dtypes}")
        flat_in = torch.cat([t.detach().reshape(-1) for t in input_tensors])
        flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)
        self.alltoall_base(flat_out, flat_in, [t.numel() for t in output_tensors],
                           [t.numel() for t in input_tensors], opts)
        pos = 0
        for t in output_tensors:
            t.detach().copy_(flat_out[pos:pos + t.numel()].view(t.shape))
            pos += t.numel()
        return completed(list(output_tensors), "all_to_all")

    def allgather_coalesced(self, output_lists: Sequence[Sequence[torch.Tensor]],
                            input_list: Sequence[torch.Tensor], opts: Any = None) -> _Work:
        """output_lists[i][j] = rank i's input_list[j] (all_gather_coalesced)."""
        if len(output_lists) != self._size or any(len(o) != len(input_list)
                                                  for o in output_lists):
            raise ValueError(f"collectives backend: all_gather_coalesced needs {self._size} "
                             f"output lists of {len(input_list)} tensors")
        for j, inp in enumerate(input_list):
            flat = torch.empty((self._size,) + tuple(inp.shape), dtype=inp.dtype)
            self._gather_flat(flat, inp)  # type: ignore[attr-defined]
            for i in range(self._size):
                output_lists[i][j].detach().copy_(flat[i])
        return completed([list(o) for o in output_lists], "all_gather_coalesced")

    def allgather_into_tensor_coalesced(self, outputs: Sequence[torch.Tensor],
                                        inputs: Sequence[torch.Tensor], opts: Any = None
                                        ) -> _Work:
        """outputs[j] = every rank's inputs[j], concatenated (coalesced all_gather_into_tensor)."""
        if len(outputs) != len(inputs):
            raise ValueError("collectives backend: allgather_into_tensor_coalesced: "
                             f"{len(outputs)} outputs for {len(inputs)} inputs")
        for out, inp in zip(outputs, inputs):
            self._gather_flat(out, inp)  # type: ignore[attr-defined]
        return completed(list(outputs), "allgather_into_tensor_coalesced")

    def reduce_scatter_tensor_coalesced(self, outputs: Sequence[torch.Tensor],
                                        inputs: Sequence[torch.Tensor], opts: Any = None
                                        ) -> _Work:
        """outputs[j] = this rank's block of op over every rank's inputs[j]."""
        if len(outputs) != len(inputs):
            raise ValueError("collectives backend: reduce_scatter_tensor_coalesced: "
                             f"{len(outputs)} outputs for {len(inputs)} inputs")
        for out, inp in zip(outputs, inputs):
            self.reduce_scatter_single(out, inp, opts)  # type: ignore[attr-defined]
        return completed(list(outputs), "reduce_scatter_tensor_coalesced")

    # -- bitwise reduce ops: gather, then reduce locally -----------------------------------
    def _bitwise(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """BAND/BOR/BXOR of tensor over ranks (every rank gets it), reduced in rank order."""
        every = torch.empty((self._size,) + tuple(tensor.shape), dtype=tensor.dtype)
        self._gather_flat(every, tensor)  # type: ignore[attr-defined]
        return functools.reduce(_BITWISE[name], list(every))

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier: rank 0 names the ranks that did not arrive in time
        (_more.py; torch's dist.monitored_barrier takes gloo groups only, so call
        group.monitored_barrier(timeout))."""
        from ._more import monitored_barrier
        monitored_barrier(self, timeout, wait_all_ranks)
