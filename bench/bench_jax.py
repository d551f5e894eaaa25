"""Overhead of collectives.jax: a jitted allreduce vs the same allreduce on numpy.

    collectives-run -np 2 python bench/bench_jax.py [--mib 64] [--iters 10]

In one run, on the same float32 array of --mib MiB, it times (a) a jitted
``collectives.jax.allreduce`` (an XLA FFI custom call into the core, result
waited for with block_until_ready) and (b) ``comm._core.allreduce`` on a
numpy array (the Cython path, in place). The two alternate iteration by
iteration so that load bursts on a shared machine hit both alike; each time
is the median over iterations of the slowest rank's time. Printed with
nccl-tests' algbw/busbw and the overhead of (a) over (b).
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import collectives
import collectives.jax as cj


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=64.0, help="array size in MiB (float32)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()

    comm = collectives.init()
    core, n = comm._core, comm.size
    count = int(args.mib * 2**20) // 4
    nbytes = count * 4
    host = np.full(count, float(comm.rank + 1), np.float32)
    x = jnp.asarray(host)
    step = jax.jit(cj.allreduce)
    donated = jax.jit(cj.allreduce, donate_argnums=0)
    expected = n * (n + 1) / 2

    def timed(fn) -> float:
        comm.Barrier()
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        return comm.allreduce(dt, op=collectives.MPI.MAX)  # the slowest rank's time

    def run_jax():
        out = step(x).block_until_ready()
        return out

    def run_donated():
        nonlocal y
        y = donated(y).block_until_ready()

    def run_numpy():
        buf[:] = host
        core.allreduce(buf, buf)

    buf = np.empty_like(host)
    y = jnp.array(host)
    jax_t, don_t, np_t = [], [], []
    for i in range(args.warmup + args.iters):
        tj, td, tn = timed(run_jax), timed(run_donated), timed(run_numpy)
        if i >= args.warmup:
            jax_t.append(tj)
            don_t.append(td)
            np_t.append(tn)
    ok = bool(np.all(np.asarray(step(x)) == expected)) and bool(np.all(buf == expected))

    if comm.rank == 0:
        bus = 2 * (n - 1) / n
        print(f"# allreduce float32 sum, {n} ranks, {nbytes} bytes ({count} elements), "
              f"median of {args.iters}, slowest rank")
        print(f"{'path':>22} {'time(ms)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'wrong':>6}")
        for name, ts in (("jax.jit(allreduce)", jax_t), ("jit, donated input", don_t),
                         ("core.allreduce(numpy)", np_t)):
            t = statistics.median(ts)
            print(f"{name:>22} {t * 1e3:10.2f} {nbytes / t / 1e9:12.3f} "
                  f"{nbytes / t / 1e9 * bus:12.3f} {0 if ok else 1:>6}")
        tn = statistics.median(np_t)
        for name, ts in (("jit", jax_t), ("jit, donated", don_t)):
            tj = statistics.median(ts)
            print(f"overhead of the JAX path ({name}): {(tj - tn) * 1e3:+.2f} ms "
                  f"({(tj / tn - 1) * 100:+.1f}%)")
        # the numpy path's copy into buf is included: it stands for the copy
        # XLA does not need (the custom call writes its own output buffer)
    collectives.finalize()


if __name__ == "__main__":
    main()
