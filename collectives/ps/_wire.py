"""The parameter server's layout (how parameters are cut into shards) and its message header.

Layout: every parameter tensor is flattened, in order, into one float32 vector
of P elements; server s of S holds the contiguous piece
``[s*P//S, (s+1)*P//S)``. So pieces differ by at most one element: a large
tensor is split across servers and small ones are packed together, and the
cut needs no search.

Every message between a worker and a server is one uint8 buffer: a fixed
64-byte header (eight little-endian int64) followed by the payload::

    word 0  MAGIC          "CPS" + protocol version
    word 1  kind           PUSH SPUSH INIT PULL DONE (worker -> server), PARAMS ERROR (server ->
                           worker); SPUSH: a sparse gradient (collectives/ps/_sparse.py)
    word 2  step           PUSH: the version of the parameters the gradient was computed on;
                           PARAMS: the version sent
    word 3  shard          the shard (= server index) the payload belongs to
    word 4  worker         the sender's worker index (-1 from a server)
    word 5  nbytes         payload bytes after the header
    word 6  dtype          DTYPE_F32 or DTYPE_F16 (fp16-compressed gradient)
    word 7  layout         hash of the parameter shapes and the number of servers

The receiver checks every word against what it expects before it touches a
parameter; the p2p tag is the kind, so a message can only land in a buffer
sized for it.
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

import numpy as np

MAGIC = 0x435053_01  # "CPS", version 1
HEADER_BYTES = 64
PUSH, INIT, PULL, DONE, PARAMS, ERROR, SPUSH = 1, 2, 3, 4, 5, 6, 7
KIND_NAMES = {PUSH: "PUSH", INIT: "INIT", PULL: "PULL", DONE: "DONE", PARAMS: "PARAMS",
              ERROR: "ERROR", SPUSH: "SPUSH"}
DTYPE_F32, DTYPE_F16 = 0, 1
DTYPES = {DTYPE_F32: np.dtype("<f4"), DTYPE_F16: np.dtype("<f2")}
ERROR_TEXT_BYTES = 1024  # an ERROR reply's text is cut to this


class Layout:
    """Where each parameter's elements sit in the flat vector and which server holds which piece.

    Args:
        shapes: the shape of every parameter tensor, in a fixed order (the same on every rank).
        num_servers: how many servers share the parameters.
    """

    def __init__(self, shapes: Iterable[Sequence[int]], num_servers: int) -> None:
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        if num_servers < 1:
            raise ValueError(f"num_servers must be >= 1, got {num_servers}")
        self.num_servers = int(num_servers)
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.total = int(sum(self.sizes))
        n, S = self.total, self.num_servers
        self.bounds = [s * n // S for s in range(S + 1)]
        digest = hashlib.sha256(repr((self.shapes, S)).encode()).digest()
        self.hash = int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF

    def shard(self, s: int) -> slice:
        """The slice of the flat vector that server s holds."""
        return slice(self.bounds[s], self.bounds[s + 1])

    def shard_size(self, s: int) -> int:
        """Number of elements of shard s."""
        return self.bounds[s + 1] - self.bounds[s]

    def __repr__(self) -> str:
        return f"Layout({self.total} elements in {len(self.shapes)} tensors over " \
               f"{self.num_servers} servers)"


def message(kind: int, step: int, shard: int, worker: int, layout_hash: int,
            payload: np.ndarray | None = None, dtype: int = DTYPE_F32) -> np.ndarray:
    """A header followed by a copy of payload's bytes, as one uint8 buffer."""
    nbytes = 0 if payload is None else payload.nbytes
    buf = np.empty(HEADER_BYTES + nbytes, dtype=np.uint8)
    buf[:HEADER_BYTES].view("<i8")[:] = (MAGIC, kind, step, shard, worker, nbytes, dtype,
                                         layout_hash)
    if nbytes:
        buf[HEADER_BYTES:] = np.ascontiguousarray(payload).view(np.uint8).reshape(-1)
    return buf


def header(buf: np.ndarray, count: int) -> tuple:
    """(kind, step, shard, worker, nbytes, dtype, layout) of a received message of count bytes;
    ValueError if it is shorter than a header, has a foreign magic or a length that disagrees."""
    if count < HEADER_BYTES:
        raise ValueError(f"a message of {count} bytes is shorter than the {HEADER_BYTES}-byte "
                         f"header")
    words = buf[:HEADER_BYTES].view("<i8")
    if int(words[0]) != MAGIC:
        raise ValueError(f"bad magic {int(words[0]):#x} (not a parameter-server message of "
                         f"this version)")
    fields = tuple(int(w) for w in words[1:])
    if fields[4] != count - HEADER_BYTES:
        raise ValueError(f"header says {fields[4]} payload bytes, the message has "
                         f"{count - HEADER_BYTES}")
    return fields


def error_message(text: str, shard: int, layout_hash: int) -> np.ndarray:
    """An ERROR reply carrying text (utf-8, cut to ERROR_TEXT_BYTES)."""
    data = np.frombuffer(text.encode("utf-8", "replace")[:ERROR_TEXT_BYTES], dtype=np.uint8)
    return message(ERROR, -1, shard, -1, layout_hash, data)
