"""What a small allreduce costs through each API a script calls (issue 38, item 9).

    python bench/frontend_overhead.py [-np 2] [--rounds 5] [--calls 300] [--base CHECKOUT]

Starts a job of -np ranks (2; 1 measures what the front ends cost by themselves, with
no peer to wait for) with collectives-run and times 8-byte allreduces back to back, per call: the core's own call
(``Communicator.allreduce``), ``collectives.MPI``, ``dist.all_reduce`` on the backend
"collectives", on gloo, and on "floor" (a backend registered as ours is whose
all_reduce returns completed work and moves nothing: what torch's dispatch and a
Work cost by themselves), and Horovod's ``hvd.allreduce`` / ``hvd.allreduce_``. The
implementations take turns block by block (``--calls`` calls a block), so a noisy
spell hits them alike (Horovod's after the others: ``hvd.init()`` starts threads that
would slow theirs); each number is the median block's time per call (``--stat min``: the
fastest block's, what a call costs without other processes' interruptions on a shared
host), the slowest rank's. ``--base`` runs the same job on another checkout (built in place)
in alternation with this one, job by job (``--rounds`` jobs each), for a before and
after of the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
IMPLS = ["core", "mpi", "torch", "floor", "gloo", "hvd", "hvd_"]

WORKER = r'''
import json, os, sys, time
import numpy as np, torch, torch.distributed as dist
import collectives, collectives.torch as hvd
from collectives import MPI
calls, out = int(sys.argv[1]), sys.argv[2]
comm = collectives.init()
rank, size = comm.rank, comm.size
port = int(os.environ["MASTER_PORT"])
dist.init_process_group("collectives", rank=rank, world_size=size)
if "FLOOR" not in dist.Backend._plugins:
    from torch.futures import Future
    work_from = torch._C._distributed_c10d._create_work_from_future
    class Floor(dist.ProcessGroup):
        def getBackendName(self): return "floor"
        def allreduce(self, tensors, opts=None):
            f = Future(); f.set_result(tensors); return work_from(f)
    dist.Backend.register_backend("floor", lambda s, r, n, t: Floor(r, n), devices=["cpu"])
floor = dist.new_group(list(range(size)), backend="floor")
gloo = dist.new_group(list(range(size)), backend="gloo")
a = np.ones(2, np.float32)
t = torch.ones(2)
core = comm._core
fns = {"core": lambda: core.allreduce(None, a),
       "mpi": lambda: comm.Allreduce(MPI.IN_PLACE, a),
       "torch": lambda: dist.all_reduce(t),
       "floor": lambda: dist.all_reduce(t, group=floor),
       "gloo": lambda: dist.all_reduce(t, group=gloo),
       "hvd": lambda: hvd.allreduce(t, op=hvd.Sum, name="b"),
       "hvd_": lambda: hvd.allreduce_(t, op=hvd.Sum, name="b")}
names = [n for n in json.loads(os.environ["FO_IMPLS"]) if n in fns]
times = {n: [] for n in names}
# Horovod's API last: hvd.init() starts its background threads, which would take
# the GIL from the other APIs' calls.
for phase in ([n for n in names if not n.startswith("hvd")],
              [n for n in names if n.startswith("hvd")]):
    if phase and phase[0].startswith("hvd"):
        hvd.init()
    for n in phase:
        for _ in range(50): fns[n]()
    for block in range(int(os.environ["FO_BLOCKS"])):
        for n in (phase if block % 2 == 0 else phase[::-1]):
            fn = fns[n]
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(calls): fn()
            times[n].append((time.perf_counter() - t0) / calls)
arr = np.array([times[n] for n in names])
comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.MAX)
if rank == 0:
    with open(out, "w") as fh:
        json.dump({n: float(np.median(arr[i]) if os.environ["FO_STAT"] == "median"
                            else np.min(arr[i])) * 1e6 for i, n in enumerate(names)}, fh)
dist.destroy_process_group()
'''


def run_job(checkout: str, calls: int, blocks: int, impls: list, np_: int = 2,
            stat: str = "median") -> dict:
    """One job of np_ ranks on `checkout` (its collectives/ first on PYTHONPATH): us per call,
    the median block's (stat "median") or the fastest block's ("min")."""
    with tempfile.TemporaryDirectory() as tmp:
        script, out = os.path.join(tmp, "worker.py"), os.path.join(tmp, "out.json")
        with open(script, "w") as fh:
            fh.write(WORKER)
        env = dict(os.environ, PYTHONPATH=checkout, OMP_NUM_THREADS="1",
                   FO_BLOCKS=str(blocks), FO_IMPLS=json.dumps(impls), FO_STAT=stat)
        subprocess.run([sys.executable, "-m", "collectives.run", "-np", str(np_), sys.executable,
                        script, str(calls), out], env=env, cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL)
        with open(out) as fh:
            return json.load(fh)


def main() -> None:
    """Run the jobs and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="jobs per checkout")
    ap.add_argument("--calls", type=int, default=300, help="calls per timed block")
    ap.add_argument("--blocks", type=int, default=9, help="timed blocks per job and impl")
    ap.add_argument("--base", default=None, help="a baseline checkout, built in place")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="a job's time per call: its median block's, or its fastest block's "
                         "(on a shared host: the cost without other processes' interruptions)")
    ap.add_argument("-np", dest="np", type=int, default=2,
                    help="ranks (1: the front ends' own cost, no peer to wait for)")
    args = ap.parse_args()
    impls = [i for i in args.impls.split(",") if i]
    here = os.path.dirname(HERE)
    checkouts = [("this", here)] + ([("base", os.path.abspath(args.base))] if args.base else [])
    got = {name: [] for name, _ in checkouts}
    for r in range(args.rounds):
        for name, path in (checkouts if r % 2 == 0 else checkouts[::-1]):
            got[name].append(run_job(path, args.calls, args.blocks, impls, args.np, args.stat))
            print(f"# round {r + 1} {name}: " + ", ".join(f"{k} {v:.1f}"
                                                      for k, v in got[name][-1].items()),
                  file=sys.stderr, flush=True)
    print(f"8-byte allreduce, {args.np} ranks, us per call (median over {args.rounds} jobs of each "
          f"job's {args.stat} block of {args.calls} calls, slowest rank)")
    print("| checkout | " + " | ".join(impls) + " |")
    print("|---|" + "---|" * len(impls))
    for name, _ in checkouts:
        cells = [f"{statistics.median(j[i] for j in got[name]):.1f}"
                 if all(i in j for j in got[name]) else "-" for i in impls]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
