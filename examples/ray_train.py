"""Data-parallel training on Ray: with RayExecutor (Horovod-style API) or Ray Train.

    python examples/ray_train.py --workers 4                  # RayExecutor, hvd API
    python examples/ray_train.py --workers 4 --elastic        # + a worker lost and replaced
    python examples/ray_train.py --workers 2 --ray-train      # TorchTrainer + CollectivesConfig
    collectives-run -np 4 python examples/ray_train.py --no-ray   # the same loop, no Ray

Every mode runs the same training loop (a small MLP on generated data,
DistributedOptimizer over ``collectives.torch``) and prints the final loss and
the median step time, so the runs can be compared (bench/README.md, "Ray").
``--address`` joins an existing Ray cluster (``ray start --head`` on one
machine, ``ray start --address=...`` on the others) instead of starting one.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time


def train(steps: int = 60, batch: int = 64, elastic: bool = False) -> dict:
    """Train the model for `steps` steps on this rank's data; the loss, the median step
    time and the world size. With elastic=True the step and the model are committed to
    the Ray worker's state after every step, and a new world resumes from rank 0's."""
    import torch
    import torch.nn as nn

    import collectives.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    state: dict = {}
    if elastic:
        import collectives.ray

        ctx = collectives.ray.context()
        state = ctx.state
        if "model" in state:
            model.load_state_dict(state["model"])
        start = hvd.broadcast_object(state.get("step", 0), root_rank=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    gen = torch.Generator().manual_seed(1000 + hvd.rank())
    target = torch.linspace(-1, 1, 32)
    times, loss = [], torch.tensor(0.0)
    for step in range(start, steps):
        x = torch.randn(batch, 32, generator=gen)
        y = (x @ target).unsqueeze(1)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if elastic:
            if step == steps // 2 and ctx.world == 1 and hvd.rank() == hvd.size() - 1:
                os._exit(1)  # a worker lost mid-training (once)
            state.update(step=step + 1, model={k: v.clone() for k, v in model.state_dict().items()})
    avg = hvd.allreduce(loss.detach(), name="final_loss").item()
    return {"rank": hvd.rank(), "size": hvd.size(), "loss": avg,
            "step_ms": 1e3 * statistics.median(times) if times else float("nan")}


def _ray_train_loop(config: dict) -> None:
    """Ray Train's loop: torch.distributed is set up on backend "collectives"; the same
    model and data, trained with DistributedDataParallel."""
    import ray.train
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = ray.train.get_context().get_world_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)
    target = torch.linspace(-1, 1, 32)
    times = []
    for _ in range(config["steps"]):
        x = torch.randn(config["batch"], 32, generator=gen)
        y = (x @ target).unsqueeze(1)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    dist.all_reduce(loss.detach())
    if rank == 0:
        print(f"ray-train backend={dist.get_backend()} size={dist.get_world_size()} "
              f"loss={loss.item() / dist.get_world_size():.5f} "
              f"step_ms={1e3 * statistics.median(times):.2f}", flush=True)


def worker_env() -> dict:
    """The variables Ray's workers get: the driver's PYTHONPATH, as it is.

    The workers import collectives where the driver does (the installed package,
    or a checkout the user put on PYTHONPATH), never from this clone, whose
    collectives/ has no built core after a plain ``pip install .``.
    """
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": path} if path else {}


def main() -> None:
    """Parse the mode and run the training."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--elastic", action="store_true",
                        help="RayExecutor with min_workers=2: the last worker dies once "
                             "halfway and is replaced")
    parser.add_argument("--ray-train", action="store_true", help="Ray Train's TorchTrainer")
    parser.add_argument("--no-ray", action="store_true",
                        help="run the loop here (under collectives-run)")
    parser.add_argument("--address", default=None, help="an existing Ray cluster")
    args = parser.parse_args()
    if args.no_ray:
        out = train(args.steps, args.batch)
        if out["rank"] == 0:
            print(f"collectives-run size={out['size']} loss={out['loss']:.5f} "
                  f"step_ms={out['step_ms']:.2f}", flush=True)
        return

    import ray

    # A local cluster gets a CPU per worker even on a smaller machine (oversubscribed).
    cpus = None if args.address else max(os.cpu_count() or 1, args.workers + 1)
    ray.init(address=args.address, num_cpus=cpus, include_dashboard=False,
             log_to_driver=args.ray_train, runtime_env={"env_vars": worker_env()})
    if args.ray_train:
        import tempfile

        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        from collectives.ray.train import CollectivesConfig

        TorchTrainer(_ray_train_loop, train_loop_config={"steps": args.steps, "batch": args.batch},
                     torch_config=CollectivesConfig(),
                     scaling_config=ScalingConfig(num_workers=args.workers),
                     run_config=RunConfig(storage_path=tempfile.mkdtemp(), name="ray_train")
                     ).fit()
        return

    from collectives.ray import RayExecutor

    settings = RayExecutor.create_settings(timeout_s=60)
    if args.elastic:
        ex = RayExecutor(settings, min_workers=2, max_workers=args.workers, reset_limit=3)
    else:
        ex = RayExecutor(settings, num_workers=args.workers)
    t0 = time.perf_counter()
    ex.start()
    started = time.perf_counter() - t0
    try:
        out = ex.run(train, kwargs={"steps": args.steps, "batch": args.batch,
                                    "elastic": args.elastic})
    finally:
        ex.shutdown()
    print(f"ray size={out[0]['size']} loss={out[0]['loss']:.5f} "
          f"step_ms={out[0]['step_ms']:.2f} start_s={started:.2f} resets={ex.resets}",
          flush=True)


if __name__ == "__main__":
    main()
