"""Tests of collectives-bench (collectives/bench/) in CI-sized form: real sweeps on loopback."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import collectives
from collectives.bench import driver as bench, peer_worker, peers as _bench_peers
from collectives.bench.turns import SPLIT_BYTES

from conftest import PACKAGE_ROOT, REPO, RUN_CWD, package_path  # noqa: E402


def _env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COLLECTIVES_", "OMPI_", "SLURM_", "PMI_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(package_path() + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _run(args: list, extra_env: dict | None = None, module: str = "collectives.bench",
         timeout: float = 100) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                          text=True, env=_env(extra_env), cwd=RUN_CWD, timeout=timeout)


def _tables(stdout: str) -> dict:
    """{impl: [data row tokens]} from the nccl-tests style output."""
    tables: dict = {}
    impl = None
    for line in stdout.splitlines():
        m = re.match(r"# (\w+): (\S+), \d+ ranks on", line)
        if m:
            impl = m.group(2).rstrip(",")
            tables[impl] = []
        elif line.startswith("# Avg bus bandwidth"):
            impl = None
        elif impl and line.strip() and not line.startswith("#"):
            tables[impl].append(line.split())
    return tables


@pytest.mark.timeout(120)
@pytest.mark.parametrize("coll,nranks", [("allreduce", 2), ("allgather", 3),
                                         ("broadcast", 3), ("reduce_scatter", 3)])
def test_sweep_check(coll: str, nranks: int, tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    res = _run([coll, "-np", nranks, "-b", "8", "-e", "64K", "-f", "8", "--iters", "2",
                "--warmup", "1", "--check", "--json", out])
    assert res.returncode == 0, res.stdout + res.stderr
    tables = _tables(res.stdout)
    want_impls = ([f"collectives-{a}" for a in bench.ALGOS] if coll == "allreduce"
                  else ["collectives-auto"])
    assert list(tables) == want_impls, res.stdout
    sizes = bench.sweep_sizes(8, 64 * 1024, 8)
    factor = bench.bus_factor(coll, nranks)
    for impl, rows in tables.items():
        assert len(rows) == len(sizes), (impl, rows)
        for cells, nominal in zip(rows, sizes):
            assert len(cells) == 13, cells
            size, count = int(cells[0]), int(cells[1])
            assert cells[2] == "float32"
            itemsize = 4
            assert size == count * itemsize
            assert count == bench.element_count(coll, nominal, itemsize, nranks)
            for base in (5, 9):  # out-of-place, in-place
                t, algbw, busbw, wrong = cells[base:base + 4]
                assert float(t) > 0
                # the time is printed to 0.1 us, which is coarse below a few us
                assert float(algbw) == pytest.approx(size / float(t) / 1e3,
                                                     rel=0.02 + 0.05 / float(t), abs=2e-3)
                assert float(busbw) == pytest.approx(float(algbw) * factor, abs=1.5e-3)
                assert wrong == "0"
    assert f"# Avg bus bandwidth" in res.stdout and "Wrong values total   : 0 OK" in res.stdout
    data = json.loads(out.read_text())
    assert len(data) == 2 * len(sizes) * len(want_impls)
    for row in data:
        assert row["coll"] == coll and row["nranks"] == nranks and row["wrong"] == 0
        assert row["busbw"] == pytest.approx(row["algbw"] * factor)
        assert row["algbw"] == pytest.approx(row["size"] / (row["time_us"] * 1e-6) / 1e9)
    assert {r["inplace"] for r in data} == {False, True}


@pytest.mark.timeout(120)
def test_tune_writes_a_table_auto_reads(tmp_path: Path) -> None:
    tune = tmp_path / "tune.txt"
    tune.write_text("# an older table\n5 1024 tree\n5 18446744073709551615 ring\n")
    res = _run(["allreduce", "-np", "2", "-b", "8", "-e", "4K", "-f", "8", "--iters", "1",
                "--warmup", "0", "--tune", tune])
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"COLLECTIVES_TUNE_FILE={tune}" in res.stdout
    rows = [line.split() for line in tune.read_text().splitlines() if not line.startswith("#")]
    assert [r for r in rows if r[0] == "5"] == [["5", "1024", "tree"], ["5", "18446744073709551615", "ring"]]
    ours = [r for r in rows if r[0] == "2"]
    assert ours and ours[-1][1] == "18446744073709551615"
    assert all(r[2] in ("ring", "tree", "butterfly") for r in ours)
    assert all(r[3:] == ["shm"] for r in ours), rows  # one host, transport not forced
    want = next(r[2] for r in ours if 8 <= int(r[1]))
    script = ("import numpy as np\nfrom collectives import MPI\nc = MPI.COMM_WORLD\n"
              "x = np.ones(2, np.float32)\nc.Allreduce(MPI.IN_PLACE, x, algorithm='auto')\n"
              "assert x[0] == 2\n")
    res = _run(["-np", "2", sys.executable, "-c", script], module="collectives.run",
               extra_env={"COLLECTIVES_TUNE_FILE": str(tune), "COLLECTIVES_DEBUG": "INFO",
                          "COLLECTIVES_DEBUG_SUBSYS": "TUNE"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"read {len(rows)} rows from {tune}" in res.stderr, res.stderr
    assert re.search(rf"allreduce #\d+ 8 bytes on 2 ranks: {want}\b", res.stderr), res.stderr


@pytest.mark.timeout(120)
def test_compare_skips_a_missing_peer(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setitem(_bench_peers.REQUIREMENTS, "gloo", ("collectives_no_such_module", None))
    for name in [k for k in os.environ if k.startswith("COLLECTIVES_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(package_path()))
    rc = bench.main(["allreduce", "-np", "2", "-b", "8", "-e", "8", "--iters", "1", "--warmup", "0",
                     "--algo", "ring", "--compare", "gloo"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "# skipping gloo: Python module 'collectives_no_such_module' is not installed" in out
    assert list(_tables(out)) == ["collectives-ring"]


class _WrongBackend(bench.Backend):
    """A one-rank 'library' whose collective writes 7 everywhere (the inputs are 1..4)."""

    name = "wrong"

    def barrier(self) -> None:
        pass

    def allreduce_f64(self, arr: np.ndarray, op: str) -> None:
        pass

    def call(self, coll, algo, op, send, recv, root):
        return (lambda: recv.fill(7)), recv


@pytest.mark.timeout(120)
def test_check_counts_wrong_values_and_fails(capsys: pytest.CaptureFixture) -> None:
    p = bench.build_parser()
    args = p.parse_args(["allreduce", "-b", "64", "-e", "64", "--iters", "1", "--warmup", "0",
                         "--check", "--dtype", "int8"])
    bench._check_args(p, args)
    assert bench.run_worker(args, _WrongBackend()) == 1
    out = capsys.readouterr().out
    cells = _tables(out)["wrong"][0]
    assert cells[8] == "64" and cells[12] == "64"
    assert "FAILED" in out


class _RecordingBackend(bench.Backend):
    """A one-rank 'library' with two algorithms that logs the calls it times."""

    name = "rec"

    def __init__(self) -> None:
        self.log: list[str] = []

    def impls(self, algos):
        return [(f"rec-{a}", a) for a in algos]

    def barrier(self) -> None:
        self.log.append("|")

    def allreduce_f64(self, arr: np.ndarray, op: str) -> None:
        pass

    def call(self, coll, algo, op, send, recv, root):
        return (lambda: self.log.append(algo)), recv


def test_sweep_alternates_the_algorithms_it_times() -> None:
    be = _RecordingBackend()
    rows, notes = bench.sweep(be, "allreduce", ["ring", "tree"], "float32", "sum", [64],
                              iters=3, warmup=2, check=False, progress=False)
    assert notes == [] and len(rows) == 4 and all(r.time_us > 0 for r in rows)
    # per placement: each algorithm's warm-up calls, then timed calls in turns
    # (each after a barrier), in the orders of turn_orders(2)
    one_placement = (["ring", "ring", "tree", "tree"] + ["|", "ring", "|", "tree"]
                     + ["|", "tree", "|", "ring"] + ["|", "ring", "|", "tree"])
    assert be.log == one_placement * 2


def test_turn_rounds_spread_iterations_evenly() -> None:
    assert bench.turn_rounds(5, 2) == [2, 2, 1]
    assert bench.turn_rounds(10, 3) == [3, 3, 2, 2]
    assert bench.turn_rounds(20, 2) == [2] * 10
    assert bench.turn_rounds(3, 0) == [3] and bench.turn_rounds(3, 5) == [3]
    # sizes below SPLIT_BYTES take one turn
    assert bench.turn_rounds(5, 2, SPLIT_BYTES) == [2, 2, 1]
    assert bench.turn_rounds(5, 2, SPLIT_BYTES - 1) == [5]


def test_sweep_spreads_each_size_over_turns() -> None:
    """With the driver's gate and turn_iters, a size from SPLIT_BYTES takes several turns:
    a full warm-up in the first, one call per implementation in each later one, and the
    timed calls carry on the orders of turn_orders across the turns; every iteration is
    timed once. A smaller size takes one turn."""
    be = _RecordingBackend()
    steps: list[int] = []

    def gate(step: int) -> None:
        steps.append(step)
        be.log.append(f"go {step}")

    rows, notes = bench.sweep(be, "allreduce", ["ring", "tree"], "float32", "sum",
                              [64, SPLIT_BYTES], iters=5, warmup=2, check=False,
                              progress=False, gate=gate, turn_iters=2)
    assert steps == list(range(5))  # 1 turn for 64 B, 3 for SPLIT_BYTES, then the final one
    assert notes == [] and len(rows) == 8 and all(r.time_us > 0 for r in rows)
    timed = (["|", "ring", "|", "tree"], ["|", "tree", "|", "ring"])  # turn_orders(2)

    def turn(warm: int, iterations: range) -> list[str]:
        one = ["ring"] * warm + ["tree"] * warm + [c for i in iterations for c in timed[i % 2]]
        return one * 2  # out of place, then in place

    assert be.log == (["go 0"] + turn(2, range(0, 5))
                      + ["go 1"] + turn(2, range(0, 2)) + ["go 2"] + turn(1, range(2, 4))
                      + ["go 3"] + turn(1, range(4, 5)) + ["go 4"])
    # outside the driver's turns the same sweep measures each size in one go
    be.log.clear()
    bench.sweep(be, "allreduce", ["ring", "tree"], "float32", "sum", [SPLIT_BYTES], iters=5,
                warmup=2, check=False, progress=False, turn_iters=2)
    assert be.log == turn(2, range(0, 5))


@pytest.mark.parametrize("n", range(0, 8))
def test_turn_orders_balance_which_call_follows_which(n: int) -> None:
    """Every order is a permutation; within them each implementation follows each other
    one equally often and takes each place equally often."""
    orders = bench.turn_orders(n)
    assert all(sorted(o) == list(range(n)) for o in orders)
    follows = Counter((a, b) for o in orders for a, b in zip(o, o[1:]))
    assert len(follows) == n * (n - 1) and len(set(follows.values())) <= 1, follows
    places = Counter((pos, x) for o in orders for pos, x in enumerate(o))
    assert len(places) == n * n and len(set(places.values())) <= 1, places


def test_expected_values_are_exact() -> None:
    for op in bench.OPS:
        for dtype in bench.DTYPES:
            n, count = 5, 40
            got = bench.expected_output("allreduce", op, dtype, 0, n, count)
            ins = np.stack([bench.rank_input("allreduce", op, "int64", r, n, count) for r in range(n)])
            ref = {"sum": ins.sum(0), "prod": ins.prod(0), "min": ins.min(0), "max": ins.max(0)}[op]
            assert got.dtype == np.dtype(dtype) and (got.astype(np.int64) == ref).all(), (op, dtype)


@pytest.mark.timeout(120)
def test_auto_reads_the_rows_of_its_transport(tmp_path: Path) -> None:
    tune = tmp_path / "tune.txt"
    tune.write_text("2 18446744073709551615 tree tcp\n2 18446744073709551615 ring shm\n"
                    "3 18446744073709551615 butterfly\n")
    script = ("import numpy as np\nfrom collectives import MPI\nc = MPI.COMM_WORLD\n"
              "x = np.ones(2, np.float32)\nc.Allreduce(MPI.IN_PLACE, x, algorithm='auto')\n"
              "assert x[0] == c.size\n")
    for n, transport, want in ((2, "tcp", "tree"), (2, "", "ring"), (3, "tcp", "butterfly"),
                               (3, "", "butterfly")):
        env = {"COLLECTIVES_TUNE_FILE": str(tune), "COLLECTIVES_DEBUG": "INFO",
               "COLLECTIVES_DEBUG_SUBSYS": "TUNE"}
        if transport:
            env["COLLECTIVES_TRANSPORT"] = transport
        res = _run(["-np", str(n), sys.executable, "-c", script], module="collectives.run",
                   extra_env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        assert re.search(rf"allreduce #\d+ 8 bytes on {n} ranks: {want}\b", res.stderr), \
            (n, transport, res.stderr)


def test_write_tune_file_keeps_other_transports(tmp_path: Path) -> None:
    tune = tmp_path / "tune.txt"
    tune.write_text("2 64 tree\n2 1024 ring tcp\n2 2048 ring shm\n4 8 ring shm\n")
    bench.write_tune_file([(2, 18446744073709551615, "butterfly")], str(tune), "shm")
    rows = [line.split() for line in tune.read_text().splitlines() if not line.startswith("#")]
    assert sorted(map(tuple, rows)) == sorted([("2", "64", "tree"), ("2", "1024", "ring", "tcp"),
                                               ("4", "8", "ring", "shm"),
                                               ("2", "18446744073709551615", "butterfly", "shm")])


def test_sizes_and_tune_table() -> None:
    assert bench.parse_size("64K") == 65536 and bench.parse_size("256M") == 256 << 20
    assert bench.sweep_sizes(8, 64 * 1024, 8) == [8, 64, 512, 4096, 32768]
    assert bench.element_count("allgather", 8, 4, 3) == 3
    mk = lambda size, algo, t: bench.Row("allreduce", f"collectives-{algo}", 4, size, size // 4,
                                         "float32", "sum", -1, t, 1.0, 1.0, None, False, "h")
    rows = [mk(8, "butterfly", 1), mk(8, "ring", 2), mk(64, "butterfly", 1), mk(64, "ring", 2),
            mk(512, "ring", 1), mk(512, "butterfly", 2), mk(512, "auto", 0.1),
            mk(512, "auto-alone", 0.1)]
    assert bench.tune_table(rows) == [(4, 64, "butterfly"), (4, 18446744073709551615, "ring")]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter"])
def test_device_cuda_sweep_on_the_emulated_gpu(coll: str) -> None:
    """--device cuda end to end (GPU buffers, CUDA IPC records, the device copy
    note), on the host-memory GPU double, so that it runs without a GPU."""
    res = _run([coll, "--device", "cuda", "-np", "2", "-b", "8", "-e", "1M", "-f", "32",
                "--iters", "2", "--warmup", "1", "--check", "--algo", "ring,auto"],
               extra_env={"COLLECTIVES_CUDA_FAKE": "1"}, timeout=140)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Wrong values total   : 0 OK" in res.stdout
    assert re.search(r"device 0 device-to-device copy .*: [0-9.]+ GB/s", res.stdout), res.stdout
    assert re.search(r"collectives-auto \S+: busbw [0-9.]+ GB/s = [0-9.]+ x the device copy",
                     res.stdout), res.stdout
    if coll == "allreduce":  # both ranks on the one (emulated) GPU: 4 / (5 x 2) of the copy
        assert re.search(r"allreduce memory-traffic floor, 2 rank\(s\) per GPU: busbw [0-9.]+ "
                         r"GB/s = 0\.40 x the device copy", res.stdout), res.stdout
        assert re.search(r"collectives-auto \S+: .* = [0-9.]+ of the memory-traffic floor",
                         res.stdout), res.stdout


def test_device_cuda_without_a_gpu_says_so() -> None:
    if collectives.cuda_available():
        pytest.skip("a GPU is present")
    res = _run(["allreduce", "--device", "cuda", "-b", "8", "-e", "8"])
    assert res.returncode != 0
    assert "--device cuda needs a CUDA build and a GPU" in res.stderr + res.stdout


def _row(impl: str, size: int, time_us, wrong=0, inplace=True) -> bench.Row:
    return bench.Row("allreduce", impl, 4, size, size // 4, "float32", "sum", -1, time_us,
                     None, None, wrong, inplace, "h")


def test_median_rows_takes_each_rows_median_over_runs() -> None:
    runs = [[_row("collectives-ring", 1024, 10.0), _row("gloo", 1024, 50.0, wrong=None)],
            [_row("collectives-ring", 1024, 30.0, wrong=2), _row("gloo", 1024, None, wrong=None)],
            [_row("collectives-ring", 1024, 20.0), _row("gloo", 1024, 70.0, wrong=None)]]
    rows = bench.median_rows(runs)
    assert [r.impl for r in rows] == ["collectives-ring", "gloo"]
    ring, gloo = rows
    assert ring.time_us == 20.0 and ring.wrong == 2
    assert ring.algbw == pytest.approx(1024 / 20e-6 / 1e9)
    assert ring.busbw == pytest.approx(ring.algbw * 2 * 3 / 4)
    assert gloo.time_us == 60.0 and gloo.wrong is None  # the run without a time is left out
    single = bench.median_rows([[_row("collectives-tree", 64, 5.0)]])
    assert single[0].time_us == 5.0 and single[0].algbw is None  # one run: the row as measured


def test_gloo_meets_at_a_store_file_beside_its_results() -> None:
    """No port is picked ahead for gloo (another job's rank could take it first)."""
    cmd = _bench_peers.command("gloo", 2, ["allreduce"], "/tmp/run1/gloo.json")
    assert cmd[-2:] == ["--worker-json", "/tmp/run1/gloo.json"]
    at = cmd.index("--store-file")
    assert cmd[at - 1] == "gloo" and cmd[at + 1] == "/tmp/run1/gloo.store"
    with pytest.raises(SystemExit, match="--store-file FILE or --port PORT"):
        peer_worker.main(["gloo", "--port", "x", "allreduce"])


def test_comparison_shows_each_ratio_over_the_runs(capsys: pytest.CaptureFixture) -> None:
    """With several runs the comparison prints the ratio of the medians and, beside it,
    the lowest and highest of the per-run ratios."""
    alone = bench.ALONE
    runs = [[_row(alone, 1024, 10.0), _row("mpi", 1024, 20.0)],   # 2.0x
            [_row(alone, 1024, 40.0), _row("mpi", 1024, 20.0)],   # 0.5x
            [_row(alone, 1024, 20.0), _row("mpi", 1024, 25.0)]]   # 1.25x
    assert bench.run_ratios(runs, alone, "mpi", 1024) == [2.0, 0.5, 1.25]
    assert bench.run_ratios(runs, alone, "gloo", 1024) == []
    bench.print_comparison(bench.median_rows(runs), runs=runs)
    out = capsys.readouterr().out
    assert "'in runs': the lowest and highest ratio of the 3 runs" in out
    row = [line.split() for line in out.splitlines() if line.strip().startswith("1024")]
    assert row and row[0][-2:] == ["1.00x", "0.50-2.00x"], out  # medians 20 us and 20 us
    bench.print_comparison(bench.median_rows(runs[:1]), runs=runs[:1])
    assert "in runs" not in capsys.readouterr().out  # one run: no spread to show


@pytest.mark.timeout(120)
def test_runs_repeats_the_sweep_and_reports_medians(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    res = _run(["allreduce", "-np", "2", "-b", "8", "-e", "1K", "-f", "8", "--iters", "2",
                "--warmup", "1", "--algo", "ring", "--runs", "2", "--check", "--json", out])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "# note: each time is the median over 2 runs of the whole sweep" in res.stdout
    rows = json.loads(out.read_text())
    assert sorted((r["size"], r["inplace"]) for r in rows) == \
        [(8, False), (8, True), (64, False), (64, True), (512, False), (512, True)]
    assert all(r["time_us"] > 0 and r["wrong"] == 0 for r in rows)
    assert _run(["allreduce", "-np", "2", "--runs", "0"]).returncode == 2


@pytest.mark.timeout(150)
def test_compare_times_auto_alone_like_the_peers(tmp_path: Path) -> None:
    """Our algorithms are timed in turns, each peer in a job of its own; the ratios to the
    peers use auto timed alone too (collectives-auto-alone), and every row is checked.
    Two runs: each starts its jobs afresh (gloo meets at a new store file each time)."""
    if _bench_peers.missing("gloo"):
        pytest.skip(f"gloo: {_bench_peers.missing('gloo')}")
    out = tmp_path / "rows.json"
    res = _run(["allreduce", "-np", "2", "-b", "8", "-e", "64", "-f", "8", "--iters", "2",
                "--warmup", "1", "--algo", "ring,auto", "--compare", "gloo", "--check",
                "--runs", "2", "--json", out], timeout=140)
    assert res.returncode == 0, res.stdout + res.stderr
    assert list(_tables(res.stdout)) == ["collectives-ring", "collectives-auto",
                                         "collectives-auto-alone", "gloo"], res.stdout
    assert "ratio = collectives-auto-alone / peer" in res.stdout, res.stdout
    assert "'in runs': the lowest and highest ratio of the 2 runs" in res.stdout, res.stdout
    ratios = [line.split()[-2:] for line in res.stdout.splitlines()
              if re.match(r"\s+(8|64)\s", line) and line.rstrip().endswith("x")]
    assert len(ratios) == 2 and all(float(r[:-1]) > 0 for r, _ in ratios), res.stdout
    spans = [[float(v) for v in span[:-1].split("-")] for _, span in ratios]
    assert all(0 < lo <= hi for lo, hi in spans), res.stdout
    rows = json.loads(out.read_text())
    alone = [r for r in rows if r["impl"] == "collectives-auto-alone"]
    assert len(alone) == 4 and all(r["wrong"] == 0 and r["time_us"] > 0 for r in alone)



@pytest.mark.timeout(150)
def test_compare_spreads_a_large_size_over_turns(tmp_path: Path) -> None:
    """A size from SPLIT_BYTES, 3 timed iterations a turn at most 2 (--turn-iters 2): every
    job (ours, auto alone, gloo) takes two turns of it, the driver's count of turns and each
    worker's agree (else a job would wait for a go that never comes), and every row is timed
    and checked."""
    if _bench_peers.missing("gloo"):
        pytest.skip(f"gloo: {_bench_peers.missing('gloo')}")
    assert bench.turn_rounds(3, 2, SPLIT_BYTES) == [2, 1]
    out = tmp_path / "rows.json"
    size = str(SPLIT_BYTES)
    res = _run(["allreduce", "-np", "2", "-b", size, "-e", size, "--iters", "3", "--turn-iters",
                "2", "--warmup", "1", "--algo", "ring,auto", "--compare", "gloo", "--check",
                "--json", out], timeout=140)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(out.read_text())
    assert sorted({r["impl"] for r in rows}) == ["collectives-auto", "collectives-auto-alone",
                                                 "collectives-ring", "gloo"]
    timed = [r for r in rows if r["time_us"] is not None]
    assert len(timed) == 7  # gloo's allreduce is in place only
    assert all(r["size"] == SPLIT_BYTES and r["time_us"] > 0 and r["wrong"] == 0 for r in timed)

# A stand-in for a bench job: the launcher starts NRANKS rank processes, each
# takes its turns through TurnGate like a real worker and logs, per size, when
# it became ready and when it measured ("measuring" is a 30 ms sleep). A rank
# told to fail at a size exits with code 3 instead of measuring it.
_FAKE_JOB = r'''
import os, subprocess, sys, time
sys.path.insert(0, os.environ["REPO"])
from collectives.bench.turns import TurnGate
args = sys.argv[1:]
turns = args[args.index("--turns") + 1]
out = args[-1]
nranks, nsteps, log, fail = int(args[0]), int(args[1]), args[2], args[3]
job = turns.rpartition(",")[2]
if "RANK" not in os.environ:
    if fail == f"start":
        sys.exit(5)
    procs = [subprocess.Popen([sys.executable, __file__, *args], env={**os.environ, "RANK": str(r)})
             for r in range(nranks)]
    codes = [p.wait() for p in procs]
    if not any(codes):
        open(out, "w").write("done")
    sys.exit(max(codes))
rank = int(os.environ["RANK"])
gate = TurnGate(turns, rank, nranks)
def note(*words):
    with open(log, "a") as fh:
        fh.write(" ".join(map(str, (f"{time.time():.6f}", job, rank) + words)) + "\n")
for step in range(nsteps):
    note("ready", step)
    gate(step)
    if fail == f"{rank}@{step}":
        sys.exit(3)
    t0 = time.time()
    time.sleep(0.03)
    note("measured", step, f"{t0:.6f}")
note("ready", nsteps)
gate(nsteps)
note("finished", nsteps)
gate.close()
'''


def _fake_jobs(tmp_path: Path, names: list, nranks: int, nsteps: int, fail: dict) -> tuple:
    script = tmp_path / "fake_job.py"
    script.write_text(_FAKE_JOB)
    log = tmp_path / "turns.log"
    jobs = [(name, [sys.executable, str(script), str(nranks), str(nsteps), str(log),
                    fail.get(name, "-"), "--worker-json", str(tmp_path / f"{name}.out")])
            for name in names]
    return jobs, log


def _turns_log(log: Path) -> tuple[dict, list]:
    """({(job, step): time every rank was ready}, [(start, end, job, step) per rank measured],
    {job: time its first rank was let finish})."""
    ready: dict = {}
    finished: dict = {}
    measured = []
    for line in log.read_text().splitlines():
        w = line.split()
        if w[3] == "ready":
            key = (w[1], int(w[4]))
            ready[key] = max(ready.get(key, 0.0), float(w[0]))
        elif w[3] == "finished":
            finished[w[1]] = min(finished.get(w[1], float(w[0])), float(w[0]))
        else:
            measured.append((float(w[5]), float(w[0]), w[1], int(w[4])))
    return ready, sorted(measured), finished


@pytest.mark.timeout(60)
def test_jobs_measure_each_size_in_turns(tmp_path: Path) -> None:
    """The driver's jobs run at once but measure one at a time, size by size, in the orders
    of turn_orders; none measures before all are ready, none ends before all have measured."""
    from collectives.bench import turns as _bench_turns

    names, nsteps = ["ours", "alone", "gloo"], 4
    jobs, log = _fake_jobs(tmp_path, names, 2, nsteps, {})
    lines: list = []
    codes = _bench_turns.run_in_turns(jobs, _env({"REPO": str(PACKAGE_ROOT)}), nsteps, bench.turn_orders,
                                      lambda name, line: lines.append((name, line)))
    assert codes == {name: 0 for name in names}, lines
    assert all((tmp_path / f"{name}.out").read_text() == "done" for name in names)
    ready, measured, finished = _turns_log(log)
    assert len(measured) == len(names) * 2 * nsteps
    # nobody measures before every job is ready for the first size
    assert min(m[0] for m in measured) > max(ready[(name, 0)] for name in names)
    # one job at a time: the turns, in time order, never overlap
    turns: list = []
    for start, end, job, step in measured:
        if turns and turns[-1][2:] == (job, step):
            turns[-1] = (turns[-1][0], max(turns[-1][1], end), job, step)
        else:
            turns.append((start, end, job, step))
    assert all(a[1] <= b[0] for a, b in zip(turns, turns[1:])), turns
    orders = bench.turn_orders(len(names))
    want = [(names[k], step) for step in range(nsteps) for k in orders[step % len(orders)]]
    assert [t[2:] for t in turns] == want
    # no job is let finish (write its results, exit) before every job has measured
    assert sorted(finished) == sorted(names)
    assert min(finished.values()) >= max(m[1] for m in measured)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fail", ["1@1", "start"])
def test_a_failed_job_leaves_the_others_their_turns(tmp_path: Path, fail: str) -> None:
    """A job whose rank dies mid-sweep, or that dies before connecting, is dropped (its
    launcher ended) and the other jobs measure every size."""
    from collectives.bench import turns as _bench_turns

    names, nsteps = ["ours", "mpi"], 3
    jobs, log = _fake_jobs(tmp_path, names, 2, nsteps, {"mpi": fail})
    codes = _bench_turns.run_in_turns(jobs, _env({"REPO": str(PACKAGE_ROOT)}), nsteps, bench.turn_orders,
                                      lambda name, line: None)
    assert codes["ours"] == 0 and codes["mpi"] != 0, codes
    assert not (tmp_path / "mpi.out").exists()
    _, measured, _ = _turns_log(log)
    assert sorted({(m[2], m[3]) for m in measured if m[2] == "ours"}) == \
        [("ours", s) for s in range(nsteps)]
    assert all(m[3] <= 1 for m in measured if m[2] == "mpi")  # none after the failure


@pytest.mark.timeout(120)
def test_rows_stream_as_measured_and_progress_goes_to_stderr() -> None:
    """stdout and stderr are pipes: each size's row is printed (and flushed) as soon as it is
    measured, while the sweep goes on, with the tables' numbers; stderr gets one progress
    line per size."""
    sizes = bench.sweep_sizes(8, 1 << 20, 4)
    proc = subprocess.Popen([sys.executable, "-m", "collectives.bench", "allreduce", "-np", "2",
                             "-b", "8", "-e", "1M", "-f", "4", "--iters", "2", "--warmup", "1",
                             "--algo", "ring", "--verbose"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            text=True, env=_env(), cwd=RUN_CWD, start_new_session=True)
    try:
        first = proc.stdout.readline()
        running = proc.poll() is None
        # Not communicate(): it reads the pipes below the text layer, and the rows that
        # readline() had already buffered (several, when the host is busy) were lost.
        rest = proc.stdout.read()
        err = proc.stderr.read()
        proc.wait(timeout=100)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode == 0, first + rest + err
    assert first.startswith("# measured collectives-ring 8 B: out-of-place "), first
    assert running, "the first row came only when the sweep had ended"
    lines = (first + rest).splitlines()
    measured = [line for line in lines if line.startswith("# measured ")]
    assert [int(line.split()[3]) for line in measured] == sizes, measured
    table_at = next(i for i, line in enumerate(lines) if line.startswith("# allreduce: "))
    assert lines.index(measured[-1]) < table_at
    for line, cells in zip(measured, _tables(first + rest)["collectives-ring"]):
        m = re.search(r"out-of-place (\S+) us busbw (\S+) GB/s, in-place (\S+) us busbw (\S+) "
                      r"GB/s$", line)
        assert m and m.groups() == (cells[5], cells[7], cells[9], cells[11]), (line, cells)
    progress = [line.split()[2] for line in err.splitlines()
                if line.startswith("collectives-bench: collectives: ")]
    assert progress == [f"{k}/{len(sizes)}" for k in range(1, len(sizes) + 1)], err


def test_help_shows_the_defaults() -> None:
    res = _run(["--help"])
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "largest size in bytes (K, M, G suffixes) (default: 256M)" in text, text
    for piece in ("smallest size in bytes (K, M, G suffixes) (default: 8)",
                  "timed iterations per size (default: 20)", "(default: 5)",
                  "element type (default: float32)", "broadcast root (default: 0)",
                  "(default: ring,tree,butterfly,auto)", "(default: 2)"):
        assert piece in text, piece
    assert "(default: None)" not in text and "(default: False)" not in text
    assert bench.build_parser().parse_args(["allreduce"]).maxbytes == 256 << 20


def test_one_number_format_across_tables(capsys: pytest.CaptureFixture) -> None:
    """The comparison prints busbw as the nccl-tests tables do (GB/s to 0.001), times to
    0.1 us."""
    rows = bench.median_rows([[_row("collectives-auto", 1 << 20, t), _row("gloo", 1 << 20, 2 * t)]
                              for t in (123.456, 123.456)])  # two runs: bandwidths filled in
    bench.print_table(rows[:1])
    bench.print_comparison(rows)
    out = capsys.readouterr().out
    busbw = f"{rows[0].busbw:.3f}"
    table = [line.split() for line in out.splitlines() if line.startswith(" ") and
             line.split()[0] == str(1 << 20)]
    assert table[0][11] == busbw and table[0][9] == "123.5", table  # the nccl-tests table
    assert table[1][1] == busbw and table[1][2] == f"{rows[1].busbw:.3f}", table  # comparison
    assert "collectives-auto 123.5  gloo 246.9" in out


def test_b2b_loops_time_calls_without_barriers_between_them() -> None:
    """--b2b N: after each iteration's barrier-per-call turns, each implementation (in the
    same order) runs one barrier then N calls with nothing between them; the loop's rows
    are separate (mode back-to-back), each time the loop's over N."""
    be = _RecordingBackend()
    rows, notes = bench.sweep(be, "allreduce", ["ring", "tree"], "float32", "sum", [64],
                              iters=2, warmup=1, check=False, progress=False, b2b=3)
    timed = (["|", "ring", "|", "tree"], ["|", "tree", "|", "ring"])  # turn_orders(2)
    loops = (["|"] + ["ring"] * 3 + ["|"] + ["tree"] * 3,
             ["|"] + ["tree"] * 3 + ["|"] + ["ring"] * 3)
    one_placement = ["ring", "tree"] + timed[0] + loops[0] + timed[1] + loops[1]
    assert be.log == one_placement * 2
    assert notes == [] and len(rows) == 8
    modes = Counter((r.impl, r.mode) for r in rows)
    assert modes == {("rec-ring", "barrier"): 2, ("rec-tree", "barrier"): 2,
                     ("rec-ring", "back-to-back"): 2, ("rec-tree", "back-to-back"): 2}
    assert all(r.time_us > 0 and r.algbw == pytest.approx(64 / r.time_us / 1e3) for r in rows)
    # the tables: each implementation's back-to-back table right after its barrier one
    from io import StringIO
    text = StringIO()
    bench.print_table(rows, text)
    heads = [line for line in text.getvalue().splitlines() if line.startswith("# allreduce: ")]
    assert [h.split(",")[0] + (" b2b" if "back-to-back" in h else "") for h in heads] == \
        ["# allreduce: rec-ring", "# allreduce: rec-ring b2b", "# allreduce: rec-tree",
         "# allreduce: rec-tree b2b"], heads
    # --tune reads the barrier-per-call rows only
    mk = lambda algo, t, mode: bench.Row("allreduce", f"collectives-{algo}", 4, 64, 16, "float32",
                                         "sum", -1, t, 1.0, 1.0, None, False, "h", mode)
    assert bench.tune_table([mk("ring", 1.5, "barrier"), mk("tree", 2, "barrier"),
                             mk("tree", 0.1, "back-to-back")]) == [(4, 18446744073709551615, "ring")]
    with pytest.raises(SystemExit):
        bench.main(["allreduce", "--b2b", "-1"])


@pytest.mark.timeout(150)
def test_b2b_mode_times_ours_and_the_peers_alike(tmp_path: Path) -> None:
    """End to end over TCP at 2 ranks: every job (our algorithms, auto alone, OpenMPI or
    gloo) gives a back-to-back row beside each barrier-per-call row, the out-of-place
    loops' last results are checked, and a second comparison gives the back-to-back
    ratios. Asserts the structure and sanity of the output, never speed."""
    peer = next((p for p in ("mpi", "gloo") if not _bench_peers.missing(p)), None)
    if peer is None:
        pytest.skip("neither mpi4py+mpirun nor torch is installed")
    out = tmp_path / "rows.json"
    res = _run(["allreduce", "-np", "2", "-b", "64K", "-e", "256K", "-f", "4", "--iters", "2",
                "--warmup", "1", "--b2b", "4", "--algo", "ring,auto", "--compare", peer,
                "--check", "--json", out, "--verbose"], extra_env={"COLLECTIVES_TRANSPORT": "tcp"},
               timeout=140)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(out.read_text())
    impls = ["collectives-ring", "collectives-auto", "collectives-auto-alone", peer]
    for impl in impls:
        for mode in ("barrier", "back-to-back"):
            mine = [r for r in rows if r["impl"] == impl and r["mode"] == mode]
            timed = [r for r in mine if r["time_us"] is not None]
            assert sorted((r["size"], r["inplace"]) for r in mine) == \
                [(65536, False), (65536, True), (262144, False), (262144, True)], (impl, mode)
            assert len(timed) == (2 if peer == "gloo" and impl == "gloo" else 4), (impl, mode)
            for r in timed:
                assert r["time_us"] > 0
                assert r["busbw"] == pytest.approx(r["size"] / r["time_us"] / 1e3, rel=1e-6)
                # in place, a sum loop leaves n^k times the input: not checked (N/A)
                want = 0 if mode == "barrier" or not r["inplace"] else None
                assert r["wrong"] == want, r
    heads = [line for line in res.stdout.splitlines() if line.startswith("# allreduce: ")]
    assert len(heads) == 8 and sum("back-to-back (no barrier between calls)" in h
                                   for h in heads) == 4, heads
    assert "# Wrong values total   : 0 OK" in res.stdout
    at = res.stdout.index("# Comparison, back-to-back calls: in-place busbw")
    assert res.stdout.index("# Comparison: in-place busbw") < at
    # back to back out of place too (a training loop's calls): mpi has such rows, gloo not
    oop = res.stdout.index("# Comparison, back-to-back calls: out-of-place busbw")
    assert at < oop
    for section, timed in ((res.stdout[at:oop], True), (res.stdout[oop:], peer == "mpi")):
        ratios = [line.split()[-1] for line in section.splitlines()
                  if re.match(r"\s+(65536|262144)\s", line)]
        assert len(ratios) == 2, section
        assert all(float(x[:-1]) > 0 for x in ratios) if timed else ratios == ["-", "-"], section
    measured = [line for line in res.stdout.splitlines()
                if line.startswith("# measured ") and " back-to-back: " in line]
    assert len(measured) == 2 * len(impls), measured  # live rows as they come, both sizes
