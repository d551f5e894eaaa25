"""What authentication costs an 8-byte allreduce: 2 ranks on loopback, with and without a job secret.

    python bench/auth_cost.py [--rounds 8] [--calls 3000] [--transport tcp] [--base /other/checkout]

Runs short 2-rank jobs, alternating the configurations round by round (so a
slow spell of a shared machine hits them alike), and prints per
configuration the median time of one allreduce (over blocks of 500 calls)
and of the first call, which opens the link (the authenticated handshake),
and their ratios to the first configuration. With --base, a checkout built
without authentication (e.g. the commit before it) runs as a third
configuration. Compare ratios within one run, not absolute numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BODY = r'''
import json, sys, time
import numpy as np
from collectives import MPI
c = MPI.COMM_WORLD
calls = int(sys.argv[1])
x = np.ones(1, np.float64); y = np.zeros(1, np.float64)
t = time.perf_counter()
c.Allreduce(x, y)
first = time.perf_counter() - t
for _ in range(500): c.Allreduce(x, y)
blocks = []
for _ in range(max(1, calls // 500)):
    t = time.perf_counter()
    for _ in range(500): c.Allreduce(x, y)
    blocks.append((time.perf_counter() - t) / 500)
if c.rank == 0:
    print(json.dumps({"first": first, "blocks": blocks}))
'''


def one_job(repo: Path, secret: bool, calls: int, transport: str) -> dict:
    """One 2-rank job; rank 0's timings."""
    sys.path.insert(0, str(REPO))
    from collectives.launcher.cli import free_port
    port = free_port()
    procs = []
    job_secret = os.urandom(32).hex()  # one per job: every rank holds the same
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("COLLECTIVES_")}
        env.update(COLLECTIVES_RANK=str(rank), COLLECTIVES_SIZE="2",
                   COLLECTIVES_LOCAL_RANK=str(rank), COLLECTIVES_LOCAL_SIZE="2",
                   COLLECTIVES_STORE_ADDR=f"127.0.0.1:{port}", PYTHONPATH=str(repo),
                   OMP_NUM_THREADS="1", COLLECTIVES_TRANSPORT=transport)
        if secret:
            env["COLLECTIVES_JOB_SECRET"] = job_secret
        procs.append(subprocess.Popen([sys.executable, "-c", BODY, str(calls)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      cwd=str(repo)))
    try:
        out = procs[0].communicate(timeout=float(os.environ.get("AUTH_COST_TIMEOUT", "300")))[0]
        procs[1].wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return json.loads(out)


def main() -> None:
    """Run the rounds and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--base", help="a checkout without authentication, built in place")
    args = ap.parse_args()
    configs = [("no secret", REPO, False), ("secret", REPO, True)]
    if args.base:
        configs.append(("base checkout", Path(args.base), False))
    runs: dict = {name: [] for name, _, _ in configs}
    for i in range(args.rounds):
        order = configs if i % 2 == 0 else configs[::-1]
        for name, repo, secret in order:
            runs[name].append(one_job(repo, secret, args.calls, args.transport))
    ref: dict = {}
    print(f"8-byte allreduce, 2 ranks, {args.transport} on loopback, {args.rounds} rounds; "
          f"per call: median and best 500-call block; first call: median and best")
    for name, _, _ in configs:
        blocks = [b for r in runs[name] for b in r["blocks"]]
        firsts = [r["first"] for r in runs[name]]
        vals = {"call": statistics.median(blocks) * 1e6, "best": min(blocks) * 1e6,
                "first": statistics.median(firsts) * 1e6, "first_best": min(firsts) * 1e6}
        for k, v in vals.items():
            ref.setdefault(k, v)
        print(f"{name:>14}: per call {vals['call']:7.2f} us ({vals['call'] / ref['call']:4.2f}x), "
              f"best {vals['best']:6.2f} us ({vals['best'] / ref['best']:4.2f}x); "
              f"first call {vals['first']:6.0f} us ({vals['first'] / ref['first']:4.2f}x), "
              f"best {vals['first_best']:6.0f} us ({vals['first_best'] / ref['first_best']:4.2f}x)")


if __name__ == "__main__":
    main()
