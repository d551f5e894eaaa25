"""The tuning table on multi-host topologies: rows keyed by shape (HxL).

collectives-bench --tune run on a cluster whose allreduce goes in two levels
measures two_level against the flat algorithms and writes rows keyed by the
cluster's shape ("8 65536 butterfly 2x4"); auto on a communicator of that
shape reads them (and only them), and without them goes two_level at every
size. The choice is checked through _core.tune_choose(labels=...) in a child
process (the table is read once per process), the bench's side through its
functions; tests/test_multihost_tune.py runs --tune on a namespace cluster.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from collectives.bench import driver as bench
from collectives.bench.sweep import CollectivesBackend

from conftest import RUN_CWD

pytestmark = pytest.mark.timeout(60)

ALL = 18446744073709551615

CHOICES = r"""
import json, sys
from collectives._core import tune_choose
cases = json.loads(sys.argv[1])
print(json.dumps([tune_choose(0, nbytes, labels) for labels, nbytes in cases]))
"""


def _choices(tune: Path, cases: list, env: dict | None = None) -> tuple[list, str]:
    e = {k: v for k, v in __import__("os").environ.items() if not k.startswith("COLLECTIVES_")}
    e.update({"COLLECTIVES_TUNE_FILE": str(tune), **(env or {})})
    res = subprocess.run([sys.executable, "-c", CHOICES, json.dumps(cases)], capture_output=True,
                         text=True, env=e, cwd=RUN_CWD, timeout=30)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout), res.stderr


B24 = [0, 0, 0, 0, 1, 1, 1, 1]
C24 = [0, 1, 0, 1, 0, 1, 0, 1]  # cyclic: the same shape
B22 = [0, 0, 1, 1]
ONE = [0] * 8


def test_auto_reads_the_rows_of_its_shape(tmp_path: Path) -> None:
    tune = tmp_path / "tune.txt"
    tune.write_text(f"8 65536 butterfly 2x4\n8 {ALL} two_level 2x4\n"
                    f"8 {ALL} tree tcp\n8 {ALL} tree shm\n8 {ALL} tree\n"
                    f"4 {ALL} ring 2x1\n")  # 2x1 is no two-level shape: ignored, warned
    cases = [(B24, 8), (B24, 65536), (B24, 65537), (B24, 64 << 20), (C24, 8), (C24, 1 << 20),
             (B22, 8), (B22, 64 << 20), (ONE, 8), (ONE, 64 << 20),
             ([0, 0, 0, 0, 1, 1, 1, 1, 1], 8)]  # 2 + 5 ranks: shape 2x5, no rows
    got, err = _choices(tune, cases)
    assert got == ["butterfly", "butterfly", "two_level", "two_level", "butterfly", "two_level",
                   "two_level", "two_level", "tree", "tree", "two_level"]
    assert "'2x1' is neither a transport" in err, err


def test_forced_algorithm_beats_shape_rows(tmp_path: Path) -> None:
    tune = tmp_path / "tune.txt"
    tune.write_text(f"8 {ALL} butterfly 2x4\n")
    got, _ = _choices(tune, [(B24, 8), (ONE, 8)], {"COLLECTIVES_ALGO": "ring"})
    assert got == ["ring", "ring"]


def test_tune_table_keyed_by_shape(tmp_path: Path) -> None:
    mk = lambda size, algo, t: bench.Row("allreduce", f"collectives-{algo}", 8, size, size // 4,
                                         "float32", "sum", -1, t, 1.0, 1.0, None, False, "h")
    rows = [mk(8, "butterfly", 1), mk(8, "two_level", 2), mk(8, "ring", 3),
            mk(4096, "butterfly", 2), mk(4096, "two_level", 1.5),
            mk(1 << 20, "two_level", 10), mk(1 << 20, "ring", 20)]
    table = bench.tune_table(rows)
    assert table == [(8, 8, "butterfly"), (8, ALL, "two_level")]
    tune = tmp_path / "tune.txt"
    tune.write_text(f"8 {ALL} ring tcp\n8 64 tree 2x4\n8 {ALL} ring 4x2\n")
    bench.write_tune_file(table, str(tune), "2x4")
    rows = [tuple(line.split()) for line in tune.read_text().splitlines() if not line.startswith("#")]
    assert sorted(rows) == sorted([("8", str(ALL), "ring", "tcp"), ("8", str(ALL), "ring", "4x2"),
                                   ("8", "8", "butterfly", "2x4"), ("8", str(ALL), "two_level", "2x4")])
    got, _ = _choices(tune, [(B24, 8), (B24, 9), ([0, 0, 1, 1, 2, 2, 3, 3], 8)])
    assert got == ["butterfly", "two_level", "ring"]


class _Core:
    def __init__(self, ids: list) -> None:
        self.ids = ids

    def host_ids(self) -> list:
        return self.ids


class _Comm:
    def __init__(self, ids: list) -> None:
        self._core = _Core(ids)
        self.local_size = ids.count(ids[0])


def _backend(ids: list) -> CollectivesBackend:
    b = CollectivesBackend.__new__(CollectivesBackend)  # without a world
    b.comm, b.size, b.rank = _Comm(ids), len(ids), 0
    return b


@pytest.mark.parametrize("ids,shape", [
    (["a", "a", "b", "b"], "2x2"), (["a", "b", "a", "b", "a", "b", "a", "b"], "2x4"),
    (["a", "a", "b", "b", "b"], "2x3"), (["a", "b", "c", "d"], ""), (["a", "a", "a"], ""),
    (["a", "", "", "a"], "3x2"),  # unknown host ids are hosts of their own
])
def test_bench_keys_its_rows_by_shape(ids: list, shape: str, monkeypatch) -> None:
    monkeypatch.delenv("COLLECTIVES_TRANSPORT", raising=False)
    b = _backend(ids)
    assert b.shape() == shape
    assert b.transport() == (shape or ("shm" if len(set(ids)) == 1 else "tcp"))


def test_tune_adds_two_level_only_on_a_two_level_world() -> None:
    p = bench.build_parser()
    args = p.parse_args(["allreduce", "--tune", "x.txt"])
    bench._check_args(p, args)
    assert args.algos == ["ring", "tree", "butterfly"] and args.tuning
    assert "--tuning" in bench.worker_args(args)
    args = p.parse_args(["allreduce", "--algo", "two_level,ring"])
    bench._check_args(p, args)
    assert args.algos == ["two_level", "ring"] and not args.tuning
