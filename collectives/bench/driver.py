"""collectives-bench: bandwidth tests of the collectives, in the nccl-tests format.

    collectives-bench allreduce -np 4 -b 8 -e 256M -f 4 --compare gloo,mpi
    collectives-run -np 4 collectives-bench allgather -b 1K -e 64M --check

With ``-np N`` outside a launched world this process is the *driver*: it
starts the N workers with ``collectives-run`` (and the peers' workers for
``--compare``), collects their results as JSON and prints the tables. Started
by ``collectives-run``, ``torchrun``, ``mpirun`` or ``srun`` without ``-np``
it measures in place and rank 0 prints.

Each size (from -b to -e, times -f each step) is timed out-of-place and
in-place: warm-up calls, then ``--iters`` calls each after a barrier; the
time of an iteration is that of the slowest rank, and the reported time is
the median over the iterations. algbw = size / time; busbw = algbw x
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

import abc
import argparse
import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .rows import (ALONE, LiveRows, Row, bus_factor, median_rows,
                   print_comparison, print_table, row_message, run_ratios, tune_table,
                   write_csv, write_json, write_plot, write_tune_file)
from .turns import turn_orders, turn_rounds

__all__ = ["Row", "parse_size", "bus_factor", "sweep_sizes", "element_count", "rank_input",
           "expected_output", "sweep", "print_table", "run_ratios", "print_comparison", "tune_table",
           "write_tune_file", "turn_orders", "turn_rounds", "build_parser", "main"]

COLLS = ("allreduce", "allgather", "broadcast", "reduce_scatter")
DTYPES = ("int8", "uint8", "int32", "int64", "float16", "float32", "float64")
OPS = ("sum", "prod", "min", "max")
ALGOS = ("ring", "tree", "butterfly", "auto")
PEERS = ("gloo", "mpi", "mpi-shm")
DEFAULT_TUNE_FILE = "collectives-tune.txt"
PROGRESS_TAG = "@@collectives-bench-progress"


# ------------------------------------------------------------------ sizes


def parse_size(text: str) -> int:
    """'8' -> 8, '64K' -> 65536, '256M' -> 268435456, '1G' -> 1073741824 (binary units)."""
    t = text.strip().upper()
    if t.endswith("B"):
        t = t[:-1]
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: expected e.g. 8, 64K, 256M, 1G") from None


def human_size(nbytes: int) -> str:
    """65536 -> '64K' (for labels)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def sweep_sizes(begin: int, end: int, factor: int) -> list[int]:
    """begin, begin*factor, ... up to end (inclusive)."""
    if begin < 1 or end < begin or factor < 2:
        raise ValueError(f"bad sweep -b {begin} -e {end} -f {factor}: need 1 <= b <= e and f >= 2")
    out, size = [], begin
    while size <= end:
        out.append(size)
        size *= factor
    return out


def element_count(coll: str, nbytes: int, itemsize: int, nranks: int) -> int:
    """Elements for a message of nbytes: allgather/reduce_scatter round down to a multiple of n (>= n)."""
    count = max(1, nbytes // itemsize)
    if coll in ("allgather", "reduce_scatter"):
        count = max(nranks, count - count % nranks)
    return count


# ------------------------------------------------------------------- data
# Inputs are small rank-derived integers, so every result is exact in every
# dtype: sums stay below 4n, products are 2 (one rank holds a 2, the others 1).


def _reduce_pattern(op: str, rank: int, nranks: int, length: int) -> np.ndarray:
    idx = np.arange(length, dtype=np.int64) + rank
    if op == "prod":
        return np.where(idx % nranks == 0, 2, 1)
    return idx % 4 + 1


def rank_input(coll: str, op: str, dtype: str, rank: int, nranks: int, count: int) -> np.ndarray:
    """What `rank` contributes: count elements (allgather: its block of count/n)."""
    if coll == "allgather":
        block = count // nranks
        return (((np.arange(block) + 3 * rank) % 16) + 1).astype(dtype)
    if coll == "broadcast":
        return ((np.arange(count) % 16) + 1).astype(dtype)
    period = 4 * nranks
    return np.resize(_reduce_pattern(op, rank, nranks, period).astype(dtype), count)


def expected_output(coll: str, op: str, dtype: str, rank: int, nranks: int, count: int) -> np.ndarray:
    """What `rank` must hold after the collective (reduce_scatter: its block), computed in dtype."""
    if coll == "allgather":
        return np.concatenate([rank_input(coll, op, dtype, r, nranks, count) for r in range(nranks)])
    if coll == "broadcast":
        return rank_input(coll, op, dtype, 0, nranks, count)
    period = 4 * nranks
    ufunc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op]
    acc = _reduce_pattern(op, 0, nranks, period).astype(dtype)
    for r in range(1, nranks):
        acc = ufunc(acc, _reduce_pattern(op, r, nranks, period).astype(dtype))
    full = np.resize(acc, count)
    if coll == "reduce_scatter":
        block = count // nranks
        return full[rank * block:(rank + 1) * block]
    return full


