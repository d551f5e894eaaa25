"""``join()`` with Horovod's semantics, over the per-call agreement of ``_agree``.

A rank in ``join()`` keeps taking part in the agreement exchanges the other
ranks start, with a JOINED slot (its ``extra``: how many exchanges it has
spent joined). Every rank sees the same slots, so every rank decides alike:

- all slots JOINED: every rank has joined; ``join()`` returns on every rank
  the rank that joined last (the fewest exchanges spent joined; among ties,
  the highest rank);
- the other ranks agree on an allreduce: their slots carry its plan in
  ``extra`` (PLAN flag, element count, wire dtype, core op), so the joined
  rank runs the same core allreduce with zeros and loops (the others' result
  is the reduction with zeros in the joined ranks' places; Average still
  divides by the full rank count, as Horovod's);
- they agree on anything else (broadcast, allgather, a grouped allreduce,
  barrier...): nothing runs and they raise LayoutMismatch naming the joined
  ranks, while the joined ranks go on waiting in ``join()`` (as Horovod's,
  whose error goes to the ranks that requested the op: its own tests call
  ``join()`` on every rank after catching it);
- they disagree among themselves, or one raised first: they raise among
  themselves, the joined rank goes on waiting.

Not served: operations that use the core without an agreement first, i.e.
the gradient allreduces DistributedOptimizer launches from its hooks; and a
joined rank waits in collectives, so it is bound by the communicator's
timeout like any rank waiting in a collective.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ._agree import JOINED, PLAN, join_plan
from ._context import current

__all__ = ["encode_plan", "join"]

_DTYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
_NUMPY = {"bfloat16": np.int16}  # carried as its bits, named to the core
_OPS = ["sum", "avg", "min", "max", "prod"]
_COUNT_BITS = 48


def encode_plan(count: int, dtype: str, op: str) -> int:
    """An allreduce's plan for joined ranks: count elements of core dtype `dtype`, op."""
    if not 0 <= count < 1 << _COUNT_BITS:
        return 0  # too large to describe: joined ranks cannot serve it (a clear error)
    return PLAN | count << 12 | _DTYPES.index(dtype) << 4 | _OPS.index(op)


def _decode(plan: int) -> tuple[int, str, str]:
    count = (plan >> 12) & ((1 << _COUNT_BITS) - 1)
    d, o = (plan >> 4) & 0xFF, plan & 0xF
    if d >= len(_DTYPES) or o >= len(_OPS):  # from a peer: checked before use
        raise ValueError(f"join: a peer sent an allreduce plan with dtype code {d}, op code {o}")
    return count, _DTYPES[d], _OPS[o]


def join(device: int = -1) -> int:
    """Wait until every rank has joined, serving the others' allreduces with zeros.

    Horovod's semantics: a rank that ran out of data calls join(); until every
    rank has, each allreduce (``allreduce``, ``allreduce_``, ``allreduce_async``)
    the other ranks run gets zeros from it. Other operations while a rank has
    joined raise LayoutMismatch on the ranks that called them (the joined ranks keep
    waiting). See ``collectives.torch._join``.

    Args:
        device: ignored (the zeros are host buffers).

    Returns:
        The rank that joined last.
    """
    ctx = current()
    if ctx.size == 1:
        return 0
    agreement = ctx.agreement
    rounds = 0
    while True:
        _, heads = agreement.exchange_joined(rounds)
        rounds += 1
        if all(h[1] == JOINED for h in heads):
            spent = [h[4] for h in heads]
            return max(r for r in range(ctx.size) if spent[r] == min(spent))
        plan = join_plan(heads)
        if plan is not None:
            _serve(ctx, plan)
        # anything else: the others raise (LayoutMismatch naming the joined ranks, or their
        # own disagreement); this rank keeps waiting for their next call


def _serve(ctx: object, plan: int) -> Optional[np.ndarray]:
    """Run the allreduce the plan describes with zeros (this rank's contribution)."""
    count, dtype, op = _decode(plan)
    zeros = np.zeros(count, dtype=_NUMPY.get(dtype, dtype))
    ctx.core.iallreduce(None, zeros, op=op, dtype=dtype).Wait()  # type: ignore[attr-defined]
    return zeros
