"""collectives-bench: bandwidth tests of the collectives, in the nccl-tests format.

    collectives-bench allreduce -np 4 -b 8 -e 256M -f 4 --compare gloo,mpi
    collectives-run -np 4 collectives-bench allgather -b 1K -e 64M --check
    collectives-bench allreduce -np 2 -b 8 -e 8 --frontend torch   # what a torch script pays

With ``-np N`` outside a launched world this process is the *driver*: it
starts the N workers with ``collectives-run`` (and the peers' workers for
``--compare``), collects their results as JSON and prints the tables. Started
by ``collectives-run``, ``torchrun``, ``mpirun`` or ``srun`` without ``-np``
it measures in place and rank 0 prints.

Each size (from -b to -e, times -f each step) is timed out-of-place and
in-place: warm-up calls, then ``--iters`` calls each after a barrier; the
time of an iteration is that of the slowest rank, and the reported time is
the median over the iterations (collectives/bench/sweep.py measures; this
module is the command line and the driver). algbw = size / time; busbw = algbw x
2(n-1)/n (allreduce), (n-1)/n (allgather, reduce_scatter), 1 (broadcast).
``--runs R`` (driver mode) repeats the whole sweep R times and reports each
row's median over the runs.

Our allreduce algorithms are timed in turns, to compare them with each other;
each peer is timed in a job of its own. With ``--compare`` the driver also
times ``auto`` in a job of its own ("collectives-auto-alone"), and the ratios
to the peers use that row: like against like. The driver's jobs run at once
and measure in turns, size by size (collectives/bench/turns.py), so that
every library meets the same noisy minute; a size's iterations are spread
over several turns from 4 MiB on (``--turn-iters``, 2 per turn by default),
so that a noisy spell of a few seconds lands in every library's share of
them alike.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict
from typing import Optional, Sequence

from .rows import (ALONE, LiveRows, Row, bus_factor, median_rows,
                   print_comparison, print_table, row_message, run_ratios, tune_table,
                   write_csv, write_json, write_plot, write_tune_file)
from .turns import turn_orders, turn_rounds
from .frontends import FRONTENDS, make_backend

__all__ = ["Row", "parse_size", "bus_factor", "sweep_sizes", "element_count", "rank_input",
           "expected_output", "sweep", "print_table", "run_ratios", "print_comparison", "tune_table",
           "write_tune_file", "turn_orders", "turn_rounds", "build_parser", "main"]
# The worker's side, re-exported: the peers' workers and the tests reach it here too.
from .sweep import (ALGOS, MULTIHOST_ALGOS, COLLS, DTYPES, OPS, PROGRESS_TAG, Backend,  # noqa: F401
                    CollectivesBackend, device_note, draw_progress, element_count,
                    expected_output, parse_size, rank_input, sweep, sweep_sizes)

PEERS = ("gloo", "mpi", "mpi-shm")
DEFAULT_TUNE_FILE = "collectives-tune.txt"


# ------------------------------------------------------------------- cli


class _DefaultsHelp(argparse.HelpFormatter):
    """--help shows each option's default, where it has one (not None, False or "")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if action.option_strings and not (d is None or d is False or d == "" or d == argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser (shared by the driver, the workers and the peers' workers)."""
    p = argparse.ArgumentParser(prog="collectives-bench",
                                description="Bandwidth tests in the nccl-tests format.",
                                formatter_class=_DefaultsHelp)
    p.add_argument("coll", choices=COLLS, help="the collective to measure")
    p.add_argument("-np", "-n", dest="np", type=int, default=None,
                   help="launch N ranks (driver mode); without it, run inside the current world")
    p.add_argument("--algo", default=",".join(ALGOS),
                   help="allreduce algorithms, comma-separated (also two_level: reduce in each "
                        "host, across hosts on rails, broadcast in each host)")
    p.add_argument("--dtype", "-d", default="float32", choices=DTYPES, help="element type")
    p.add_argument("--op", "-o", default="sum", choices=OPS, help="reduction")
    p.add_argument("--root", "-r", type=int, default=0, help="broadcast root")
    # String defaults go through parse_size too, and --help shows them as written.
    p.add_argument("-b", "--minbytes", type=parse_size, default="8",
                   help="smallest size in bytes (K, M, G suffixes)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default="256M",
                   help="largest size in bytes (K, M, G suffixes)")
    p.add_argument("-f", "--stepfactor", type=int, default=4,
                   help="each size is the previous one times this")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size")
    p.add_argument("--warmup", "-w", type=int, default=5,
                   help="untimed iterations before them")
    p.add_argument("--turn-iters", type=int, default=2, metavar="K",
                   help="driver mode, sizes from 4M: timed iterations a job measures in one turn "
                        "before the next job takes its turn at the same size (0: all "
                        "of them; smaller sizes take one turn)")
    p.add_argument("--runs", type=int, default=1,
                   help="driver mode: run the whole sweep (ours and each --compare peer, taking "
                        "turns size by size) N times and report each row's median time over the runs")
    p.add_argument("--b2b", type=int, default=0, metavar="N",
                   help="also time each size back to back: per iteration a loop of N calls "
                        "with no barrier between them, timed as a whole and divided by N "
                        "(per rank the median loop, then the slowest rank's), as a training "
                        "loop issues its allreduces; shown in a table of its own after each "
                        "barrier-per-call table and, with --compare, in a comparison of its "
                        "own (0: off)")
    p.add_argument("--check", "-c", action="store_true",
                   help="verify every result exactly; exit non-zero if any value is wrong")
    p.add_argument("--compare", default="",
                   help=f"peers to run the same sweep, comma-separated: {','.join(PEERS)}")
    p.add_argument("--csv", default=None, metavar="FILE", help="also write the rows as CSV")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="also plot busbw against size (needs matplotlib)")
    p.add_argument("--tune", nargs="?", const=DEFAULT_TUNE_FILE, default=None, metavar="FILE",
                   help=f"allreduce: write the table auto reads (FILE omitted: {DEFAULT_TUNE_FILE})")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where the buffers live; cuda: each rank on GPU local_rank %% count, "
                        "CUDA IPC between same-host ranks (compared with the device's copy "
                        "bandwidth; the peers run on host memory only and are skipped)")
    p.add_argument("--frontend", default="mpi", choices=FRONTENDS,
                   help="the API the calls go through, to measure what a script pays: mpi "
                        "(collectives.MPI), core (the native communicator), torch "
                        "(torch.distributed on the backend, with the floor of a backend that "
                        "does nothing), hvd (Horovod's API), jax (collectives.jax in jax.jit)")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="also print each size's rows as it is measured (# measured lines), "
                        "before the tables")
    p.add_argument("--worker-json", default=None, help=argparse.SUPPRESS)
    p.add_argument("--turns", default=None, help=argparse.SUPPRESS)  # HOST:PORT,JOB (_bench_turns)
    p.add_argument("--progress", action="store_true", help=argparse.SUPPRESS)
    # set by --tune, passed on to workers: measure two_level too where the world has its shape
    p.add_argument("--tuning", action="store_true", help=argparse.SUPPRESS)
    return p


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.algos = [a.strip() for a in args.algo.split(",") if a.strip()]
    bad = [a for a in args.algos if a not in ALGOS + MULTIHOST_ALGOS]
    if bad or not args.algos:
        p.error(f"--algo {args.algo}: choose from {','.join(ALGOS + MULTIHOST_ALGOS)}")
    if args.coll != "allreduce":
        args.algos = ["auto"]
    args.peers = [x.strip() for x in args.compare.split(",") if x.strip()]
    bad = [x for x in args.peers if x not in PEERS]
    if bad:
        p.error(f"--compare {args.compare}: unknown peer {bad[0]!r}; choose from {','.join(PEERS)}")
    if args.tune and args.coll != "allreduce":
        p.error("--tune applies to allreduce only")
    if args.tune:
        args.algos = ["ring", "tree", "butterfly"]  # + two_level on a multi-host world (run_worker)
        args.tuning = True
    if args.iters < 1 or args.warmup < 0 or args.turn_iters < 0:
        p.error("--iters must be >= 1, --warmup and --turn-iters >= 0")
    if args.runs < 1:
        p.error("--runs must be >= 1")
    if args.b2b < 0:
        p.error("--b2b must be >= 0")
    if args.device == "cuda" and args.frontend not in ("mpi", "core"):
        p.error(f"--device cuda: measured through --frontend mpi or core only")
    if args.tune and args.frontend != "mpi":
        p.error("--tune measures the core's algorithms: --frontend mpi")
    try:
        args.sizes = sweep_sizes(args.minbytes, args.maxbytes, args.stepfactor)
    except ValueError as exc:
        p.error(str(exc))


def worker_args(args: argparse.Namespace, algos: Optional[Sequence[str]] = None) -> list[str]:
    """The sweep options to pass on to a worker (never -np, --compare or outputs); algos
    replaces --algo."""
    out = [args.coll, "--algo", ",".join(algos or args.algos), "--dtype", args.dtype, "--op", args.op,
           "--root", str(args.root), "-b", str(args.minbytes), "-e", str(args.maxbytes),
           "-f", str(args.stepfactor), "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--turn-iters", str(args.turn_iters), "--device", args.device, "--b2b", str(args.b2b),
           "--frontend", args.frontend]
    return out + (["--check"] if args.check else []) + (["--tuning"] if args.tuning else [])


def run_worker(args: argparse.Namespace, backend: Backend) -> int:
    """Sweep on this rank; rank 0 writes --worker-json or prints. Returns the exit code."""
    if args.coll == "broadcast" and not 0 <= args.root < backend.size:
        raise SystemExit(f"collectives-bench: --root {args.root} is not a rank of {backend.size}")
    device = None
    if args.device == "cuda":
        import collectives
        from .. import _core

        if not collectives.cuda_available():
            raise SystemExit("collectives-bench: --device cuda needs a CUDA build and a GPU "
                             f"(cuda_built() is {collectives.cuda_built()}, "
                             f"{_core.cuda_device_count()} devices)")
        device = backend.comm.local_rank % _core.cuda_device_count()
    gate = None
    if args.turns:
        from .turns import TurnGate

        gate = TurnGate(args.turns, backend.rank, backend.size)
    # Each size as soon as it is measured: to the driver, or printed here as it would.
    shown = None if args.worker_json else LiveRows(len(args.sizes), "", sys.stderr.isatty(),
                                                   lambda: draw_progress(1, 1, ""),
                                                   verbose=args.verbose)

    def live(rows: list) -> None:
        if shown is not None:
            shown.handle("collectives", row_message(rows))
            return
        sys.stderr.write(row_message(rows))
        sys.stderr.flush()
    algos = list(args.algos)
    shape = getattr(backend, "shape", lambda: "")()
    if args.tuning and shape and "two_level" not in algos:
        # On a world in two levels the table keys its rows by shape (HxL) and
        # auto picks among two_level and the flat algorithms per size.
        algos.append("two_level")
    try:
        rows, notes = sweep(backend, args.coll, algos, args.dtype, args.op, args.sizes,
                            args.iters, args.warmup, args.check, args.root,
                            progress=True if args.progress else None, device=device, gate=gate,
                            turn_iters=args.turn_iters, on_rows=live, b2b=args.b2b)
    finally:
        if gate is not None:
            gate.close()
    if device is not None and backend.rank == 0:
        sharing = -(-backend.comm.local_size // max(1, _core.cuda_device_count()))
        notes = notes + device_note(device, rows, coll=args.coll, sharing=sharing)
    backend.finish()
    if backend.rank == 0:
        if args.worker_json:
            with open(args.worker_json, "w", encoding="utf-8") as fh:
                json.dump({"rows": [asdict(r) for r in rows], "notes": notes,
                           "transport": backend.transport()}, fh)
        else:
            report(args, rows, notes, backend.transport())
    return 1 if any(r.wrong for r in rows) else 0


def report(args: argparse.Namespace, rows: list[Row], notes: Sequence[str],
           transport: str = "", runs: Sequence[Sequence[Row]] = ()) -> None:
    """Print the tables and write --csv/--json/--plot/--tune (on the driver or rank 0);
    transport keys the --tune rows (see write_tune_file); runs, each run's rows where
    there were several, give the comparison each ratio's spread."""
    seen = set()
    for note in notes:
        if note not in seen:
            print(f"# note: {note}")
            seen.add(note)
    print_table(rows)
    if args.check:
        wrong = sum(r.wrong or 0 for r in rows)
        print(f"# Wrong values total   : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    print_comparison(rows, runs=runs)
    if args.csv:
        write_csv(rows, args.csv)
    if args.json:
        write_json(rows, args.json)
    if args.plot:
        write_plot(rows, args.plot)
    if args.tune:
        table = tune_table(rows)
        write_tune_file(table, args.tune, transport)
        over = f" over {transport}" if transport in ("tcp", "shm") else \
            (f" on {transport} (hosts x ranks per host)" if transport else "")
        print(f"# wrote the allreduce table for {rows[0].nranks} ranks{over} to {os.path.abspath(args.tune)} "
              f"({len(table)} rows); use it with COLLECTIVES_TUNE_FILE={os.path.abspath(args.tune)}")
    sys.stdout.flush()


def _child_stderr(show_progress: bool, label: str, line: str) -> None:
    """A line a worker job wrote to stderr: its progress lines drawn as a bar, others
    passed through."""
    at = line.find(PROGRESS_TAG)
    if at < 0:
        sys.stderr.write(line)
        return
    parts = line[at + len(PROGRESS_TAG):].split(None, 2)
    if show_progress and len(parts) >= 2:
        draw_progress(int(parts[0]), int(parts[1]),
                      f"{label}: {parts[2].strip() if len(parts) > 2 else ''}")


def drive(args: argparse.Namespace) -> int:
    """Driver mode: launch our workers and the peers', collect the JSON, report."""
    from . import peers as _bench_peers, turns as _bench_turns

    env = dict(os.environ)
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    show = sys.stderr.isatty()
    extra = ["--progress"] if show else []
    rows: list[Row] = []
    notes: list[str] = []
    transport = ""
    rc = 0
    peers = []
    for peer in args.peers:
        why = _bench_peers.missing(peer)
        if args.device == "cuda":
            why = "--device cuda measures this library against the device copy bandwidth"
        if why:
            print(f"# skipping {peer}: {why}", flush=True)
        else:
            peers.append(peer)
    alone = bool(peers) and "auto" in args.algos and len(args.algos) > 1

    def jobs_in(folder: str) -> list[tuple[str, list[str]]]:
        """The run's jobs, each command ending with --worker-json <folder>/<job>.json."""
        def ours(name: str, algos: Optional[Sequence[str]] = None) -> tuple[str, list[str]]:
            return (name, [sys.executable, "-m", "collectives.run", "-np", str(args.np),
                           sys.executable, "-m", "collectives.bench", *worker_args(args, algos),
                           *extra, "--worker-json", os.path.join(folder, f"{name}.json")])

        jobs = [ours("collectives")]
        if alone:
            jobs.append(ours(ALONE, ["auto"]))  # timed like the peers: a job of its own
        for peer in peers:
            jobs.append((peer, _bench_peers.command(peer, args.np, worker_args(args) + extra,
                                                    os.path.join(folder, f"{peer}.json"))))
        return jobs

    with tempfile.TemporaryDirectory(prefix="collectives-bench-") as tmp:
        runs: list[list[Row]] = []
        for run in range(args.runs):
            # All jobs at once, measuring in turns size by size (_bench_turns): a
            # noisy spell on a shared machine hits every library alike. Each run
            # in a folder of its own: no file of an earlier run is read again.
            folder = os.path.join(tmp, f"run{run + 1}")
            os.mkdir(folder)
            jobs = jobs_in(folder)
            suffix = "" if args.runs == 1 else f" (run {run + 1}/{args.runs})"
            nsteps = sum(len(turn_rounds(args.iters, args.turn_iters, nbytes))
                         for nbytes in args.sizes)
            live = LiveRows(len(args.sizes), suffix, show, lambda: draw_progress(1, 1, ""),
                            verbose=args.verbose)
            codes = _bench_turns.run_in_turns(
                jobs, env, nsteps, turn_orders,  # rows printed as they come, else progress
                lambda name, line: live.handle(name, line) or _child_stderr(show, name + suffix,
                                                                           line))
            got: list[Row] = []
            for name, cmd in jobs:
                path, code = cmd[-1], codes[name]
                if not os.path.exists(path):
                    print(f"# {name}{suffix}: the run failed (exit code {code}) and left no results",
                          flush=True)
                    rc = rc or (code or 1)
                    continue
                with open(path, encoding="utf-8") as fh:
                    data = json.load(fh)
                got += [Row(**{**r, "impl": ALONE}) if name == ALONE else Row(**r)
                        for r in data["rows"]]
                notes += data["notes"] if run == 0 else []
                if name == "collectives":
                    transport = data.get("transport", "")
                if code and name in ("collectives", ALONE):
                    rc = code
            runs.append(got)
        rows = median_rows(runs)
        if args.runs > 1:
            notes.append(f"each time is the median over {args.runs} runs of the whole sweep")
    if rows:
        report(args, rows, notes, transport, runs)
    if any(r.wrong for r in rows):
        rc = rc or 1
    return rc


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of collectives-bench; returns the exit code."""
    p = build_parser()
    args = p.parse_args(argv)
    _check_args(p, args)
    if args.plot and not args.worker_json:  # fail before measuring, not after
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            p.error("--plot needs matplotlib (pip install 'collectives[bench]' or pip install matplotlib)")
    from ..rendezvous.env import detect

    info = detect()
    in_world = info.size > 1 or "COLLECTIVES_RANK" in os.environ
    if args.np is not None and not in_world and not args.worker_json:
        if args.np < 1:
            p.error("-np must be at least 1")
        return drive(args)
    if args.np is not None and args.np != info.size:
        print(f"# note: -np {args.np} ignored: already inside a world of {info.size} ranks",
              file=sys.stderr)
    if args.peers and not args.worker_json:
        print("# --compare runs only in driver mode (collectives-bench ... -np N); ignored",
              file=sys.stderr)
    return run_worker(args, make_backend(args.frontend))


if __name__ == "__main__":
    sys.exit(main())
