"""collectives-bench's results: the rows, their medians over runs, and what is made of them.

The nccl-tests tables, the comparison with the peers (ratios, and their spread
over runs), the CSV, JSON and plot files, and the table ``--tune`` writes for
``algorithm="auto"``. collectives.bench.driver measures and drives; this
module measures nothing, and the driver re-exports its public names.
"""
from __future__ import annotations

import csv
import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["ALONE", "BARRIER", "BACK_TO_BACK", "Row", "bus_factor", "median_rows", "print_table", "run_ratios",
           "print_comparison", "write_csv", "write_json", "write_plot", "tune_table",
           "write_tune_file", "ROW_TAG", "live_lines", "row_message", "LiveRows"]

ALONE = "collectives-auto-alone"  # auto timed in a job of its own (driver mode, --compare)
# A row's timing (Row.mode): each call after a barrier, or loops of calls back to back (--b2b).
BARRIER, BACK_TO_BACK = "barrier", "back-to-back"
_ALL_BYTES = 18446744073709551615  # "every size" in a tune file (SIZE_MAX)
ROW_TAG = "@@collectives-bench-row"  # a worker's stderr line: one size's rows, measured
# The one number format of every table: times in us to 0.1, bandwidths in GB/s to 0.001.
TIME_FMT, BW_FMT = ".1f", ".3f"


def bus_factor(coll: str, nranks: int) -> float:
    """busbw / algbw: 2(n-1)/n allreduce, (n-1)/n allgather and reduce_scatter, 1 broadcast."""
    if coll == "allreduce":
        return 2.0 * (nranks - 1) / nranks
    if coll in ("allgather", "reduce_scatter"):
        return (nranks - 1) / nranks
    return 1.0


@dataclass
class Row:
    """One measured (implementation, size, placement, timing mode); time_us None = not
    supported. mode BARRIER: the slowest rank's time of a call made after a barrier, median
    over the iterations; BACK_TO_BACK: per rank the median over the loops of a loop's time
    over its calls (no barrier between them), then the slowest rank's."""

    coll: str
    impl: str
    nranks: int
    size: int
    count: int
    dtype: str
    op: str
    root: int
    time_us: Optional[float]
    algbw: Optional[float]
    busbw: Optional[float]
    wrong: Optional[int]
    inplace: bool
    host: str
    mode: str = BARRIER


def median_rows(runs: Sequence[Sequence[Row]]) -> list[Row]:
    """One row per (implementation, size, placement): the median time over the runs that
    measured it (bandwidths follow from it), the most wrong values any run saw."""
    groups: dict[tuple[str, int, bool, str], list[Row]] = {}
    for run in runs:
        for r in run:
            groups.setdefault((r.impl, r.size, r.inplace, r.mode), []).append(r)
    out = []
    for same in groups.values():
        row = replace(same[0])
        timed = [r for r in same if r.time_us is not None]
        if timed and len(same) > 1:
            row.time_us = float(np.median([r.time_us for r in timed]))
            row.algbw = row.size / (row.time_us * 1e-6) / 1e9 if row.time_us > 0 else None
            row.busbw = None if row.algbw is None else row.algbw * bus_factor(row.coll, row.nranks)
        wrongs = [r.wrong for r in same if r.wrong is not None]
        row.wrong = max(wrongs) if wrongs else None
        out.append(row)
    return out


# ---------------------------------------------------------------- output


