"""Host reduction kernels (native/reduce/reduce.c) against numpy as the oracle.

Every test runs on two backends:
  * ``ext``: ``collectives._core.reduce_local`` / ``scale_local``, the path
    users and the collectives take;
  * ``ctypes``: native/reduce/reduce.c compiled alone with gcc and loaded with ctypes,
    a secondary check of the kernels that does not depend on the extension
    (skipped when gcc is absent).

Expected values are exact: integer ops wrap as numpy's do, float16 is
numpy's own float16 arithmetic (float32 then round to nearest even, which is
correctly rounded for + - * /, so it must match bit for bit), bfloat16 is the
float32 result rounded by ``f32_to_bf16`` below. NaNs compare as NaNs (the
payload is not part of the contract).
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from typing import Callable, Optional

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DTYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
INT_DTYPES = ["int8", "uint8", "int32", "int64"]
FLOAT_DTYPES = ["float16", "bfloat16", "float32", "float64"]
OPS = ["sum", "prod", "min", "max", "avg"]
# Odd tails past every vector width (64 bytes) and past the 256-element half block.
LENGTHS = [0, 1, 7, 31, 1000, 4097]


# ---- bfloat16 reference ------------------------------------------------------

def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen bfloat16 bits (uint16) to float32: they are its top half."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 bits, nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)


def storage_dtype(dtype: str) -> np.dtype:
    """The numpy dtype that holds `dtype` (bfloat16 lives in uint16)."""
    return np.dtype(np.uint16 if dtype == "bfloat16" else dtype)


def as_values(x: np.ndarray, dtype: str) -> np.ndarray:
    """Arithmetic view of an array of `dtype`, for comparisons."""
    return bf16_to_f32(x) if dtype == "bfloat16" else x


# ---- oracle --------------------------------------------------------------

NP_OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "avg": np.add}


def reference(op: str, a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """numpy's result of a op b in `dtype` (wrapping for integers)."""
    fn = NP_OPS[op]
    with np.errstate(all="ignore"):
        if dtype == "bfloat16":
            return f32_to_bf16(fn(bf16_to_f32(a), bf16_to_f32(b)))
        return fn(a, b)


def assert_same(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    """Exact equality; NaN matches NaN."""
    got_v, want_v = as_values(got, dtype), as_values(want, dtype)
    if dtype in INT_DTYPES:
        np.testing.assert_array_equal(got_v, want_v)
    else:
        assert np.array_equal(got_v, want_v, equal_nan=True), (
            f"{dtype}: first mismatches at "
            f"{np.flatnonzero(~((got_v == want_v) | (np.isnan(got_v) & np.isnan(want_v))))[:8]}")


def random_array(rng: np.random.Generator, dtype: str, n: int) -> np.ndarray:
    """Full-range integers (so SUM/PROD wrap); floats of mixed sign and scale."""
    if dtype in INT_DTYPES:
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=n, endpoint=True, dtype=dtype)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, size=n)).astype(np.float32)
    if dtype == "bfloat16":
        return f32_to_bf16(x)
    return x.astype(dtype)


# ---- backends ------------------------------------------------------------

_DTYPE_CODES = {name: i for i, name in enumerate(DTYPES)}
_OP_CODES = {name: i for i, name in enumerate(OPS)}


