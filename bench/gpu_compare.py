"""One table for issue 40: allreduce on GPU buffers (ours), on host buffers (ours)
and on CUDA tensors through torch.distributed's gloo backend, in the same run.

    COLLECTIVES_TRANSPORT=tcp collectives-run -np 2 python bench/gpu_compare.py \
        --sizes 8,1M,16M,64M,256M --iters 10 --json out.json

Ours on GPU buffers uses collectives._core.DeviceBuffer (plain device memory),
so `--impls gpu,host` runs without torch, also on the emulated GPU
(COLLECTIVES_CUDA_FAKE=1: host memory, so it measures the device path's
overheads only); gloo needs torch with CUDA.

Every rank uses GPU 0 (one GPU lent); each measurement is `iters` back-to-back
float32 sum allreduces after `warmup`, timed on every rank from a barrier to the
last call's completion (torch.cuda.synchronize() for GPU tensors: our call
returns once its result is final, gloo's work may not), the slowest rank's time
reported. Columns as nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n;
`wrong` counts elements of a separate allreduce of rank-valued data that differ
from the exact sum. Rank 0 prints the table and the ratios the issue asks for:
ours(GPU) / ours(host) and ours(GPU) / gloo(CUDA) by busbw, and the times at 8 B.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from collectives import MPI, _core


def parse_size(text: str) -> int:
    """'8', '64K', '1M', '256M' -> bytes."""
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if mult > 1 else text) * mult


def main() -> None:
    """Measure, then print (rank 0) the table and write --json."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="8,1M,16M,64M,256M")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--impls", default="gpu,host,gloo")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    core = comm._core
    n, r = comm.size, comm.rank
    impls = args.impls.split(",")
    torch = dist = None
    if "gloo" in impls:
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(0)
        dist.init_process_group("gloo", rank=r, world_size=n)  # collectives-run sets MASTER_*

    def sync():
        if torch is not None:
            torch.cuda.synchronize()

    def run(impl, buf):
        if impl == "gloo":
            dist.all_reduce(buf)
        else:
            core.allreduce(None, buf, "sum", "auto", None, "float32")

    def make(impl, count, values=None):
        host = np.full(count, 1.0, np.float32) if values is None else values
        if impl == "host":
            return host.copy()
        if impl == "gloo":
            return torch.from_numpy(host.copy()).to(torch.device("cuda", 0))
        d = _core.DeviceBuffer(host.nbytes, "float32", 0)
        d.copy_from(host)
        return d

    def fetch(impl, buf):
        if impl == "host":
            return buf
        if impl == "gloo":
            return buf.cpu().numpy()
        out = np.empty(buf.nbytes // 4, np.float32)
        buf.copy_to(out)
        return out

    rows = []
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        count = max(1, size // 4)
        for impl in impls:
            vals = ((np.arange(count) % 7) + r).astype(np.float32)
            buf = make(impl, count, vals)
            run(impl, buf)
            want = n * (np.arange(count) % 7) + n * (n - 1) / 2
            wrong = int(np.count_nonzero(fetch(impl, buf) != want))
            buf = make(impl, count)
            iters = args.iters if size > 65536 else max(args.iters, 200)  # latency: more calls
            for _ in range(args.warmup):
                run(impl, buf)
            sync()
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                run(impl, buf)
            sync()
            mine = (time.perf_counter() - t0) / iters
            t = comm.allreduce(mine, op=MPI.MAX)
            wrong = comm.allreduce(wrong, op=MPI.SUM)
            algbw = size / t / 1e9
            rows.append(dict(ranks=n, size=size, impl=impl, time_us=t * 1e6, algbw=algbw,
                             busbw=algbw * 2 * (n - 1) / n, wrong=wrong))
            if r == 0:
                x = rows[-1]
                print(f"{n:5d} {size:>11d} {impl:>5s} {x['time_us']:12.1f} {algbw:8.3f} "
                      f"{x['busbw']:8.3f} {wrong:6d}", flush=True)
    # the latency target: 3x the host time plus one copy each way
    small = np.zeros(2, np.float32)
    dev8 = _core.DeviceBuffer(8, "float32", 0)
    t0 = time.perf_counter()
    for _ in range(200):
        dev8.copy_from(small)
        dev8.copy_to(small)
    copies_us = (time.perf_counter() - t0) / 200 * 1e6
    if r == 0:
        print(f"# 8 B device-to-host + host-to-device copies (cudaMemcpy, rank 0): "
              f"{copies_us:.1f} us; target for gpu at 8 B: 3 x host + that")
        by = {(x["size"], x["impl"]): x for x in rows}
        print(f"# ratios, {n} ranks (busbw; at 8 B the times):")
        for size in sorted({x["size"] for x in rows}):
            g, h, o = by.get((size, "gpu")), by.get((size, "host")), by.get((size, "gloo"))
            if not g:
                continue
            if size <= 64:
                print(f"#   {size:>11d} B: gpu {g['time_us']:.1f} us, host "
                      f"{h['time_us'] if h else float('nan'):.1f} us, gloo "
                      f"{o['time_us'] if o else float('nan'):.1f} us")
                continue
            vh = g["busbw"] / h["busbw"] if h else float("nan")
            vo = g["busbw"] / o["busbw"] if o else float("nan")
            print(f"#   {size:>11d} B: gpu/host {vh:.2f} (target >= 0.9)  "
                  f"gpu/gloo {vo:.2f} (target >= 1.5)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    if "gloo" in impls:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
