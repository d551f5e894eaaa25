"""Lowercase (pickle-based) collectives over the buffer ones.

Objects are pickled to bytes; sizes travel first as int64 so every rank can
size its receive buffer, then the bytes go through the core's broadcast or
allgatherv like any buffer.
"""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np


def bcast(core: Any, obj: Any, root: int) -> Any:
    """Root's obj on every rank."""
    if core.size == 1:
        return pickle.loads(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
    data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL) if core.rank == root else b""
    length = np.array([len(data)], dtype=np.int64)
    core.broadcast(length, root)
    buf = np.frombuffer(data, dtype=np.uint8).copy() if core.rank == root else \
        np.empty(int(length[0]), dtype=np.uint8)
    core.broadcast(buf, root)
    return obj if core.rank == root else pickle.loads(buf.tobytes())


def allgather(core: Any, obj: Any) -> list:
    """Every rank's obj, in rank order."""
    data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    if core.size == 1:
        return [pickle.loads(data)]
    lengths = np.zeros(core.size, dtype=np.int64)
    core.allgatherv(np.array([len(data)], dtype=np.int64), lengths, [1] * core.size)
    counts = [int(n) for n in lengths]
    out = np.empty(sum(counts), dtype=np.uint8)
    core.allgatherv(np.frombuffer(data, dtype=np.uint8), out, counts)
    objs, pos = [], 0
    for n in counts:
        objs.append(pickle.loads(out[pos:pos + n].tobytes()))
        pos += n
    return objs