class CtypesReduce:
    """reduce.c loaded with ctypes, with the extension's Python signatures."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.coll_reduce_local.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_size_t,
                                                                   ctypes.c_int, ctypes.c_int]
        lib.coll_scale_local.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_size_t, ctypes.c_int,
                                                                 ctypes.c_double]

    @staticmethod
    def _dtype(dtype: Optional[str], *arrays: np.ndarray) -> int:
        name = dtype if dtype is not None else arrays[0].dtype.name
        if name not in _DTYPE_CODES:
            raise ValueError(f"unsupported dtype {name!r}")
        for a in arrays:
            if a.dtype != storage_dtype(name) or a.shape != arrays[0].shape:
                raise ValueError("arrays differ in dtype or shape")
        return _DTYPE_CODES[name]

    def reduce_local(self, out: np.ndarray, in1: np.ndarray, in2: np.ndarray,
                     op: str = "sum", dtype: Optional[str] = None) -> None:
        """out = in1 op in2 through coll_reduce_local."""
        if op not in _OP_CODES:
            raise ValueError(f"unknown op {op!r}")
        code = self._dtype(dtype, out, in1, in2)
        rc = self.lib.coll_reduce_local(out.ctypes.data, in1.ctypes.data, in2.ctypes.data,
                                        out.size, code, _OP_CODES[op])
        if rc != 0:
            raise ValueError(f"coll_reduce_local returned {rc}")

    def scale_local(self, out: np.ndarray, inp: np.ndarray, divisor: float,
                    dtype: Optional[str] = None) -> None:
        """out = inp / divisor through coll_scale_local."""
        code = self._dtype(dtype, out, inp)
        rc = self.lib.coll_scale_local(out.ctypes.data, inp.ctypes.data, out.size, code,
                                       float(divisor))
        if rc != 0:
            raise ValueError(f"coll_scale_local returned {rc}")


@pytest.fixture(scope="session")
def ctypes_backend(tmp_path_factory: pytest.TempPathFactory) -> CtypesReduce:
    """reduce.c built as its own shared library (same flags as setup.py, symbols visible)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found: the ctypes check of reduce.c needs it")
    lib = tmp_path_factory.mktemp("reduce") / "libreduce.so"
    subprocess.run([gcc, "-O3", "-std=gnu11", "-Wall", "-Werror", "-shared", "-fPIC",
                    "-I" + os.path.join(ROOT, "native"),
                    os.path.join(ROOT, "native", "reduce", "reduce.c"), "-o", str(lib)], check=True)
    return CtypesReduce(ctypes.CDLL(str(lib)))


@pytest.fixture(params=["ext", "ctypes"])
def backend(request: pytest.FixtureRequest):
    """The object with reduce_local/scale_local under test."""
    if request.param == "ext":
        from collectives import _core  # must be built: a missing extension is a failure
        return _core
    return request.getfixturevalue("ctypes_backend")


# ---- every (dtype, op, length, aliasing) ------------------------------------

@pytest.mark.parametrize("alias", ["none", "out=in1", "out=in2"])
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_matches_numpy(backend, dtype: str, op: str, n: int, alias: str) -> None:
    rng = np.random.default_rng([DTYPES.index(dtype), OPS.index(op), n])
    a, b = random_array(rng, dtype, n), random_array(rng, dtype, n)
    want = reference(op, a, b, dtype)
    if alias == "out=in1":
        out = a
    elif alias == "out=in2":
        out = b
    else:
        out = np.full(n, 0x55, dtype=storage_dtype(dtype))
    backend.reduce_local(out, a, b, op=op, dtype=dtype)
    assert_same(out, want, dtype)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bfloat16"])
def test_dtype_inferred_from_arrays(backend, dtype: str) -> None:
    rng = np.random.default_rng(1)
    a, b = random_array(rng, dtype, 100), random_array(rng, dtype, 100)
    out = np.empty_like(a)
    backend.reduce_local(out, a, b)
    assert_same(out, reference("sum", a, b, dtype), dtype)


# ---- integers wrap like numpy ------------------------------------------------

