"""What a collectives-bench worker measures: sizes, inputs and expected outputs, the
backends that run one call (ours; the peers' in collectives.bench.peer_worker), and the
sweep over sizes and algorithms with its progress lines.

Each size (from -b to -e, times -f each step) is timed out-of-place and
in-place: warm-up calls, then ``--iters`` calls each after a barrier; the
time of an iteration is that of the slowest rank, and the reported time is
the median over the iterations. With ``b2b`` (``--b2b N``) each iteration also
times a loop of N calls back to back, with no barrier between them, as a
training loop issues them (and OSU's and nccl-tests' loops time them): a
loop's time over N per rank, the median over the iterations per rank, the
slowest rank's median reported, in rows of their own (mode BACK_TO_BACK). The command line and the driver that starts
the workers are in collectives.bench.driver.
"""
from __future__ import annotations

import abc
import argparse
import os
import socket
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .rows import BACK_TO_BACK, Row, bus_factor
from .turns import turn_orders, turn_rounds

COLLS = ("allreduce", "allgather", "broadcast", "reduce_scatter")
DTYPES = ("int8", "uint8", "int32", "int64", "float16", "float32", "float64")
OPS = ("sum", "prod", "min", "max")
ALGOS = ("ring", "tree", "butterfly", "auto")
# Also accepted by --algo; --tune adds it where the world goes in two levels.
MULTIHOST_ALGOS = ("two_level",)
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


def device_note(device: int, rows: Sequence["Row"], nbytes: int = 256 << 20,
                coll: str = "", sharing: int = 1) -> list[str]:
    """The device's own copy bandwidth, and each implementation's largest-size busbw over it;
    for allreduce also over the memory-traffic floor of `sharing` ranks on one GPU."""
    from .. import _core

    copy = _core.cuda_copy_bandwidth(device, nbytes)
    notes = [f"device {device} device-to-device copy (cudaMemcpy, {human_size(nbytes)}): "
             f"{copy:.1f} GB/s, the physical limit"]
    # A ring allreduce of N bytes reads and writes 5 (n-1)/n N per rank (each reduction
    # reads two operands and writes one, each gather copy reads and writes one), so k
    # ranks on one GPU move 5 k (n-1)/n N through its memory, which a copy drives at
    # 2 x copy (its n / t counts one side): busbw <= 4 copy / (5 k).
    floor = 4 * copy / (5 * max(1, sharing)) if coll == "allreduce" else 0.0
    if floor:
        notes.append(f"allreduce memory-traffic floor, {sharing} rank(s) per GPU: busbw "
                     f"{floor:.1f} GB/s = {floor / copy:.2f} x the device copy")
    for impl in dict.fromkeys(r.impl for r in rows):
        best = max((r for r in rows if r.impl == impl and r.busbw), key=lambda r: r.size,
                   default=None)
        if best is not None:
            line = (f"{impl} {human_size(best.size)}: busbw {best.busbw:.1f} GB/s = "
                    f"{best.busbw / copy:.2f} x the device copy")
            if floor:
                line += f" = {best.busbw / floor:.2f} of the memory-traffic floor"
            notes.append(line)
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
        """(the call to time, or None if unsupported; the view where the result lands,
        or None for a call that has no result to check, such as a floor)."""

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
        """As the core keys its table: the shape HxL (hosts x the most ranks on one) when
        the world goes in two levels, else shm when every rank is on this host and tcp is
        not forced, else tcp."""
        shape = self.shape()
        if shape:
            return shape
        forced = os.environ.get("COLLECTIVES_TRANSPORT", "").lower()
        one_host = getattr(self.comm, "local_size", 0) == self.size
        return "tcp" if forced == "tcp" or not one_host else "shm"

    def shape(self) -> str:
        """"HxL" when this world has two or more hosts and one runs two or more ranks
        (its allreduce may go two_level), else ""."""
        from .. import _core

        core = getattr(self.comm, "_core", None)
        if core is None or self.size < 2:
            return ""
        ids = core.host_ids()
        labels = [ids.index(h) if h else -1 - i for i, h in enumerate(ids)]  # "": a host of its own
        topo = _core.topology(labels)
        return f"{len(topo['hosts'])}x{topo['max_local']}" if topo["two_level"] else ""

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
          on_rows: Optional[Callable[[list[Row]], None]] = None,
          b2b: int = 0) -> tuple[list[Row], list[str]]:
    """Measure every (size, placement, implementation); collective on all ranks.

    Per size and placement, every implementation is warmed up, then their
    timed calls alternate (iteration i of each before iteration i+1 of any),
    each iteration in the next order of turn_orders. ``gate(step)``, when
    given, is called before each turn (holding no buffer) and once more after
    the last: the driver's turns (TurnGate). A size takes one turn, or, with
    ``turn_iters``, len(turn_rounds(iters, turn_iters, size)) turns of that
    many timed iterations each (steps numbered from 0 across the sweep).
    ``on_rows(rows)``, on rank 0, gets a size's rows (every implementation,
    both placements) as soon as they are measured. ``b2b`` > 0: each timed
    iteration of each implementation also times a loop of b2b calls without
    a barrier between them (after the barrier-per-call turns of that
    iteration, in the same orders), into rows of mode BACK_TO_BACK.

    Returns:
        (rows, notes): rows in (impl, size, inplace) order; notes name
        cases the library does not support. With `device` (a CUDA ordinal),
        the collectives run on GPU copies of the buffers.
    """
    impls = backend.impls(algos)
    rows: dict[tuple, Row] = {}
    notes: list[str] = []
    show = backend.rank == 0 and (progress if progress is not None else sys.stderr.isatty())
    tagged = bool(progress) and not sys.stderr.isatty()
    plan = _SweepPlan(backend, coll, impls, dtype, op, iters, warmup, check, root,
                      host or socket.gethostname(), device,
                      (len(sizes) * 2 * len(impls)) if show else 0, tagged,
                      on_rows if backend.rank == 0 else None, b2b=b2b)
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
    out = sorted(rows.values(), key=lambda x: (order[x.impl], x.mode == BACK_TO_BACK, x.size,
                                               x.inplace))
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
    b2b: int = 0  # calls a back-to-back loop times (0: none)
    done: int = 0


