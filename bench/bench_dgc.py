"""Deep Gradient Compression vs dense, fp16 and top-k: accuracy, bytes on the wire, step time.

    # accuracy (and bytes) on a generated task, 4 ranks, 3 seeds each:
    python -m collectives.run -np 4 python bench/bench_dgc.py accuracy --seeds 3
    # time per step of a ~10 M parameter MLP on a 4-host 1 Gbit/s network:
    bench/netns.sh up 4 1gbit      # as root
    PYTHONPATH=$PWD bench/netns.sh run 4 python bench/bench_dgc.py time
    bench/netns.sh down 4
    # end to end on a ~25 M parameter MLP (~100 MB fp32 gradient), interleaved:
    # dense fp32, fp16, DGC 0.1 % and PowerSGD rank 4 (DDP powerSGD_hook over the
    # torch.distributed backend "collectives"), and local SGD with no exchange (the
    # floor of a step on this host): step time, bytes, accuracy
    PYTHONPATH=$PWD bench/netns.sh run 4 python bench/bench_dgc.py e2e --width 3300
    # compression time per step, fused native pass vs the torch-op reference (1 process):
    PYTHONPATH=$PWD python bench/bench_dgc.py compress --width 3300

Methods: dense (fp32 allreduce, momentum SGD), fp16 (Compression.fp16), top-k
with error feedback (TopKCompressor + momentum SGD) and DGC (DGC + DGCSGD:
momentum correction, masking, local clipping, warm-up), at densities 1 % and
0.1 %.

accuracy: a teacher network (random 2-layer tanh MLP) labels Gaussian inputs
into 10 classes; each rank trains a 32-256-256-10 student on fresh samples
every step (an "epoch" is --train samples over all ranks) for --epochs
epochs; test accuracy on 4096 held-out samples. DGC warms up over the first
--warmup epochs (densities compress_ratio**((e+1)/(W+1))); top-k does not
warm up (the simpler baseline).

bytes: what one rank puts on the wire per step for the gradients: dense =
4 B x parameters (fp16: 2 B), sparse = its packed buffer (counts, values,
indices) + the 8 B size exchange + the dense small tensors. ratio = dense fp32
/ sent; "steady" is after warm-up.

time: the median over steps of the slowest rank's step (forward, backward,
compression, exchange, update), round-robin over the methods.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import collectives.torch as hvd
from collectives.torch.dgc import DGC, DGCSGD, TopKCompressor

METHODS = [("dense", None), ("fp16", None), ("topk", 0.01), ("topk", 0.001), ("dgc", 0.01),
           ("dgc", 0.001)]


def make_optimizer(method: str, density: float, model: nn.Module, lr: float, momentum: float,
                   wd: float, warmup: int, steps_per_epoch: int, clip: float):
    """The DistributedOptimizer for one method, and its compressor (None for dense/fp16)."""
    comp = None
    if method == "dgc":
        comp = DGC(compress_ratio=density, momentum=momentum, clip_norm=clip,
                   warmup_epochs=warmup, steps_per_epoch=steps_per_epoch)
        base = DGCSGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=wd)
    else:
        base = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=wd)
        if method == "topk":
            comp = TopKCompressor(compress_ratio=density)
    compression = comp if comp is not None else \
        (hvd.Compression.fp16 if method == "fp16" else hvd.Compression.none)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                   compression=compression)
    return opt, comp


def step_bytes(method: str, comp, numel: int) -> int:
    """Gradient bytes this rank put on the wire in the last step."""
    if comp is None:
        return numel * (2 if method == "fp16" else 4)
    return comp.stats["dense_bytes"] + comp.stats["sparse_bytes"]


# ------------------------------------------------------------------ accuracy

def teacher_data(n: int, seed: int) -> tuple:
    """n Gaussian inputs (32-d) labelled by a fixed random teacher network."""
    g = torch.Generator().manual_seed(1234)  # the teacher is the same for every run
    w1 = torch.randn(32, 64, generator=g) / 32 ** 0.5
    w2 = torch.randn(64, 10, generator=g) / 8
    gx = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=gx)
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def run_accuracy(args: argparse.Namespace) -> None:
    """Train every method and seed; rank 0 prints the accuracy and bytes table."""
    r, n = hvd.rank(), hvd.size()
    xte, yte = teacher_data(4096, seed=2)
    steps_per_epoch = args.train // (args.batch_size * n)
    rows = []
    for method, density in METHODS:
        accs, ratios, steady = [], [], []
        for seed in range(args.seeds):
            torch.manual_seed(100 + seed)
            model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                  nn.Linear(256, 10))
            numel = sum(p.numel() for p in model.parameters())
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            opt, comp = make_optimizer(method, density, model, args.lr, 0.9, 1e-4, args.warmup,
                                       steps_per_epoch, args.clip)
            sent, sent_steady = [], []
            for epoch in range(args.epochs):
                for i in range(steps_per_epoch):
                    # fresh samples every step: no overfitting, accuracy keeps rising
                    xb, yb = teacher_data(args.batch_size,
                                          seed=((seed * 1000 + epoch) * 1000 + i) * n + r + 10)
                    opt.zero_grad()
                    F.cross_entropy(model(xb), yb).backward()
                    opt.step()
                    b = step_bytes(method, comp, numel)
                    sent.append(b)
                    if epoch >= args.warmup:
                        sent_steady.append(b)
            with torch.no_grad():
                acc = (model(xte).argmax(1) == yte).float().mean().item()
            opt.remove_hooks()
            accs.append(acc)
            ratios.append(4 * numel / statistics.mean(sent))
            steady.append(4 * numel / statistics.mean(sent_steady))
        rows.append((method, density, accs, statistics.mean(ratios), statistics.mean(steady),
                     numel))
    if r == 0:
        print(f"# accuracy: {n} ranks, {args.epochs} epochs x {steps_per_epoch} steps, batch "
              f"{args.batch_size}/rank, lr {args.lr}, {args.seeds} seeds, DGC warm-up "
              f"{args.warmup} epochs, {rows[0][5]} parameters")
        print(f"{'method':>8} {'density':>8} {'acc mean':>9} {'std':>7} {'min':>7} {'max':>7} "
              f"{'bytes ratio (all)':>18} {'(after warm-up)':>16}")
        for method, density, accs, ratio, steady_ratio, _ in rows:
            sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
            dens = "-" if density is None else f"{density * 100:g}%"
            print(f"{method:>8} {dens:>8} {statistics.mean(accs) * 100:8.2f}% {sd * 100:6.2f}% "
                  f"{min(accs) * 100:6.2f}% {max(accs) * 100:6.2f}% {ratio:17.1f}x "
                  f"{steady_ratio:15.1f}x")


# ------------------------------------------------------------------ time

def run_time(args: argparse.Namespace) -> None:
    """Time steps of a wide MLP for every method (round-robin); rank 0 prints the table."""
    r = hvd.rank()
    torch.manual_seed(0)
    w = args.width
    model = nn.Sequential(nn.Linear(1024, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                          nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10))
    numel = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(r)
    x = torch.randn(args.batch_size, 1024, generator=g)
    y = torch.randint(0, 10, (args.batch_size,), generator=g)
    runs = {}
    for method, density in METHODS:
        opt, comp = make_optimizer(method, density or 1.0, model, 0.01, 0.9, 0.0, 0, 1, None)
        opt.remove_hooks()  # re-attached per round below
        runs[(method, density)] = [opt, comp, [], []]

    def step(opt) -> float:
        hvd.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        return float(hvd.allreduce(dt, op=hvd.Max, name="bench.time"))

    for rnd in range(args.rounds):
        for key, run in runs.items():
            opt, comp = run[0], run[1]
            opt._hooks = [p.register_post_accumulate_grad_hook(opt._on_grad)
                          for p in model.parameters()]
            for i in range(args.steps):
                t = step(opt)
                if rnd > 0 or i >= args.skip:
                    run[2].append(t)
                    run[3].append(step_bytes(key[0], comp, numel))
            opt.remove_hooks()
    if r == 0:
        print(f"# time per step: {hvd.size()} ranks, MLP 1024-{w}-{w}-{w}-10 "
              f"({numel / 1e6:.1f} M parameters), batch {args.batch_size}/rank, "
              f"{len(runs[('dense', None)][2])} timed steps each")
        base = statistics.median(runs[("dense", None)][2])
        print(f"{'method':>8} {'density':>8} {'step ms':>9} {'speedup':>8} {'bytes/step':>12} "
              f"{'bytes ratio':>12}")
        for (method, density), (_, _, times, sent) in runs.items():
            med = statistics.median(times)
            dens = "-" if density is None else f"{density * 100:g}%"
            print(f"{method:>8} {dens:>8} {med * 1e3:9.1f} {base / med:7.2f}x "
                  f"{statistics.mean(sent):12.0f} {4 * numel / statistics.mean(sent):11.1f}x")


# ------------------------------------------------------------------ end to end

# "local": plain SGD with no exchange at all, the step time no method that still
# communicates can beat (forward, backward and the update on this host)
E2E_METHODS = ["dense", "fp16", "dgc", "powersgd", "local"]


def e2e_data(n: int, seed: int, din: int) -> tuple:
    """n Gaussian inputs (din-d) labelled into 10 classes by a fixed random teacher."""
    g = torch.Generator().manual_seed(4321)
    w1 = torch.randn(din, 64, generator=g) / din ** 0.5
    w2 = torch.randn(64, 10, generator=g) / 8
    x = torch.randn(n, din, generator=torch.Generator().manual_seed(seed))
    return x, (torch.tanh(x @ w1) @ w2).argmax(1)


def powersgd_bytes(model: nn.Module, rank: int) -> int:
    """PowerSGD's payload per step: P and Q (rank columns) per matrix, 1-D tensors whole."""
    total = 0
    for p in model.parameters():
        if p.dim() >= 2:
            a, b = p.shape[0], p.numel() // p.shape[0]
            total += 4 * min(rank * (a + b), a * b)
        else:
            total += 4 * p.numel()
    return total


