"""collectives.jax on GPU arrays (issue 40): the CUDA FFI handlers.

Here (CPU-only jax) only what does not need a GPU runs: the handler library
holds the CUDA handlers (they compile without CUDA headers), and a CPU-only
JAX registers no CUDA target and is otherwise unchanged. On a machine whose
JAX has an NVIDIA GPU (bench/gpu_check.sh, marker ``cuda``), 2 ranks run
allreduce (every op, several dtypes, pytrees), allgather, broadcast from every
root and barrier on GPU arrays, eager and inside ``jit``, against a numpy
oracle, and the CPU-only functions raise NotImplementedError for GPU arrays.
"""
from __future__ import annotations

import ctypes

import pytest

from conftest import run_world

jax = pytest.importorskip("jax")


def _jax_has_cuda() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices("cuda"))
    except RuntimeError:
        return False


@pytest.fixture(scope="module")
def cj():
    import collectives.jax as cj

    return cj


def test_handler_library_has_the_cuda_handlers(cj):
    lib = ctypes.CDLL(str(cj._build_library()))
    for symbol in list(cj._TARGETS.values()) + list(cj._CUDA_TARGETS.values()):
        assert hasattr(lib, symbol), symbol
    assert set(cj._CUDA_TARGETS) <= set(cj._TARGETS)


def test_cpu_only_jax_is_unchanged(cj):
    if _jax_has_cuda():
        pytest.skip("this JAX has a GPU")
    assert cj._has_cuda_backend() is False
    from collectives import MPI

    comm = MPI.COMM_SELF
    x = jax.numpy.arange(6, dtype=jax.numpy.float32)
    assert list(x.devices())[0].platform == "cpu"
    y = jax.jit(lambda v: cj.allreduce(v, comm=comm))(x)
    assert (jax.numpy.asarray(y) == x * comm.size).all()


GPU_BODY = r'''
import numpy as np
import jax, jax.numpy as jnp
import collectives, collectives.jax as cj

comm = collectives.init()
n, r = comm.size, comm.rank
gpu = jax.devices("cuda")[0]

def value(rank, shape, dtype, op="sum", seed=0):
    i = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) + seed
    v = np.where((i + rank) % 3 == 0, 2, 1) if op == "prod" else (i * 3 + rank * 5) % 11 - 3
    return jax.device_put(jnp.asarray(v, dtype), gpu)

def oracle(op, shape, dtype, seed=0):
    vals = np.stack([np.asarray(value(k, shape, dtype, op, seed), np.float64) for k in range(n)])
    return {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max,
            "mean": np.mean}[op](vals, axis=0)

def same(case, got, want, tol=0.0):
    ok = list(got.devices())[0].platform == "gpu"
    expect(ok, case, f"result left the GPU: {got.devices()}")
    g = np.asarray(got, np.float64)
    if not np.allclose(g, want, rtol=tol, atol=tol):
        fail(case, f"max error {np.max(np.abs(g - want))}")

cases = 0
for dtype in (jnp.float32, jnp.bfloat16, jnp.int32, jnp.float16):
    tol = 1e-2 if dtype in (jnp.bfloat16, jnp.float16) else 0.0
    for op in ("sum", "prod", "min", "max", "mean"):
        if op == "mean" and dtype == jnp.int32:
            continue
        for shape in ((1,), (3, 5), (1 << 20,)):
            x = value(r, shape, dtype, op)
            want = oracle(op, shape, dtype)
            same(dict(what="eager", dtype=str(dtype), op=op, shape=shape),
                 cj.allreduce(x, op=op), want, tol)
            f = jax.jit(lambda v, op=op: cj.allreduce(v * 1, op=op))
            same(dict(what="jit", dtype=str(dtype), op=op, shape=shape), f(x), want, tol)
            cases += 2
tree = {"a": value(r, (4,), jnp.float32), "b": [value(r, (2, 3), jnp.int32)]}
out = jax.jit(lambda t: cj.allreduce(t))(tree)
same(dict(what="pytree a"), out["a"], oracle("sum", (4,), jnp.float32))
same(dict(what="pytree b"), out["b"][0], oracle("sum", (2, 3), jnp.int32))
for shape in ((3,), (1 << 18,)):
    g = jax.jit(lambda v: cj.allgather(v))(value(r, shape, jnp.float32))
    same(dict(what="allgather", shape=shape), g,
         np.stack([np.asarray(value(k, shape, jnp.float32)) for k in range(n)]))
    for root in range(n):
        x = value(r, shape, jnp.float32, seed=root)
        b = jax.jit(lambda v, root=root: cj.broadcast(v, root=root))(x)
        same(dict(what="broadcast", root=root, shape=shape), b,
             np.asarray(value(root, shape, jnp.float32, seed=root)))
        same(dict(what="broadcast keeps x", root=root), x,
             np.asarray(value(r, shape, jnp.float32, seed=root)))
    cases += 1 + n
cj.barrier()
try:
    cj.send(value(r, (2,), jnp.float32), dest=(r + 1) % n)
    fail(dict(what="send on GPU"), "no error")
except NotImplementedError:
    pass
emit("cases", count=cases)
'''


@pytest.mark.cuda
@pytest.mark.timeout(300)
@pytest.mark.skipif(not _jax_has_cuda(), reason="needs a JAX with an NVIDIA GPU")
def test_jax_collectives_on_gpu_arrays(cj):
    import collectives

    if not collectives.cuda_available():
        pytest.skip("needs a CUDA build of collectives")
    cj._build_library()
    env = {"COLLECTIVES_CACHE_DIR": str(cj._cache_dir()),
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    res = run_world(2, GPU_BODY, timeout=280, env=env, collective_timeout=60).assert_ok()
    assert all(rr.one("cases")["count"] > 100 for rr in res.ranks)