def _num(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_table(rows: Sequence[Row], out: Any = None) -> None:
    """Print one nccl-tests table per implementation and timing mode (an implementation's
    back-to-back table right after its barrier-per-call one), each ending with its average
    busbw."""
    out = out or sys.stdout
    by_impl: dict[tuple[str, str], list[Row]] = {}
    for row in sorted(rows, key=lambda r: r.mode != BARRIER):  # stable: impls keep their order
        by_impl.setdefault((row.impl, row.mode), []).append(row)
    order = list(dict.fromkeys(r.impl for r in rows))
    for (impl, mode), group in sorted(by_impl.items(), key=lambda kv: (order.index(kv[0][0]),
                                                                      kv[0][1] != BARRIER)):
        first = group[0]
        timing = f", {mode} (no barrier between calls)" if mode == BACK_TO_BACK else ""
        print(f"#\n# {first.coll}: {impl}, {first.nranks} ranks on {first.host}, dtype {first.dtype}, "
              f"op {first.op}{timing}", file=out)
        print("#" + " " * 54 + "out-of-place" + " " * 24 + "in-place", file=out)
        head = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                "time", "algbw", "busbw", "#wrong")
        units = ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "",
                 "(us)", "(GB/s)", "(GB/s)", "")
        widths = (11, 13, 9, 7, 6, 10, 8, 8, 7, 10, 8, 8, 7)
        for cells in (head, units):
            text = "".join(f"{c:>{w}}" for c, w in zip(cells, widths))
            print("#" + text[1:], file=out)
        cells_by_size: dict[int, dict[bool, Row]] = {}
        for row in group:
            cells_by_size.setdefault(row.size, {})[row.inplace] = row
        busbws = []
        for size, pair in cells_by_size.items():
            any_row = next(iter(pair.values()))
            cells = [str(size), str(any_row.count), any_row.dtype,
                     any_row.op if any_row.coll in ("allreduce", "reduce_scatter") else "none",
                     str(any_row.root)]
            for inplace in (False, True):
                row = pair.get(inplace)
                if row is None or row.time_us is None:
                    cells += ["-", "-", "-", "-"]
                    continue
                busbws.append(row.busbw)
                cells += [format(row.time_us, TIME_FMT), format(row.algbw, BW_FMT),
                          format(row.busbw, BW_FMT),
                          "N/A" if row.wrong is None else str(row.wrong)]
            print("".join(f"{c:>{w}}" for c, w in zip(cells, widths)), file=out)
        avg = f"{format(sum(busbws) / len(busbws), BW_FMT)} GB/s" if busbws else "N/A"
        print(f"# Avg bus bandwidth    : {avg} ({impl}{', ' + mode if mode == BACK_TO_BACK else ''})", file=out)


def run_ratios(runs: Sequence[Sequence[Row]], ours: str, peer: str, size: int,
               mode: str = BARRIER, inplace: bool = True) -> list[float]:
    """ours / peer speed (their time over ours) in each run that timed both, in timing
    mode `mode`, in place or out of place."""
    out = []
    for run in runs:
        cell = {r.impl: r for r in run if r.size == size and r.inplace == inplace and r.mode == mode}
        a, b = cell.get(ours), cell.get(peer)
        if a and b and a.time_us and b.time_us:
            out.append(b.time_us / a.time_us)
    return out


def print_comparison(rows: Sequence[Row], out: Any = None,
                     runs: Sequence[Sequence[Row]] = ()) -> None:
    """Per size, every implementation's busbw and the ratios ours / each peer; with
    several runs, also each ratio's lowest and highest over the runs. One comparison per
    timing mode measured: barrier per call, in place; back-to-back, in place; and
    back-to-back out of place, the way a training loop calls (a fresh output buffer)."""
    for mode, inplace in ((BARRIER, True), (BACK_TO_BACK, True), (BACK_TO_BACK, False)):
        some = [r for r in rows if r.mode == mode]
        if some and any(r.time_us is not None for r in some if r.inplace == inplace):
            _print_comparison(some, out or sys.stdout, runs, mode, inplace)