def make_buffers(coll: str, inp: np.ndarray, rank: int, nranks: int, count: int,
                 inplace: bool, root: int) -> tuple[Optional[np.ndarray], np.ndarray, Callable[[], None]]:
    """(sendbuf or None when in place, recvbuf, refill): the buffers of one case.

    In place, recvbuf holds the input: allgather's own block at rank*block,
    reduce_scatter's whole input. refill() restores the input.
    """
    dtype = inp.dtype
    if coll == "broadcast":
        buf = np.zeros(count, dtype)

        def refill_b() -> None:
            if rank == root:
                np.copyto(buf, inp)
            else:
                buf.fill(0)
        refill_b()
        return None, buf, refill_b
    if coll == "allgather":
        block = count // nranks
        recv = np.zeros(count, dtype)
        if inplace:
            def refill_g() -> None:
                recv.fill(0)
                np.copyto(recv[rank * block:(rank + 1) * block], inp)
            refill_g()
            return None, recv, refill_g
        return inp.copy(), recv, lambda: recv.fill(0)
    if inplace:  # allreduce, reduce_scatter
        buf = inp.copy()
        return None, buf, lambda: np.copyto(buf, inp)
    out_count = count // nranks if coll == "reduce_scatter" else count
    recv = np.zeros(out_count, dtype)
    return inp.copy(), recv, lambda: recv.fill(0)


