"""A Horovod-style PyTorch training script on generated data (no downloads).

Written as for Horovod; only the import differs::

    collectives-run -np 2 python examples/pytorch_synthetic.py --steps 20

Each rank draws its own shard of a synthetic regression problem, gradients
are averaged by DistributedOptimizer while backward runs, and rank 0 prints
the loss averaged over ranks.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import collectives.torch as hvd  # was: import horovod.torch as hvd


def main() -> None:
    """Train a small MLP on synthetic data with Horovod's API."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--fp16-allreduce", action="store_true")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(42 + hvd.rank())  # different init per rank: the broadcast fixes it
    torch.set_num_threads(1)

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    # Horovod's recipe: scale the learning rate by the number of workers
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)

    true_w = torch.linspace(-1, 1, 32).unsqueeze(1)
    gen = torch.Generator().manual_seed(1000 + hvd.rank())
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 32, generator=gen)
        y = x @ true_w + 0.01 * torch.randn(args.batch_size, 1, generator=gen)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        avg = hvd.allreduce(loss.detach(), name="loss")
        if hvd.rank() == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {avg.item():.4f}", flush=True)

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    same = all(torch.equal(flat, other) for other in hvd.allgather_object(flat))
    if hvd.rank() == 0:
        print(f"final loss {avg.item():.4f}; parameters equal on all ranks: {same}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
