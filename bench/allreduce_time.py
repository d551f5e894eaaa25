"""Time one allreduce per algorithm (issue: 64 MiB float32 at -np 2 and -np 4).

    collectives-run -np 4 python bench/allreduce_time.py [--size 64M] [--iters 5]

Prints, on rank 0, the median and best time over the iterations of the
slowest rank (a barrier before each call), with algbw and busbw.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from collectives import MPI


def parse_size(text: str) -> int:
    """'64M' -> 67108864."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def main() -> None:
    """Run the timing and print one line per algorithm on rank 0."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--algos", default="ring,tree,butterfly,auto")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    n = comm.size
    nbytes = parse_size(args.size)
    x = np.ones(nbytes // 4, dtype=np.float32)
    y = np.empty_like(x)
    t_max = np.zeros(1)
    for algo in args.algos.split(","):
        comm.Allreduce(x, y, algorithm=algo)  # warm-up: connects the links
        times = []
        for _ in range(args.iters):
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(x, y, algorithm=algo)
            t = np.array([time.perf_counter() - t0])
            comm.Allreduce(t, t_max, op=MPI.MAX)
            times.append(float(t_max[0]))
        assert y[0] == n and y[-1] == n, "wrong result"
        med = float(np.median(times))
        algbw = nbytes / med / 1e9
        if comm.rank == 0:
            print(f"np={n} {algo:>9} {nbytes / 2**20:8.1f} MiB  median {med * 1e3:9.2f} ms  "
                  f"best {min(times) * 1e3:9.2f} ms  algbw {algbw:6.3f} GB/s  "
                  f"busbw {algbw * 2 * (n - 1) / n:6.3f} GB/s", flush=True)


if __name__ == "__main__":
    main()
