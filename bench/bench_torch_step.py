"""Time per training step of a 20-layer MLP: fused vs unfused DistributedOptimizer vs DDP.

    collectives-run -np 2 python bench/bench_torch_step.py [--width 256] [--steps 30]

The model has many small parameter tensors (20 x (Linear weight, bias,
LayerNorm weight, bias) = 80), the case tensor fusion is for. In one run, on
the same data, it times: DistributedOptimizer with fusion
(COLLECTIVES_FUSION_THRESHOLD default, 128 MiB), without (threshold 0: one
allreduce per tensor), DDP over gloo, and DDP over the "collectives"
backend. The variants run round-robin (5 steps each per round) so that load
bursts on a shared machine hit all alike; each time is the median over
steps of the slowest rank's step; ratios are relative to the fused
DistributedOptimizer.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import collectives.torch as hvd
from collectives.torch._context import DEFAULT_FUSION_BYTES, current


def make_model(width: int, depth: int) -> nn.Module:
    """depth blocks of Linear + LayerNorm + ReLU, then a scalar head."""
    torch.manual_seed(0)
    layers: list = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def timed_step(step: Callable[[int], None], i: int) -> float:
    """Seconds of one step, taken as the slowest rank's (ranks start together)."""
    hvd.barrier()
    t0 = time.perf_counter()
    step(i)
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    return float(hvd.allreduce(dt, op=hvd.Max, name="bench.time"))


def main() -> None:
    """Run the variants and print the table on rank 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    gen = torch.Generator().manual_seed(r)
    data = [(torch.randn(args.batch_size, args.width, generator=gen),
             torch.randn(args.batch_size, 1, generator=gen)) for _ in range(8)]
    variants: list = []  # (name, buckets, step function)

    def sgd_step(model: nn.Module, opt: torch.optim.Optimizer) -> Callable[[int], None]:
        def step(i: int) -> None:
            x, y = data[i % len(data)]
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        return step

    for threshold in (DEFAULT_FUSION_BYTES, 0):
        current().fusion_threshold = threshold  # read when the optimizer is built
        model = make_model(args.width, args.depth)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
                                       named_parameters=model.named_parameters())
        name = (f"DistributedOptimizer, fusion {threshold >> 20} MiB" if threshold else
                "DistributedOptimizer, no fusion (0)")
        variants.append((name, len(opt._buckets), sgd_step(model, opt)))
    current().fusion_threshold = DEFAULT_FUSION_BYTES
    local = make_model(args.width, args.depth)
    variants.append(("local step, no communication", 0,
                     sgd_step(local, torch.optim.SGD(local.parameters(), lr=1e-3))))

    port = int(os.environ.get("BENCH_TORCH_PORT", "29561"))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=n)
    coll = dist.new_group(backend="collectives")
    for name, group in (("DDP over gloo", None), ("DDP over collectives", coll)):
        model = make_model(args.width, args.depth)
        ddp = nn.parallel.DistributedDataParallel(model, process_group=group)
        variants.append((name, -1, sgd_step(ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3))))

    # Round-robin, a few steps of each variant per round, so that a burst of load on
    # the machine hits every variant alike.
    times: list = [[] for _ in variants]
    for i in range(args.warmup):
        for _, _, step in variants:
            timed_step(step, i)
    rounds = max(1, args.steps // 5)
    for rnd in range(rounds):
        for k, (_, _, step) in enumerate(variants):
            for j in range(5):
                times[k].append(timed_step(step, rnd * 5 + j))
    results = [(name, buckets, statistics.median(ts)) for (name, buckets, _), ts in
               zip(variants, times)]
    dist.destroy_process_group()

    if r == 0:
        nparams = sum(1 for _ in make_model(args.width, args.depth).parameters())
        print(f"# {n} ranks, MLP {args.depth} x {args.width}, {nparams} parameter tensors, "
              f"batch {args.batch_size}/rank, median of {args.steps} steps")
        print(f"{'variant':<40} {'buckets':>7} {'ms/step':>9} {'vs fused':>9}")
        base = results[0][2]
        for name, buckets, t in results:
            b = str(buckets) if buckets >= 0 else "-"
            print(f"{name:<40} {b:>7} {t * 1e3:9.2f} {t / base:8.2f}x")
    hvd.shutdown()


if __name__ == "__main__":
    main()
