"""Helpers imported by every worker script that tests/conftest.py's run_world starts.

A worker runs a grid of cases in a loop and reports through stdout lines
``@@ {json}`` (see ``emit``). A wrong value is reported with the case's
parameters, this rank and the first differing index (``check``), and the
worker keeps going; ``finish()`` exits 1 if anything was wrong. Results are
also hashed per case, and ``verify_hashes`` checks that every rank got
bit-identical results.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback

import numpy as np

RANK = int(os.environ.get("COLLECTIVES_RANK", os.environ.get("RANK", "0")))

_failures = 0
_MAX_REPORTED = 25
_hashes: dict = {}

DTYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
MPI_DTYPES = [d for d in DTYPES if d != "bfloat16"]
OPS = ["sum", "prod", "min", "max", "avg"]
ALGORITHMS = ["ring", "tree", "butterfly", "auto"]
SIGNED = {"int8", "int32", "int64", "float16", "bfloat16", "float32", "float64"}


def emit(tag: str, **data) -> None:
    """Print one record the test reads back: ``@@ {"tag": tag, "rank": r, ...}``."""
    data = {"tag": tag, "rank": RANK, **data}
    sys.stdout.write("@@ " + json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


def fail(case, message: str) -> None:
    """Record a wrong result (printed up to a limit; always counted)."""
    global _failures
    _failures += 1
    if _failures <= _MAX_REPORTED:
        emit("fail", case=case, message=message)


def expect(cond: bool, case, message: str) -> bool:
    """fail(case, message) unless cond."""
    if not cond:
        fail(case, message)
    return bool(cond)


# ------------------------------------------------------------ dtypes, data

def np_dtype(dtype: str):
    """The numpy storage dtype (bfloat16 is stored as uint16 bit patterns)."""
    return np.uint16 if dtype == "bfloat16" else np.dtype(dtype)


def f32_to_bf16(x) -> np.ndarray:
    """float32 values -> bfloat16 bit patterns (round to nearest even)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype(np.uint16)


def bf16_to_f32(bits) -> np.ndarray:
    """bfloat16 bit patterns -> float32 values."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def store(values, dtype: str) -> np.ndarray:
    """Exact small numbers (float64/int64 array) stored in `dtype`."""
    if dtype == "bfloat16":
        return f32_to_bf16(np.asarray(values, dtype=np.float32))
    return np.asarray(values).astype(np_dtype(dtype))


def as_float(arr, dtype: str) -> np.ndarray:
    """Stored values back as float64 (for messages and comparisons)."""
    if dtype == "bfloat16":
        return bf16_to_f32(arr).astype(np.float64)
    return np.asarray(arr).astype(np.float64)


# rank_values, expected_values and expected_stored are periodic in the element index:
# (i + seed) % 7, and for prod (i + rank) % 3 and (i + 2 * rank) % 5. Each is computed on
# one common period (lcm(7, 15) = 105 elements) and tiled to the count: the same values
# as computing every element, at memcpy speed (the grids' large counts made these
# helpers most of a grid's time).
_PERIOD = 105


def _tiled(one: np.ndarray, count: int) -> np.ndarray:
    """`one` (a period) repeated to `count` elements, as a fresh array."""
    if count <= one.size:
        return one[:count].copy()
    return np.tile(one, -(-count // one.size))[:count]


def _rank_values_period(op: str, dtype: str, rank: int, seed: int) -> np.ndarray:
    i = np.arange(_PERIOD, dtype=np.int64) + seed
    if op == "prod":
        v = np.where((i + rank) % 3 == 0, 2, 1).astype(np.int64)
        if dtype in SIGNED:
            v = np.where((i + 2 * rank) % 5 == 0, -v, v)
        return v
    base = i % 7 - (3 if dtype in SIGNED else 0)
    return base + rank


def rank_values(op: str, dtype: str, count: int, rank: int, seed: int = 0) -> np.ndarray:
    """Rank-derived small integers (int64) whose reductions are exact in every dtype.

    sum/min/max/avg: base(i) + rank with base(i) = (i + seed) % 7 (minus 3 when
    signed), so sum = n*base + n(n-1)/2, min = base, max = base + n - 1.
    prod: 1 or 2 (negated for signed types on some elements), at most 3 twos
    among 8 ranks, so |prod| <= 8.
    """
    return _tiled(_rank_values_period(op, dtype, rank, seed), count)


def _expected_values_period(op: str, dtype: str, n: int, seed: int) -> np.ndarray:
    i = np.arange(_PERIOD, dtype=np.int64) + seed
    base = i % 7 - (3 if dtype in SIGNED else 0)
    if op == "sum":
        return n * base + n * (n - 1) // 2
    if op == "min":
        return base
    if op == "max":
        return base + n - 1
    if op == "avg":
        s = n * base + n * (n - 1) // 2
        if dtype.startswith(("int", "uint")):
            return np.sign(s) * (np.abs(s) // n)  # C division truncates toward zero
        return s.astype(np.float64)  # divided in the dtype by expected_stored
    # prod: oracle over the ranks (small, exact)
    out = np.ones(_PERIOD, dtype=np.int64)
    for r in range(n):
        out = out * _rank_values_period("prod", dtype, r, seed)
    return out


def expected_values(op: str, dtype: str, count: int, n: int, seed: int = 0) -> np.ndarray:
    """The exact result (float64 or int64) of op over ranks 0..n-1 of rank_values."""
    return _tiled(_expected_values_period(op, dtype, n, seed), count)


def expected_stored(op: str, dtype: str, count: int, n: int, seed: int = 0) -> np.ndarray:
    """expected_values stored in dtype; AVG on floats divides as the dtype does."""
    e = _expected_values_period(op, dtype, n, seed)
    if op == "avg" and not dtype.startswith(("int", "uint")):
        if dtype == "bfloat16":
            one = f32_to_bf16(e.astype(np.float32) / np.float32(n))
        elif dtype == "float16":
            one = (e.astype(np.float32) / np.float32(n)).astype(np.float16)
        else:
            t = np_dtype(dtype)
            one = (e.astype(t) / t.type(n)).astype(t)
    else:
        one = store(e, dtype)
    return _tiled(one, count)  # every step above is elementwise: a period suffices


def check(case, got: np.ndarray, expected: np.ndarray, dtype: str = "") -> bool:
    """Bitwise comparison; on mismatch report the first differing index and values."""
    got = np.asarray(got)
    expected = np.asarray(expected)
    if got.shape != expected.shape:
        fail(case, f"shape {got.shape} != expected {expected.shape}")
        return False
    if got.dtype != expected.dtype:
        expected = expected.astype(got.dtype)
    a = got.view(np.uint8).reshape(got.size, -1) if got.size else got
    b = expected.view(np.uint8).reshape(expected.size, -1) if expected.size else expected
    if got.size == 0:
        return True
    if np.array_equal(a, b):  # the usual case, fast; on a mismatch, find the first below
        return True
    diff = np.nonzero(np.any(a != b, axis=1))[0]
    if diff.size == 0:
        return True
    k = int(diff[0])
    gv, ev = got[k], expected[k]
    if dtype == "bfloat16":
        gv, ev = float(bf16_to_f32(gv)), float(bf16_to_f32(ev))
    fail(case, f"{diff.size} of {got.size} elements differ; first at index {k}: "
               f"got {gv!r}, expected {ev!r}")
    return False


def record_hash(case, arr) -> None:
    """Remember a digest of this case's result for verify_hashes."""
    # sha256 (hardware-assisted here) reads the array in place: twice blake2b's speed
    _hashes[json.dumps(case, sort_keys=True, default=str)] = \
        hashlib.sha256(np.ascontiguousarray(arr)).hexdigest()[:16]


