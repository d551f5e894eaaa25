"""Microbenchmarks of the host SUM kernels against numpy's np.add(a, b, out=c).

Run:  pytest bench/bench_reduce.py --benchmark-only

Each case reduces two 16 MiB buffers into a third (larger than L2, so this is
mostly memory bandwidth) and records in ``extra_info`` the GB/s counted as the
bytes of in1 + in2 + out per second (3 x 16 MiB per call), the same on both
sides, so the two columns compare directly. numpy has no bfloat16, so that
row has no numpy baseline.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from collectives import _core

NBYTES = 16 << 20
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32"]


def _inputs(dtype: str):
    """Two inputs and an output of NBYTES each, with finite values."""
    rng = np.random.default_rng(0)
    n = NBYTES // (2 if dtype in ("float16", "bfloat16") else np.dtype(dtype).itemsize)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    if dtype == "bfloat16":  # the top 16 bits of a float32 are a valid bfloat16
        return (x.view(np.uint32) >> 16).astype(np.uint16), \
            (y.view(np.uint32) >> 16).astype(np.uint16), np.empty(n, np.uint16)
    if dtype == "int32":
        return (x * 1000).astype(np.int32), (y * 1000).astype(np.int32), np.empty(n, np.int32)
    return x.astype(dtype), y.astype(dtype), np.empty(n, dtype)


def _run(benchmark, fn: Callable[[], None]) -> None:
    fn()  # touch the pages before timing
    benchmark(fn)
    if benchmark.stats is not None:  # None under --benchmark-disable
        benchmark.extra_info["GB/s"] = round(3 * NBYTES / benchmark.stats.stats.mean / 1e9, 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_collectives(benchmark, dtype: str) -> None:
    a, b, out = _inputs(dtype)
    benchmark.group = f"sum-{dtype}-16MiB"
    _run(benchmark, lambda: _core.reduce_local(out, a, b, "sum", dtype))


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bfloat16"])
def test_sum_numpy(benchmark, dtype: str) -> None:
    a, b, out = _inputs(dtype)
    benchmark.group = f"sum-{dtype}-16MiB"
    _run(benchmark, lambda: np.add(a, b, out=out))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sum_collectives_in_place(benchmark, dtype: str) -> None:
    """out = in1, the form the ring allreduce uses (2 x 16 MiB read, 1 written)."""
    a, b, _ = _inputs(dtype)
    benchmark.group = f"sum-{dtype}-16MiB"
    _run(benchmark, lambda: _core.reduce_local(a, a, b, "sum", dtype))
