"""Collectives on a namespace cluster: ours (auto / two_level / flat) against Gloo, same run (root).

    python bench/multihost.py --hosts 2 --per-host 4 --placement cyclic --rate 1gbit \
        --sizes 64M --iters 5 --algos auto,ring --gloo
    python bench/multihost.py --hosts 2 --per-host 4 --collective allgather --sizes 16M --gloo
    python bench/multihost.py --hosts 2 --per-host 4 --tune /tmp/tune.txt --sizes 8,64M
    python bench/multihost.py --hosts 2 --per-host 4 --env COLLECTIVES_TUNE_FILE=/tmp/tune.txt \
        --sizes 8,64K,64M --algos auto,two_level,butterfly,ring --gloo

Builds the cluster of tests/_netns.py (one network namespace per host on a
bridge, tbf-shaped links, a hostname per host so that same-host ranks use
shared memory), starts hosts x per-host ranks in it (block: ranks 0.. on host
0 first; cyclic: round robin), and in each iteration times one call of every
implementation in turn (each after a barrier; an implementation's time is the
slowest rank's). Prints per size and implementation the median and best time,
busbw (allreduce 2(n-1)/n S / t, allgather (n-1)/n S / t, broadcast S / t;
S is the whole gathered buffer for allgather, as in nccl-tests) and the
ratio of Gloo's median to this row's (above 1: faster than Gloo). --algos
names allreduce algorithms; allgather and broadcast have one algorithm each
(their rows say "ours").

--collective dgc times DGC's sparse exchange alone (the allgatherv of every
rank's packed selections, then decoding) of a model of --sizes elements
(4 B each: 100M is a 25 M parameter model), --density of each rank's
entries, --overlap of them shared by the ranks of a host (replicas of one
model pick mostly the same entries): "unmerged" (sparse_ops.exchange: the
two-level allgatherv, every rank's selections cross into each other host
once) against "merged" (dgc_hosts: one union per host crosses), and prints
the bytes leaving a host per step for each and for a flat ring over all
ranks (n - 1 of the n buffers on its busiest host link).

--tune FILE runs ``collectives-bench allreduce --tune FILE`` in the ranks
instead (sizes from the smallest to the largest of --sizes, times 8 each
step): it measures two_level against ring, tree and butterfly per size on
this cluster and writes rows keyed by its shape (e.g. ``8 65536 butterfly
2x4``), which ``algorithm="auto"`` reads through COLLECTIVES_TUNE_FILE.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def parse_size(text: str) -> int:
    """'64M' -> 67108864."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def worker(args) -> None:
    """One rank: time every implementation at every size; rank 0 writes the JSON."""
    import numpy as np
    from collectives import MPI

    comm = MPI.COMM_WORLD
    n, r = comm.size, comm.rank
    if args.collective == "dgc":
        return dgc_worker(args, comm)
    impls = [a for a in args.algos.split(",") if a] if args.collective == "allreduce" else ["ours"]
    pg = None
    if args.gloo:
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:"
                                f"{os.environ['MASTER_PORT']}", rank=r, world_size=n)
        pg = dist
        impls.append("gloo")
    rows = []
    for nbytes in [parse_size(s) for s in args.sizes.split(",")]:
        count = max(nbytes // 4, 1)
        if args.collective == "allgather":
            count = max(count // n, 1)
        x = np.ones(count, np.float32)
        g = np.empty(count * n, np.float32)
        t = torch.from_numpy(x.copy()) if pg else None
        tl = [torch.empty(count) for _ in range(n)] if pg else None
        times = {i: [] for i in impls}
        for it in range(args.warmup + args.iters):
            order = impls[it % len(impls):] + impls[:it % len(impls)]  # take turns
            for impl in order:
                comm.Barrier()
                t0 = time.perf_counter()
                if impl == "gloo":
                    if args.collective == "allreduce":
                        pg.all_reduce(t)
                    elif args.collective == "allgather":
                        pg.all_gather(tl, t)
                    else:
                        pg.broadcast(t, src=0)
                elif args.collective == "allreduce":
                    comm.Allreduce(MPI.IN_PLACE, x, algorithm=impl)
                elif args.collective == "allgather":
                    comm.Allgather(x, g)
                else:
                    comm.Bcast(x, root=0)
                dt = time.perf_counter() - t0
                if it >= args.warmup:
                    times[impl].append(dt)
        for impl in impls:
            mine = np.array(times[impl])
            slowest = np.empty_like(mine)
            comm.Allreduce(mine, slowest, op=MPI.MAX)
            rows.append({"bytes": nbytes, "impl": impl, "median": float(np.median(slowest)),
                         "best": float(slowest.min()), "n": n})
    if r == 0:
        Path(args.out).write_text(json.dumps(rows))
    if pg:
        pg.destroy_process_group()


def dgc_worker(args, comm) -> None:
    """Time the flat and the host-merged sparse exchange; rank 0 writes the JSON."""
    import numpy as np
    import torch
    from collectives import MPI
    from collectives.torch import sparse_ops
    from collectives.torch.dgc_hosts import HostExchange

    torch.set_num_threads(1)
    core, n, r = comm._core, comm.size, comm.rank
    hx = HostExchange.create(core)
    ids = core.host_ids()
    host = ids.index(ids[r])
    fmt = sparse_ops.WireFormat(torch.float32, torch.int32)
    rows = []
    for nbytes in [parse_size(s) for s in args.sizes.split(",")]:
        numel = nbytes // 4
        k = max(int(numel * args.density), 1)
        ns = int(k * args.overlap)
        g = torch.Generator().manual_seed(1000 + host)
        perm = torch.randperm(numel, generator=g)
        rest = torch.randint(ns, numel, (4 * k,), generator=torch.Generator().manual_seed(7 + r))
        own = perm[torch.unique(rest)[:k - ns]]
        idx = torch.cat([perm[:ns], own]).long()
        vals = torch.randn(idx.numel(), generator=torch.Generator().manual_seed(r))
        buf = sparse_ops.pack_selected([(vals, idx)], [k], fmt)
        out = torch.zeros(numel)
        times = {"unmerged": [], "merged": []}
        host_bytes = {}
        for it in range(args.warmup + args.iters):
            for impl in (("unmerged", "merged") if it % 2 == 0 else ("merged", "unmerged")):
                comm.Barrier()
                t0 = time.perf_counter()
                if impl == "unmerged":
                    gathered, sizes = sparse_ops.exchange(core, n, buf)
                    out.zero_()
                    sparse_ops.decode(gathered, sizes, [out], [k], fmt)
                    # each of the host's buffers crosses into each other host once
                    host_bytes[impl] = sum(s for q, s in enumerate(sizes) if ids[q] == ids[r])
                    host_bytes["ring"] = sum(sizes) - max(sizes)  # n - 1 of n buffers
                else:
                    gathered, sizes, mcaps = hx.exchange(buf, [k], [numel], fmt)
                    out.zero_()
                    sparse_ops.decode(gathered, sizes, [out], mcaps, HostExchange.merged_format(fmt))
                    host_bytes[impl] = hx.host_link_bytes
                dt = time.perf_counter() - t0
                if it >= args.warmup:
                    times[impl].append(dt)
        for impl, ts in times.items():
            mine = np.array(ts)
            slowest = np.empty_like(mine)
            comm.Allreduce(mine, slowest, op=MPI.MAX)
            hb = np.array([host_bytes[impl], host_bytes["ring"]], np.float64)
            most = np.empty_like(hb)
            comm.Allreduce(hb, most, op=MPI.MAX)
            rows.append({"bytes": nbytes, "impl": impl, "median": float(np.median(slowest)),
                         "best": float(slowest.min()), "n": n, "host_bytes": int(most[0]),
                         "ring_bytes": int(most[1]), "k": k})
    if r == 0:
        Path(args.out).write_text(json.dumps(rows))


def run_ranks(c, n: int, cmd: list, port: int, deadline_s: float,
              extra: Optional[dict] = None) -> None:
    """Run cmd as ranks 0..n-1 on cluster c (tests/_netns.py), each in its host's
    namespaces with the cluster's rank environment, one job secret (an authenticated job,
    as a real one is) and this checkout first on PYTHONPATH; exit naming the exit codes
    unless every rank succeeded by the deadline. (bench/ps_hosts.py launches this way too.)"""
    procs = []
    secret = os.urandom(16).hex()
    try:
        for rank in range(n):
            env = {k: v for k, v in os.environ.items() if not k.startswith("COLLECTIVES_")}
            env.update({k: str(v) for k, v in c.rank_env(port)(rank, n).items()})
            env["COLLECTIVES_JOB_SECRET"] = secret
            env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
            env.update(extra or {})
            procs.append(subprocess.Popen(c.prefix(rank) + cmd, env=env,
                                          start_new_session=True))
        deadline = time.monotonic() + deadline_s
        for p in procs:
            p.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        sys.exit(f"ranks failed: {[p.returncode for p in procs]}")


def driver(args) -> None:
    """Build the cluster, run the ranks in it, print the table."""
    sys.path.insert(0, str(REPO / "tests"))
    from _netns import Cluster

    n = args.hosts * args.per_host
    with Cluster(args.hosts, rate=args.rate) as c, tempfile.TemporaryDirectory() as tmp:
        hosts = c.hosts_of(n, args.placement)
        port = 20000 + os.getpid() % 20000
        out = os.path.join(tmp, "rows.json")
        sizes = [parse_size(s) for s in args.sizes.split(",")]
        tune = [sys.executable, "-m", "collectives.bench", "allreduce", "--tune",
                os.path.abspath(args.tune), "-b", str(min(sizes)), "-e", str(max(sizes)),
                "-f", "8", "--iters", str(args.iters), "--warmup", str(args.warmup)] \
            if args.tune else []
        cmd = tune if args.tune else [
               sys.executable, str(Path(__file__).resolve()), "--worker", "--out", out,
               "--collective", args.collective, "--density", str(args.density),
               "--overlap", str(args.overlap),
               "--sizes", args.sizes, "--iters", str(args.iters), "--warmup",
               str(args.warmup), "--algos", args.algos] + (["--gloo"] if args.gloo else [])
        extra = dict(kv.partition("=")[::2] for kv in args.env)
        run_ranks(c, n, cmd, port, args.deadline, extra)
        if args.tune:
            return
        rows = json.loads(Path(out).read_text())
    print(f"# {args.collective}, {args.hosts} hosts x {args.per_host} ranks, {args.placement} placement "
          f"{hosts}, links {args.rate}, {args.iters} iterations")
    print(f"{'size':>10} {'impl':>10} {'median s':>10} {'best s':>10} {'busbw GB/s':>11} "
          f"{'gloo/this':>9}")
    for row in rows:
        gloo = [g for g in rows if g["impl"] == "gloo" and g["bytes"] == row["bytes"]]
        ratio = f"{gloo[0]['median'] / row['median']:.2f}" if gloo else "-"
        if args.collective == "dgc":
            base = [g for g in rows if g["impl"] == "unmerged" and g["bytes"] == row["bytes"]][0]
            print(f"{row['bytes']:>10} {row['impl']:>10} {row['median']:>10.6f} "
                  f"{row['best']:>10.6f}  k={row['k']} host link bytes {row['host_bytes']} "
                  f"({row['host_bytes'] / row['ring_bytes']:.3f} of a flat ring's "
                  f"{row['ring_bytes']}), unmerged/this {base['median'] / row['median']:.2f}")
            continue
        factor = {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n,
                  "broadcast": 1.0}[args.collective]
        busbw = row["bytes"] * factor / row["median"] / 1e9
        print(f"{row['bytes']:>10} {row['impl']:>10} {row['median']:>10.6f} {row['best']:>10.6f} "
              f"{busbw:>11.4f} {ratio:>9}")


def main() -> None:
    """Parse the command line; run as the driver or as one rank (--worker)."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--per-host", type=int, default=2)
    ap.add_argument("--placement", default="block", choices=["block", "cyclic"])
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--collective", default="allreduce",
                    choices=["allreduce", "allgather", "broadcast", "dgc"])
    ap.add_argument("--density", type=float, default=0.001, help="dgc: entries sent per rank")
    ap.add_argument("--overlap", type=float, default=0.0,
                    help="dgc: fraction of a rank's entries shared by the ranks of its host")
    ap.add_argument("--sizes", default="64M")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--algos", default="auto,ring")
    ap.add_argument("--gloo", action="store_true", help="time torch.distributed gloo too")
    ap.add_argument("--tune", default=None, metavar="FILE",
                    help="run collectives-bench --tune in the ranks, writing FILE (see above)")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for every rank")
    ap.add_argument("--deadline", type=float, default=600)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    main()
