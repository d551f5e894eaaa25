"""An allreduce's plan: what a rank in ``join()`` needs to serve it with zeros (see _join).

Element count, the core's dtype and op, packed in one integer that travels
with the allreduce's description in the negotiation.
"""
from __future__ import annotations

import numpy as np

from ._agree import PLAN

__all__ = ["encode_plan", "decode_plan", "serve_plan"]

_DTYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
_NUMPY = {"bfloat16": np.int16}  # carried as its bits, named to the core
_OPS = ["sum", "avg", "min", "max", "prod"]
_COUNT_BITS = 48


def encode_plan(count: int, dtype: str, op: str) -> int:
    """An allreduce's plan for joined ranks: count elements of core dtype `dtype`, op."""
    if not 0 <= count < 1 << _COUNT_BITS:
        return 0  # too large to describe: joined ranks cannot serve it (a clear error)
    return PLAN | count << 12 | _DTYPES.index(dtype) << 4 | _OPS.index(op)


def decode_plan(plan: int) -> tuple[int, str, str]:
    count = (plan >> 12) & ((1 << _COUNT_BITS) - 1)
    d, o = (plan >> 4) & 0xFF, plan & 0xF
    if d >= len(_DTYPES) or o >= len(_OPS):  # from a peer: checked before use
        raise ValueError(f"join: a peer sent an allreduce plan with dtype code {d}, op code {o}")
    return count, _DTYPES[d], _OPS[o]


def serve_plan(core: object, plan: int) -> None:
    """Run the allreduce the plan describes with zeros (a joined rank's contribution)."""
    count, dtype, op = decode_plan(plan)
    zeros = np.zeros(count, dtype=_NUMPY.get(dtype, dtype))
    core.iallreduce(None, zeros, op=op, dtype=dtype).Wait()  # type: ignore[attr-defined]
