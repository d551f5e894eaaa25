"""Elastic recovery times: kill one of 4 workers mid-training, measure how fast the job goes on.

    python bench/elastic_recovery.py --runs 3

Each run is ``collectives-run --elastic -np 4 --min-np 2 --max-np 4 --max-restarts 1`` of
this file in worker mode: a small MLP trained with DistributedOptimizer, committing every
``--commit-every`` steps. Worker 1 SIGKILLs itself at step ``--kill-step``. Printed per run
(seconds, wall clock of one machine):

- resume@3: from the kill until every survivor has completed its first step at 3 workers
  (failure noticed, rollback, new generation, rendezvous, sync, one step);
- new@4: from the kill until the replacement has completed its first step at 4, split into
  start (kill -> the replacement's interpreter runs), import (python + torch +
  collectives.torch, and building the model and optimizer), join (hvd.init() waits for the next commit and re-forms) and
  sync+step (state broadcast, first step).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

T0 = time.time()


def _event(kind: str, **fields) -> None:
    fields.update(ev=kind, id=os.environ.get("COLLECTIVES_ELASTIC_ID"), t=time.time())
    print(json.dumps(fields), flush=True)


def worker(args: argparse.Namespace) -> None:
    """One worker: train until the world is back at 4 and has done a few steps there."""
    _event("proc_start", t0=T0)
    import signal

    import torch

    import collectives.torch as hvd

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 1))
    # Built before hvd.init(): torch.optim's first use imports more of torch (seconds on a
    # loaded host), which the running workers would otherwise wait for at the join.
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    _event("imported")
    hvd.init()
    _event("init_done")
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0)
    me = os.environ.get("COLLECTIVES_ELASTIC_ID")

    @hvd.elastic.run
    def train(state):
        first = True
        end = state.step + 5 if hvd.size() == 4 and state.step > 0 else 10 ** 6
        while state.step < end:
            if me == "1" and state.step == args.kill_step:
                _event("kill")
                os.kill(os.getpid(), signal.SIGKILL)
            g = torch.Generator().manual_seed(state.step * 100 + hvd.rank())
            x = torch.randn(32, 64, generator=g)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            state.step += 1
            if first:
                _event("first_step", size=hvd.size(), rank=hvd.rank())
                first = False
            time.sleep(args.step_sleep)
            if state.step % args.commit_every == 0:
                state.commit()

    train(state)
    hvd.shutdown()


def one_run(args: argparse.Namespace) -> dict:
    """Launch one job; return its timings."""
    cmd = [sys.executable, "-m", "collectives.run", "--elastic", "-np", "4", "--min-np", "2",
           "--max-np", "4", "--max-restarts", "1", sys.executable, os.path.abspath(__file__),
           "--worker", "--kill-step", str(args.kill_step), "--step-sleep", str(args.step_sleep),
           "--commit-every", str(args.commit_every)]
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if out.returncode != 0:
        sys.exit(f"the job failed ({out.returncode}):\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    ev = [json.loads(line.partition("<stdout>:")[2]) for line in out.stdout.splitlines()
          if "<stdout>:{" in line]
    kill = next(e["t"] for e in ev if e["ev"] == "kill")
    resumed = [e["t"] for e in ev if e["ev"] == "first_step" and e["size"] == 3]
    new = [e for e in ev if e["id"] == "4"]
    at = {e["ev"]: e for e in new}
    return {"resume@3": max(resumed) - kill,
            "new@4": at["first_step"]["t"] - kill,
            "start": at["proc_start"]["t0"] - kill,
            "import": at["imported"]["t"] - at["proc_start"]["t0"],
            "join": at["init_done"]["t"] - at["imported"]["t"],
            "sync+step": at["first_step"]["t"] - at["init_done"]["t"]}


def main() -> None:
    """Run the measurement --runs times and print each run and the medians."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--kill-step", type=int, default=23)
    p.add_argument("--step-sleep", type=float, default=0.02)
    p.add_argument("--commit-every", type=int, default=5)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    rows = [one_run(args) for _ in range(args.runs)]
    keys = list(rows[0])
    print("run  " + "  ".join(f"{k:>9}" for k in keys))
    for i, r in enumerate(rows):
        print(f"{i:3d}  " + "  ".join(f"{r[k]:9.3f}" for k in keys))
    print("med  " + "  ".join(f"{statistics.median(r[k] for r in rows):9.3f}" for k in keys))


if __name__ == "__main__":
    main()
