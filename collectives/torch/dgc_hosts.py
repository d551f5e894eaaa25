"""DGC's sparse exchange merged per host, for worlds of several hosts with several ranks each.

The flat exchange (``sparse_ops.exchange``) allgathers every rank's packed
selections, so each host link carries every selection of the other hosts'
ranks: at H hosts of L ranks, each host's L buffers leave it (two-level
allgatherv), against n - 1 buffers on a flat ring's busiest link. Here a
host's ranks merge their selections first, so a host link carries the union
of its host's indices once:

1. inside the host (shared memory): allgatherv of the L packed buffers
   (padded to the caps, so no size exchange comes first);
2. local rank j of L takes the entries of every buffer that fall in part j
   of each tensor's index range and merges them: the union of those indices,
   values at equal indices summed (float32, in local-rank order); the host's
   parts together are its union, and the merging is split over its ranks;
3. every rank's merged part is allgathered over the world, which goes in two
   levels (tune.c, allgather_two_level.c): each part crosses into each other
   host once, so a host link carries its host's union once per other host;
   every rank then scatter-adds the parts in rank order.

The result is the flat exchange's union-sum: each output element is the sum
of every rank's value there. Only the association of that sum differs (a
host's values first, then the hosts' sums in the rank order of the parts
holding that element, the same on every rank, so every replica stays
identical): bit for bit equal to the flat path on values whose partial
sums are exact (integers), within float rounding otherwise. Merged values travel as float32 even when ranks send float16, so
no rounding is added. Bytes per host link: the size of its host's union
(between 1 and L times one rank's selections, by how much the ranks' indices
overlap) instead of L (two-level) or n - 1 (flat ring) selections.

The exchange is blocking: with ``overlap=True`` the sparse tensors of such a
world are exchanged in ``synchronize()`` (the three phases need results of
one another; the dense allreduces still overlap backward).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch

from .. import _core
from . import sparse_ops
from .sparse_ops import WireFormat

__all__ = ["HostExchange", "merge_union"]


def merge_union(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Union of the (values, indices) of several ranks, values at equal indices summed.

    Returns (float32 values, int64 indices sorted ascending). The values at
    one index are added in float32 in the order of parts (a stable sort keeps
    it; np.add.reduceat adds each run left to right), so every rank that
    merges the same parts gets the same bits.
    """
    if not parts:
        return np.zeros(0, np.float32), np.zeros(0, np.int64)
    idx = np.concatenate([np.asarray(i, np.int64) for _, i in parts])
    vals = np.concatenate([np.asarray(v, np.float32) for v, _ in parts])
    if idx.size == 0:
        return vals, idx
    order = np.argsort(idx, kind="stable")
    idx, vals = idx[order], vals[order]
    starts = np.flatnonzero(np.concatenate(([True], idx[1:] != idx[:-1])))
    return np.add.reduceat(vals, starts), idx[starts]


def _parse(gathered: torch.Tensor, sizes: Sequence[int], caps: Sequence[int],
           fmt: WireFormat, fixed: bool = False) -> list:
    """Each buffer's per-tensor (values, indices) as numpy, checked as sparse_ops.decode does
    (fixed: every buffer padded to buffer_bytes(caps))."""
    t, base, out = len(caps), 0, []
    for who, nbytes in enumerate(sizes):
        if nbytes < 8 * t or base % 8:
            raise ValueError(f"host sparse exchange: buffer {who} has {nbytes} bytes, expected a "
                             f"header of {t} counts")
        counts = gathered[base:base + 8 * t].view(torch.int64).tolist()
        need = sparse_ops.buffer_bytes(counts, fmt)
        if any(c < 0 or c > cap for c, cap in zip(counts, caps)) or \
                (need > nbytes if fixed else need != nbytes):
            raise ValueError(f"host sparse exchange: buffer {who} has counts {counts} in {nbytes} "
                             f"bytes (caps {list(caps)})")
        total = sum(counts)
        voff = base + 8 * t
        ioff = voff + sparse_ops._pad8(total * fmt.value_dtype.itemsize)
        vals = gathered[voff:voff + total * fmt.value_dtype.itemsize].view(fmt.value_dtype)
        idx = gathered[ioff:ioff + total * fmt.index_dtype.itemsize].view(fmt.index_dtype)
        vn, inn = vals.float().numpy(), idx.long().numpy()
        per, pos = [], 0
        for c in counts:
            per.append((vn[pos:pos + c], inn[pos:pos + c]))
            pos += c
        out.append(per)
        base += nbytes
    return out


