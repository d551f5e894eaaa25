"""Horovod elastic training with PyTorch on generated data: workers may die and join.

Written as for ``horovod.torch.elastic``; only the import differs::

    collectives-run --elastic -np 4 --min-np 2 --max-np 4 python examples/pytorch_elastic.py

Try ``--kill-at 3:25`` (worker 3 SIGKILLs itself before step 25): the others roll
back to the last commit, re-form at 3 and go on; with ``--max-restarts 1`` given to
collectives-run a replacement joins at a later commit and receives the state.
"""
from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import collectives.torch as hvd  # was: import horovod.torch as hvd


def main() -> None:
    """Train a small MLP elastically: commit every few batches, survive lost workers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20, help="batches per epoch")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--commit-every", type=int, default=5)
    parser.add_argument("--step-sleep", type=float, default=0.0,
                        help="seconds per step (to watch workers come and go)")
    parser.add_argument("--kill-at", default="",
                        help="ID:STEP: the worker of that elastic id SIGKILLs itself there")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(42)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    true_w = torch.linspace(-1, 1, 32).unsqueeze(1)
    me = os.environ.get("COLLECTIVES_ELASTIC_ID", "")
    kill_id, _, kill_step = args.kill_at.partition(":")

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0, step=0)

    def on_reset() -> None:  # Horovod's recipe: the learning rate follows the world size
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()
        if hvd.rank() == 0:
            print(f"world re-formed: {hvd.size()} workers, resuming at epoch {state.epoch} "
                  f"batch {state.batch}", flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        for state.epoch in range(state.epoch, args.epochs):
            for state.batch in range(state.batch, args.batches):
                if me == kill_id and state.step == int(kill_step):
                    print(f"worker {me}: killing myself at step {state.step}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                gen = torch.Generator().manual_seed(state.step * 1000 + hvd.rank())
                x = torch.randn(args.batch_size, 32, generator=gen)
                y = x @ true_w
                optimizer.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                state.step += 1
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                if state.batch % args.commit_every == 0:
                    avg = hvd.allreduce(loss.detach(), name="loss")
                    if hvd.rank() == 0:
                        print(f"epoch {state.epoch} batch {state.batch:3d} size {hvd.size()} "
                              f"loss {avg.item():.4f}", flush=True)
                    state.commit()
            state.batch = 0

    train(state)
    if hvd.rank() == 0:
        print(f"done: {state.step} steps, {hvd.size()} workers at the end", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
