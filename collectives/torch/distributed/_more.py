"""The torch.distributed backend's monitored barrier and sparse allreduce, as gloo does them.

``monitored_barrier(group, timeout, wait_all_ranks)``: gloo's algorithm and
messages (ProcessGroupGloo::monitoredBarrier). Every rank but 0 sends rank 0
a message and waits for its answer; rank 0 waits for each rank in turn within
what is left of the timeout (wait_all_ranks: each rank within the whole
timeout) and answers every rank only once all have arrived, so either every
rank passes or none does. Rank 0 names the first rank that did not arrive
("Rank 1 failed to pass monitoredBarrier in 2000 ms"; wait_all_ranks: "Ranks
1, 2 failed ..."); the others say they reached it but got no answer from
rank 0 within the timeout. Every wait is the barrier's own, not the core's
(a receive left unanswered is cancelled), so a failed monitored barrier
leaves the group usable. The messages travel on a communicator of their own, made from the
group's without a message (the group's own point-to-point tags stay the
user's). ``torch.distributed.monitored_barrier`` itself accepts only gloo
groups (torch raises "monitored_barrier is only implemented for GLOO
backend"): ``group.monitored_barrier(timeout)`` reaches this one.

``sparse_allreduce``: the sum of a sparse COO tensor over ranks, written into
it (gloo's: coalesce, allgather the metadata, the indices and the values,
add). Only SUM, as gloo; ranks whose tensors differ in shape, sparse
dimensions or dtype fail on every rank with a ValueError naming them.
"""
from __future__ import annotations

import hashlib
import time
from datetime import timedelta
from typing import Any, Optional

import torch

__all__ = ["monitored_barrier", "sparse_allreduce"]


def _tags(pg: Any) -> tuple:
    """(arrive, release): this call's tags on the monitor's communicator. Each call has its
    own (a count every rank keeps, as gloo's per-call tags), so a receive left posted by a
    failed call never takes a later call's message."""
    seq = getattr(pg, "_monitor_seq", 0)
    pg._monitor_seq = seq + 1
    base = 2 * (seq % (2**30 - 1))
    return base, base + 1


def _monitor_comm(pg: Any) -> Any:
    """The group's monitored-barrier communicator (same ranks, made without a message)."""
    comm = getattr(pg, "_monitor", None)
    if comm is None or comm.closed:
        from collectives import _core
        name = getattr(pg, "_group_name", None) or "default"
        tag = int.from_bytes(hashlib.blake2b(f"monitored_barrier/{name}".encode(),
                                             digest_size=4).digest(), "little")
        comm = pg._monitor = _core.comm_create_group(pg._core, list(range(pg._size)), tag)
    return comm


def _ms(secs: float) -> int:
    return int(round(secs * 1000))


def _arrived(request: Any, deadline: float) -> tuple:
    """(True, None) once request completes by deadline; (False, error or None) otherwise."""
    try:
        while not request.Test():
            if time.monotonic() >= deadline:
                return False, None
            time.sleep(0.001)
        return True, None
    except Exception as exc:  # the rank died or its link broke: it did not pass
        return False, exc


def monitored_barrier(pg: Any, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """gloo's monitored barrier over pg (a ProcessGroupCollectives); see the module text.

    Args:
        pg: the group.
        timeout: a timedelta or seconds; None: the group's timeout.
        wait_all_ranks: rank 0 waits for every rank and names all that did not arrive.
    """
    from collectives import _core
    if timeout is None:
        secs = pg._timeout if pg._timeout is not None else 1800.0
    else:
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    rank, n = pg._rank, pg._size
    if n == 1:
        return
    token = torch.tensor([rank], dtype=torch.int64)
    comm = _monitor_comm(pg)
    if rank != 0:  # within the barrier's timeout, as gloo's (not the group's)
        arrive, release = _tags(pg)
        start = time.monotonic()
        far = max(secs, 1.0) * n + 1.0  # the core's deadline, past the wait below
        try:
            _core.p2p_send(comm, token.numpy(), 0, arrive, far)
            answer = _core.p2p_irecv(comm, token.numpy(), 0, release, far)
            passed, error = _arrived(answer, start + secs)
        except Exception as exc:
            passed, error = False, exc
        if not passed:  # (the receive is cancelled when answer is freed)
            raise RuntimeError(
                f"Rank {rank} successfully reached monitoredBarrier, but received errors while "
                "waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.\n"
                " Original exception: \n"
                + (str(error) if error else f"no answer from rank 0 within {_ms(secs)} ms"))
        return
    start = time.monotonic()
    if secs <= 0:  # nothing is posted and no tag taken: the group stays usable
        raise RuntimeError(f"Rank 0 timed out in monitoredBarrier after {_ms(secs)} ms. "
                           f"Original timeout: {_ms(secs)} ms. Successfully processed ranks: ")
    arrive, release = _tags(pg)
    bufs = {q: torch.empty(1, dtype=torch.int64) for q in range(1, n)}
    # the core's deadline lies past every wait below: a rank that does not arrive is
    # reported here (its receive is cancelled when its request is freed)
    recvs = {q: _core.p2p_irecv(comm, bufs[q].numpy(), q, arrive, secs * n + 1.0)
             for q in range(1, n)}
    passed: list = []
    failed: list = []
    for q, request in recvs.items():
        left = secs if wait_all_ranks else secs - (time.monotonic() - start)
        if not wait_all_ranks and left <= 0:
            raise RuntimeError(
                f"Rank 0 timed out in monitoredBarrier after {_ms(time.monotonic() - start)} ms."
                f" Original timeout: {_ms(secs)} ms. Successfully processed ranks: "
                + ", ".join(map(str, passed)))
        arrived, error = _arrived(request, time.monotonic() + left)
        if arrived:
            passed.append(q)
            continue
        if not wait_all_ranks:
            msg = f"[Rank 0]: Rank {q} failed to pass monitoredBarrier in {_ms(secs)} ms"
            raise RuntimeError(msg + (f"\n Original exception: \n{error}" if error else ""))
        failed.append(q)
    if failed:
        raise RuntimeError(f"[Rank 0]: Ranks {', '.join(map(str, failed))} failed to pass "
                           f"monitoredBarrier in {_ms(secs)} ms")
    for q in range(1, n):
        _core.p2p_send(comm, token.numpy(), q, release, pg._timeout)


# -- sparse allreduce ------------------------------------------------------------------------

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
           torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]


