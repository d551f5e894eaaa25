"""Data-parallel training with Deep Gradient Compression (Horovod-style API).

    collectives-run -np 4 python examples/pytorch_dgc.py [--ratio 0.001] [--epochs 6]

DGC sends about 0.1 % of each large gradient per step (plus the small dense
tensors); the rest waits in each rank's memory until it grows. The density
warms up over the first epochs (25 %, 6.25 %, ... in the paper). The
residuals are per rank, so a checkpoint saves ``compression.state_dict()``
on every rank.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

import collectives.torch as hvd
from collectives.torch.dgc import DGC, DGCSGD


def main() -> None:
    """Train a small classifier on generated data with DGC; print loss and bytes sent."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ratio", type=float, default=0.001)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--warmup-epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=30)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    compression = DGC(compress_ratio=args.ratio, momentum=0.9, clip_norm=5.0,
                      warmup_epochs=args.warmup_epochs)
    opt = DGCSGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression)
    dense_bytes = 4 * sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(hvd.rank())
    teacher = torch.randn(64, 10, generator=torch.Generator().manual_seed(42))
    for epoch in range(args.epochs):
        density = compression.warmup_compress_ratio(epoch)
        sent = 0
        for _ in range(args.steps_per_epoch):
            x = torch.randn(32, 64, generator=g)
            y = (x @ teacher).argmax(1)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            sent += compression.stats["dense_bytes"] + compression.stats["sparse_bytes"]
        loss = hvd.allreduce(loss.detach(), name="loss")
        if hvd.rank() == 0:
            print(f"epoch {epoch}: density {density:.4%}, loss {loss.item():.4f}, "
                  f"gradient bytes/step {sent / args.steps_per_epoch:,.0f} "
                  f"(dense: {dense_bytes:,})")
    # a per-rank checkpoint: the model and optimizer, and this rank's residuals
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"ckpt-{hvd.rank()}.pt")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                    "dgc": compression.state_dict()}, path)
        compression.load_state_dict(torch.load(path)["dgc"])
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    same = all(torch.equal(params, o) for o in hvd.allgather_object(params))
    if hvd.rank() == 0:
        print(f"parameters equal on all ranks: {same}")


if __name__ == "__main__":
    main()