def run_e2e(args: argparse.Namespace) -> None:
    """Train one model per method, round-robin in blocks of steps; rank 0 prints the table."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    r, n = hvd.rank(), hvd.size()
    w, din = args.width, 1024
    dist.init_process_group("collectives", init_method=f"tcp://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:"
                            f"{args.torch_port}", rank=r, world_size=n)
    total_steps = args.rounds * args.steps
    warm = max(1, total_steps // 8)  # DGC warm-up: 2 "epochs" of an eighth of the budget
    runs = {}
    for method in E2E_METHODS:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(din, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                              nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10))
        numel = sum(p.numel() for p in model.parameters())
        comp, net = None, model
        if method == "powersgd":
            # one DDP bucket: PowerSGD's hook issues its P/Q allreduces from completion
            # callbacks, and with several buckets their order against the next bucket's
            # first allreduce differs between ranks (a hang on an in-order backend)
            net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1024)
            state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                       start_powerSGD_iter=2, min_compression_rate=2)
            net.register_comm_hook(state, psgd.powerSGD_hook)
            opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        elif method == "local":
            opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        elif method == "dgc":
            comp = DGC(compress_ratio=args.density, momentum=0.9, warmup_epochs=2,
                       steps_per_epoch=warm)
            opt = hvd.DistributedOptimizer(DGCSGD(model.parameters(), lr=args.lr, momentum=0.9),
                                           named_parameters=model.named_parameters(),
                                           compression=comp)
        else:
            opt = hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                named_parameters=model.named_parameters(),
                compression=hvd.Compression.fp16 if method == "fp16" else hvd.Compression.none)
            opt.remove_hooks()  # re-attached for its own steps (one hook set at a time)
        if method == "dgc":
            opt.remove_hooks()
        runs[method] = dict(net=net, model=model, opt=opt, comp=comp, times=[], bytes=[],
                            numel=numel, step=0, parts=[])

    def one_step(run: dict, method: str) -> None:
        step = run["step"]
        x, y = e2e_data(args.batch_size, (step * n + r) * 7 + 1, din)
        hvd.barrier()
        t0 = time.perf_counter()
        run["opt"].zero_grad()
        loss = F.cross_entropy(run["net"](x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        run["opt"].step()
        t3 = time.perf_counter()
        dt = torch.tensor([t3 - t0, t1 - t0, t2 - t1, t3 - t2], dtype=torch.float64)
        dt = hvd.allreduce(dt, op=hvd.Max, name="bench.e2e.time")
        run["step"] += 1
        if run["step"] > warm * 2 + 1:  # after DGC's warm-up and PowerSGD's start, for all
            run["times"].append(float(dt[0]))
            run["parts"].append(dt[1:].tolist())
            if method == "powersgd":
                run["bytes"].append(powersgd_bytes(run["model"], 4))
            elif method == "local":
                run["bytes"].append(0)
            elif run["comp"] is not None:
                st = run["comp"].stats
                run["bytes"].append(st["dense_bytes"] + st["sparse_bytes"])
            else:
                run["bytes"].append(run["numel"] * (2 if method == "fp16" else 4))

    for rnd in range(args.rounds):
        for method, run in runs.items():
            opt = run["opt"]
            hooked = method not in ("powersgd", "local")
            if hooked:
                opt._hooks = [p.register_post_accumulate_grad_hook(opt._on_grad)
                              for p in run["model"].parameters()]
            for _ in range(args.steps):
                one_step(run, method)
            if hooked:
                opt.remove_hooks()
        if r == 0:
            print(f"# round {rnd + 1}/{args.rounds} done", flush=True)
    xte, yte = e2e_data(2048, 99, din)
    accs = {}
    with torch.no_grad():
        for method, run in runs.items():
            accs[method] = (run["model"](xte).argmax(1) == yte).float().mean().item()
    if r == 0:
        numel = runs["dense"]["numel"]
        print(f"# e2e: {n} ranks, MLP {din}-{w}-{w}-{w}-10 ({numel / 1e6:.1f} M parameters, "
              f"{4 * numel / 1e6:.0f} MB fp32 gradient), batch {args.batch_size}/rank, "
              f"{total_steps} steps per method in {args.rounds} interleaved rounds, lr {args.lr}, "
              f"DGC {args.density * 100:g}% (warm-up {2 * warm} steps), PowerSGD rank 4; "
              f"load: {open('/proc/loadavg').read().split()[:3]}")
        base = statistics.median(runs["fp16"]["times"])
        print(f"{'method':>9} {'step ms':>9} {'vs fp16':>8} {'fwd ms':>7} {'bwd ms':>8} "
              f"{'step() ms':>9} {'bytes/step':>12} {'test acc':>9}")
        for method, run in runs.items():
            med = statistics.median(run["times"])
            parts = [statistics.median(p[i] for p in run["parts"]) * 1e3 for i in range(3)]
            print(f"{method:>9} {med * 1e3:9.1f} {base / med:7.2f}x {parts[0]:7.1f} "
                  f"{parts[1]:8.1f} {parts[2]:9.1f} {statistics.mean(run['bytes']):12.0f} "
                  f"{accs[method] * 100:8.2f}%")
        floor = statistics.median(runs["local"]["times"])
        print(f"# the floor: no exchange at all takes {floor * 1e3:.1f} ms a step, so no method "
              f"that communicates can be more than {base / floor:.2f}x faster than fp16 here")
    dist.destroy_process_group()


def run_compress(args: argparse.Namespace) -> None:
    """Time DGC's selection for the e2e model's weight shapes: fused pass vs torch reference.

    Alternates the two for --rounds x --steps steps on the same gradients (the
    memory of each evolves the same way: the results are bit-identical) and
    prints the median time per step of each and their ratio.
    """
    w = args.width
    shapes = [(w, 1024), (w, w), (w, w), (10, w)]
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(*s, generator=g) for s in shapes]
    comps = {f: DGC(compress_ratio=args.density, momentum=0.9, fused=f) for f in (True, False)}
    times: dict = {True: [], False: []}
    for i in range(args.rounds * args.steps):
        for f, comp in comps.items():
            t0 = time.perf_counter()
            for j, gr in enumerate(grads):
                comp.select(f"t{j}", gr, j)
            times[f].append(time.perf_counter() - t0)
            comp.end_step()
    numel = sum(t.numel() for t in grads)
    fused, ref = statistics.median(times[True]), statistics.median(times[False])
    print(f"# compress: DGC {args.density * 100:g}% over {numel / 1e6:.1f} M entries "
          f"({len(shapes)} tensors), {len(times[True])} steps each, alternating; load "
          f"{open('/proc/loadavg').read().split()[:3]}")
    print(f"torch reference {ref * 1e3:8.1f} ms/step   fused native {fused * 1e3:8.1f} ms/step   "
          f"ratio {ref / fused:5.2f}x")


def main() -> None:
    """Parse arguments and run one mode."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["accuracy", "time", "e2e", "compress"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2, help="DGC warm-up epochs")
    parser.add_argument("--train", type=int, default=8192, help="training samples (all ranks)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--clip", type=float, default=None, help="DGC clip_norm")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=6, help="time: steps per method per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip", type=int, default=1, help="time: untimed first steps")
    parser.add_argument("--density", type=float, default=0.001, help="e2e: DGC density")
    parser.add_argument("--torch-port", type=int, default=29533, help="e2e: torch store port")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.mode == "compress":
        run_compress(args)
        return
    hvd.init()
    if args.mode == "accuracy":
        run_accuracy(args)
    elif args.mode == "e2e":
        run_e2e(args)
    else:
        run_time(args)


if __name__ == "__main__":
    main()
