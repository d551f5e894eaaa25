"""What the per-call argument agreement of collectives.torch costs (issue 24).

Run as ranks, e.g. ``collectives-run -np 2 python bench/bench_agree.py``.
For each size, times ``hvd.allreduce`` as shipped (agreement on every call;
up to 384 bytes the data travels inside it and no second collective runs)
against the same call with the agreement switched off (the core allreduce
alone, what the old cached check cost once a layout had been seen), in
alternating rounds of --iters calls, and prints the median time per call of
each and their ratio. Only the ratios within one run mean anything on a
shared host.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import collectives.torch as hvd
from collectives.torch import _agree
from collectives.torch._context import current


def main() -> None:
    """Time both modes at each size and print one line per size (rank 0)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="8,1048576", help="bytes per tensor (float32)")
    p.add_argument("--iters", type=int, default=200, help="calls per round")
    p.add_argument("--rounds", type=int, default=11, help="rounds per mode, alternating")
    args = p.parse_args()
    hvd.init()
    agreement = current().agreement
    real_agree = agreement.agree

    def skip(what, desc, payload=None, extra=0):  # no exchange: "not inlined" everywhere
        return _agree.Agreed(np.zeros((hvd.size(), _agree.SLOT), dtype=np.uint8),
                             [(_agree.MAGIC, _agree.OK, 0, -1, 0)] * hvd.size())

    for nbytes in [int(s) for s in args.sizes.split(",")]:
        t = torch.ones(max(1, nbytes // 4))
        times = {"agree": [], "off": []}
        for rnd in range(2 * args.rounds + 2):
            mode = "agree" if rnd % 2 == 0 else "off"
            agreement.agree = real_agree if mode == "agree" else skip
            hvd.barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                hvd.allreduce(t, op=hvd.Sum)
            if rnd >= 2:  # the first round of each mode warms up
                times[mode].append((time.perf_counter() - start) / args.iters)
        agreement.agree = real_agree
        a, o = statistics.median(times["agree"]), statistics.median(times["off"])
        if hvd.rank() == 0:
            print(f"{t.numel() * 4:>9} B  with agreement {a * 1e6:9.1f} us  without "
                  f"{o * 1e6:9.1f} us  ratio {a / o:5.2f}  ({args.rounds} rounds of "
                  f"{args.iters}, {hvd.size()} ranks)", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
