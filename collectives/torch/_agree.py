"""The per-call agreement: every rank learns every rank's arguments before data moves.

Each Horovod operation starts with one small allgather of a fixed-size slot
per rank (``SLOT`` bytes, so it can never itself disagree). A slot holds:

    bytes   0  u32  magic "HVDA"     a slot written by this module
            4  u32  status           OK, or FAILED: this rank raised before the call
            8  u64  digest           64-bit hash (blake2b) of the full description
           16  i64  nbytes           this rank's payload bytes; -1: not inlined
           24  i64  extra            per-operation number (allgather: this rank's dim 0)
           32       description      what must match, as text (cut to DESC bytes)
    SLOT - INLINE   payload          this rank's data when nbytes <= INLINE

Every rank sees the same slots, so every rank decides the same way: all go
on, or all raise (``LayoutMismatch`` naming the ranks that differ, or, on the
ranks that did not fail, naming the rank that raised and its error), with the
same message on every rank (a rank's own traceback says which call). Nothing
was sent but the slots, so the communicator stays usable after either.

Small operations are finished from the slots alone (allreduce reduces the
inlined payloads with the core's own kernels, in rank order, so every rank
computes bit-identical results; broadcast copies the root's): for them the
check is the collective. Larger ones pay one small allgather in front of the
data, a latency, not a bandwidth, cost.

Why not only a fingerprint in the data's wire header (which already carries
count, dtype, op and root): the core sees a header only while the data
moves, a rank that finds a mismatch there cannot stop peers already further
in the schedule, so the core breaks the communicator (coll.h); and ranks that
disagree on the count send messages of different sizes, which no later call
could resynchronise. The agreement decides before any of that.

The exchange is a blocking collective: it waits for the allreduces already
queued on the core's progress thread (as any blocking collective does), so
``allreduce_async`` of a large tensor returns once the earlier queued ones
have finished, not at once.
"""
from __future__ import annotations

import hashlib
import struct
import threading
import time
from typing import Any, Callable, Optional

import numpy as np

from .exceptions import LayoutMismatch

SLOT = 512
HEAD = 32
DESC = 96
INLINE = SLOT - HEAD - DESC  # 384 bytes: e.g. 96 float32 elements
MAGIC = 0x41445648  # "HVDA"
OK, FAILED, JOINED = 1, 2, 3  # JOINED: this rank is in join() (see _join)
PLAN = 1 << 62  # set in `extra` of an allreduce a joined rank can serve (see _join)
_HEAD = struct.Struct("<IIQqq")  # magic, status, digest, nbytes, extra: HEAD bytes


def digest(text: bytes) -> int:
    """A 64-bit hash of a description (blake2b)."""
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


class Agreed:
    """Every rank's slot after the exchange (all rows equal in layout by then).

    Args:
        slots: (size, SLOT) uint8, row r from rank r.
        heads: per rank, the unpacked head (magic, status, digest, nbytes, extra).
    """

    def __init__(self, slots: np.ndarray, heads: list) -> None:
        self.slots = slots
        self.nbytes = [h[3] for h in heads]
        self.extra = [h[4] for h in heads]

    @property
    def inline(self) -> bool:
        """True if every rank's payload is in its slot: nothing more to send."""
        return min(self.nbytes) >= 0

    def payload(self, rank: int) -> np.ndarray:
        """Rank `rank`'s inlined payload bytes (uint8)."""
        return self.slots[rank, SLOT - INLINE:SLOT - INLINE + self.nbytes[rank]]


def _text(slot: np.ndarray, lo: int, hi: int) -> str:
    return bytes(slot[lo:hi]).rstrip(b"\0").decode("utf-8", "replace")


