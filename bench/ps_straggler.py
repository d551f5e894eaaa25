"""A straggler against allreduce and the parameter server's modes: time per step and to a target.

    # the table (one launch per method and seed; 4 workers, PS runs add 2 servers):
    python bench/ps_straggler.py table --seeds 3
    # one run by hand:
    python -m collectives.run -np 6 --servers 2 python bench/ps_straggler.py run --method ssp

Task: bench_dgc's teacher (a random 32-64-10 tanh network labels Gaussian
inputs); each worker trains a 32-H-H-10 MLP (H = --hidden) with momentum SGD
on fresh samples, batch --batch-size per worker. Every worker's step also
sleeps --compute seconds (the forward/backward of a large model, emulated so
that the few cores of a test host do not decide the result), and the last
worker sleeps --slow times that (the straggler; 3: a worker 3x slower), every step
(--pattern constant) or all at once every 10th step (--pattern bursts: a
worker paused now and then; as slow on average), or by SIGSTOP/SIGCONT from
a helper process (--pattern sigstop: stopped (slow-1) x 0.5 s after every
0.5 s of running).

Methods: allreduce (collectives.torch.DistributedOptimizer, sync), ps-sync,
ps-backup (sync, 1 backup worker), async, ssp (staleness 2): the four PS
modes through collectives.ps.torch.Optimizer with 2 servers; ps-spare: sync
with one backup worker ADDED (--workers + 1 workers, the first --workers
gradients of each step applied: Chen et al.'s N + b), ps-dgc: ps-sync with
DGC on the pushed gradients (--dgc-ratio).

--netns H runs every rank inside the namespaces coll-h0..coll-h<H-1> of
bench/netns.sh (``bench/netns.sh up H 1gbit`` first, as root): worker i on
host i % H, server j on host --server-hosts[j] (default 1,3: one server per
two workers, sharing their hosts), over TCP.

Reported (worker 0, which is never the straggler): the median step time,
the wall time until its test accuracy (on 2048 held-out samples, measured
every --eval-every steps; the evaluation is not counted) first reaches
--target, the final accuracy after --steps steps and the mean of the last 5
evaluations (steadier: one evaluation swings by a few points); mean over
seeds.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

METHODS = ["allreduce", "ps-sync", "ps-backup", "async", "ssp", "ps-spare", "ps-dgc"]
DEFAULT_METHODS = "allreduce,ps-sync,ps-backup,async,ssp"
MODES = {"ps-sync": "sync", "ps-backup": "sync", "ps-spare": "sync", "ps-dgc": "sync"}


def teacher_data(n: int, seed: int):
    """n Gaussian inputs (32-d) labelled by a fixed random teacher network (as bench_dgc)."""
    import torch

    g = torch.Generator().manual_seed(1234)
    w1 = torch.randn(32, 64, generator=g) / 32 ** 0.5
    w2 = torch.randn(64, 10, generator=g) / 8
    gx = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=gx)
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def run(args: argparse.Namespace) -> None:
    """One method, one seed: this rank's part; worker 0 prints one '@@ {json}' line."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(args.seed)
    h = args.hidden
    model = nn.Sequential(nn.Linear(32, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(),
                          nn.Linear(h, 10))
    lr = args.lr * (args.async_lr_scale if args.method in ("async", "ssp") else 1.0)
    base = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if args.method == "allreduce":
        import collectives.torch as hvd

        hvd.init()
        index, nworkers = hvd.rank(), hvd.size()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    else:
        import collectives.ps.torch as pst

        mode = MODES.get(args.method, args.method)
        comp = "none"
        if args.method == "ps-dgc":
            from collectives.torch.dgc import DGC

            comp = DGC(compress_ratio=args.dgc_ratio, momentum=0.9)
        opt = pst.Optimizer(base, mode, staleness=2, compression=comp,
                            backup_workers=1 if args.method in ("ps-backup", "ps-spare") else 0)
        if opt.is_server:
            opt.serve()
            return
        index, nworkers = opt.role.index, opt.role.num_workers
    xte, yte = teacher_data(2048, seed=10_000)
    g = torch.Generator().manual_seed(args.seed * 1000 + index)
    straggler = index == nworkers - 1
    pauser = None
    if straggler and args.pattern == "sigstop":
        # A helper stops this process for (slow - 1) * 0.5 s after every 0.5 s it runs:
        # as slow on average as the other patterns, but frozen, mid-step, as by preemption.
        run_s, stop_s = 0.5, 0.5 * (args.slow - 1)
        me = os.getpid()
        pauser = subprocess.Popen(["sh", "-c", f"while :; do sleep {run_s}; kill -STOP {me}; "
                                               f"sleep {stop_s}; kill -CONT {me}; done"])
    steps, times, t_target, evals = [], [], None, 0.0
    start = time.perf_counter()
    for k in range(args.steps):
        t0 = time.perf_counter()
        x, y = teacher_data(args.batch_size, seed=int(torch.randint(0, 2**31 - 1, (1,),
                                                                     generator=g)))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        # constant: the straggler is --slow times slower every step; bursts: as slow on
        # average, but all of it at once every 10th step (a paused or preempted worker)
        if not straggler or args.pattern == "sigstop":
            time.sleep(args.compute)
        elif args.pattern == "constant":
            time.sleep(args.compute * args.slow)
        else:
            time.sleep(args.compute * (1 + (10 * (args.slow - 1) if k % 10 == 9 else 0)))
        opt.step()
        times.append(time.perf_counter() - t0)
        if index == 0 and (k + 1) % args.eval_every == 0:
            e0 = time.perf_counter()
            with torch.no_grad():
                acc = float((model(xte).argmax(1) == yte).float().mean())
            evals += time.perf_counter() - e0
            steps.append((k + 1, round(acc, 4), round(time.perf_counter() - start - evals, 3)))
            if t_target is None and acc >= args.target:
                t_target = time.perf_counter() - start - evals
    if pauser is not None:
        pauser.kill()
        pauser.wait()
        os.kill(os.getpid(), signal.SIGCONT)
    if args.method != "allreduce":
        opt.finish()
    if index == 0:
        print("@@ " + json.dumps({"method": args.method, "seed": args.seed,
                                  "step_ms": 1e3 * statistics.median(times),
                                  "t_target": t_target, "final": steps[-1][1],
                                  "curve": steps}), flush=True)


def table(args: argparse.Namespace) -> None:
    """Launch every method and seed through collectives-run; print the table."""
    here = os.path.abspath(__file__)
    rows = {}
    passthrough = ["--steps", str(args.steps), "--hidden", str(args.hidden), "--lr", str(args.lr),
                   "--compute", str(args.compute), "--slow", str(args.slow), "--target",
                   str(args.target), "--eval-every", str(args.eval_every), "--batch-size",
                   str(args.batch_size), "--pattern", args.pattern, "--async-lr-scale",
                   str(args.async_lr_scale)]
    passthrough += ["--dgc-ratio", str(args.dgc_ratio)]
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for method in args.methods.split(","):
            workers = args.workers + (method == "ps-spare")
            np_, extra = (workers, []) if method == "allreduce" else \
                (workers + args.servers, ["--servers", str(args.servers)])
            argv = [sys.executable, here, "run", "--method", method, "--seed", str(seed),
                    *passthrough]
            env = dict(os.environ)  # the checkout's collectives, if it is not installed
            # one thread per rank: more ranks than cores, and spinning OpenMP threads would
            # fight over them
            env.setdefault("OMP_NUM_THREADS", "1")
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(
                here)), env.get("PYTHONPATH")]))
            if args.netns:
                before = _link_bytes(args.netns)
                out = _run_netns(args, method, workers, argv, env)
                after = _link_bytes(args.netns)
                # the busiest host link, per step of worker 0 (both directions)
                busiest = max(max(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before))
                link_mb = busiest / args.steps / 1e6
            else:
                cmd = [sys.executable, "-m", "collectives.run", "-np", str(np_), *extra, *argv]
                out = subprocess.run(cmd, capture_output=True, text=True,
                                     timeout=args.run_timeout, env=env)
            recs = [json.loads(line.split("@@ ", 1)[1]) for line in out.stdout.splitlines()
                    if "@@ " in line]
            if out.returncode != 0 or not recs:
                print(f"# {method} seed {seed} failed (rc {out.returncode}):\n{out.stdout[-3000:]}"
                      f"{out.stderr[-2000:]}", file=sys.stderr)
                continue
            if args.netns:
                recs[0]["link_mb"] = link_mb
            rows.setdefault(method, []).append(recs[0])
            print(f"# {method} seed {seed}: {recs[0]['step_ms']:.1f} ms/step, target at "
                  f"{recs[0]['t_target']}, final {recs[0]['final']}, busiest link "
                  f"{recs[0].get('link_mb', 0):.2f} MB/step, curve (step, acc, s) "
                  f"{recs[0]['curve']}", file=sys.stderr, flush=True)
    print(f"# load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min) at "
          f"the end; {'netns %d hosts, servers on hosts %s' % (args.netns, args.server_hosts) if args.netns else 'loopback'}")
    print(f"# {args.workers} workers ({args.servers} servers for PS), MLP 32-{args.hidden}-"
          f"{args.hidden}-10, batch {args.batch_size}/worker, {args.steps} steps, compute "
          f"{args.compute * 1e3:g} ms/step, straggler x{args.slow:g} ({args.pattern}), "
          f"target acc {args.target}, async/ssp lr x{args.async_lr_scale:g}, "
          f"{args.seeds} seeds (mean)")
    link = " busiest link MB/step |" if args.netns else ""
    print("| method | step ms (worker 0) | s to target | final acc | acc, last 5 evals | "
          "vs allreduce to target |" + link)
    print("|---|---|---|---|---|---|" + ("---|" if args.netns else ""))
    base = None
    for method in args.methods.split(","):
        rs = rows.get(method)
        if not rs:
            print(f"| {method} | failed | | | |")
            continue
        hits = [r["t_target"] for r in rs if r["t_target"] is not None]
        tt = statistics.mean(hits) if len(hits) == len(rs) else None
        if method == "allreduce":
            base = tt
        ratio = f"{base / tt:.2f}x" if base and tt else "-"
        shown = f"{tt:.2f}" if tt is not None else f"not reached ({len(hits)}/{len(rs)})"
        print(f"| {method} | {statistics.mean(r['step_ms'] for r in rs):.1f} | {shown} | "
              f"{statistics.mean(r['final'] for r in rs):.4f} | "
              f"{statistics.mean(_last5(r) for r in rs):.4f} | {ratio} |" +
              (f" {statistics.mean(r['link_mb'] for r in rs):.2f} |" if args.netns else ""))