def _allgather_ints(pg: Any, values: list) -> torch.Tensor:
    """(size, len(values)) int64: every rank's values (the same length on every rank)."""
    mine = torch.tensor(values, dtype=torch.int64)
    every = torch.empty((pg._size, len(values)), dtype=torch.int64)
    pg._gather_flat(every, mine)
    return every


def _allgatherv(pg: Any, mine: torch.Tensor, counts: list) -> torch.Tensor:
    """Every rank's flat mine (counts[i] elements from rank i), concatenated in rank order."""
    from collectives import _core
    from ._work import Staged
    out = torch.empty(sum(counts), dtype=mine.dtype)
    src = Staged(mine.reshape(-1).contiguous(), "sparse allreduce input")
    dst = Staged(out, "sparse allreduce output", copy_in=False)
    pg._core.allgatherv(src.view, dst.view, counts, None, pg._timeout, dst.dtype)
    dst.copy_out()
    return out


def sparse_allreduce(pg: Any, tensor: torch.Tensor, op_name: str) -> torch.Tensor:
    """tensor (sparse COO) = its SUM over the ranks of pg, as gloo computes it; returns it."""
    if op_name != "SUM":
        raise ValueError(f"collectives backend: allreduce of a sparse tensor supports "
                         f"ReduceOp.SUM only (as gloo), not ReduceOp.{op_name}")
    if tensor.layout != torch.sparse_coo:
        raise TypeError(f"collectives backend: allreduce of a {tensor.layout} tensor; sparse "
                        "tensors must be torch.sparse_coo")
    if tensor.device.type != "cpu":
        raise TypeError("collectives backend: sparse allreduce takes CPU tensors")
    if tensor.dtype not in _DTYPES:
        raise TypeError(f"collectives backend: sparse allreduce of {tensor.dtype}")
    local = tensor.detach().coalesce()
    dense_shape = list(local.shape[local.sparse_dim():])
    meta = [_DTYPES.index(tensor.dtype), local.sparse_dim(), local.dim(), local._nnz()]
    every = _allgather_ints(pg, meta)
    for what, col in (("dtype", 0), ("sparse dimensions", 1), ("dimensions", 2)):
        if (every[:, col] != every[0, col]).any():
            values = [_DTYPES[v] if col == 0 else int(v) for v in every[:, col].tolist()]
            raise ValueError(f"collectives backend: sparse allreduce: the ranks' tensors differ "
                             f"in {what}: " + ", ".join(f"rank {q}: {v}"
                                                        for q, v in enumerate(values)))
    shapes = _allgather_ints(pg, list(local.shape))
    if (shapes != shapes[0]).any():
        raise ValueError("collectives backend: sparse allreduce: the ranks' tensors differ in "
                         "shape: " + ", ".join(f"rank {q}: {tuple(s)}"
                                               for q, s in enumerate(shapes.tolist())))
    nnz = [int(k) for k in every[:, 3].tolist()]
    sdim = local.sparse_dim()
    per_value = 1
    for d in dense_shape:
        per_value *= d
    indices = _allgather_ints_v(pg, local.indices(), [sdim * k for k in nnz])
    values = _allgatherv(pg, local.values(), [per_value * k for k in nnz])
    out: Optional[torch.Tensor] = None
    ipos = vpos = 0
    for k in nnz:
        part = torch.sparse_coo_tensor(indices[ipos:ipos + sdim * k].view(sdim, k),
                                       values[vpos:vpos + per_value * k].view([k] + dense_shape),
                                       local.shape)
        out = part if out is None else out + part
        ipos, vpos = ipos + sdim * k, vpos + per_value * k
    assert out is not None
    with torch.no_grad():
        tensor.copy_(out)
    return tensor


def _allgather_ints_v(pg: Any, indices: torch.Tensor, counts: list) -> torch.Tensor:
    """Every rank's int64 indices, flat, concatenated in rank order."""
    return _allgatherv(pg, indices.to(torch.int64).contiguous(), counts)
