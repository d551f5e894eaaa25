"""What Horovod's negotiation costs per training step in collectives.torch (issue 36).

Run as ranks, e.g. ``collectives-run -np 2 python bench/bench_negotiate.py``.
A step is 25 float32 tensors of 8 B to 4 MiB (a geometric series), about
9.5 MiB in all, allreduced (Sum) the way Horovod's
optimizer hooks do: 25 named ``allreduce_async_`` calls, then ``synchronize``
of each. Modes, in alternating rounds of --steps steps (medians printed):

- ``negotiated``: that, through the public API: every step is agreed by name
  (from the response cache after the first: one small allreduce per round);
- ``per-call``: the check before this issue: per tensor, the agreement's
  allgather of every rank's description, then the data (one op on the
  negotiating thread runs all --steps steps, so no negotiation is timed);
- ``none``: the 25 core allreduces alone, no check (as per-call);
- ``api``: with --api only: the public API of whatever collectives.torch is
  imported, for comparing two builds (run it once with each on PYTHONPATH);
- ``negotiated[attr=value]``: with ``--variant attr=value`` (repeatable): as
  ``negotiated`` with that attribute of the Negotiator set meanwhile (e.g.
  ``fuse_alone_bytes=1e18``: every allreduce fused, as before it existed), so
  that two policies are compared in the same processes, interleaved.

Only ratios within one run mean anything on a shared host.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import collectives.torch as hvd

SIZES = [4 * round(2 ** (1 + 19 * k / 24)) for k in range(25)]  # 8 B .. 4 MiB, geometric


SUBMIT = {"s": 0.0}  # seconds spent in the 25 allreduce_async_ calls (the public API's cost)


def negotiated(tensors: list, steps: int) -> None:
    """steps steps through the public API (named async allreduces, then synchronize)."""
    for _ in range(steps):
        t0 = time.perf_counter()
        handles = [hvd.allreduce_async_(t, name=f"grad.{i}", op=hvd.Sum)
                   for i, t in enumerate(tensors)]
        SUBMIT["s"] += time.perf_counter() - t0
        for h in handles:
            hvd.synchronize(h)


def on_lane(tensors: list, steps: int, check: bool) -> None:
    """steps steps inside one op on the negotiating thread: per tensor the agreement
    (check=True) and the core allreduce; every request waited for at the end of a step."""
    from collectives.torch._context import as_buffer, current
    from collectives.torch._lane import run_call

    ctx = current()
    bufs = [as_buffer(t)[0] for t in tensors]

    def run() -> None:
        for _ in range(steps):
            reqs = []
            for i, b in enumerate(bufs):
                if check:
                    ctx.agreement.agree("allreduce", f"allreduce shape={b.shape} dtype=float32 "
                                        f"op=Sum name='grad.{i}'")
                reqs.append(ctx.core.iallreduce(None, b, op="sum"))
            for r in reqs:
                r.Wait()

    run_call(ctx, "bench", "per-call" if check else "none", run)


def with_attr(lane: object, attr: str, value: float, fn: object) -> None:
    """fn() with lane.attr = value (an int where the value is whole), restored after. Every
    rank sets it before queueing the step's ops, so every rank's rounds read the same."""
    before = getattr(lane, attr)
    setattr(lane, attr, int(value) if value == int(value) and value < 2 ** 62 else value)
    try:
        fn()  # type: ignore[operator]
    finally:
        setattr(lane, attr, before)


def main() -> None:
    """Time each mode and print one line per mode (rank 0)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20, help="steps per round")
    p.add_argument("--rounds", type=int, default=7, help="rounds per mode, alternating")
    p.add_argument("--api", action="store_true", help="only the public API (any build)")
    p.add_argument("--variant", action="append", default=[], metavar="ATTR=VALUE",
                   help="also time `negotiated` with this Negotiator attribute set")
    args = p.parse_args()
    hvd.init()
    tensors = [torch.zeros(max(1, s // 4)) for s in SIZES]
    lane = getattr(__import__("collectives.torch._context", fromlist=["current"]).current(),
                   "lane", None)
    modes = {"api": lambda: negotiated(tensors, args.steps)} if args.api else {
        "negotiated": lambda: negotiated(tensors, args.steps),
        "per-call": lambda: on_lane(tensors, args.steps, True),
        "none": lambda: on_lane(tensors, args.steps, False)}
    for spec in args.variant:
        attr, value = spec.split("=", 1)
        modes[f"negotiated[{spec}]"] = (lambda attr=attr, value=float(value):
                                        with_attr(lane, attr, value,
                                                  lambda: negotiated(tensors, args.steps)))
    times: dict = {m: [] for m in modes}
    spent = {"rounds": 0, "a_s": 0.0, "steps": 0, "submit_s": 0.0}  # the negotiated mode's
    for rnd in range(args.rounds + 1):
        for mode, fn in modes.items():
            hvd.barrier()
            before = dict(getattr(lane, "stats", {}))
            submit0 = SUBMIT["s"]
            start = time.perf_counter()
            fn()
            if rnd:  # the first round of each mode warms up (and fills the cache)
                times[mode].append((time.perf_counter() - start) / args.steps)
                if mode in ("negotiated", "api") and before:  # (not the variants)
                    spent["rounds"] += lane.stats["rounds"] - before["rounds"]
                    spent["a_s"] += lane.stats.get("a_s", 0.0) - before.get("a_s", 0.0)
                    spent["steps"] += args.steps
                    spent["submit_s"] += SUBMIT["s"] - submit0
    if hvd.rank() == 0:
        base = statistics.median(times["none"]) if "none" in times else None
        print(f"{hvd.size()} ranks, 25 tensors ({sum(SIZES) / 2 ** 20:.1f} MiB) per step, "
              f"{args.rounds} rounds of {args.steps} steps")
        for mode, ts in times.items():
            med = statistics.median(ts)
            ratio = f"  x{med / base:5.2f} of none" if base else ""
            print(f"{mode:>11}: {med * 1e3:8.2f} ms/step (min {min(ts) * 1e3:.2f}){ratio}",
                  flush=True)
        if lane is not None and hasattr(lane, "stats"):
            print(f"negotiation rounds {lane.stats['rounds']}, with records "
                  f"{lane.stats['full_rounds']}")
            if spent["steps"] and "a_s" in lane.stats:
                print(f"negotiated steps: {spent['rounds'] / spent['steps']:.1f} rounds/step, "
                      f"{spent['a_s'] * 1e3 / spent['steps']:.2f} ms/step in step A (the "
                      "bit-vector allreduce, waiting behind queued data included), "
                      f"{spent['submit_s'] * 1e3 / spent['steps']:.2f} ms/step in the 25 "
                      "allreduce_async_ calls")
    hvd.shutdown()


if __name__ == "__main__":
    main()
