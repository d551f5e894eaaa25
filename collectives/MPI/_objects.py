"""Lowercase (pickle-based) collectives over the buffer ones.

Objects are pickled to bytes; sizes travel first as int64 so every rank can
size its receive buffer (with bcast's root, which every rank checks), then
the bytes go through the core's broadcast or allgatherv like any buffer.
What comes from a peer loads through collectives.rendezvous.safe_pickle:
plain data only when the job has no secret.
"""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from ..rendezvous.safe_pickle import loads as _peer_loads

COLL_REMOTE_ERROR = 4  # coll_result_t: a peer disagreed (native/coll.h)


def bcast(core: Any, obj: Any, root: Any) -> Any:
    """Root's obj on every rank.

    Every rank first learns every rank's root with the size (one small
    allgather): ranks that disagree on the root would otherwise each send as
    the root and return their own object, silently. From the same table every
    rank raises the same error, before any object byte moves, and the
    communicator stays usable.
    """
    from .._core import CollectivesError, check_root

    root = check_root(root, core.size)
    if core.size == 1:
        return pickle.loads(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
    data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL) if core.rank == root else b""
    table = np.zeros(2 * core.size, dtype=np.int64)
    core.allgatherv(np.array([root, len(data)], dtype=np.int64), table, [2] * core.size)
    roots = [int(r) for r in table[0::2]]
    if len(set(roots)) > 1:
        said = ", ".join(f"rank {k}: root {r}" for k, r in enumerate(roots))
        raise CollectivesError(COLL_REMOTE_ERROR, f"rank {core.rank}: the ranks disagree on the "
                                                  f"root of bcast ({said})")
    length = int(table[2 * root + 1])
    buf = np.frombuffer(data, dtype=np.uint8).copy() if core.rank == root else \
        np.empty(length, dtype=np.uint8)
    core.broadcast(buf, root)
    return obj if core.rank == root else _peer_loads(buf.tobytes())


def _unpickle_blocks(out: np.ndarray, counts: list) -> list:
    """The objects pickled back to back in out, counts[i] bytes each."""
    objs, pos = [], 0
    for n in counts:
        objs.append(_peer_loads(out[pos:pos + n].tobytes()))
        pos += n
    return objs


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
    return _unpickle_blocks(out, counts)


def gather(core: Any, obj: Any, root: int) -> Any:
    """Every rank's obj, in rank order, at root (None elsewhere)."""
    from .. import _core

    data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    if core.size == 1:
        return [pickle.loads(data)]
    mine = np.array([len(data)], dtype=np.int64)
    lengths = np.zeros(core.size, dtype=np.int64) if core.rank == root else None
    _core.gatherv(core, mine, lengths, [1] * core.size if core.rank == root else None, None, root)
    counts = [int(k) for k in lengths] if core.rank == root else None
    out = np.empty(sum(counts), dtype=np.uint8) if core.rank == root else None
    _core.gatherv(core, np.frombuffer(data, dtype=np.uint8), out, counts, None, root)
    if core.rank != root:
        return None
    return _unpickle_blocks(out, counts)


def scatter(core: Any, objs: Any, root: int) -> Any:
    """objs[i] from root on rank i."""
    from .. import _core

    if core.rank == root:
        parts = [pickle.dumps(o, pickle.HIGHEST_PROTOCOL) for o in objs]
        if core.size == 1:
            return pickle.loads(parts[0])
        counts = [len(p) for p in parts]
        lengths = np.array(counts, dtype=np.int64)
        data = np.frombuffer(b"".join(parts), dtype=np.uint8)
    else:
        counts = lengths = data = None
    mine = np.zeros(1, dtype=np.int64)
    _core.scatterv(core, lengths, mine, [1] * core.size if core.rank == root else None, None, root)
    buf = np.empty(int(mine[0]), dtype=np.uint8)
    _core.scatterv(core, data, buf, counts, None, root)
    return _peer_loads(buf.tobytes())


def alltoall(core: Any, objs: list) -> list:
    """objs[j] to rank j from every rank; returns what each rank sent this one, in rank order."""
    from .. import _core

    parts = [pickle.dumps(o, pickle.HIGHEST_PROTOCOL) for o in objs]
    if core.size == 1:
        return [pickle.loads(parts[0])]
    n = core.size
    send_len = np.array([len(p) for p in parts], dtype=np.int64)
    recv_len = np.zeros(n, dtype=np.int64)
    _core.alltoallv(core, send_len, recv_len, [1] * n, [1] * n)
    rcounts = [int(k) for k in recv_len]
    out = np.empty(sum(rcounts), dtype=np.uint8)
    _core.alltoallv(core, np.frombuffer(b"".join(parts), dtype=np.uint8), out,
                    [len(p) for p in parts], rcounts)
    objs_in, pos = [], 0
    for k in rcounts:
        objs_in.append(_peer_loads(out[pos:pos + k].tobytes()))
        pos += k
    return objs_in