def verify_hashes(comm) -> None:
    """Every rank must have bit-identical results for every recorded case."""
    all_hashes = comm.allgather(_hashes)
    for key, h in _hashes.items():
        others = {r: hs.get(key) for r, hs in enumerate(all_hashes)}
        if len(set(others.values())) != 1:
            fail(json.loads(key), f"results differ across ranks: {others}")
    emit("hashes", cases=len(_hashes))
    _hashes.clear()


def guarded(case, fn, *args, **kwargs):
    """Call fn; if it raises, report the case and re-raise (the world is broken then)."""
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:
        emit("fail", case=case, message=f"raised {type(exc).__name__}: {exc}",
             tb=traceback.format_exc()[-2000:])
        raise


def error_record(exc: BaseException, started: float, **extra) -> None:
    """Emit an "error" record: exception type, message, seconds since `started`."""
    from collectives import MPI

    emit("error", type=type(exc).__name__, mpi=isinstance(exc, MPI.Exception),
         message=str(exc), elapsed=round(time.monotonic() - started, 3), **extra)


def fd_count() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def task_count() -> int:
    """OS threads of this process."""
    return len(os.listdir("/proc/self/task"))


def arrive(name: str) -> None:
    """Tell the other ranks of this world that this rank reached `name` (a file in the
    world's own directory, WORLD_DIR: see conftest.run_world)."""
    open(os.path.join(os.environ["WORLD_DIR"], "arrived-" + name), "w").close()


def wait_for(*names: str, timeout: float = 30.0) -> bool:
    """Wait until every name has arrived (see arrive): instead of sleeping "long enough"
    for the others to get somewhere. False if `timeout` seconds passed first."""
    paths = [os.path.join(os.environ["WORLD_DIR"], "arrived-" + name) for name in names]
    end = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def finish() -> None:
    """Exit 1 if any case failed (flushing first)."""
    emit("done", failures=_failures)
    sys.stdout.flush()
    sys.stderr.flush()
    if _failures:
        sys.exit(1)