def result_view(coll: str, send: Any, recv: Any, nranks: int) -> Any:
    """Where a case's result lands: recv, or its first block for in-place reduce_scatter
    (a device buffer is returned whole: the sweep takes the view on its host copy)."""
    if coll == "reduce_scatter" and send is None and isinstance(recv, np.ndarray):
        return recv[:len(recv) // nranks]
    return recv


class DeviceCase:
    """A case's buffers mirrored in GPU memory (--device cuda): the collective runs
    on the device copies; refill() and fetch() move the host arrays in and out."""

    def __init__(self, send: Optional[np.ndarray], recv: np.ndarray, device: int) -> None:
        from .. import _core

        self.host_send, self.host_recv = send, recv
        self.send = None if send is None else _core.DeviceBuffer(send.nbytes, str(send.dtype), device)
        self.recv = _core.DeviceBuffer(recv.nbytes, str(recv.dtype), device)

    def refill(self) -> None:
        """Copy the (refilled) host input to the device."""
        if self.send is not None:
            self.send.copy_from(self.host_send)
        self.recv.copy_from(self.host_recv)

    def fetch(self) -> None:
        """Copy the device result back into the host recv array."""
        self.recv.copy_to(self.host_recv)


def device_note(device: int, rows: Sequence["Row"], nbytes: int = 256 << 20) -> list[str]:
    """The device's own copy bandwidth, and each implementation's largest-size busbw over it."""
    from .. import _core

    copy = _core.cuda_copy_bandwidth(device, nbytes)
    notes = [f"device {device} device-to-device copy (cudaMemcpy, {human_size(nbytes)}): "
             f"{copy:.1f} GB/s, the physical limit"]
    for impl in dict.fromkeys(r.impl for r in rows):
        best = max((r for r in rows if r.impl == impl and r.busbw), key=lambda r: r.size,
                   default=None)
        if best is not None:
            notes.append(f"{impl} {human_size(best.size)}: busbw {best.busbw:.1f} GB/s = "
                         f"{best.busbw / copy:.2f} x the device copy")
    return notes


# ----------------------------------------------------------------- sweep


class Backend(abc.ABC):
    """What a sweep needs from a communication library (ours, gloo, MPI)."""

    name = "?"
    rank = 0
    size = 1
    tolerate_errors = True  # a peer's error on a case marks it unsupported; ours fails the run

    def impls(self, algos: Sequence[str]) -> list[tuple[str, str]]:
        """(impl name, algorithm) pairs to measure."""
        return [(self.name, "")]

    @abc.abstractmethod
    def barrier(self) -> None:
        """Block until every rank arrives."""

    @abc.abstractmethod
    def allreduce_f64(self, arr: np.ndarray, op: str) -> None:
        """In-place allreduce of a float64 array with op "max" or "sum"."""

    @abc.abstractmethod
    def call(self, coll: str, algo: str, op: str, send: Optional[np.ndarray], recv: np.ndarray,
             root: int) -> tuple[Optional[Callable[[], None]], np.ndarray]:
        """(the call to time, or None if unsupported; the view where the result lands)."""

    def finish(self) -> None:
        """Release the library."""

    def transport(self) -> str:
        """The transport key of this world's auto table rows: "shm" or "tcp" ("" if unknown)."""
        return ""


class CollectivesBackend(Backend):
    """This library, through collectives.MPI."""

    name = "collectives"
    tolerate_errors = False

    def __init__(self) -> None:
        from .. import MPI

        self._use(MPI)

    def _use(self, MPI: Any) -> None:
        """Run on `MPI`, a module with mpi4py's API (ours, or mpi4py itself)."""
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

    def _allreduce_call(self, send: Any, recv: np.ndarray, mop: Any, algo: str) -> Callable[[], None]:
        """The timed Allreduce, our algorithm choice a plain keyword: passing it through
        ``**options`` cost either library about 0.2 us a call, a fifth of an 8-byte one."""
        c, algorithm = self.comm, algo or "auto"
        return lambda: c.Allreduce(send, recv, op=mop, algorithm=algorithm)

    def impls(self, algos: Sequence[str]) -> list[tuple[str, str]]:
        """One implementation per requested algorithm."""
        return [(f"collectives-{a}", a) for a in algos]

    def transport(self) -> str:
        """As the core keys its table: shm when every rank is on this host and tcp is not forced."""
        forced = os.environ.get("COLLECTIVES_TRANSPORT", "").lower()
        one_host = getattr(self.comm, "local_size", 0) == self.size
        return "tcp" if forced == "tcp" or not one_host else "shm"

    def barrier(self) -> None:
        """MPI.Barrier."""
        self.comm.Barrier()

    def allreduce_f64(self, arr: np.ndarray, op: str) -> None:
        """In-place Allreduce of float64 timings."""
        self.comm.Allreduce(self.MPI.IN_PLACE, arr, op=self.ops[op])

    def call(self, coll: str, algo: str, op: str, send: Optional[np.ndarray], recv: np.ndarray,
             root: int) -> tuple[Optional[Callable[[], None]], np.ndarray]:
        """The timed call for one case, and the buffer that holds its result."""
        c, mop = self.comm, self.ops[op]
        s = self.MPI.IN_PLACE if send is None else send
        if coll == "allreduce":
            return self._allreduce_call(s, recv, mop, algo), recv
        if coll == "allgather":
            return (lambda: c.Allgather(s, recv)), recv
        if coll == "broadcast":
            return (lambda: c.Bcast(recv, root)), recv
        return (lambda: c.Reduce_scatter_block(s, recv, op=mop)), result_view(coll, send, recv,
                                                                             self.size)


def _progress(done: int, total: int, label: str, tagged: bool) -> None:
    if tagged:  # a worker: the driver draws the bar
        sys.stderr.write(f"{PROGRESS_TAG} {done} {total} {label}\n")
        sys.stderr.flush()
    else:
        draw_progress(done, total, label)


def draw_progress(done: int, total: int, label: str) -> None:
    """Draw (or, when done == total, erase) a progress bar on stderr."""
    width = 30
    filled = int(width * done / max(total, 1))
    if done >= total:
        sys.stderr.write("\r" + " " * (width + 50) + "\r")
    else:
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label[:40]:<40}")
    sys.stderr.flush()