@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_integer_wraparound(backend, dtype: str) -> None:
    info = np.iinfo(dtype)
    bits = np.dtype(dtype).itemsize * 8
    a = np.array([info.max, info.min, info.max, 1 << (bits // 2), info.min, -1 if info.min else 3],
                 dtype=np.int64).astype(dtype)
    b = np.array([1, -1 if info.min else 0, info.max, 1 << (bits // 2), -1 if info.min else 2,
                  info.min if info.min else info.max], dtype=np.int64).astype(dtype)
    for op in ("sum", "prod"):
        out = np.empty_like(a)
        backend.reduce_local(out, a, b, op=op)
        assert_same(out, reference(op, a, b, dtype), dtype)
    out = np.empty(1, dtype)
    backend.reduce_local(out, a[:1], np.ones(1, dtype), op="sum")
    assert out[0] == info.min  # max + 1 wraps to min


# ---- NaN, Inf, signed zero -------------------------------------------------

@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_nan_propagates(backend, dtype: str, op: str) -> None:
    nan, inf = float("nan"), float("inf")
    # NaN in in1 only, in in2 only, both, neither; at positions spread over
    # vector lanes and the scalar tail.
    x = np.array([nan, 1.0, nan, 2.0, -inf, inf, 0.0, -0.0, nan, 5.0, -3.0] * 7, np.float32)
    y = np.array([1.0, nan, nan, 3.0, inf, inf, -0.0, 0.0, -2.0, nan, -4.0] * 7, np.float32)
    if dtype == "bfloat16":
        a, b = f32_to_bf16(x), f32_to_bf16(y)
    else:
        a, b = x.astype(dtype), y.astype(dtype)
    out = np.empty_like(a)
    backend.reduce_local(out, a, b, op=op, dtype=dtype)
    assert_same(out, reference(op, a, b, dtype), dtype)
    got = as_values(out, dtype)
    assert np.isnan(got[np.isnan(x) | np.isnan(y)]).all()


def test_float16_all_bit_patterns_round_trip(backend) -> None:
    """x * 1 == x for every float16, so widening and narrowing are exact."""
    a = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    out = np.empty_like(a)
    backend.reduce_local(out, a, np.ones_like(a), op="prod")
    assert_same(out, a, "float16")


def test_bfloat16_all_bit_patterns_round_trip(backend) -> None:
    a = np.arange(1 << 16, dtype=np.uint16)
    out = np.empty_like(a)
    backend.reduce_local(out, a, f32_to_bf16(np.ones(a.size, np.float32)), op="prod",
                         dtype="bfloat16")
    assert_same(out, a, "bfloat16")


def test_float16_overflow_subnormals_and_ties(backend) -> None:
    tiny = np.float16(2.0 ** -24)  # smallest subnormal
    a = np.array([60000, -60000, tiny, tiny, 2048, 2048, 1, 65504, 65504], np.float16)
    b = np.array([10000, -10000, tiny, -tiny, 1, 3, np.float16(2.0 ** -11), 16, 8], np.float16)
    # 2048 + 1 is a tie (rounds to even 2048), 2048 + 3 rounds up to 2052,
    # 1 + 2^-11 is a tie at 1; 65504 + 16 is the tie between 65504 (odd) and
    # 65536, so it overflows to Inf, while 65504 + 8 stays finite.
    out = np.empty_like(a)
    backend.reduce_local(out, a, b, op="sum")
    assert_same(out, reference("sum", a, b, "float16"), "float16")
    assert out.tolist() == [np.inf, -np.inf, 2.0 ** -23, 0.0, 2048, 2052, 1, np.inf, 65504]


def test_bfloat16_rounds_to_nearest_even(backend) -> None:
    one = f32_to_bf16(np.array([1.0], np.float32))
    half_ulp = f32_to_bf16(np.array([2.0 ** -8], np.float32))  # bf16 ulp of 1 is 2^-7
    out = np.empty_like(one)
    backend.reduce_local(out, one, half_ulp, op="sum", dtype="bfloat16")
    assert bf16_to_f32(out)[0] == 1.0  # tie to even
    three_q = f32_to_bf16(np.array([1.0 + 2.0 ** -7], np.float32))
    backend.reduce_local(out, three_q, half_ulp, op="sum", dtype="bfloat16")
    assert bf16_to_f32(out)[0] == 1.0 + 2.0 ** -6  # tie, odd mantissa rounds up


# ---- hypothesis: arbitrary bit patterns and lengths -------------------------

# The backend fixture holds no state, so one instance may serve every example.
SHARED_FIXTURE = [HealthCheck.function_scoped_fixture]

def _bits(n: int, width: int) -> st.SearchStrategy:
    return st.lists(st.integers(0, (1 << width) - 1), min_size=n, max_size=n)


@st.composite
def bit_pairs(draw: Callable, width: int):
    n = draw(st.integers(0, 600))
    return draw(_bits(n, width)), draw(_bits(n, width))


@settings(max_examples=30, deadline=None, suppress_health_check=SHARED_FIXTURE)
@given(pair=bit_pairs(16), op=st.sampled_from(OPS))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_random_bits(backend, dtype: str, pair, op: str) -> None:
    """Every float16/bfloat16 bit pattern (NaN, Inf, subnormals) in every op."""
    a = np.array(pair[0], np.uint16)
    b = np.array(pair[1], np.uint16)
    if dtype == "float16":
        a, b = a.view(np.float16), b.view(np.float16)
    out = np.empty_like(a)
    backend.reduce_local(out, a, b, op=op, dtype=dtype)
    assert_same(out, reference(op, a, b, dtype), dtype)


@settings(max_examples=30, deadline=None, suppress_health_check=SHARED_FIXTURE)
@given(pair=bit_pairs(32), op=st.sampled_from(OPS))
@pytest.mark.parametrize("dtype", ["float32", "int32", "uint8", "int8"])
def test_random_bits(backend, dtype: str, pair, op: str) -> None:
    a = np.array(pair[0], np.uint32).astype(np.uint8 if "8" in dtype else np.uint32)
    b = np.array(pair[1], np.uint32).astype(a.dtype)
    a, b = a.view(dtype), b.view(dtype)
    out = np.empty_like(a)
    backend.reduce_local(out, a, b, op=op)
    assert_same(out, reference(op, a, b, dtype), dtype)


@settings(max_examples=30, deadline=None, suppress_health_check=SHARED_FIXTURE)
@given(pair=bit_pairs(64), op=st.sampled_from(OPS))
@pytest.mark.parametrize("dtype", ["float64", "int64"])
def test_random_bits_64(backend, dtype: str, pair, op: str) -> None:
    a = np.array(pair[0], np.uint64).view(dtype)
    b = np.array(pair[1], np.uint64).view(dtype)
    out = np.empty_like(a)
    backend.reduce_local(out, a, b, op=op)
    assert_same(out, reference(op, a, b, dtype), dtype)


# ---- scale -------------------------------------------------------------------

def scale_reference(a: np.ndarray, divisor: float, dtype: str) -> np.ndarray:
    """Floats: division in the dtype (halves via float32); integers: C division
    (toward zero) by the divisor rounded half away from zero, wrapping."""
    if dtype == "bfloat16":
        return f32_to_bf16(bf16_to_f32(a) / np.float32(divisor))
    if dtype == "float16":
        return (a.astype(np.float32) / np.float32(divisor)).astype(np.float16)
    if dtype in ("float32", "float64"):
        return a / np.dtype(dtype).type(divisor)
    d = int(divisor + 0.5) if divisor >= 0 else int(divisor - 0.5)
    bits = np.dtype(dtype).itemsize * 8
    signed = np.iinfo(dtype).min < 0
    out = []
    for x in a.tolist():
        q = abs(x) // abs(d)
        q = q if (x < 0) == (d < 0) else -q
        q %= 1 << bits
        if signed and q >= 1 << (bits - 1):
            q -= 1 << bits
        out.append(q)
    return np.array(out, dtype=dtype)


@pytest.mark.parametrize("divisor", [1.0, 2.0, 3.0, 7.0, -3.0, 2.5])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 31, 4097])
def test_scale_matches_numpy(backend, dtype: str, n: int, divisor: float) -> None:
    rng = np.random.default_rng([DTYPES.index(dtype), n])
    a = random_array(rng, dtype, n)
    if dtype in INT_DTYPES:  # the extremes, where truncation and overflow show
        a[: min(n, 2)] = [np.iinfo(dtype).min, np.iinfo(dtype).max][: min(n, 2)]
    want = scale_reference(a, divisor, dtype)
    out = np.empty_like(a)
    backend.scale_local(out, a, divisor, dtype=dtype)
    assert_same(out, want, dtype)
    backend.scale_local(a, a, divisor, dtype=dtype)  # in place
    assert_same(a, want, dtype)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_scale_min_by_minus_one_wraps(backend, dtype: str) -> None:
    a = np.array([np.iinfo(dtype).min, 5], dtype=dtype)
    out = np.empty_like(a)
    backend.scale_local(out, a, -1.0)
    assert out.tolist() == [np.iinfo(dtype).min, -5]


# ---- argument errors -------------------------------------------------------

def test_invalid_op_raises(backend) -> None:
    a = np.zeros(4, np.float32)
    with pytest.raises(ValueError):
        backend.reduce_local(a, a, a, op="xor")


@pytest.mark.parametrize("dtype", ["float128", "complex64", "int16", "bool", ""])
def test_invalid_dtype_raises(backend, dtype: str) -> None:
    a = np.zeros(4, np.float32)
    with pytest.raises(ValueError):
        backend.reduce_local(a, a, a, op="sum", dtype=dtype)
    with pytest.raises(ValueError):
        backend.scale_local(a, a, 2.0, dtype=dtype)


def test_unsupported_array_dtype_raises(backend) -> None:
    a = np.zeros(4, np.complex64)
    with pytest.raises((ValueError, TypeError)):
        backend.reduce_local(a, a, a)


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_scale_by_zero_raises(backend, dtype: str) -> None:
    a = np.ones(4, dtype)
    with pytest.raises(ValueError):
        backend.scale_local(a, a, 0.0)


# numpy arrays are read through numpy's C API (buffer.pxi, _ndarray_dtype); the
# element type must come out as the buffer protocol reads it, for every dtype.
_VIEW_DTYPES = ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c8", "?", "c",
                "S1", "S4", "V1", "V2", "V4", ">f4", "<f4", "=i8", ">i8", np.intc, np.int_,
                np.longlong, np.uintp]


