"""Sparse pushes: DGC (or top-k) on the worker, a bounded SPUSH message, densified on the server.

The payload of an SPUSH message for a shard of ``size`` elements::

    int64   count                     entries that follow, 0 <= count <= size
    int32   index[count], zero pad    positions in the shard, strictly increasing, < size
    value   value[count]              the header's dtype: float32 or float16

so ``nbytes == 8 + pad8(4 * count) + count * itemsize`` exactly. The server
checks all of that (see ``densify``) before it writes anything, so a buggy
or hostile worker cannot write outside its shard, add an entry twice or
make the server allocate more than a shard. The gradient the server then
applies is the dense vector with those entries (zero elsewhere): every mode
treats it exactly like a dense PUSH.

On the worker, ``DGCPush`` runs ``collectives.torch.dgc.DGC`` per parameter
tensor (its momentum correction, local clipping, residual accumulation,
momentum masking, warm-up schedule and threshold selection, as the
allreduce path does) and cuts the selected entries per shard. A shard whose
entries would take more bytes sparse than dense (the warm-up's high
densities, small tensors that DGC keeps dense) goes as a dense PUSH.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import _wire as W

INDEX = np.dtype("<i4")


def _pad8(n: int) -> int:
    return -(-n // 8) * 8


def payload_bytes(count: int, dtype: int) -> int:
    """Bytes of an SPUSH payload of count entries with values of dtype code."""
    return 8 + _pad8(4 * count) + count * W.DTYPES[dtype].itemsize


def encode(index: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The SPUSH payload (uint8) for shard-local int indices and float32/float16 values."""
    count = len(index)
    item = values.dtype.itemsize
    buf = np.zeros(8 + _pad8(4 * count) + count * item, dtype=np.uint8)
    buf[:8].view("<i8")[0] = count
    buf[8:8 + 4 * count].view(INDEX)[:] = index
    start = 8 + _pad8(4 * count)
    buf[start:].view(values.dtype)[:] = values
    return buf


def densify(payload: np.ndarray, size: int, dtype: int) -> np.ndarray:
    """The dense float32 gradient (size elements) of an SPUSH payload; ValueError, before
    anything is written, unless its count, length and indices are all valid for the shard."""
    if dtype not in W.DTYPES:
        raise ValueError(f"unknown dtype code {dtype}")
    n = len(payload)
    if n < 8:
        raise ValueError(f"sparse push of {n} bytes: shorter than its count")
    count = int(payload[:8].view("<i8")[0])
    if not 0 <= count <= size:
        raise ValueError(f"sparse push of {count} entries: the shard holds {size} elements")
    if n != payload_bytes(count, dtype):
        raise ValueError(f"sparse push of {count} entries of {W.DTYPES[dtype]} in {n} bytes "
                         f"(expected {payload_bytes(count, dtype)})")
    index = payload[8:8 + 4 * count].view(INDEX)
    start = 8 + _pad8(4 * count)
    values = payload[start:start + count * W.DTYPES[dtype].itemsize].view(W.DTYPES[dtype])
    if count:
        if int(index.min()) < 0 or int(index.max()) >= size:
            bad = int(index[(index < 0) | (index >= size)][0])
            raise ValueError(f"sparse push: index {bad} outside the shard of {size} elements")
        if count > 1 and not bool((index[1:] > index[:-1]).all()):
            raise ValueError("sparse push: indices are not strictly increasing")
    g = np.zeros(size, dtype=np.float32)
    g[index] = values
    return g


def split(layout: W.Layout, index: np.ndarray, values: np.ndarray, dense_dtype: int,
          sparse_dtype: int) -> list:
    """Per shard, (kind, dtype, payload) for a gradient given by strictly increasing flat
    indices and float32 values: SPUSH where that is fewer bytes than the dense shard,
    else PUSH of the dense shard in dense_dtype."""
    cuts = np.searchsorted(index, layout.bounds)
    out = []
    for s in range(layout.num_servers):
        lo, size = layout.bounds[s], layout.shard_size(s)
        idx, val = index[cuts[s]:cuts[s + 1]], values[cuts[s]:cuts[s + 1]]
        if payload_bytes(len(idx), sparse_dtype) < size * W.DTYPES[dense_dtype].itemsize:
            out.append((W.SPUSH, sparse_dtype,
                        encode((idx - lo).astype(INDEX), val.astype(W.DTYPES[sparse_dtype]))))
        else:
            dense = np.zeros(size, dtype=np.float32)
            dense[idx - lo] = val
            out.append((W.PUSH, dense_dtype, dense.astype(W.DTYPES[dense_dtype], copy=False)))
    return out


