"""What COLLECTIVES_ENCRYPT=1 costs an allreduce: encrypted against unencrypted, same run.

    python bench/encrypt_cost.py loopback [--np 2,4] [--rounds 5]
    sudo python bench/encrypt_cost.py shaped [--rate 1gbit] [--rounds 5]

loopback: collectives-bench (ring allreduce, float32, 1 MiB to 64 MiB, TCP on
one host) with the variable off and on, taking turns, the order swapped every
round; per size the median over the rounds of each configuration's time.

shaped: two network namespaces made here (e37-a, e37-b: a veth pair, tc tbf
at --rate both ways, deleted at the end, also on failure), one rank in each,
the same sizes and alternation, against the line rate: at 1 Gbit/s a 2-rank
allreduce of S bytes moves S bytes each way per rank, so it cannot take less
than S / (125 MB/s).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

SECRET = "encrypt-cost-bench-secret-0123456789abcdef"
SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

RANK_BODY = r"""
import json, sys, time
import numpy as np
from collectives import MPI
comm = MPI.COMM_WORLD
sizes, iters = json.loads(sys.argv[1]), int(sys.argv[2])
out = {}
for size in sizes:
    x = np.ones(size // 4, np.float32)
    y = np.empty_like(x)
    comm.Allreduce(x, y, algorithm="ring")
    times = []
    for _ in range(iters):
        comm.Barrier()
        t = time.perf_counter()
        comm.Allreduce(x, y, algorithm="ring")
        times.append(comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
    assert float(y[0]) == comm.size
    out[size] = sorted(times)[len(times) // 2]
if comm.rank == 0:
    print("@@", json.dumps(out))
"""


def _env(encrypt: str) -> dict:
    env = dict(os.environ)
    env.update({"COLLECTIVES_ENCRYPT": encrypt, "COLLECTIVES_JOB_SECRET": SECRET,
                "COLLECTIVES_TRANSPORT": "tcp",
                "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))})
    return env


def loopback_once(n: int, encrypt: str, iters: int) -> dict:
    """Seconds per size (out-of-place, median of iters) from one collectives-bench run."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, "-m", "collectives.bench", "allreduce", "-np", str(n),
                        "-b", "1M", "-e", "64M", "-f", "4", "--algo", "ring", "--iters",
                        str(iters), "--warmup", "2", "--json", f.name],
                       env=_env(encrypt), check=True, capture_output=True, timeout=1200)
        rows = json.load(open(f.name))
    return {r["size"]: r["time_us"] / 1e6 for r in rows if not r["inplace"]}


def shaped_once(encrypt: str, iters: int, ns: list) -> dict:
    """Seconds per size from one rank in each namespace."""
    body = os.path.join(tempfile.gettempdir(), "encrypt_cost_rank.py")
    with open(body, "w") as f:
        f.write(RANK_BODY)
    port = 20000 + os.getpid() % 20000
    procs = []
    for i, name in enumerate(ns):
        env = _env(encrypt)
        env.update({"COLLECTIVES_RANK": str(i), "COLLECTIVES_SIZE": str(len(ns)),
                    "COLLECTIVES_LOCAL_RANK": "0", "COLLECTIVES_LOCAL_SIZE": "1",
                    "COLLECTIVES_STORE_ADDR": f"10.137.0.1:{port}", "COLLECTIVES_TIMEOUT": "120"})
        procs.append(subprocess.Popen(["ip", "netns", "exec", name, sys.executable, body,
                                       json.dumps(SIZES), str(iters)], env=env,
                                      stdout=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a rank failed: {[p.returncode for p in procs]}")
    line = next(l for l in outs[0].splitlines() if l.startswith("@@ "))
    return {int(k): v for k, v in json.loads(line[3:]).items()}


def netns(action: str, rate: str = "") -> list:
    """Make (or delete) namespaces e37-a and e37-b joined by a tbf-shaped veth pair."""
    ns = ["e37-a", "e37-b"]
    if action == "down":
        for name in ns:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        return ns
    for name in ns:
        subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "link", "add", "e37va", "netns", ns[0], "type", "veth", "peer", "name",
                    "e37vb", "netns", ns[1]], check=True)
    for i, (name, dev) in enumerate(zip(ns, ["e37va", "e37vb"])):
        for cmd in (["ip", "link", "set", "lo", "up"],
                    ["ip", "addr", "add", f"10.137.0.{i + 1}/24", "dev", dev],
                    ["ip", "link", "set", dev, "up"],
                    ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst",
                     "512kb", "latency", "100ms"]):
            subprocess.run(["ip", "netns", "exec", name, *cmd], check=True)
    return ns


def table(title: str, runs: dict, nbytes_floor=None) -> None:
    """Median seconds per (configuration, size) over the rounds, and the ratios."""
    print(f"\n{title}")
    head = "| size | off: time (ms) | off: busbw (GB/s) | on: time (ms) | on: busbw (GB/s) | on/off time |"
    if nbytes_floor:
        head += " line-rate floor (ms) |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for size in SIZES:
        off = statistics.median(r[size] for r in runs["0"])
        on = statistics.median(r[size] for r in runs["1"])
        n = runs["n"]
        bus = lambda t: size / t / 1e9 * 2 * (n - 1) / n
        row = (f"| {size >> 20} MiB | {off * 1e3:.1f} | {bus(off):.3f} | {on * 1e3:.1f} | "
               f"{bus(on):.3f} | {on / off:.2f} |")
        if nbytes_floor:
            row += f" {nbytes_floor(size) * 1e3:.1f} |"
        print(row)


def main() -> None:
    """Run the chosen comparison and print its tables (markdown)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["loopback", "shaped"])
    ap.add_argument("--np", default="2,4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rate", default="1gbit")
    args = ap.parse_args()
    if args.mode == "loopback":
        for n in map(int, args.np.split(",")):
            runs = {"0": [], "1": [], "n": n}
            for rnd in range(args.rounds):
                for enc in (("0", "1") if rnd % 2 == 0 else ("1", "0")):
                    runs[enc].append(loopback_once(n, enc, args.iters))
                print(f"# np {n} round {rnd + 1}/{args.rounds} done", file=sys.stderr)
            table(f"loopback, {n} ranks over TCP, ring allreduce float32, median of {args.rounds} "
                  f"rounds (each the median of {args.iters} calls)", runs)
        return
    rate_bps = {"g": 1e9, "m": 1e6, "k": 1e3}[args.rate.lower().rstrip("bit")[-1]] * \
        float(args.rate.lower().rstrip("bit")[:-1])
    netns("down")
    ns = netns("up", args.rate)
    try:
        runs = {"0": [], "1": [], "n": 2}
        for rnd in range(args.rounds):
            for enc in (("0", "1") if rnd % 2 == 0 else ("1", "0")):
                runs[enc].append(shaped_once(enc, args.iters, ns))
            print(f"# round {rnd + 1}/{args.rounds} done", file=sys.stderr)
        table(f"2 namespaces, veth shaped to {args.rate} each way (tc tbf), ring allreduce "
              f"float32, median of {args.rounds} rounds", runs,
              nbytes_floor=lambda size: size * 8 / rate_bps)
    finally:
        netns("down")


if __name__ == "__main__":
    main()
