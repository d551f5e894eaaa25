"""Issue 26: which side of a device collective loses the order with the caller's
stream. Run: collectives-run -np 2 python bench/gpu_stream_probe.py VARIANT...
Variants: plain, sync_before, sync_after, blocking_stream, default_stream, no_final_sync
(the last reads the result on the null stream without waiting for the stream: the
probe's own race, which is what issue 26's first run of the stream tests measured).
Prints, on rank 0, the number of wrong iterations out of ITERS per variant."""
import sys

import cupy as cp
import numpy as np

from collectives import MPI

comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
spin = cp.RawKernel(r'''
extern "C" __global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
}''', "spin")
ITERS = 60
for variant in sys.argv[1:]:
    rng = np.random.default_rng(11)
    if variant == "default_stream":
        s = cp.cuda.Stream.null
    else:
        s = cp.cuda.Stream(non_blocking=variant != "blocking_stream")
    bad = 0
    first = None
    for it in range(ITERS):
        count = int(rng.integers(1, 1 << 20))
        delay = int(rng.integers(0, 2_000_000))
        with s:
            spin((1,), (1,), (cp.int64(delay),))
            x = cp.full(count, r + 1, dtype=cp.float32) * 3 + it
            if it == 0 and r == 0:
                print(variant, "stream ptr", s.ptr, "CAI stream", x.__cuda_array_interface__.get("stream"), flush=True)
            if variant == "sync_before":
                s.synchronize()
            comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
            if variant == "sync_after":
                cp.cuda.runtime.deviceSynchronize()
            z = x * 2 - 1
        if variant != "no_final_sync":
            s.synchronize()  # asnumpy() runs on the null stream, which a non-blocking one does not join
        want = 2.0 * (3 * n * (n + 1) / 2 + n * it) - 1
        got = cp.asnumpy(z)
        wrong = int(np.count_nonzero(got != want))
        if wrong:
            bad += 1
            if first is None:
                first = (it, count, wrong, float(got[0]), want)
    total = comm.allreduce(bad)
    if r == 0:
        print(f"{variant}: {total} wrong iterations of {ITERS * n} (first on rank 0: {first})", flush=True)