class Agreement:
    """The exchange itself, bound to one communicator.

    Args:
        core: the core ``Communicator`` the slots travel on.
        rank, size: this rank and the rank count.
    """

    def __init__(self, core: Any, rank: int, size: int) -> None:
        self.core = core
        self.rank = rank
        self.size = size
        self.lock = threading.Lock()
        self._counts = [SLOT] * size
        self._local = threading.local()
        # called before every exchange (the context drains its async lane there, so an
        # exchange made on the caller's thread follows every op queued before it)
        self.before_exchange: Optional[Callable[[], None]] = None
        self.timeline: Any = None  # a timeline.Timeline while one records

    @property
    def calls(self) -> int:
        """Exchanges made so far on the calling thread (the decorator tells a failure
        before one apart; the async lane's exchanges do not count on the caller's)."""
        return getattr(self._local, "calls", 0)

    def _exchange(self, slot: bytearray) -> tuple[np.ndarray, list]:
        out = np.empty(self.size * SLOT, dtype=np.uint8)
        if self.before_exchange is not None:
            self.before_exchange()
        start = time.perf_counter_ns()
        with self.lock:
            self._local.calls = self.calls + 1
            self.core.allgatherv(np.frombuffer(slot, dtype=np.uint8), out, self._counts)
        if self.timeline is not None:
            self.timeline.record("NEGOTIATE", "agreement", start, time.perf_counter_ns())
        return out.reshape(self.size, SLOT), [_HEAD.unpack_from(out, r * SLOT)
                                              for r in range(self.size)]

    def agree(self, what: str, desc: str, payload: Optional[np.ndarray] = None,
              extra: int = 0) -> Agreed:
        """Exchange slots; raise LayoutMismatch on every rank if any rank's `desc` differs
        or any rank failed. `payload` (bytes as uint8, or None) is inlined if it fits."""
        slot = bytearray(SLOT)
        nbytes = -1
        if payload is not None and payload.nbytes <= INLINE:
            nbytes = payload.nbytes
            slot[SLOT - INLINE:SLOT - INLINE + nbytes] = payload.tobytes()
        text = desc.encode()
        _HEAD.pack_into(slot, 0, MAGIC, OK, digest(text), nbytes, extra)
        slot[HEAD:HEAD + min(len(text), DESC)] = text[:DESC]
        slots, heads = self._exchange(slot)
        self._judge(what, slots, heads)
        return Agreed(slots, heads)

    def fail(self, what: str, error: BaseException) -> None:
        """Tell every rank that this rank's call raised `error` before any data moved
        (they raise LayoutMismatch naming it); the caller re-raises `error`."""
        slot = bytearray(SLOT)
        _HEAD.pack_into(slot, 0, MAGIC, FAILED, 0, -1, 0)
        text = f"{what}: {type(error).__name__}: {error}".encode()[:SLOT - HEAD]
        slot[HEAD:HEAD + len(text)] = text
        _, heads = self._exchange(slot)
        bad = [r for r in range(self.size) if heads[r][0] != MAGIC]
        if bad:
            raise LayoutMismatch(f"{what}: rank {bad[0]} sent no agreement slot (collectives "
                                 "called in a different order?)") from error

    def exchange_joined(self, rounds: int) -> tuple[np.ndarray, list]:
        """join()'s exchange: a JOINED slot (extra = exchanges since this rank joined)
        against whatever the other ranks send; raises only for a malformed or missing slot."""
        slot = bytearray(SLOT)
        _HEAD.pack_into(slot, 0, MAGIC, JOINED, 0, -1, rounds)
        slot[HEAD:HEAD + 4] = b"join"
        slots, heads = self._exchange(slot)
        bad = [r for r in range(self.size) if heads[r][0] != MAGIC or
               not -1 <= heads[r][3] <= INLINE]
        if bad:
            raise LayoutMismatch(f"join: rank {bad[0]} sent a malformed or no agreement slot")
        return slots, heads

    def _judge(self, what: str, slots: np.ndarray, heads: list) -> None:
        first = heads[0]
        if all(h[0] == MAGIC and h[1] == OK and h[2] == first[2] and -1 <= h[3] <= INLINE
               for h in heads):
            return
        bad = [r for r in range(self.size) if heads[r][1] == OK and not -1 <= heads[r][3] <= INLINE]
        if bad:  # the bytes come from a peer: bounded before anything reads them
            raise LayoutMismatch(f"{what}: rank {bad[0]} sent a malformed agreement slot "
                                 f"(payload of {heads[bad[0]][3]} bytes)")
        bad = [r for r in range(self.size) if heads[r][0] != MAGIC]
        if bad:
            raise LayoutMismatch(f"{what}: rank {bad[0]} sent no agreement slot (collectives "
                                 "called in a different order?)")
        failed = [r for r in range(self.size) if heads[r][1] == FAILED]
        if failed:
            k = failed[0]
            raise LayoutMismatch(f"rank {k} raised before the collective, so no rank ran it "
                                 f"({_text(slots[k], HEAD, SLOT)})")
        bad = [r for r in range(self.size) if heads[r][1] not in (OK, JOINED)]
        if bad:
            raise LayoutMismatch(f"{what}: rank {bad[0]} sent an agreement slot with unknown "
                                 f"status {heads[bad[0]][1]}")
        joined = [r for r in range(self.size) if heads[r][1] == JOINED]
        live = [r for r in range(self.size) if heads[r][1] != JOINED]
        ref = live[0] if live else 0
        differ = [r for r in live if heads[r][2] != heads[ref][2]]
        if joined and not differ:
            if join_plan(heads) is not None:
                return  # the joined ranks contribute zeros (see _join)
            raise LayoutMismatch(joined_message(slots, heads))
        k = differ[0]
        raise LayoutMismatch(
            f"ranks passed different arguments to one call, so no rank ran it: rank {ref} has "
            f"{_text(slots[ref], HEAD, HEAD + DESC)}; rank {k} has "
            f"{_text(slots[k], HEAD, HEAD + DESC)}"
            + (f" (ranks {', '.join(map(str, differ))} differ from rank {ref})"
               if len(differ) > 1 else ""))


