"""The worker's side: push a gradient to every server and pull the new parameters, per shard
in parallel (one thread per server; each blocks in the core with the GIL released)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import numpy as np

from . import _sparse
from . import _wire as W


class PSError(RuntimeError):
    """A parameter server failed, or refused a message (names the server and why)."""


class Worker:
    """A worker's links to every server, with the version of each shard it last pulled.

    Args:
        links: {server index: pair communicator}.
        layout: the parameter layout.
        index: this worker's index (0 .. num_workers - 1).
        server_ranks: the world rank of each server (for error messages).
        compression: "none", "fp16" (gradients are pushed as float16), "dgc" (Deep Gradient
            Compression at density 0.001, no momentum of its own) or a
            collectives.torch.dgc.DGC / TopKCompressor instance: sparse pushes (see
            collectives/ps/_sparse.py).
        timeout: seconds to wait for a server's reply (None: COLLECTIVES_TIMEOUT).
        num_workers: how many workers train (DGC's local clipping scales with it).
        host: init(host_sum=True): the communicator of this host's workers (its rank 0
            pushes their sum and broadcasts the reply); dense pushes only ("none", "fp16").
    """

    def __init__(self, links: dict, layout: W.Layout, index: int, server_ranks: list,
                 compression: Any = "none", timeout: Optional[float] = None,
                 num_workers: int = 1, host: Any = None) -> None:
        if isinstance(compression, str) and compression not in ("none", "fp16", "dgc"):
            raise ValueError(f"compression {compression!r} is not 'none', 'fp16' or 'dgc'")
        if host is not None and not (isinstance(compression, str) and
                                     compression in ("none", "fp16")):
            raise ValueError(f"host_sum sums dense gradients: compression 'none' or 'fp16', "
                             f"not {compression!r}")
        self.host = host
        self.links, self.layout, self.index = links, layout, index
        self.server_ranks = server_ranks
        self.dtype = W.DTYPE_F16 if compression == "fp16" else W.DTYPE_F32
        comp = _sparse.make_compressor(compression)
        self.sparse = None if comp is None else _sparse.DGCPush(layout, comp, num_workers)
        self.timeout = timeout
        self.versions = [0] * layout.num_servers
        self.params = np.zeros(layout.total, dtype=np.float32)
        self.bufs = [np.empty(W.HEADER_BYTES + max(4 * layout.shard_size(s), W.ERROR_TEXT_BYTES),
                              dtype=np.uint8) for s in range(layout.num_servers)]
        self.pool = ThreadPoolExecutor(layout.num_servers) if layout.num_servers > 1 else None
        self.finished = False

    def _name(self, s: int) -> str:
        return f"parameter server {s} (rank {self.server_ranks[s]})"

    def _exchange(self, s: int, msg: np.ndarray, reply: bool) -> None:
        """Send msg to server s and, if reply, receive its PARAMS into self.params."""
        from .._core import p2p_recv, p2p_send

        core, buf = self.links[s], self.bufs[s]
        kind = int(msg[:16].view("<i8")[1])
        try:
            p2p_send(core, msg, 0, kind, self.timeout)
            if not reply:
                return
            _, tag, count = p2p_recv(core, buf, 0, -1, self.timeout)
        except Exception as exc:
            raise PSError(f"worker {self.index}: {self._name(s)} failed: {exc}") from exc
        try:
            kind, step, shard, _, nbytes, dtype, layout = W.header(buf, count)
        except ValueError as exc:
            raise PSError(f"worker {self.index}: garbage from {self._name(s)}: {exc}") from None
        if kind == W.ERROR:
            raise PSError(bytes(buf[W.HEADER_BYTES:count]).decode("utf-8", "replace"))
        size = self.layout.shard_size(s)
        if (kind, tag, shard, layout, dtype, nbytes) != (W.PARAMS, W.PARAMS, s, self.layout.hash,
                                                         W.DTYPE_F32, 4 * size) or step < 0:
            raise PSError(f"worker {self.index}: {self._name(s)} sent kind {kind} for shard "
                          f"{shard} of {nbytes} bytes, layout {layout:#x}: expected PARAMS of "
                          f"{4 * size} bytes for shard {s}, layout {self.layout.hash:#x}")
        self.params[self.layout.shard(s)] = buf[W.HEADER_BYTES:count].view("<f4")
        self.versions[s] = step

    def _all(self, make, reply: bool = True) -> None:
        S = self.layout.num_servers
        if self.pool is None:
            self._exchange(0, make(0), reply)
            return
        futures = [self.pool.submit(self._exchange, s, make(s), reply) for s in range(S)]
        errors = [f.exception() for f in futures]
        for e in errors:
            if e is not None:
                raise e

    def _flat(self, values, what: str) -> np.ndarray:
        a = np.asarray(values)
        if a.dtype != np.float32:
            raise TypeError(f"{what}: dtype {a.dtype}, the parameter server holds float32")
        if a.ndim != 1 or a.size != self.layout.total:
            raise ValueError(f"{what}: {a.size} elements of shape {a.shape}; the layout holds "
                             f"{self.layout.total} (a flat float32 vector)")
        return a

    def start(self, initial: Optional[np.ndarray] = None) -> np.ndarray:
        """Worker 0 sends its initial values (unless a server loaded a checkpoint); every worker
        then pulls the servers' parameters, which it returns (flat float32)."""
        if initial is not None and self.index == 0:
            flat = self._flat(initial, "initial parameters")
            self._all(lambda s: W.message(W.INIT, 0, s, self.index, self.layout.hash,
                                          flat[self.layout.shard(s)]), reply=False)
        return self.pull()

    def pull(self) -> np.ndarray:
        """The servers' newest parameters (flat float32; this worker's own buffer)."""
        self._all(lambda s: W.message(W.PULL, 0, s, self.index, self.layout.hash))
        return self.params

    def push_pull(self, grad: np.ndarray) -> np.ndarray:
        """Push a gradient computed on the parameters last pulled; returns the parameters
        to compute the next one on (when the mode lets this worker go on).

        TypeError/ValueError before any byte is sent if grad is not a flat float32 vector
        of the layout's size; PSError if a server failed or refused it.
        """
        g = self._flat(grad, "gradient")
        if self.host is not None:
            return self._push_host(g)
        if self.sparse is not None:
            return self._push_parts(self.sparse.compress(g, self.dtype))
        if self.dtype == W.DTYPE_F16:
            g = g.astype(np.float16)
        self._all(lambda s: W.message(W.PUSH, self.versions[s], s, self.index, self.layout.hash,
                                      g[self.layout.shard(s)], self.dtype))
        return self.params

    def _push_host(self, g: np.ndarray) -> np.ndarray:
        """host_sum: the host's gradients summed at its first worker (float32, shared
        memory), pushed once per server by it; the reply broadcast inside the host."""
        from .._core import reduce

        first = self.host.rank == 0
        total = np.empty_like(g) if first else None
        try:
            reduce(self.host, g, total, "sum", 0, self.timeout)
        except Exception as exc:
            raise PSError(f"worker {self.index}: summing the host's gradients failed: {exc}") \
                from exc
        if first:
            send = total.astype(np.float16) if self.dtype == W.DTYPE_F16 else total
            self._all(lambda s: W.message(W.PUSH, self.versions[s], s, self.index,
                                          self.layout.hash, send[self.layout.shard(s)],
                                          self.dtype))
        versions = np.array(self.versions, dtype=np.int64)
        try:
            self.host.broadcast(self.params, 0, self.timeout)
            self.host.broadcast(versions, 0, self.timeout)
        except Exception as exc:
            raise PSError(f"worker {self.index}: the host's first worker did not pass the "
                          f"parameters on: {exc}") from exc
        self.versions = versions.tolist()
        return self.params

    def push_pull_sparse(self, index: Any, values: Any) -> np.ndarray:
        """push_pull of a sparse gradient: the entries at these flat indices (strictly
        increasing int) have these float32 values, every other entry is zero.

        TypeError/ValueError before any byte is sent unless the indices are in range and
        strictly increasing with one value each; each shard goes as a sparse push, or
        dense where that is fewer bytes.
        """
        if self.host is not None:
            raise ValueError("push_pull_sparse: host_sum sums dense gradients (push_pull)")
        idx, val = _sparse.check_sparse(index, values, self.layout.total)
        return self._push_parts(_sparse.split(self.layout, idx, val, self.dtype, W.DTYPE_F32))

    def _push_parts(self, parts: list) -> np.ndarray:
        self._all(lambda s: W.message(parts[s][0], self.versions[s], s, self.index,
                                      self.layout.hash, parts[s][2], parts[s][1]))
        return self.params

    def finish(self) -> None:
        """Tell every server this worker is done (idempotent)."""
        if self.finished:
            return
        self.finished = True
        try:
            self._all(lambda s: W.message(W.DONE, 0, s, self.index, self.layout.hash),
                      reply=False)
        finally:
            if self.pool is not None:
                self.pool.shutdown()