def _warm_case(backend: Backend, coll: str, algo: str, op: str, send: Optional[np.ndarray],
               recv: np.ndarray, root: int, refill: Callable[[], None],
               dev: Optional[DeviceCase], warmup: int) -> tuple[Any, Any, str]:
    """One implementation's timed call, after its warm-up calls.

    Returns (fn, result, error): the call and the host view its result lands
    in; fn None where the backend lacks the case; error, the first line of
    the exception, where the library raised on the first call and the
    backend tolerates that (a peer without this dtype or op).
    """
    refill()
    if dev is None:
        fn, result = backend.call(coll, algo, op, send, recv, root)
    else:
        dev.refill()
        fn, _ = backend.call(coll, algo, op, dev.send, dev.recv, root)
        result = result_view(coll, send, recv, backend.size)
    if fn is None:
        return None, None, ""
    try:
        fn()
    except Exception as exc:
        if not backend.tolerate_errors:
            raise
        return None, None, str(exc).splitlines()[0][:160]
    for _ in range(max(0, warmup - 1)):
        fn()
    return fn, result, ""


def sweep(backend: Backend, coll: str, algos: Sequence[str], dtype: str, op: str,
          sizes: Sequence[int], iters: int, warmup: int, check: bool, root: int = 0,
          progress: Optional[bool] = None, host: Optional[str] = None,
          device: Optional[int] = None,
          gate: Optional[Callable[[int], None]] = None,
          turn_iters: int = 0,
          on_rows: Optional[Callable[[list[Row]], None]] = None) -> tuple[list[Row], list[str]]:
    """Measure every (size, placement, implementation); collective on all ranks.

    Per size and placement, every implementation is warmed up, then their
    timed calls alternate (iteration i of each before iteration i+1 of any),
    each iteration in the next order of turn_orders. ``gate(step)``, when
    given, is called before each turn (holding no buffer) and once more after
    the last: the driver's turns (TurnGate). A size takes one turn, or, with
    ``turn_iters``, len(turn_rounds(iters, turn_iters, size)) turns of that
    many timed iterations each (steps numbered from 0 across the sweep).
    ``on_rows(rows)``, on rank 0, gets a size's rows (every implementation,
    both placements) as soon as they are measured.

    Returns:
        (rows, notes): rows in (impl, size, inplace) order; notes name
        cases the library does not support. With `device` (a CUDA ordinal),
        the collectives run on GPU copies of the buffers.
    """
    impls = backend.impls(algos)
    rows: dict[tuple[str, int, bool], Row] = {}
    notes: list[str] = []
    show = backend.rank == 0 and (progress if progress is not None else sys.stderr.isatty())
    tagged = bool(progress) and not sys.stderr.isatty()
    plan = _SweepPlan(backend, coll, impls, dtype, op, iters, warmup, check, root,
                      host or socket.gethostname(), device,
                      (len(sizes) * 2 * len(impls)) if show else 0, tagged,
                      on_rows if backend.rank == 0 else None)
    step = 0
    for nbytes in sizes:
        timed: dict[bool, _Timed] = {}
        rounds = turn_rounds(iters, turn_iters if gate is not None else 0, nbytes)
        for r, n_iters in enumerate(rounds):
            if gate is not None:
                gate(step)
            step += 1
            _sweep_size(plan, nbytes, rows, notes, timed, sum(rounds[:r]), n_iters)
    if gate is not None:
        gate(step)
    if show:
        _progress(plan.total, plan.total, "", tagged)
    order = {impl: i for i, (impl, _) in enumerate(impls)}
    out = sorted(rows.values(), key=lambda x: (order[x.impl], x.size, x.inplace))
    return out, notes


