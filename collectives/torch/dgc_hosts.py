"""DGC's sparse exchange merged per host, for worlds of several hosts with several ranks each.

The flat exchange (``sparse_ops.exchange``) allgathers every rank's packed
selections, so each host link carries every selection of the other hosts'
ranks: at H hosts of L ranks, each host's L buffers leave it (two-level
allgatherv), against n - 1 buffers on a flat ring's busiest link. Here a
host's ranks merge their selections first, so a host link carries the union
of its host's indices once:

1. inside the host (shared memory): allgatherv of the L packed buffers; every
   local rank decodes them and forms, per tensor, the union of the indices
   with the values at equal indices summed (float32, in local-rank order);
2. across hosts on rails: the union of every tensor is cut into P = min_local
   contiguous parts, and local rank j < P allgathers part j with local rank j
   of every other host (one bundle per host crosses each host link, spread
   over P ranks);
3. inside the host again: each local rank shares the parts it received, so
   every rank holds every host's union, and scatter-adds them in host order.

The result is the flat exchange's union-sum: each output element is the sum
of every rank's value there. Only the association of that sum differs (a
host's values first, then hosts in host order, the same order on every rank,
so every replica stays identical): bit for bit equal to the flat path on
values whose partial sums are exact (integers), within float rounding
otherwise. Merged values travel as float32 even when ranks send float16, so
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
    """The host and rail communicators of one world and the merged sparse exchange over them.

    Build it with ``HostExchange.create(core)`` on every rank of core at the
    same point (it splits core twice); it is None where the world does not
    go in two levels (one host, or one rank per host).
    """

    def __init__(self, host: Any, rail: Optional[Any], host_index: int, nhosts: int,
                 local: int, parts: int) -> None:
        self.host, self.rail = host, rail
        self.host_index, self.nhosts, self.local, self.parts = host_index, nhosts, local, parts
        self.host_link_bytes = 0  # bytes of this host's bundle in the last exchange

    @classmethod
    def create(cls, core: Any) -> Optional["HostExchange"]:
        """Split core into host and rail communicators (collective on core), or None."""
        ids = core.host_ids()
        labels = [ids.index(h) if h else -1 - i for i, h in enumerate(ids)]
        topo = _core.topology(labels)
        if not topo["two_level"]:
            return None
        r = core.rank
        h, local, parts = topo["host"][r], topo["local"][r], topo["min_local"]
        host = _core.comm_split(core, h, local)
        # local rank j < min_local: the rail of every host's local rank j, ranked by host
        # order; the others are in no rail (they send nothing across hosts)
        rail = _core.comm_split(core, local if local < parts else _core.UNDEFINED, h)
        return cls(host, rail, h, len(topo["hosts"]), local, parts)

    def exchange(self, buf: torch.Tensor, caps: Sequence[int], fmt: WireFormat
                 ) -> tuple[torch.Tensor, list, list]:
        """Exchange this rank's packed buffer (sparse_ops layout, caps per tensor).

        Returns (gathered, sizes, merged_caps): every host's union in host
        order, in the sparse_ops layout with float32 values and fmt's indices,
        for ``sparse_ops.decode(gathered, sizes, outs, merged_caps, merged_format(fmt))``.
        """
        mfmt = self.merged_format(fmt)
        mcaps = [c * self.host.size for c in caps]
        # 1. the host's buffers, merged alike on every local rank; padded to the caps'
        # size (a copy in shared memory) so that no size exchange comes first
        fixed = sparse_ops.buffer_bytes(caps, fmt)
        if buf.numel() > fixed:
            raise ValueError(f"host sparse exchange: a buffer of {buf.numel()} bytes, the caps "
                             f"{list(caps)} hold {fixed}")
        mine_in = np.zeros(fixed, np.uint8)
        mine_in[:buf.numel()] = buf.numpy()
        L = self.host.size
        hbufs = torch.from_numpy(_allgatherv(self.host, L, mine_in, [fixed] * L))
        ranks = _parse(hbufs, [fixed] * L, caps, fmt, fixed=True)
        union = [merge_union([per[t] for per in ranks]) for t in range(len(caps))]
        mine = self._pack(union, mcaps, mfmt)
        chunks = [self._pack([self._part(v, i, j) for v, i in union], mcaps, mfmt)
                  for j in range(self.parts)]
        self.host_link_bytes = sum(c.numel() for c in chunks)
        # 2. part `local` across hosts (ranked by host order on the rail)
        got = []  # (host, bytes) of other hosts' parts this rank received
        if self.rail is not None:
            part = chunks[self.local]
            rsizes = _allgatherv(self.rail, self.rail.size, np.array([part.numel()], np.int64),
                                 [1] * self.rail.size).tolist()
            rbufs = _allgatherv(self.rail, self.rail.size, part.numpy(), rsizes)
            off = 0
            for h, s in enumerate(rsizes):
                if h != self.host_index:
                    got.append(rbufs[off:off + s])
                off += s
        # 3. share them inside the host: local rank j < P received nhosts - 1 parts
        others = self.nhosts - 1
        counts = [others if j < self.parts else 0 for j in range(self.host.size)]
        mysizes = np.array([g.size for g in got], np.int64)
        allsizes = _allgatherv(self.host, self.host.size, mysizes, counts).tolist()
        allbytes = _allgatherv(self.host, self.host.size,
                               np.concatenate(got) if got else np.zeros(0, np.uint8),
                               [sum(allsizes[sum(counts[:j]):sum(counts[:j + 1])])
                                for j in range(self.host.size)])
        # host order: parts of host h from local ranks 0..P-1 (disjoint indices), ours whole
        pieces: dict = {self.host_index: [mine.numpy()]}
        off, k = 0, 0
        for j in range(self.parts):
            for h in (x for x in range(self.nhosts) if x != self.host_index):
                s = allsizes[k]
                pieces.setdefault(h, []).append(allbytes[off:off + s])
                off, k = off + s, k + 1
        bufs = [b for h in range(self.nhosts) for b in pieces[h]]
        sizes = [int(b.size) for b in bufs]
        return torch.from_numpy(np.concatenate(bufs)), sizes, mcaps

    @staticmethod
    def merged_format(fmt: WireFormat) -> WireFormat:
        """The wire format of merged bundles: float32 values (sums), fmt's indices."""
        return WireFormat(torch.float32, fmt.index_dtype)

    def _part(self, vals: np.ndarray, idx: np.ndarray, j: int) -> tuple:
        lo, hi = (vals.size * j) // self.parts, (vals.size * (j + 1)) // self.parts
        return vals[lo:hi], idx[lo:hi]

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