def check_sparse(index: Any, values: Any, total: int) -> tuple:
    """(int64 index, float32 values) of a user's sparse gradient; TypeError/ValueError unless
    the indices are integers, strictly increasing, within [0, total), one value each."""
    idx, val = np.asarray(index), np.asarray(values)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"sparse gradient: indices of dtype {idx.dtype}, need integers")
    if val.dtype != np.float32:
        raise TypeError(f"sparse gradient: values of dtype {val.dtype}, need float32")
    if idx.ndim != 1 or val.shape != idx.shape:
        raise ValueError(f"sparse gradient: indices of shape {idx.shape}, values of shape "
                         f"{val.shape}: need two 1-d arrays of the same length")
    if len(idx) > total:
        raise ValueError(f"sparse gradient of {len(idx)} entries: the model has {total}")
    idx = idx.astype(np.int64)
    if len(idx) and (idx[0] < 0 or idx[-1] >= total or not (idx[1:] > idx[:-1]).all()):
        raise ValueError(f"sparse gradient: indices must be strictly increasing in [0, {total})")
    return idx, val


class DGCPush:
    """Worker-side compression of pushed gradients with ``collectives.torch.dgc.DGC``.

    Args:
        layout: the parameter layout (its shapes name the tensors: "0", "1", ...).
        compressor: a DGC or TopKCompressor instance (its density, momentum, clipping,
            warm-up; one per worker: it holds this worker's residuals).
        num_workers: for DGC's local clipping threshold (clip_norm / sqrt(N)).
    """

    def __init__(self, layout: W.Layout, compressor: Any, num_workers: int) -> None:
        import torch

        from ..torch import dgc

        if not isinstance(compressor, dgc.SparseCompressor):
            raise TypeError(f"{type(compressor).__name__}: pass a collectives.torch.dgc.DGC "
                            f"or TopKCompressor")
        if compressor.wire.value_dtype not in (torch.float32, torch.float16):
            raise ValueError("DGC values must travel as float32 or float16")
        self.layout, self.comp = layout, compressor
        if isinstance(compressor, dgc.DGC):
            compressor.nranks = num_workers
        self.value_dtype = W.DTYPE_F16 if compressor.wire.value_dtype == torch.float16 \
            else W.DTYPE_F32
        self.offsets = np.cumsum([0] + layout.sizes)
        self.eligible = [compressor.eligible(str(j), torch.empty(s, device="meta"))
                         for j, s in enumerate(layout.shapes)]
        self.stats: dict = {}

    def _sparse_wins(self, numel: int) -> bool:
        # a sparse entry costs 4 (index) + value bytes, a dense element 4
        return self.comp.k(numel) * (4 + W.DTYPES[self.value_dtype].itemsize) < 4 * numel

    def compress(self, grad: np.ndarray, dense_dtype: int = W.DTYPE_F32) -> list:
        """One step: fold grad (flat float32) into the residuals, select, and return the
        per-shard (kind, dtype, payload) to push (see split)."""
        import torch

        from ..torch import sparse_ops

        comp = self.comp
        idx_parts, val_parts = [], []
        sparse_entries = 0
        f16 = self.value_dtype == W.DTYPE_F16
        for j, n in enumerate(self.layout.sizes):
            lo = int(self.offsets[j])
            g = torch.from_numpy(grad[lo:lo + n])
            name = str(j)
            if self.eligible[j] and self._sparse_wins(n):
                v = comp.accumulate_sparse(name, g)
                k = comp.k(n)
                thr = sparse_ops.choose_threshold(v, k, comp.sample_ratio, comp.rounds,
                                                  comp.sample_start(j))
                vals = torch.empty(k, dtype=torch.float32)
                idx = torch.empty(k, dtype=torch.int64)
                c = sparse_ops.select(v, thr, k, vals, idx)
                vals, idx = vals[:c], idx[:c]
                if f16:  # what the server will decode: the rounding error stays in v
                    vals = vals.half().float()
                comp.sent(name, idx, vals)
                idx_parts.append(idx.numpy() + lo)
                val_parts.append(vals.numpy())
                sparse_entries += c
            else:
                out = comp.accumulate_dense(name, g)
                idx_parts.append(np.arange(lo, lo + n, dtype=np.int64))
                val_parts.append(out.reshape(-1).numpy())
        comp.end_step()
        index = np.concatenate(idx_parts) if idx_parts else np.zeros(0, np.int64)
        values = np.concatenate(val_parts).astype(np.float32, copy=False) if val_parts \
            else np.zeros(0, np.float32)
        msgs = split(self.layout, index, values, dense_dtype, self.value_dtype)
        self.stats = {"sparse_entries": sparse_entries, "entries": int(len(index)),
                      "bytes": int(sum(p.nbytes for _, _, p in msgs))}
        return msgs


def make_compressor(compression: Any, momentum: float = 0.0, nesterov: bool = False,
                    **kwargs: Any) -> Optional[Any]:
    """A DGC instance for compression="dgc" (default density 0.001), the instance itself
    if one is given, None for "none"/"fp16"."""
    if isinstance(compression, str):
        if compression != "dgc":
            return None
        from ..torch.dgc import DGC

        return DGC(momentum=momentum, nesterov=nesterov, **kwargs)
    return compression
