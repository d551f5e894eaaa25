"""Train a small MLP through parameter servers.

    collectives-run -np 6 --servers 2 python examples/pytorch_ps.py --mode ssp --staleness 2

The last --servers ranks hold the parameters, the others compute gradients on
synthetic data (a fixed random teacher network labels Gaussian inputs).
Modes: sync (equals allreduce training), sync --backup-workers 1, async, ssp;
--dgc 0.01 pushes DGC-compressed gradients (1 % of the entries).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import collectives.ps.torch as pst


def main() -> None:
    """Parse the options, train, print each server's report summary and the workers' accuracy."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["sync", "async", "ssp"], default="sync")
    p.add_argument("--backup-workers", type=int, default=0)
    p.add_argument("--staleness", type=int, default=2)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--fp16", action="store_true", help="push gradients as float16")
    p.add_argument("--dgc", type=float, default=0.0, metavar="DENSITY",
                   help="push DGC-compressed gradients at this density (e.g. 0.01)")
    args = p.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))
    compression = "fp16" if args.fp16 else "none"
    if args.dgc:  # the workers apply the momentum (DGC's momentum correction)
        from collectives.torch.dgc import DGC

        compression = DGC(compress_ratio=args.dgc, momentum=0.9, fp16_values=args.fp16,
                          warmup_ratios=[0.25, 0.0625], steps_per_epoch=max(1, args.steps // 10))
    opt = pst.Optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        args.mode, backup_workers=args.backup_workers,
                        staleness=args.staleness, compression=compression)
    teacher = torch.Generator().manual_seed(1234)
    w1 = torch.randn(32, 64, generator=teacher) / 32 ** 0.5
    w2 = torch.randn(64, 10, generator=teacher) / 8

    def data(n: int, g: torch.Generator):
        x = torch.randn(n, 32, generator=g)
        return x, (torch.tanh(x @ w1) @ w2).argmax(1)

    if opt.is_server:
        reports = opt.serve()
        dropped = sum(len(r.dropped) for r in reports)
        stale = max((s for r in reports for s in r.staleness), default=0)
        print(f"server {opt.role.index}: {len(reports)} updates, {dropped} late gradients "
              f"dropped, largest staleness {stale}")
        return
    g = torch.Generator().manual_seed(100 + opt.role.index)
    for _ in range(args.steps):
        x, y = data(64, g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    opt.finish()
    x, y = data(2048, torch.Generator().manual_seed(7))
    with torch.no_grad():
        acc = float((model(x).argmax(1) == y).float().mean())
    print(f"worker {opt.role.index}: test accuracy {acc:.3f}")


if __name__ == "__main__":
    main()