@pytest.mark.parametrize("dtype", _VIEW_DTYPES, ids=lambda d: np.dtype(d).str)
def test_numpy_fast_path_reads_types_as_the_buffer_protocol_does(dtype) -> None:
    from collectives import _core

    def read(obj):
        try:
            return _core.dtype_of(obj)
        except (TypeError, ValueError) as exc:  # DatatypeError is a TypeError (MPI's ERR_TYPE)
            return "TypeError" if isinstance(exc, TypeError) else type(exc).__name__

    arr = np.zeros(4, dtype)
    assert read(arr) == read(memoryview(arr))
    if np.dtype(dtype).byteorder == (">" if np.little_endian else "<"):
        assert read(arr) == "TypeError"  # never reduced as if native


def test_ml_dtypes_bfloat16_arrays_and_its_lookalikes() -> None:
    """ml_dtypes' bfloat16 (dtype.char 'E') is bfloat16; its 1-byte types that
    reuse letters ('e' int1, 'E' uint1, 'c' int2) are not float16/bfloat16/uint8."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from collectives import _core

    a = np.array([1.5, -2.0, 3.0], ml_dtypes.bfloat16)
    out = np.zeros(3, ml_dtypes.bfloat16)
    assert _core.dtype_of(a) == "bfloat16"
    _core.reduce_local(out, a, a, "sum")
    np.testing.assert_array_equal(out.astype(np.float32), [3.0, -4.0, 6.0])
    for name in ("int1", "uint1", "int2", "uint2", "int4", "float8_e4m3fn", "float8_e5m2"):
        with pytest.raises((TypeError, ValueError)):
            _core.dtype_of(np.zeros(4, getattr(ml_dtypes, name)))