def _print_comparison(rows: Sequence[Row], out: Any, runs: Sequence[Sequence[Row]],
                      mode: str, inplace: bool = True) -> None:
    impls = list(dict.fromkeys(r.impl for r in rows))
    ours = [i for i in impls if i.startswith("collectives")]
    peers = [i for i in impls if not i.startswith("collectives")]
    if not ours or not peers:
        return
    ref = next((i for i in (ALONE, "collectives-auto") if i in ours), ours[-1])
    short = {i: i.split("-", 1)[1] if i.startswith("collectives-") else i for i in impls}
    cell = {(r.impl, r.size): r for r in rows if r.inplace == inplace}
    sizes = sorted({r.size for r in rows})
    spread = len(runs) > 1
    cols = [short[i] for i in ours + peers] + [f"{short[ref]}/{p}" for p in peers]
    if spread:
        cols += [f"{short[ref]}/{p} in runs" for p in peers]
    widths = [max(10, len(c) + 2) for c in cols]
    timing = ", back-to-back calls" if mode == BACK_TO_BACK else ""
    where = "in-place" if inplace else "out-of-place"
    print(f"#\n# Comparison{timing}: {where} busbw (GB/s), {rows[0].coll} on {rows[0].nranks} ranks; "
          f"ratio = {ref} / peer (>1: ours faster)"
          + (f"; 'in runs': the lowest and highest ratio of the {len(runs)} runs" if spread else ""),
          file=out)
    print("#" + f"{'size':>10}" + "".join(f"{c:>{w}}" for c, w in zip(cols, widths)), file=out)
    for size in sizes:
        vals = [cell.get((i, size)) for i in ours + peers]
        text = [_num(v.busbw if v else None, BW_FMT) for v in vals]
        base = cell.get((ref, size))
        for p in peers:
            theirs = cell.get((p, size))
            ok = base and theirs and base.busbw and theirs.busbw
            text.append(f"{base.busbw / theirs.busbw:.2f}x" if ok else "-")
        for p in peers if spread else ():
            each = run_ratios(runs, ref, p, size, mode, inplace)
            text.append(f"{min(each):.2f}-{max(each):.2f}x" if each else "-")
        print(f"{size:>11}" + "".join(f"{t:>{w}}" for t, w in zip(text, widths)), file=out)
    small = sizes[0]
    lat = "  ".join(f"{i} {_num(cell[(i, small)].time_us if (i, small) in cell else None, TIME_FMT)}"
                    for i in ours + peers)
    print(f"# latency at {small} B ({where} time, us): {lat}", file=out)


def live_lines(rows: Sequence[Row], label: str = "") -> list[str]:
    """A size's rows as soon as they are measured (the tables follow at the end): per
    implementation, out-of-place and in-place time and busbw, as in the tables."""
    impls = list(dict.fromkeys((r.impl, r.mode) for r in rows))
    return [_live_line([r for r in rows if (r.impl, r.mode) == key], label) for key in impls]


def _live_line(rows: Sequence[Row], label: str) -> str:
    first = rows[0]
    cells = []
    for row in sorted(rows, key=lambda r: r.inplace):
        where = "in-place" if row.inplace else "out-of-place"
        if row.time_us is None:
            cells.append(f"{where} -")
            continue
        wrong = "" if row.wrong is None else f" #wrong {row.wrong}"
        cells.append(f"{where} {format(row.time_us, TIME_FMT)} us "
                     f"busbw {_num(row.busbw, BW_FMT)} GB/s{wrong}")
    run = f" ({label})" if label else ""
    mode = f" {first.mode}" if first.mode != BARRIER else ""
    return f"# measured {first.impl}{run} {first.size} B{mode}: " + ", ".join(cells)


def row_message(rows: Sequence[Row]) -> str:
    """The stderr line by which a worker hands one size's rows to the driver as it goes."""
    return f"{ROW_TAG} {json.dumps([asdict(r) for r in rows])}\n"


class LiveRows:
    """The driver's side of row_message, for one run (`suffix`, e.g. " (run 2/3)"): with
    `verbose`, prints each measured size at once on stdout ("# measured" lines, which the
    tables repeat) and, when stderr is not a terminal (no progress bar there), one
    progress line on stderr per size and job."""

    def __init__(self, nsizes: int, suffix: str, bar_shown: bool, erase_bar: Any = None,
                 verbose: bool = False) -> None:
        self.nsizes = nsizes
        self.verbose = verbose  # print the "# measured" lines (the tables repeat them)
        self.suffix = suffix
        self.bar_shown = bar_shown
        self.erase_bar = erase_bar
        self.sizes: dict[str, set] = {}
        self.started = time.monotonic()
        self.closed = False  # stdout went away (| head): the run goes on, silently

    def handle(self, job: str, line: str) -> bool:
        """Print the rows of job's row_message line; False for any other line."""
        at = line.find(ROW_TAG)
        if at < 0:
            return False
        rows = [Row(**r) for r in json.loads(line[at + len(ROW_TAG):])]
        if job == ALONE:
            rows = [replace(r, impl=ALONE) for r in rows]
        try:
            if self.verbose and self.bar_shown and self.erase_bar is not None:
                self.erase_bar()
            if self.verbose and not self.closed:
                print("\n".join(live_lines(rows, self.suffix.strip(" ()"))), flush=True)
        except OSError:  # a closed pipe must not stop the reader that drains the job
            self.closed = True
        try:
            if not self.bar_shown:
                done = self.sizes.setdefault(job, set())
                done.add(rows[0].size)
                sys.stderr.write(f"collectives-bench: {job}{self.suffix}: {len(done)}/"
                                 f"{self.nsizes} sizes measured "
                                 f"({time.monotonic() - self.started:.1f} s)\n")
                sys.stderr.flush()
        except OSError:
            pass
        return True


