"""Tensor fusion: allreduces agreed in one round run as one core allreduce (Horovod's).

The negotiation (``_negotiate``) hands ``run_fused`` each run of consecutive
ready allreduces (those over ``FUSE_ALONE_BYTES`` run alone, in place, and
do not break a run) that every rank groups alike: the grouping reads only what
every rank holds the same (each op's plan: element count, wire dtype, core
op; its description: prescale and postscale), so members pack the same
buffer layout and a joined rank packs zeros in it. The fused buffer is at
most the fusion threshold (``HOROVOD_FUSION_THRESHOLD`` /
``COLLECTIVES_FUSION_THRESHOLD``). Each op's job completes with its own
handle over the shared request; its finish copies its slice out (postscale
applied), as the unfused path does.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ._context import CORE_DTYPES, as_buffer
from ._plan import decode_plan

__all__ = ["run_fused"]

_TORCH = {name: dtype for dtype, name in CORE_DTYPES.items()}


class _Shared:
    """One core request that several handles wait on (waited for once)."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.error: Optional[BaseException] = None
        self.done = False

    def Test(self) -> bool:  # noqa: N802 -- the core request's name
        """True once the request has completed."""
        return self.done or self.request.Test()

    def Wait(self) -> None:  # noqa: N802
        """Wait once; later calls return (or raise) the same."""
        if not self.done:
            try:
                self.request.Wait()
            except BaseException as e:  # noqa: BLE001 -- every handle raises it
                self.error = e
            self.done = True
        if self.error is not None:
            raise self.error


class _FusedHandle:
    """One op's part of a fused allreduce: waits for the shared request, then copies its
    slice (postscale applied) into the op's output."""

    def __init__(self, shared: _Shared, flat: torch.Tensor, pos: int, n: int,
                 output: torch.Tensor, postscale: float) -> None:
        self.shared, self.flat, self.pos, self.n = shared, flat, pos, n
        self.output, self.postscale = output, postscale
        self.done = False

    def poll(self) -> bool:
        """True once the fused allreduce has completed."""
        return self.done or self.shared.Test()

    def wait(self) -> torch.Tensor:
        """Wait, then write this op's result into its output and return it."""
        if not self.done:
            try:
                self.shared.Wait()
            except BaseException as exc:
                from .exceptions import internal_error

                err = internal_error(exc)  # a failed collective: Horovod's class
                if err is exc:
                    raise
                raise err from exc
            part = self.flat[self.pos:self.pos + self.n]
            if self.postscale != 1.0:
                part = part.to(torch.float64).mul_(self.postscale) \
                    if not part.is_floating_point() else part * self.postscale
            with torch.no_grad():
                self.output.detach().copy_(part.view(self.output.shape))
            self.done, self.flat = True, None
        return self.output


def run_fused(core: Any, group: list) -> None:
    """Run one allreduce for `group`: [(job or None, plan, prescale, postscale)], all with
    the same wire dtype, op and scale factors; None: this rank serves zeros (joined)."""
    _, dtype, op = decode_plan(group[0][1])
    counts = [decode_plan(plan)[0] for _, plan, _, _ in group]
    wire = _TORCH[dtype]
    flat = torch.empty(sum(counts), dtype=wire)  # every element is written below
    pos = 0
    for (job, _, prescale, _), n in zip(group, counts):
        if job is not None:
            flat[pos:pos + n].copy_(job.fuse[0].detach().reshape(-1))
        else:
            flat[pos:pos + n].zero_()
        pos += n
    prescale, postscale = group[0][2], group[0][3]
    if prescale != 1.0:
        flat.mul_(prescale) if flat.is_floating_point() else \
            flat.copy_(flat.to(torch.float64).mul_(prescale))
    buf, dt = as_buffer(flat)
    shared = _Shared(core.iallreduce(None, buf, op=op, dtype=dt))
    pos = 0
    for (job, _, _, _), n in zip(group, counts):
        if job is not None:
            job.attach(_FusedHandle(shared, flat, pos, n, job.fuse[1], postscale))
        pos += n
