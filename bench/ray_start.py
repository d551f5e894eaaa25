"""Ray against collectives-run: the cost of starting a world, and the step time of one training.

    PYTHONPATH=$PWD python bench/ray_start.py [--np 4] [--repeat 5] [--steps 60]
    PYTHONPATH=$PWD python bench/ray_start.py --elastic [--np 4] [--repeat 3]

Interleaved, `repeat` times each, on a local Ray cluster started once here:

- start: `collectives-run -np N python -c <init + barrier>` (whole launch: N Python
  processes started, the world formed, a barrier, every process gone) against a
  RayExecutor's start() + run(barrier) + shutdown() (actors placed and started, the
  world formed, a barrier, the actors killed). ray.init() itself is reported apart.
- step: examples/ray_train.py's loop (the same model, data and DistributedOptimizer)
  under collectives-run --no-ray and under a RayExecutor: the median step time of each.

Prints medians and the Ray/collectives-run ratios. On a shared or small host only the
ratios within one run mean something.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "examples"))

BARRIER = "import collectives; from collectives import MPI; collectives.init(); MPI.COMM_WORLD.Barrier()"


def _barrier():
    from collectives import MPI

    MPI.COMM_WORLD.Barrier()
    return MPI.COMM_WORLD.size


def _elastic_steps(steps: int, kill_at: int):
    """Allreduce steps; the last rank of the first world exits at step kill_at. Rank 0
    returns the seconds from the kill to the new world's first step."""
    import numpy as np

    import collectives.ray
    from collectives import MPI

    ctx = collectives.ray.context()
    comm = MPI.COMM_WORLD
    start = comm.bcast(ctx.state.get("step", 0), root=0)
    resumed = None
    x = np.ones(1 << 17)
    for step in range(start, steps):
        if ctx.world == 1 and ctx.rank == comm.size - 1 and step == kill_at:
            with open(os.environ["RAY_START_KILL_FILE"], "w") as fh:
                fh.write(repr(time.time()))
            os._exit(1)
        comm.Allreduce(x.copy(), x)
        x[:] = 1
        if resumed is None and ctx.world > 1:
            resumed = time.time()
        ctx.state["step"] = step + 1
    return resumed, comm.size


def _run_launcher(np_: int, args: list) -> tuple:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "collectives.run", "-np", str(np_)] + args,
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    took = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"collectives-run failed: {out.stderr[-2000:]}")
    return took, out.stdout


def main() -> None:
    """Run the interleaved measurements and print the medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--elastic", action="store_true",
                        help="instead: kill the last of np workers of an elastic job "
                             "(min_workers=np-1) mid-run; the time until all train again")
    args = parser.parse_args()

    import ray

    import ray_train
    from ray import cloudpickle

    from collectives.ray import RayExecutor
    from ray_train import train

    cloudpickle.register_pickle_by_value(ray_train)  # the actors need not import it

    t0 = time.perf_counter()
    ray.init(num_cpus=max(os.cpu_count() or 1, args.np + 1), include_dashboard=False,
             log_to_driver=False)
    print(f"ray.init (once): {time.perf_counter() - t0:.2f} s", flush=True)
    settings = RayExecutor.create_settings(timeout_s=120)
    if args.elastic:
        import tempfile

        kill_file = os.path.join(tempfile.mkdtemp(), "killed")
        for i in range(args.repeat):
            ex = RayExecutor(settings, min_workers=args.np - 1, max_workers=args.np)
            ex.start(extra_env_vars={"RAY_START_KILL_FILE": kill_file})
            try:
                out = ex.run(_elastic_steps, args=[args.steps, args.steps // 2])
            finally:
                ex.shutdown()
            with open(kill_file) as fh:
                killed = float(fh.read())
            print(f"elastic round {i}: {args.np} workers, one killed: training resumed on "
                  f"{out[0][1]} ({ex.resets} re-form) after {out[0][0] - killed:.2f} s",
                  flush=True)
        ray.shutdown()
        return
    start_run, start_ray, first_ray = [], [], []
    step_run, step_ray = [], []
    for i in range(args.repeat):
        took, _ = _run_launcher(args.np, ["python", "-c", BARRIER])
        start_run.append(took)
        t0 = time.perf_counter()
        ex = RayExecutor(settings, num_workers=args.np)
        ex.start()
        assert ex.run(_barrier) == [args.np] * args.np
        first_ray.append(time.perf_counter() - t0)
        ex.shutdown()
        start_ray.append(time.perf_counter() - t0)

        _, out = _run_launcher(args.np, ["python", "examples/ray_train.py", "--no-ray",
                                         "--steps", str(args.steps)])
        step_run.append(float(re.search(r"step_ms=([0-9.]+)", out).group(1)))
        ex = RayExecutor(settings, num_workers=args.np)
        ex.start()
        try:
            res = ex.run(train, kwargs={"steps": args.steps})
        finally:
            ex.shutdown()
        step_ray.append(res[0]["step_ms"])
        print(f"round {i}: collectives-run {start_run[-1]:.2f} s, Ray {start_ray[-1]:.2f} s "
              f"(to barrier {first_ray[-1]:.2f} s); step {step_run[-1]:.2f} ms vs "
              f"{step_ray[-1]:.2f} ms", flush=True)
    med = statistics.median
    print(f"start, {args.np} ranks (median of {args.repeat}): collectives-run "
          f"{med(start_run):.2f} s; Ray start+barrier {med(first_ray):.2f} s, +shutdown "
          f"{med(start_ray):.2f} s; ratio Ray/collectives-run {med(start_ray) / med(start_run):.2f}")
    print(f"step (median of the runs' medians): collectives-run {med(step_run):.2f} ms; Ray "
          f"{med(step_ray):.2f} ms; ratio {med(step_ray) / med(step_run):.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
