"""Time one allreduce per algorithm, with the CPU it costs (issue: 64 MiB float32 at -np 2 and -np 4).

    collectives-run -np 4 python bench/allreduce_time.py [--size 64M] [--iters 5] [--in-place]

Prints, on rank 0, the median and best time over the iterations of the
slowest rank (a barrier before each call), with algbw and busbw, and the CPU
time the calls cost, user and system, summed over the ranks (getrusage): a
call that keeps every core busy cannot take less than that CPU time over the
host's cores, its "floor". On loopback, where the kernel's TCP copies are
most of the system time, a call near its floor can only get faster by costing
the kernel less per byte.
"""
from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np

from collectives import MPI


def parse_size(text: str) -> int:
    """'64M' -> 67108864."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def cpu_times() -> np.ndarray:
    """This process's user and system CPU seconds so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([r.ru_utime, r.ru_stime])


def main() -> None:
    """Run the timing and print one line per algorithm on rank 0."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--algos", default="ring,tree,butterfly,auto")
    ap.add_argument("--in-place", action="store_true", help="MPI.IN_PLACE, as the peers' comparison")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    n = comm.size
    nbytes = parse_size(args.size)
    x = np.ones(nbytes // 4, dtype=np.float32)
    y = np.empty_like(x)
    t_max = np.zeros(1)
    cpus = os.cpu_count() or 1

    for algo in args.algos.split(","):
        comm.Allreduce(x, y, algorithm=algo)  # warm-up: connects the links
        times, cpu = [], np.zeros(2)
        for _ in range(args.iters):
            if args.in_place:
                x.fill(1)
            comm.Barrier()
            c0 = cpu_times()
            t0 = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE if args.in_place else x, x if args.in_place else y,
                           algorithm=algo)
            t = np.array([time.perf_counter() - t0])
            cpu += cpu_times() - c0
            comm.Allreduce(t, t_max, op=MPI.MAX)
            times.append(float(t_max[0]))
        out = x if args.in_place else y
        assert out[0] == n and out[-1] == n, "wrong result"
        total = np.zeros(2)
        comm.Allreduce(cpu / args.iters, total, op=MPI.SUM)  # per call, all ranks
        med = float(np.median(times))
        algbw = nbytes / med / 1e9
        if comm.rank == 0:
            print(f"np={n} {algo:>9} {nbytes / 2**20:8.1f} MiB  median {med * 1e3:9.2f} ms  "
                  f"best {min(times) * 1e3:9.2f} ms  algbw {algbw:6.3f} GB/s  "
                  f"busbw {algbw * 2 * (n - 1) / n:6.3f} GB/s  cpu/call {total.sum() * 1e3:8.1f} ms "
                  f"(user {total[0] * 1e3:.1f}, sys {total[1] * 1e3:.1f})  "
                  f"floor on {cpus} cpus {total.sum() / cpus * 1e3:8.2f} ms", flush=True)


if __name__ == "__main__":
    main()