def _last5(rec: dict) -> float:
    """Mean test accuracy of the last 5 evaluations: one evaluation of the iterate swings by
    a few points from one to the next (lr 0.05, momentum 0.9, batch 32 per worker)."""
    return statistics.mean(acc for _, acc, _ in rec["curve"][-5:])


def _link_bytes(hosts: int) -> list:
    """Bytes each netns host has received (the switch port's tbf) and sent (its veth's)."""
    def sent(ns: str, dev: str) -> int:
        out = subprocess.run(["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev",
                              dev], capture_output=True, text=True).stdout
        return int(out.split("Sent ", 1)[1].split(" ", 1)[0]) if "Sent " in out else 0
    return [(sent("coll-br", f"port{i}"), sent(f"coll-h{i}", f"veth{i}")) for i in range(hosts)]


def _run_netns(args: argparse.Namespace, method: str, workers: int, argv: list,
               env: dict) -> subprocess.CompletedProcess:
    """One run with each rank inside a bench/netns.sh host (as `bench/netns.sh run` sets
    them up: store on host 0, TCP only); returns rank 0's output, any rank's failure."""
    hosts = [w % args.netns for w in range(workers)]
    servers = 0 if method == "allreduce" else args.servers
    server_hosts = [int(h) for h in args.server_hosts.split(",")][:servers]
    if len(server_hosts) != servers or not all(0 <= h < args.netns for h in server_hosts):
        raise SystemExit(f"--server-hosts {args.server_hosts}: need {servers} hosts < "
                         f"{args.netns}")
    hosts += server_hosts
    port = 20000 + (os.getpid() * 7 + int(time.time())) % 20000
    procs = []
    for rank, h in enumerate(hosts):
        local = hosts[:rank].count(h)
        ranks_env = {"COLLECTIVES_RANK": rank, "COLLECTIVES_SIZE": len(hosts),
                     "COLLECTIVES_LOCAL_RANK": local, "COLLECTIVES_LOCAL_SIZE": hosts.count(h),
                     "COLLECTIVES_STORE_ADDR": f"10.77.0.1:{port}",
                     "COLLECTIVES_TRANSPORT": "tcp"}
        if servers:
            ranks_env["COLLECTIVES_PS_SERVERS"] = servers
        cmd = ["ip", "netns", "exec", f"coll-h{h}", "env",
               *[f"{k}={v}" for k, v in ranks_env.items()], *argv]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE if rank == 0 else
                                      subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                      env=env))
    deadline = time.monotonic() + args.run_timeout
    out, err, rc = "", "", 0
    try:
        for rank, p in enumerate(procs):
            o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            out += o or ""
            err += e[-1000:] if p.returncode else ""
            rc = rc or p.returncode
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return subprocess.CompletedProcess(argv, rc, out, err)