def _allgatherv(core: Any, size: int, buf: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    out = np.empty(int(sum(sizes)), dtype=buf.dtype)
    if size == 1:
        out[:] = buf
    else:
        core.allgatherv(buf, out, [int(s) for s in sizes])
    return out


class HostExchange:
    """The host communicator of one world and the merged sparse exchange over it.

    Build it with ``HostExchange.create(core)`` on every rank of core at the
    same point (it splits core); it is None where the world does not go in
    two levels (one host, or one rank per host).
    """

    def __init__(self, core: Any, host: Any, hosts: Sequence[int], max_local: int) -> None:
        self.core, self.host = core, host
        self.hosts = list(hosts)  # host index of each rank of core
        self.max_local = max_local
        self.host_link_bytes = 0  # bytes of this host's union in the last exchange

    @classmethod
    def create(cls, core: Any) -> Optional["HostExchange"]:
        """Split core into host communicators (collective on core), or None."""
        ids = core.host_ids()
        labels = [ids.index(h) if h else -1 - i for i, h in enumerate(ids)]
        topo = _core.topology(labels)
        if not topo["two_level"]:
            return None
        r = core.rank
        host = _core.comm_split(core, topo["host"][r], topo["local"][r])
        return cls(core, host, topo["host"], topo["max_local"])

    def exchange(self, buf: torch.Tensor, caps: Sequence[int], numels: Sequence[int],
                 fmt: WireFormat) -> tuple[torch.Tensor, list, list]:
        """Exchange this rank's packed buffer (sparse_ops layout; caps and element counts
        per tensor).

        Returns (gathered, sizes, merged_caps): one merged part per rank, in rank
        order, in the sparse_ops layout with float32 values and fmt's indices,
        for ``sparse_ops.decode(gathered, sizes, outs, merged_caps, merged_format(fmt))``.
        """
        mfmt = self.merged_format(fmt)
        L, j = self.host.size, self.host.rank
        # 1. the host's buffers, padded to the caps' size (a copy in shared memory) so
        # that no size exchange comes first
        fixed = sparse_ops.buffer_bytes(caps, fmt)
        if buf.numel() > fixed:
            raise ValueError(f"host sparse exchange: a buffer of {buf.numel()} bytes, the caps "
                             f"{list(caps)} hold {fixed}")
        padded = np.zeros(fixed, np.uint8)
        padded[:buf.numel()] = buf.numpy()
        hbufs = torch.from_numpy(_allgatherv(self.host, L, padded, [fixed] * L))
        ranks = _parse(hbufs, [fixed] * L, caps, fmt, fixed=True)
        # 2. local rank j merges part j of L of each tensor's index range: the host's
        # union, cut so that each local rank does 1/L of the merging
        sel = []
        for t, numel in enumerate(numels):
            lo, hi = (numel * j) // L, (numel * (j + 1)) // L
            parts = []
            for per in ranks:
                v, i = per[t]
                m = (i >= lo) & (i < hi)
                parts.append((v[m], i[m]))
            sel.append(merge_union(parts))
        mcaps = [c * self.max_local for c in caps]
        mine = self._pack(sel, mcaps, mfmt)
        # 3. every rank's part to every rank: the world's allgatherv goes in two levels,
        # so each part crosses into each other host once
        n = len(self.hosts)
        sizes = _allgatherv(self.core, n, np.array([mine.numel()], np.int64), [1] * n).tolist()
        gathered = _allgatherv(self.core, n, mine.numpy(), sizes)
        me = self.hosts[self.core.rank]
        self.host_link_bytes = sum(s for s, h in zip(sizes, self.hosts) if h == me)
        return torch.from_numpy(gathered), [int(s) for s in sizes], mcaps

    @staticmethod
    def merged_format(fmt: WireFormat) -> WireFormat:
        """The wire format of merged bundles: float32 values (sums), fmt's indices."""
        return WireFormat(torch.float32, fmt.index_dtype)

    @staticmethod
    def _pack(sel: Sequence[tuple[np.ndarray, np.ndarray]], caps: Sequence[int],
              fmt: WireFormat) -> torch.Tensor:
        """sel in the sparse_ops layout, sized by what it holds (no padding to caps)."""
        counts = [int(v.size) for v, _ in sel]
        if any(c > cap for c, cap in zip(counts, caps)):
            raise ValueError(f"host sparse exchange: counts {counts} exceed caps {list(caps)}")
        total, t = sum(counts), len(sel)
        vb, ib = fmt.value_dtype.itemsize, fmt.index_dtype.itemsize
        vdt = np.dtype(str(fmt.value_dtype).replace("torch.", ""))
        idt = np.dtype(str(fmt.index_dtype).replace("torch.", ""))
        voff = 8 * t
        ioff = voff + sparse_ops._pad8(total * vb)
        buf = np.zeros(sparse_ops.buffer_bytes(counts, fmt), np.uint8)
        buf[:voff].view(np.int64)[:] = counts
        if total:
            buf[voff:voff + total * vb].view(vdt)[:] = np.concatenate([v for v, _ in sel])
            buf[ioff:ioff + total * ib].view(idt)[:] = np.concatenate([i for _, i in sel])
        return torch.from_numpy(buf)
