"""What HOROVOD_AUTOTUNE converges to, and the step time before and after (issue 36).

Run as ranks, e.g. ``collectives-run -np 2 python bench/bench_autotune.py``.
A step is --tensors float32 tensors (a geometric series of 256 B to
--largest bytes), allreduced (Sum) as Horovod's optimizer hooks do, with
--compute-us of busy work before each tensor's ``allreduce_async_`` (the
backward pass producing it), then ``synchronize`` of each: the shape where
the fusion threshold and the cycle time matter.

1. ``before``: --steps steps with the values in force (HOROVOD_CYCLE_TIME and
   HOROVOD_FUSION_THRESHOLD, default 1 ms and 128 MiB);
2. the autotuner is attached (as ``HOROVOD_AUTOTUNE=1`` does at init, with
   the --warmup/--steps-per-sample/--max-samples settings) and the job steps
   until rank 0's last record is applied (every rank stops at the same step);
3. ``before``, ``tuned`` and ``worst`` (the point scored lowest while tuning)
   in alternating rounds of --steps steps (every rank sets the values between
   rounds, after a barrier, so that every round's ops are fused alike on
   every rank); medians printed by rank 0, with the points tried and their
   scores.

Only ratios within one run mean anything on a shared host.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import collectives.torch as hvd
from collectives.torch import _autotune
from collectives.torch._context import current


def spin(us: float) -> None:
    """Busy for `us` microseconds (a stand-in for the backward pass's compute)."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def step(tensors: list, compute_us: float) -> None:
    """One step: compute, then queue, per tensor; then wait for them all."""
    handles = []
    for i, t in enumerate(tensors):
        spin(compute_us)
        handles.append(hvd.allreduce_async_(t, name=f"grad.{i}", op=hvd.Sum))
    for h in handles:
        hvd.synchronize(h)


def timed(tensors: list, steps: int, compute_us: float) -> float:
    """Seconds per step over `steps` steps, after a barrier."""
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step(tensors, compute_us)
    return (time.perf_counter() - start) / steps


def main() -> None:
    """Measure, tune, measure; rank 0 prints."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tensors", type=int, default=64)
    p.add_argument("--largest", type=int, default=1 << 20, help="bytes of the largest tensor")
    p.add_argument("--compute-us", type=float, default=100.0, help="busy time per tensor")
    p.add_argument("--steps", type=int, default=20, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=5, help="rounds of each, alternating")
    p.add_argument("--warmup", type=int, default=3, help="HOROVOD_AUTOTUNE_WARMUP_SAMPLES")
    p.add_argument("--steps-per-sample", type=int, default=10,
                   help="HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE")
    p.add_argument("--max-samples", type=int, default=20,
                   help="HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES")
    args = p.parse_args()
    os.environ.pop("HOROVOD_AUTOTUNE", None)  # attached below, after the `before` steps
    hvd.init()
    lane = current().lane
    count = args.tensors
    sizes = [max(64, int(256 * (args.largest / 256) ** (k / max(1, count - 1))) // 4)
             for k in range(count)]
    tensors = [torch.ones(s) for s in sizes]
    before = (lane.fusion_bytes, lane.cycle_s)
    timed(tensors, args.steps, args.compute_us)  # warm: the response cache fills

    os.environ.update({"HOROVOD_AUTOTUNE": "1",
                       "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": str(args.warmup),
                       "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": str(args.steps_per_sample),
                       "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": str(args.max_samples)})
    hvd.barrier()
    _autotune.attach(lane, hvd.rank(), hvd.size())
    start, tuning_steps = time.perf_counter(), 0
    while True:
        step(tensors, args.compute_us)
        tuning_steps += 1
        done = bool(lane.tuned) and not lane.tuned[-1][3]
        if hvd.allreduce(torch.tensor([int(done)]), op=hvd.Max, name="done").item():
            break
    tuning_s = time.perf_counter() - start
    tuned = (lane.fusion_bytes, lane.cycle_s)

    # the point rank 0 scored lowest, to show the spread the tuner chose from (every rank
    # learns it from rank 0's history)
    worst = [0.0, 0.0]
    if hvd.rank() == 0:
        mib, ms, _ = min(lane.tuner.history, key=lambda h: h[2])
        worst = [float(int(round(mib * 2 ** 20))), ms / 1e3]
    worst_t = hvd.broadcast(torch.tensor(worst, dtype=torch.float64), 0, name="worst")
    modes = {"before": before, "tuned": tuned,
             "worst": (int(worst_t[0].item()), float(worst_t[1].item()))}
    times: dict = {mode: [] for mode in modes}
    for rnd in range(args.rounds):
        for mode, (fusion, cycle) in modes.items():
            hvd.barrier()  # every rank sets them between the same two steps
            lane.fusion_bytes, lane.cycle_s = fusion, cycle
            times[mode].append(timed(tensors, args.steps, args.compute_us))
    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks, {count} tensors ({sum(sizes) * 4 / 2 ** 20:.2f} MiB, "
              f"{sizes[0] * 4} B .. {sizes[-1] * 4} B) per step, {args.compute_us:g} us of "
              f"compute before each")
        for mib, ms, score in lane.tuner.history:
            print(f"  tried fusion {mib:7.2f} MiB, cycle {ms:6.2f} ms: {score / 1e6:8.1f} MB/s")
        print(f"tuning: {tuning_steps} steps, {tuning_s:.1f} s; converged to fusion "
              f"{tuned[0] / 2 ** 20:.2f} MiB, cycle {tuned[1] * 1e3:.2f} ms")
        for mode, (fusion, cycle) in modes.items():
            ts = times[mode]
            print(f"{mode:>7} (fusion {fusion / 2 ** 20:6.2f} MiB, cycle {cycle * 1e3:6.2f} ms): "
                  f"{statistics.median(ts) * 1e3:7.2f} ms/step (min {min(ts) * 1e3:.2f})")
    hvd.shutdown()


if __name__ == "__main__":
    main()
