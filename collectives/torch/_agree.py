"""The per-call agreement: every rank learns every rank's arguments before data moves.

Each Horovod operation starts with one small allgather of a fixed-size slot
per rank (``SLOT`` bytes, so it can never itself disagree). A slot holds:

    bytes   0  u32  magic "HVDA"     a slot written by this module
            4  u32  status           OK, or FAILED: this rank raised before the call
            8  u64  digest           62-bit hash of the full description
           16  i64  nbytes           this rank's payload bytes; -1: not inlined
           24  i64  extra            per-operation number (allgather: this rank's dim 0)
           32       description      what must match, as text (cut to DESC bytes)
    SLOT - INLINE   payload          this rank's data when nbytes <= INLINE

Every rank sees the same slots, so every rank decides the same way: all go
on, or all raise (``LayoutMismatch`` naming the ranks that differ, or, on the
ranks that did not fail, naming the rank that raised and its error). Nothing
was sent but the slots, so the communicator stays usable after either.

Small operations are finished from the slots alone (allreduce reduces the
inlined payloads with the core's own kernels, in rank order, so every rank
computes bit-identical results; broadcast copies the root's): for them the
check is the collective. Larger ones pay one small allgather in front of the
data, a latency, not a bandwidth, cost.
"""
from __future__ import annotations

import functools
import hashlib
import threading
from typing import Any, Callable, Optional

import numpy as np

SLOT = 512
HEAD = 32
DESC = 96
INLINE = SLOT - HEAD - DESC  # 384 bytes: e.g. 96 float32 elements
MAGIC = 0x41445648  # "HVDA"
OK, FAILED = 1, 2
_MASK = (1 << 62) - 1


class LayoutMismatch(RuntimeError, ValueError):
    """Ranks passed different arguments (shape, dtype, root, op, name) to the same call,
    or another rank's call failed before any data moved: every rank raises it, and the
    communicator stays usable."""