@dataclass
class _SweepPlan:
    """What every size of one sweep shares; `done` counts cases for the progress bar
    (drawn when total > 0)."""

    backend: Backend
    coll: str
    impls: list
    dtype: str
    op: str
    iters: int
    warmup: int
    check: bool
    root: int
    host: str
    device: Optional[int]
    total: int
    tagged: bool
    on_rows: Optional[Callable[[list], None]] = None
    done: int = 0


@dataclass
class _Timed:
    """One placement of one size across its turns: the implementations that run it
    (found in the first turn), their rows, and every timed iteration so far."""

    impls: list
    rows: list
    times: np.ndarray  # (implementation, iteration), seconds on this rank


def _sweep_size(plan: _SweepPlan, nbytes: int, rows: dict, notes: list, timed: dict,
                first: int, n_iters: int) -> None:
    """Measure timed iterations first .. first+n_iters-1 of one size, out of place then
    in place, into `timed` (kept by the caller across the size's turns); with the last
    iteration, the rows. Buffers are made here and freed on return (a job waiting for
    its turn holds none)."""
    backend, coll, n, rank = plan.backend, plan.coll, plan.backend.size, plan.backend.rank
    itemsize = np.dtype(plan.dtype).itemsize
    count = element_count(coll, nbytes, itemsize, n)
    inp = rank_input(coll, plan.op, plan.dtype, rank, n, count)
    last = first + n_iters == plan.iters
    want = expected_output(coll, plan.op, plan.dtype, rank, n, count) if plan.check and last else None
    size = count * itemsize
    root, row_root = plan.root, (plan.root if coll == "broadcast" else -1)
    # A later turn warms each implementation with one call: after waiting for
    # the other jobs, a job's first call finds cold caches and TCP restarting
    # its congestion window after the idle spell (tcp_slow_start_after_idle),
    # whichever library it is.
    warmup = plan.warmup if first == 0 else min(plan.warmup, 1)
    for inplace in (False, True):
        send, recv, refill = make_buffers(coll, inp, rank, n, count, inplace, root)
        dev = None if plan.device is None else DeviceCase(send, recv, plan.device)
        # Prepare and warm every implementation, then time them in turns
        # (iteration i of each before iteration i+1 of any): a noisy spell
        # on a shared machine then hits all of them alike, and so, with the
        # orders of turn_orders, does any effect of which call follows
        # which, and their rows compare.
        t = timed.get(inplace)  # None in the size's first turn
        cases: list[tuple[Callable[[], None], Any]] = []
        live: list[tuple[str, str]] = []
        for impl, algo in (plan.impls if t is None else t.impls):
            if plan.total:
                _progress(plan.done, plan.total,
                          f"{impl} {human_size(size)}{' in-place' if inplace else ''}", plan.tagged)
            if t is None:  # a case counts once for the progress bar, in its first turn
                plan.done += 1
                rows[(impl, size, inplace)] = Row(coll, impl, n, size, count, plan.dtype, plan.op,
                                                  row_root, None, None, None, None, inplace,
                                                  plan.host)
            fn, result, error = _warm_case(backend, coll, algo, plan.op, send, recv, root, refill,
                                           dev, warmup)
            if error and t is not None:  # it ran in the first turn
                raise RuntimeError(f"{impl}: {coll} failed in a later turn: {error}")
            if error:
                what = f"{coll} {plan.dtype}" + (f" {plan.op}" if coll in ("allreduce", "reduce_scatter") else "")
                notes.append(f"{impl}: {what} not supported: {error}")
            elif fn is not None:
                cases.append((fn, result))
                live.append((impl, algo))
        if t is None:
            t = timed[inplace] = _Timed(live, [rows[(impl, size, inplace)] for impl, _ in live],
                                        np.zeros((len(live), plan.iters)))
        orders = turn_orders(len(cases))
        for i in range(first, first + n_iters):
            for k in orders[i % len(orders)]:
                fn = cases[k][0]
                backend.barrier()
                t0 = time.perf_counter()
                fn()
                t.times[k, i] = time.perf_counter() - t0
        if not last:
            continue
        if cases:
            backend.allreduce_f64(t.times, "max")
        for (fn, result), row, times in zip(cases, t.rows, t.times):
            med = float(np.median(times))
            row.time_us = med * 1e6
            row.algbw = size / med / 1e9
            row.busbw = row.algbw * bus_factor(coll, n)
            if plan.check:
                refill()
                if dev is not None:
                    dev.refill()
                backend.barrier()
                fn()
                if dev is not None:
                    dev.fetch()
                bad = np.array([float(np.count_nonzero(result != want))])
                backend.allreduce_f64(bad, "sum")
                row.wrong = int(bad[0])
    if last and plan.on_rows is not None:
        plan.on_rows([rows[(impl, size, p)] for impl, _ in plan.impls for p in (False, True)
                      if (impl, size, p) in rows])


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
                   help="allreduce algorithms, comma-separated")
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
    p.add_argument("--worker-json", default=None, help=argparse.SUPPRESS)
    p.add_argument("--turns", default=None, help=argparse.SUPPRESS)  # HOST:PORT,JOB (_bench_turns)
    p.add_argument("--progress", action="store_true", help=argparse.SUPPRESS)
    return p


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.algos = [a.strip() for a in args.algo.split(",") if a.strip()]
    bad = [a for a in args.algos if a not in ALGOS]
    if bad or not args.algos:
        p.error(f"--algo {args.algo}: choose from {','.join(ALGOS)}")
    if args.coll != "allreduce":
        args.algos = ["auto"]
    args.peers = [x.strip() for x in args.compare.split(",") if x.strip()]
    bad = [x for x in args.peers if x not in PEERS]
    if bad:
        p.error(f"--compare {args.compare}: unknown peer {bad[0]!r}; choose from {','.join(PEERS)}")
    if args.tune and args.coll != "allreduce":
        p.error("--tune applies to allreduce only")
    if args.tune:
        args.algos = ["ring", "tree", "butterfly"]
    if args.iters < 1 or args.warmup < 0 or args.turn_iters < 0:
        p.error("--iters must be >= 1, --warmup and --turn-iters >= 0")
    if args.runs < 1:
        p.error("--runs must be >= 1")
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
           "--turn-iters", str(args.turn_iters), "--device", args.device]
    return out + (["--check"] if args.check else [])


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
                                                   lambda: draw_progress(1, 1, ""))

    def live(rows: list) -> None:
        if shown is not None:
            shown.handle("collectives", row_message(rows))
            return
        sys.stderr.write(row_message(rows))
        sys.stderr.flush()
    try:
        rows, notes = sweep(backend, args.coll, args.algos, args.dtype, args.op, args.sizes,
                            args.iters, args.warmup, args.check, args.root,
                            progress=True if args.progress else None, device=device, gate=gate,
                            turn_iters=args.turn_iters, on_rows=live)
    finally:
        if gate is not None:
            gate.close()
    if device is not None and backend.rank == 0:
        notes = notes + device_note(device, rows)
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
        over = f" over {transport}" if transport else ""
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
            live = LiveRows(len(args.sizes), suffix, show, lambda: draw_progress(1, 1, ""))
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
    from .._env import detect

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
    return run_worker(args, CollectivesBackend())


if __name__ == "__main__":
    sys.exit(main())
