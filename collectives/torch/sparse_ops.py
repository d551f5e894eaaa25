"""Sparse gradient exchange for ``collectives.torch.dgc``: selection, wire format, exchange.

Each step, every rank packs the entries it selected from each sparse tensor
into one byte buffer, the buffers are allgathered (a variable-size
allgatherv, after a tiny allgatherv of their sizes), and every rank
scatter-adds all buffers into dense gradients. The loops over tensor
elements (threshold count, pack, scatter-add) run in C (``native/reduce/sparse.c``);
this module only lays out buffers and checks what arrives.

Wire format of one rank's buffer (host byte order; every rank is the same
build on the same kind of host)::

    [T x int64: count c_t of tensor t]
    [values: sum_t c_t entries, float32 or float16, tensor 0's first]
    [zero pad to a multiple of 8 bytes]
    [indices: sum_t c_t entries, int32 or int64, same order]
    [zero pad to a multiple of 8 bytes]

T, the tensors' order and the dtypes are the same on every rank (they follow
from the fixed bucket order and the shared density schedule); only the counts
differ. A buffer whose sizes do not add up, a count above the tensor's cap
or an index outside the tensor is an error (ValueError), never a crash.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from .. import _core

__all__ = ["WireFormat", "choose_threshold", "sample_plan", "adapt_threshold", "select", "pack",
           "pack_selected", "buffer_bytes", "exchange", "decode"]

# Below this many elements a tensor is sampled whole: the exact threshold costs
# less than the adaptation rounds a tiny sample would need.
MIN_SAMPLE = 4096
# A threshold is accepted once it selects between LOW_FILL * k and k entries.
LOW_FILL = 0.8
TINY = float(np.finfo(np.float32).tiny)  # smallest threshold: exact zeros are never sent


@dataclass(frozen=True)
class WireFormat:
    """Dtypes of the values and indices on the wire."""

    value_dtype: torch.dtype = torch.float32
    index_dtype: torch.dtype = torch.int32

    @property
    def entry_bytes(self) -> int:
        """Bytes per sent entry (value + index)."""
        return self.value_dtype.itemsize + self.index_dtype.itemsize


def _pad8(n: int) -> int:
    return -(-n // 8) * 8


def choose_threshold(x: torch.Tensor, k: int, sample_ratio: float, rounds: int = 3,
                     start: int = 0) -> float:
    """A magnitude threshold selecting about k (at most ~k) entries of flat float32 `x`.

    The first guess is the magnitude of rank ks = k * s / n in a strided
    sample of |x| (s = sample_ratio of the entries, at least MIN_SAMPLE, from
    offset `start` modulo the stride). Each of up to `rounds` adaptation
    rounds counts the real hits (in C) and moves to the sample rank scaled by
    target / count, aiming at 0.9 k, until the count is in [LOW_FILL * k, k].
    The result may still select more than k (a sample too small to resolve
    k): select() then keeps the exact top k of the candidates.

    Args:
        x: flat contiguous float32 tensor.
        k: target number of entries, >= 1.
        sample_ratio: fraction of the entries sampled.
        rounds: adaptation rounds.
        start: sample offset (varied per step so every entry gets sampled).

    Returns:
        A threshold > 0.
    """
    n = x.numel()
    off, stride, s, rank = sample_plan(n, k, sample_ratio, start)
    sample = x[off::stride][:s].abs()
    top = torch.topk(sample, min(s, 4 * rank + 16)).values.tolist()
    xn = x.numpy()
    return adapt_threshold(top, k, rank, rounds, lambda i, thr: _core.sparse_count_above(xn, thr))


def sample_plan(n: int, k: int, sample_ratio: float, start: int) -> tuple:
    """(offset, stride, sample size, initial rank) of choose_threshold's strided sample."""
    s = min(n, max(math.ceil(n * sample_ratio), MIN_SAMPLE))
    stride = max(1, n // s)
    off = start % stride
    s = min(s, (n - off + stride - 1) // stride)
    rank = min(s, max(1, round(s * k / n)))
    return off, stride, s, rank


def adapt_threshold(top: Sequence[float], k: int, rank: int, rounds: int, count: Any) -> float:
    """choose_threshold's adaptation rounds over the sorted sample top `top`, with
    `count(i, thr)` the exact number of entries at or above thr = max(top[i], TINY)."""
    best, best_count = None, -1
    for _ in range(rounds + 1):
        i = min(rank, len(top)) - 1
        thr = max(top[i], TINY)
        c = count(i, thr)
        if c <= k and c > best_count:
            best, best_count = thr, c
        if LOW_FILL * k <= c <= k:
            break
        new = min(len(top), max(1, round(rank * 0.9 * k / max(c, 1))))
        if new == rank:
            new = rank - 1 if c > k else rank + 1
        if not 1 <= new <= len(top):
            break
        rank = new
    return best if best is not None else thr


def select(x: torch.Tensor, thr: float, k: int, values: torch.Tensor,
           indices: torch.Tensor) -> int:
    """Pack at most k entries of `x` with |x| >= thr into values[:k], indices[:k]; return count.

    If more than k entries pass the threshold, the k largest of them are kept
    (exact top-k among the candidates), not the first k in index order.
    """
    xn = x.numpy()
    count = _core.sparse_count_above(xn, thr)
    if count <= k:
        return _core.sparse_pack(xn, thr, values[:k].numpy(), indices[:k].numpy())
    cand_v = torch.empty(count, dtype=torch.float32)
    cand_i = torch.empty(count, dtype=torch.int64)
    _core.sparse_pack(xn, thr, cand_v.numpy(), cand_i.numpy())
    keep = torch.topk(cand_v.abs(), k, sorted=False).indices.sort().values
    values[:k].copy_(cand_v[keep])
    indices[:k].copy_(cand_i[keep])
    return k


def pack(parts: Sequence[tuple[torch.Tensor, float, int]], fmt: WireFormat
         ) -> tuple[torch.Tensor, list]:
    """Select from each (x, threshold, k) and lay the result out in the wire format.

    Returns:
        The uint8 buffer, and for each part (values as float32, indices as int64)
        exactly as the receivers will decode them.
    """
    # Part j is packed right after part j-1's entries: its k slots always fit,
    # since the entries before it are at most the sum of the earlier caps.
    cap = sum(k for _, _, k in parts)
    wire_v = torch.empty(cap, dtype=fmt.value_dtype)
    wire_i = torch.empty(cap, dtype=fmt.index_dtype)
    counts, out, off = [], [], 0
    for x, thr, k in parts:
        c = select(x, thr, k, wire_v[off:off + k], wire_i[off:off + k])
        counts.append(c)
        out.append((wire_v[off:off + c].float(), wire_i[off:off + c].long()))
        off += c
    wire_v, wire_i = wire_v[:off], wire_i[:off]
    header = torch.tensor(counts, dtype=torch.int64).view(torch.uint8)
    vbytes = wire_v.view(torch.uint8)
    ibytes = wire_i.view(torch.uint8)
    pv = _pad8(vbytes.numel()) - vbytes.numel()
    pi = _pad8(ibytes.numel()) - ibytes.numel()
    zeros = torch.zeros(8, dtype=torch.uint8)
    buf = torch.cat([header, vbytes, zeros[:pv], ibytes, zeros[:pi]])
    return buf, out


def pack_selected(sel: Sequence[tuple[torch.Tensor, torch.Tensor]], caps: Sequence[int],
                  fmt: WireFormat) -> torch.Tensor:
    """Lay out already selected (float32 values, int64 indices) in the wire format, zero
    padded to the fixed size buffer_bytes(caps): every rank's buffer then has the same
    size and one allgather, started at once, moves it (no size exchange first)."""
    counts = [int(v.numel()) for v, _ in sel]
    if any(c > cap for c, cap in zip(counts, caps)) or len(caps) != len(sel):
        raise ValueError(f"pack_selected: counts {counts} exceed caps {list(caps)}")
    total = sum(counts)
    vb = fmt.value_dtype.itemsize
    buf = torch.zeros(buffer_bytes(caps, fmt), dtype=torch.uint8)
    t = len(sel)
    buf[:8 * t].view(torch.int64).copy_(torch.tensor(counts, dtype=torch.int64))
    voff, ioff = 8 * t, 8 * t + _pad8(total * vb)
    if total:
        buf[voff:voff + total * vb].view(fmt.value_dtype).copy_(torch.cat([v for v, _ in sel]))
        ib = fmt.index_dtype.itemsize
        buf[ioff:ioff + total * ib].view(fmt.index_dtype).copy_(torch.cat([i for _, i in sel]))
    return buf


def buffer_bytes(counts: Sequence[int], fmt: WireFormat) -> int:
    """Size in bytes of a buffer holding these counts."""
    total = sum(counts)
    return 8 * len(counts) + _pad8(total * fmt.value_dtype.itemsize) + \
        _pad8(total * fmt.index_dtype.itemsize)


def exchange(core: Any, size: int, buf: torch.Tensor) -> tuple[torch.Tensor, list]:
    """Allgather every rank's uint8 buffer (sizes first); return them concatenated and the sizes."""
    if size == 1:
        return buf, [buf.numel()]
    sizes = np.zeros(size, dtype=np.int64)
    core.allgatherv(np.array([buf.numel()], dtype=np.int64), sizes, [1] * size)
    gathered = torch.empty(int(sizes.sum()), dtype=torch.uint8)
    core.allgatherv(buf.numpy(), gathered.numpy(), [int(s) for s in sizes])
    return gathered, [int(s) for s in sizes]


def decode(gathered: torch.Tensor, sizes: Sequence[int], outs: Sequence[torch.Tensor],
           caps: Sequence[int], fmt: WireFormat, fixed: bool = False) -> None:
    """Scatter-add every rank's buffer into the flat float32 tensors `outs` (not zeroed here).

    Args:
        gathered: the buffers of all ranks, concatenated in rank order.
        sizes: each rank's buffer size in bytes.
        outs: one flat contiguous float32 tensor per sparse tensor, in wire order.
        caps: the most entries a rank may send for each tensor (its k).
        fmt: the wire format.
        fixed: every buffer is padded to buffer_bytes(caps) (pack_selected's layout).
    """
    t = len(outs)
    out_np = [o.numpy() for o in outs]
    base = 0
    for rank, nbytes in enumerate(sizes):
        if nbytes < 8 * t or base % 8:
            raise ValueError(f"sparse exchange: rank {rank} sent {nbytes} bytes, expected a "
                             f"header of {t} counts")
        counts = gathered[base:base + 8 * t].view(torch.int64).tolist()
        if any(c < 0 or c > cap for c, cap in zip(counts, caps)):
            raise ValueError(f"sparse exchange: rank {rank} sent counts {counts}, caps {list(caps)}")
        expect = buffer_bytes(counts, fmt)
        if fixed and nbytes != buffer_bytes(caps, fmt):
            raise ValueError(f"sparse exchange: rank {rank} sent {nbytes} bytes, expected "
                             f"{buffer_bytes(caps, fmt)}")
        if expect != nbytes and not fixed:
            raise ValueError(f"sparse exchange: rank {rank} sent {nbytes} bytes, its counts "
                             f"{counts} need {expect}")
        total = sum(counts)
        voff = base + 8 * t
        ioff = voff + _pad8(total * fmt.value_dtype.itemsize)
        vals = gathered[voff:voff + total * fmt.value_dtype.itemsize].view(fmt.value_dtype)
        idx = gathered[ioff:ioff + total * fmt.index_dtype.itemsize].view(fmt.index_dtype)
        vn, inn = vals.numpy(), idx.numpy()
        pos = 0
        for j, c in enumerate(counts):
            if c:
                _core.sparse_scatter_add(out_np[j], vn[pos:pos + c], inn[pos:pos + c])
            pos += c
        base += nbytes