def write_csv(rows: Sequence[Row], path: str) -> None:
    """All rows as CSV with a header line."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, [f.name for f in fields(Row)])
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))


def write_json(rows: Sequence[Row], path: str) -> None:
    """All rows as a JSON list of objects."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump([asdict(r) for r in rows], fh, indent=1)


def write_plot(rows: Sequence[Row], path: str) -> None:
    """busbw against message size (log2 x axis), one line per implementation."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("collectives-bench: --plot needs matplotlib "
                         "(pip install 'collectives[bench]' or pip install matplotlib)") from None
    fig, ax = plt.subplots(figsize=(8, 5))
    for impl, mode in dict.fromkeys((r.impl, r.mode) for r in rows):
        pts = [(r.size, r.busbw) for r in rows if (r.impl, r.mode) == (impl, mode)
               and r.busbw is not None and (r.inplace or impl.startswith("collectives"))]
        pts = sorted({s: b for s, b in pts}.items())  # one point a size (in-place wins)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                    label=impl if mode == BARRIER else f"{impl} ({mode})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    first = rows[0]
    ax.set_title(f"{first.coll}: {first.nranks} ranks on {first.host} ({first.dtype}, {first.op})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ------------------------------------------------------------------ tune


def tune_table(rows: Sequence[Row]) -> list[tuple[int, int, str]]:
    """Rows (nranks, max_bytes, algorithm) choosing per size the fastest measured algorithm.

    The time of an algorithm at a size is the mean of its out-of-place and
    in-place times. Consecutive sizes with the same winner merge into one
    row; the last row covers every larger size.
    """
    best: dict[int, tuple[float, str]] = {}
    per: dict[tuple[int, str], list[float]] = {}
    for r in rows:
        if not r.impl.startswith("collectives-") or r.time_us is None or r.mode != BARRIER:
            continue
        algo = r.impl.split("-", 1)[1]
        if not algo.startswith("auto"):  # auto and auto-alone run one of the others
            per.setdefault((r.size, algo), []).append(r.time_us)
    for (size, algo), ts in per.items():
        t = sum(ts) / len(ts)
        if size not in best or t < best[size][0]:
            best[size] = (t, algo)
    if not best:
        return []
    n = rows[0].nranks
    out: list[tuple[int, int, str]] = []
    sizes = sorted(best)
    for i, size in enumerate(sizes):
        algo = best[size][1]
        if i + 1 < len(sizes) and best[sizes[i + 1]][1] == algo:
            continue
        out.append((n, size if i + 1 < len(sizes) else _ALL_BYTES, algo))
    return out


def write_tune_file(table: Sequence[tuple[int, int, str]], path: str, transport: str = "") -> None:
    """Merge table into the tune file at path, its rows marked with transport ("tcp", "shm"
    or "" for both): rows of other (rank count, transport) pairs are kept, ours replaced."""
    ours = {(n, transport) for n, _, _ in table}
    kept: list[tuple[int, int, str, str]] = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) in (3, 4) and not line.startswith("#") and parts[0].isdigit() \
                        and parts[1].isdigit():
                    tp = parts[3] if len(parts) == 4 else ""
                    if (int(parts[0]), tp) not in ours:
                        kept.append((int(parts[0]), int(parts[1]), parts[2], tp))
    mine = [(n, b, a, transport) for n, b, a in table]
    merged = sorted(kept + mine, key=lambda t: (t[3], t[0]))  # stable: sizes stay in order
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"# allreduce algorithm table written by collectives-bench --tune on "
                 f"{socket.gethostname()}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                 "# <nranks> <max_bytes> <algorithm> [tcp|shm]: among the lines of a world's "
                 "transport (or of none), first matching line for the nearest rank count not "
                 "above ours wins\n")
        for n, max_bytes, algo, tp in merged:
            fh.write(f"{n} {max_bytes} {algo}{' ' + tp if tp else ''}\n")
