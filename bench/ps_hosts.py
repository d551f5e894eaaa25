"""Parameter server on the namespace cluster: one push per worker against one per host (root).

    python bench/ps_hosts.py --hosts 2 --per-host 4 --rate 1gbit --params 4M --steps 6

Builds the cluster of tests/_netns.py with hosts + 1 hosts: hosts x per-host
workers (block placement) and one server alone on the last host, every host
link shaped to --rate. Runs sync training steps of a --params float32
gradient twice, each in a job of its own: ``ps.init(host_sum=False)`` (every
worker pushes to the server and pulls its reply: hosts x per-host messages
each way through the server's link per step) and ``host_sum=True`` (a host's
workers sum over shared memory, its first worker pushes once and broadcasts
the reply: hosts messages each way). Prints per mode the median step time
of the slowest worker (after --warmup steps), the pushes the server counted
per step, and the bytes through the server's link per step (pushes x 4 B x
params, each way).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def parse_size(text: str) -> int:
    """'4M' -> 4194304 (binary units)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def worker(args) -> None:
    """One rank: the server serves; workers time push_pull; the server writes the JSON."""
    import numpy as np
    import collectives.ps as ps

    role = ps.init(num_servers=1, host_sum=args.host_sum)
    shapes = [(args.params,)]
    if role.is_server:
        got = []
        ps.serve(shapes, ps.SGD(lr=1e-3), "sync", server=got.append)
        Path(args.out).write_text(json.dumps({"pushes": sum(got[0].pushes.values())}))
        return
    w = ps.worker(shapes)
    w.start(np.zeros(args.params, np.float32) if role.index == 0 else None)
    g = np.full(args.params, 1e-3, np.float32)
    times = []
    for k in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        w.push_pull(g)
        if k >= args.warmup:
            times.append(time.perf_counter() - t0)
    Path(f"{args.out}.w{role.index}").write_text(json.dumps(times))
    w.finish()


def run(args, host_sum: bool, tmp: str) -> dict:
    """One job on a fresh cluster; returns the server's count and every worker's times."""
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(HERE))
    from _netns import Cluster
    from multihost import run_ranks

    nw = args.hosts * args.per_host
    n = nw + 1
    out = os.path.join(tmp, f"ps-{int(host_sum)}.json")
    with Cluster(args.hosts + 1, rate=args.rate) as c:
        c.hosts_of(n, [h for h in range(args.hosts) for _ in range(args.per_host)] + [args.hosts])
        port = 20000 + os.getpid() % 20000
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--out", out,
               "--params", str(args.params), "--steps", str(args.steps), "--warmup",
               str(args.warmup)] + (["--host-sum"] if host_sum else [])
        run_ranks(c, n, cmd, port, args.deadline)
    res = json.loads(Path(out).read_text())
    res["times"] = [json.loads(Path(f"{out}.w{w}").read_text()) for w in range(nw)]
    return res


def main() -> None:
    """Parse the command line; run both modes (driver) or one rank (--worker)."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--per-host", type=int, default=4)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--params", type=parse_size, default="4M", help="float32 elements")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=600)
    ap.add_argument("--host-sum", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    import numpy as np

    print(f"# ps sync, {args.hosts} hosts x {args.per_host} workers + 1 server host, links "
          f"{args.rate}, {args.params} float32 parameters, {args.steps} steps")
    print(f"{'mode':>14} {'median step s':>14} {'pushes/step':>12} {'server link MB/step':>20}")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for host_sum in (False, True):
            res = run(args, host_sum, tmp)
            slowest = np.max(np.array(res["times"]), axis=0)
            per_step = res["pushes"] / (args.steps + args.warmup)
            rows[host_sum] = float(np.median(slowest))
            print(f"{'host_sum' if host_sum else 'per worker':>14} {rows[host_sum]:>14.4f} "
                  f"{per_step:>12.1f} {per_step * 4 * args.params / 1e6:>20.1f}")
    print(f"# per worker / host_sum step time: {rows[False] / rows[True]:.2f}")


if __name__ == "__main__":
    main()