def joined_message(slots: np.ndarray, heads: list) -> str:
    """The error every rank raises (the same words on each) when the ranks not in
    join() agree on an operation the joined ranks cannot serve."""
    joined = [r for r in range(len(heads)) if heads[r][1] == JOINED]
    live = [r for r in range(len(heads)) if heads[r][1] != JOINED]
    return (f"rank{'s' if len(joined) > 1 else ''} {', '.join(map(str, joined))} called "
            "join(), and joined ranks serve only allreduce (with zeros), so no rank ran "
            f"{_text(slots[live[0]], HEAD, HEAD + DESC)}")


def join_plan(heads: list) -> Optional[int]:
    """The allreduce plan (see _join) the ranks not in join() agree on, or None: they
    must all be OK, with one digest and one PLAN-flagged `extra`."""
    live = [h for h in heads if h[1] != JOINED]
    if not live or any(h[1] != OK or h[2] != live[0][2] or h[4] != live[0][4] for h in live):
        return None
    return live[0][4] if live[0][4] & PLAN else None


def inline_bytes(buf: Any) -> Optional[np.ndarray]:
    """The bytes of a host buffer (an as_buffer view) if they fit in a slot, else None."""
    if not isinstance(buf, np.ndarray) or buf.nbytes > INLINE:
        return None
    return np.ascontiguousarray(buf).reshape(-1).view(np.uint8)


def reduce_inline(agreed: Agreed, out: np.ndarray, op: str, dtype: Optional[str]) -> None:
    """out = op over every rank's inlined payload, in rank order, with the core's kernels
    (so every rank computes the same bits); AVG divides the sum by the rank count once."""
    from collectives import _core

    flat = out.reshape(-1)
    size = len(agreed.nbytes)
    if any(nb != flat.nbytes for nb in agreed.nbytes):
        raise LayoutMismatch(f"allreduce: ranks sent {agreed.nbytes} bytes for a tensor of "
                             f"{flat.nbytes} bytes")
    flat.view(np.uint8)[:] = agreed.payload(0)
    if flat.size == 0:
        return
    for r in range(1, size):
        _core.reduce_local(flat, flat, agreed.payload(r).view(flat.dtype), op=op, dtype=dtype)
    if op == "avg":
        _core.scale_local(flat, flat, float(size), dtype=dtype)


def _usable(core: Any) -> bool:
    """False once the communicator is closed or broken (then nothing can be announced)."""
    try:
        return not core.closed and not core.broken
    except Exception:
        return False
