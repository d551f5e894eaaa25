"""``join()`` with Horovod's semantics, in the negotiation (``_negotiate``).

``join()`` queues the key ``join``. From the round in which a rank announces
it until every rank has, that rank counts as having queued every allreduce
the others agree on: its negotiating thread runs the same core allreduce
with zeros, from the plan every allreduce carries (element count, wire
dtype, core op; ``encode_plan``), so the others' result is the reduction
with zeros in the joined ranks' places (Average still divides by the full
rank count, as Horovod's). This covers ``allreduce*``, ``grouped_allreduce*``
and ``DistributedOptimizer``'s buckets. Any other op the others agree on
while a rank has joined fails on the ranks that called it with
``LayoutMismatch`` naming the joined ranks, while the joined ranks keep
waiting (as Horovod's, whose error goes to the ranks that requested the op).
``join`` completes once every rank has announced it and returns, on every
rank, the rank that joined last (the latest round; among ties, the highest
rank). Every rank also sets its count of calls (the numbers in unnamed ops'
names) to the largest any rank had when it joined, so a rank that made an
extra call before joining (one whose op failed because a rank had joined)
names its later ops as the others do.
"""
from __future__ import annotations

from ._context import current
from ._plan import encode_plan, serve_plan

__all__ = ["encode_plan", "join", "serve_plan"]


def join(device: int = -1) -> int:
    """Wait until every rank has joined, serving the others' allreduces with zeros.

    Horovod's semantics: a rank that ran out of data calls join(); until every
    rank has, each allreduce the other ranks run gets zeros from it. Other
    operations while a rank has joined raise LayoutMismatch on the ranks that
    called them (the joined ranks keep waiting). See ``collectives.torch._join``.

    Args:
        device: ignored (the zeros are host buffers).

    Returns:
        The rank that joined last.
    """
    from ._lane import Job
    from ._negotiate import JOIN

    ctx = current()
    if ctx.size == 1:
        return 0
    # the description carries this process's call number: at completion every rank takes the
    # largest, so ranks that made different calls before joining name later ops alike again
    n = ctx.lane.next_handle()
    return ctx.lane.submit(Job(lambda: 0, key=JOIN, desc=f"{JOIN} {n}")).wait()