def digest(text: str) -> int:
    """A 62-bit hash of a description (blake2b)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") & _MASK


class Agreed:
    """Every rank's slot after the exchange (all rows equal in layout by then).

    Args:
        slots: (size, SLOT) uint8, row r from rank r.
    """

    def __init__(self, slots: np.ndarray) -> None:
        self.slots = slots
        head = slots[:, :HEAD].copy().view(np.int64)  # (size, 4)
        self.nbytes = head[:, 2]
        self.extra = head[:, 3]

    @property
    def inline(self) -> bool:
        """True if every rank's payload is in its slot: nothing more to send."""
        return bool((self.nbytes >= 0).all())

    def payload(self, rank: int) -> np.ndarray:
        """Rank `rank`'s inlined payload bytes (uint8)."""
        n = int(self.nbytes[rank])
        return self.slots[rank, SLOT - INLINE:SLOT - INLINE + n]


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
        self.calls = 0  # exchanges so far (the decorator tells a failure before one apart)
        self.lock = threading.Lock()

    def _exchange(self, slot: np.ndarray) -> np.ndarray:
        out = np.zeros(self.size * SLOT, dtype=np.uint8)
        with self.lock:
            self.calls += 1
            self.core.allgatherv(slot, out, [SLOT] * self.size)
        return out.reshape(self.size, SLOT)

    def agree(self, what: str, desc: str, payload: Optional[np.ndarray] = None,
              extra: int = 0) -> Agreed:
        """Exchange slots; raise LayoutMismatch on every rank if any rank's `desc` differs
        or any rank failed. `payload` (bytes as uint8, or None) is inlined if it fits."""
        slot = np.zeros(SLOT, dtype=np.uint8)
        nbytes = -1
        if payload is not None and payload.nbytes <= INLINE:
            nbytes = payload.nbytes
            slot[SLOT - INLINE:SLOT - INLINE + nbytes] = payload.reshape(-1).view(np.uint8)
        head = np.array([MAGIC | (OK << 32), digest(desc), nbytes, extra], dtype=np.int64)
        slot[:HEAD] = head.view(np.uint8)
        d = desc.encode()[:DESC]
        slot[HEAD:HEAD + len(d)] = np.frombuffer(d, dtype=np.uint8)
        slots = self._exchange(slot)
        self._judge(what, slots)
        return Agreed(slots)

    def fail(self, what: str, error: BaseException) -> None:
        """Tell every rank that this rank's call raised `error` before any data moved
        (they raise LayoutMismatch naming it); the caller re-raises `error`."""
        slot = np.zeros(SLOT, dtype=np.uint8)
        slot[:HEAD] = np.array([MAGIC | (FAILED << 32), 0, -1, 0], dtype=np.int64).view(np.uint8)
        text = f"{type(error).__name__}: {error}".encode()[:SLOT - HEAD]
        slot[HEAD:HEAD + len(text)] = np.frombuffer(text, dtype=np.uint8)
        slots = self._exchange(slot)
        heads = slots[:, :8].copy().view(np.uint32).reshape(self.size, 2)
        if (heads[:, 0] != MAGIC).any():
            bad = int(np.nonzero(heads[:, 0] != MAGIC)[0][0])
            raise LayoutMismatch(f"{what}: rank {bad} sent no agreement slot (collectives "
                                 "called in a different order?)") from error

    def _judge(self, what: str, slots: np.ndarray) -> None:
        heads = slots[:, :16].copy().view(np.uint64).reshape(self.size, 2)
        magic = heads[:, 0] & 0xFFFFFFFF
        status = heads[:, 0] >> 32
        if (magic != MAGIC).any():
            bad = int(np.nonzero(magic != MAGIC)[0][0])
            raise LayoutMismatch(f"{what}: rank {bad} sent no agreement slot (collectives "
                                 "called in a different order?)")
        failed = [r for r in range(self.size) if status[r] == FAILED]
        if failed:
            k = failed[0]
            raise LayoutMismatch(f"{what}: rank {k} raised before the collective, so no rank "
                                 f"ran it ({_text(slots[k], HEAD, SLOT)})")
        digests = heads[:, 1]
        differ = [r for r in range(self.size) if digests[r] != digests[0]]
        if differ:
            k = differ[0]
            raise LayoutMismatch(
                f"{what}: ranks passed different arguments, so no rank ran it: rank 0 has "
                f"{_text(slots[0], HEAD, HEAD + DESC)}; rank {k} has "
                f"{_text(slots[k], HEAD, HEAD + DESC)}"
                + (f" (ranks {', '.join(map(str, differ))} differ from rank 0)"
                   if len(differ) > 1 else ""))


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
    flat.view(np.uint8)[:] = agreed.payload(0)
    if flat.size == 0:
        return
    for r in range(1, size):
        _core.reduce_local(flat, flat, agreed.payload(r).view(flat.dtype), op=op, dtype=dtype)
    if op == "avg":
        _core.scale_local(flat, flat, float(size), dtype=dtype)


_depth = threading.local()


def symmetric(what: str, get: Callable[[], Any]) -> Callable:
    """Decorator: an exception raised before the call's agreement (bad argument on this
    rank) is first announced to every rank through a FAILED slot, so they raise too
    instead of waiting in a collective this rank never joins. `get()` returns the
    context's Agreement, or raises if there is none (then nothing is exchanged)."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(_depth, "n", 0)
            if depth:
                return fn(*args, **kwargs)
            try:
                agreement = get()
            except Exception:
                agreement = None
            before = agreement.calls if agreement is not None else 0
            _depth.n = 1
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                if agreement is not None and agreement.size > 1 and agreement.calls == before \
                        and not getattr(agreement.core, "broken", False):
                    agreement.fail(what, e)
                raise
            finally:
                _depth.n = 0

        return call

    return wrap
