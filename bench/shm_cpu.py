"""Per-call wall time (slowest rank, median) and CPU time (user+sys, summed over ranks) of
in-place allreduce/allgather of given sizes. argv: impl sizes..."""
import json, os, resource, sys, time
import numpy as np
impl = sys.argv[1]
if impl == "mpi":
    from mpi4py import MPI
else:
    from collectives import MPI
c = MPI.COMM_WORLD
r, n = c.Get_rank(), c.Get_size()
out = []
for kind in sys.argv[2].split(","):
  for size in [int(s) for s in sys.argv[3:]]:
    cnt = size // 4 // n * n
    a = np.ones(cnt, np.float32)
    g = np.empty(cnt, np.float32)
    iters = max(5, min(200, (64 << 20) // size))
    def call():
        if kind == "allreduce":
            c.Allreduce(MPI.IN_PLACE, a)
        else:
            c.Allgather(a[: cnt // n], g)
    for _ in range(3): call()
    c.Barrier()
    ts = []
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(iters):
        c.Barrier()
        t0 = time.perf_counter(); call(); ts.append(time.perf_counter() - t0)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime) / iters
    t = np.array(ts)
    tmax = np.empty_like(t)
    c.Allreduce(t, tmax, op=MPI.MAX)
    cpus = np.array([cpu]); cpusum = np.empty(1)
    c.Allreduce(cpus, cpusum, op=MPI.SUM)
    if r == 0:
        out.append((kind, size, float(np.median(tmax)) * 1e6, float(cpusum[0]) * 1e6))
if r == 0:
    for kind, size, t, cpu in out:
        print(f"{impl:8s} {kind:9s} {size:>9d} wall_us {t:9.1f} cpu_us_all_ranks {cpu:9.1f}", flush=True)