def main() -> None:
    """Command line: `run` (one rank of one method) or `table` (everything)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["run", "table"])
    p.add_argument("--method", choices=METHODS, default="ps-sync")
    p.add_argument("--methods", default=DEFAULT_METHODS, help=f"of {','.join(METHODS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--async-lr-scale", type=float, default=1.0,
                   help="async/ssp apply each worker's gradient alone: their lr is lr x this "
                        "(1/workers keeps the step of a round of updates that of sync)")
    p.add_argument("--compute", type=float, default=0.02, help="seconds slept per step")
    p.add_argument("--slow", type=float, default=3.0, help="the straggler's factor")
    p.add_argument("--pattern", choices=["constant", "bursts", "sigstop"], default="constant")
    p.add_argument("--target", type=float, default=0.68)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--run-timeout", type=float, default=300)
    p.add_argument("--dgc-ratio", type=float, default=0.01, help="ps-dgc: DGC's density")
    p.add_argument("--netns", type=int, default=0, metavar="H",
                   help="run the ranks on the H hosts of bench/netns.sh (0: loopback)")
    p.add_argument("--server-hosts", default="1,3", help="--netns: host of each server")
    args = p.parse_args()
    run(args) if args.what == "run" else table(args)


if __name__ == "__main__":
    main()