@dataclass
class _Timed:
    """One placement of one size across its turns: the implementations that run it
    (found in the first turn), their rows, and every timed iteration so far."""

    impls: list
    rows: list
    times: np.ndarray  # (implementation, iteration), seconds on this rank
    loops: list  # rows of the back-to-back loops (empty without --b2b)
    loop_times: np.ndarray  # (implementation, iteration): a loop's seconds per call, this rank


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
                if plan.b2b:
                    rows[(impl, size, inplace, BACK_TO_BACK)] = replace(
                        rows[(impl, size, inplace)], mode=BACK_TO_BACK)
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
            loops = [rows[(impl, size, inplace, BACK_TO_BACK)] for impl, _ in live] if plan.b2b \
                else []
            t = timed[inplace] = _Timed(live, [rows[(impl, size, inplace)] for impl, _ in live],
                                        np.zeros((len(live), plan.iters)), loops,
                                        np.zeros((len(live), plan.iters)))
        orders = turn_orders(len(cases))
        # A loop's last result is checked where repeating the call leaves it as one call
        # does (out of place, or an idempotent case); else its #wrong stays N/A.
        same = send is not None or coll in ("broadcast", "allgather") or plan.op in ("min", "max")
        for i in range(first, first + n_iters):
            for k in orders[i % len(orders)]:
                fn = cases[k][0]
                backend.barrier()
                t0 = time.perf_counter()
                fn()
                t.times[k, i] = time.perf_counter() - t0
            if t.loops:  # iteration i's back-to-back loops, right after its single calls
                _time_loops(plan, cases, orders[i % len(orders)], t.loop_times, i, refill, dev,
                            want if same else None, t.loops)
        if not last:
            continue
        if cases:
            backend.allreduce_f64(t.times, "max")
        if cases and t.loops:
            # Per rank the median loop, then the slowest rank's (not the median of the
            # per-loop maxima: without a barrier the ranks' loops need not line up).
            per_rank = np.median(t.loop_times, axis=1)
            backend.allreduce_f64(per_rank, "max")
            for row, sec in zip(t.loops, per_rank):
                _fill_row(row, coll, size, n, float(sec))
        for (fn, result), row, times in zip(cases, t.rows, t.times):
            _fill_row(row, coll, size, n, float(np.median(times)))
            if plan.check and result is not None:  # None: a case with no result (a floor)
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
        plan.on_rows([rows[key] for impl, _ in plan.impls for p in (False, True)
                      for key in ((impl, size, p), (impl, size, p, BACK_TO_BACK)) if key in rows])


def _fill_row(row: Row, coll: str, size: int, n: int, seconds: float) -> None:
    """A row's time, algbw and busbw from its time of one call."""
    row.time_us = seconds * 1e6
    row.algbw = size / seconds / 1e9
    row.busbw = row.algbw * bus_factor(coll, n)


def _time_loops(plan: _SweepPlan, cases: list, order: list, loop_times: np.ndarray, i: int,
                refill: Callable[[], None], dev: Optional[DeviceCase],
                want: Optional[np.ndarray], loops: list) -> None:
    """Iteration i of the back-to-back loops: per implementation (in `order`, the
    iteration's order of turn_orders, as its barrier-per-call calls), refill the input, a
    barrier, then plan.b2b calls with nothing between them; loop_times[k, i] is that loop's
    time over plan.b2b on this rank. With `want` (--check, the size's last turn), the
    result after the last iteration's loop is compared with it, the count of wrong
    elements over all ranks going to loops[k].wrong."""
    for k in order:
        fn = cases[k][0]
        refill()  # in place the loop sums into its own input: start each loop alike
        if dev is not None:
            dev.refill()
        plan.backend.barrier()
        t0 = time.perf_counter()
        for _ in range(plan.b2b):
            fn()
        loop_times[k, i] = (time.perf_counter() - t0) / plan.b2b
        if want is not None and i == plan.iters - 1 and cases[k][1] is not None:
            if dev is not None:
                dev.fetch()
            bad = np.array([float(np.count_nonzero(cases[k][1] != want))])
            plan.backend.allreduce_f64(bad, "sum")
            loops[k].wrong = int(bad[0])
