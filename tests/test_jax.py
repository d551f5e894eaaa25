"""collectives.jax on real processes started by ``python -m collectives.run``.

One launch per world size runs the whole grid (every function, eager and
jitted, on mixed-dtype pytrees, against a one-process numpy oracle), the
ordering stress test, grad and vmap; the data-parallel example is checked
against one process training on the global batch.
"""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from conftest import REPO, run_world

jax = pytest.importorskip("jax")


@pytest.fixture(scope="module")
def jax_env():
    """Build the FFI handler once here, so the ranks only load it from the cache."""
    import collectives.jax as cj

    cj._build_library()
    return {"COLLECTIVES_CACHE_DIR": str(cj._cache_dir()), "JAX_PLATFORMS": "cpu"}


GRID_BODY = r'''
import time
from functools import partial
import numpy as np
import jax, jax.numpy as jnp
import collectives, collectives.jax as cj

comm = collectives.init()
n, r = comm.size, comm.rank
BF16 = jnp.bfloat16

def value(rank, shape, dtype, op="sum", seed=0):
    """Rank-derived small integers: every reduction is exact in every dtype."""
    i = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) + seed
    v = np.where((i + rank) % 3 == 0, 2, 1) if op == "prod" else (i * 3 + rank * 5) % 11 - 3
    return jnp.asarray(v, dtype)

def oracle(op, shape, dtype, seed=0):
    vals = np.stack([np.asarray(value(k, shape, dtype, op, seed), np.float64) for k in range(n)])
    red = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max, "mean": np.mean}[op]
    return red(vals, axis=0)

def pmean_of(shape, dtype, seed):
    """jax.lax.pmean over the n ranks' values, stacked on one named axis: what
    allreduce(op="mean") follows, float result dtype included, for integers."""
    stacked = jnp.stack([value(k, shape, dtype, "mean", seed) for k in range(n)])
    return jax.vmap(lambda v: jax.lax.pmean(v, "i"), axis_name="i")(stacked)[0]

TOL = {np.dtype(BF16): 1e-2, np.dtype("float16"): 1e-3}

def same(case, got, want, dtype, exact=True):
    got = np.asarray(got)
    if got.dtype != np.dtype(dtype):
        return fail(case, f"dtype {got.dtype} != {np.dtype(dtype)}")
    if got.shape != np.shape(want):
        return fail(case, f"shape {got.shape} != {np.shape(want)}")
    g = got.astype(np.float64)
    tol = 0 if exact else TOL.get(np.dtype(dtype), 1e-6)
    if not np.allclose(g, want, rtol=tol, atol=tol):
        k = int(np.argmax(np.abs(g - want).ravel())) if g.size else 0
        fail(case, f"index {k}: got {g.ravel()[k]!r}, want {np.ravel(want)[k]!r}")

# (shape, dtype) leaves of the test pytree; float64/int64 join once x64 is on
def leaves(x64=False):
    out = [((), jnp.float32), ((0,), jnp.float32), ((5,), jnp.int32), ((3, 4), BF16),
           ((7,), jnp.float16), ((257,), jnp.float32), ((2, 3), jnp.int32)]
    return out + [((4,), jnp.float64), ((3,), jnp.int64)] if x64 else out

def tree_of(specs, fn):
    return {"a": [fn(s, d, i) for i, (s, d) in enumerate(specs[:3])],
            "b": {f"k{i}": fn(s, d, i) for i, (s, d) in enumerate(specs[3:], 3)}}

def run_grid(x64=False):
    t0 = time.time()
    specs = leaves(x64)
    flat = lambda t: jax.tree_util.tree_leaves(t)
    for mode in (("jit",) if x64 else ("eager", "jit")):  # x64: the dtypes, not the modes
        wrap = jax.jit if mode == "jit" else (lambda f: f)
        for op in ("sum", "prod", "min", "max", "mean"):
            x = tree_of(specs, lambda s, d, i: value(r, s, d, op, i))
            got = wrap(partial(cj.allreduce, op=op))(x)
            for (s, d), g, i in zip(specs, flat(got), range(len(specs))):
                case = ("allreduce", mode, op, s, str(d), x64)
                if op == "mean" and not jnp.issubdtype(d, jnp.floating):
                    ref = pmean_of(s, d, i)  # integers: JAX's float mean, its dtype
                    same(case, g, np.asarray(ref, np.float64), ref.dtype, exact=False)
                else:
                    same(case, g, oracle(op, s, d, i), d, exact=op != "mean")
        x = tree_of(specs, lambda s, d, i: value(r, s, d, seed=i))
        got = wrap(cj.allgather)(x)
        for (s, d), g, i in zip(specs, flat(got), range(len(specs))):
            want = np.stack([np.asarray(value(k, s, d, seed=i), np.float64) for k in range(n)])
            same(("allgather", mode, s, str(d), x64), g, want, d)
        tiled = [(s, d) for s, d in specs if len(s)]
        xt = tree_of(tiled, lambda s, d, i: value(r, s, d, seed=i))
        got = wrap(partial(cj.allgather, tiled=True))(xt)
        for (s, d), g, i in zip(tiled, flat(got), range(len(tiled))):
            want = np.concatenate([np.asarray(value(k, s, d, seed=i), np.float64)
                                   for k in range(n)])
            same(("allgather-tiled", mode, s, str(d), x64), g, want, d)
        for root in sorted({0, n - 1}):
            got = wrap(partial(cj.broadcast, root=root))(x)
            for (s, d), g, i in zip(specs, flat(got), range(len(specs))):
                same(("broadcast", mode, root, s, str(d), x64), g,
                     np.asarray(value(root, s, d, seed=i), np.float64), d)
    # dtypes the core cannot reduce travel as bytes through allgather/broadcast
    flags = jnp.array([r % 2 == 0, True, False])
    expect(np.array_equal(np.asarray(cj.allgather(flags)),
                          np.array([[k % 2 == 0, True, False] for k in range(n)])), "bool", "")
    z = cj.broadcast(jnp.array([1 + 2j, r], jnp.complex64), root=n - 1)
    expect(np.array_equal(np.asarray(z), np.array([1 + 2j, n - 1], np.complex64)), "complex", str(z))
    emit("grid", x64=x64, seconds=round(time.time() - t0, 2))

run_grid()

# barrier: eager, and inside jit between two collectives
cj.barrier()
y = jax.jit(lambda a: (cj.barrier(), cj.allreduce(a))[1])(jnp.ones(3))
same("barrier-jit", y, np.full(3, n), jnp.float32)

# Two collectives with no data dependency in one jitted function, 200 times
# with changing shapes: if any rank ran them in another order, the core's
# header check would fail on a count or op mismatch.
t0 = time.time()
@jax.jit
def two(a, b):
    return cj.allgather(b), cj.allreduce(a, op="max")

for it in range(200):
    k = it % 4
    a = jnp.full((3 * k + 2,), float(r + it), jnp.float32)
    b = jnp.full((2 * k + 1,), r, jnp.int32)
    g, m = two(a, b)
    if it % 50 == 0 or it == 199:
        same(("order", it, "max"), m, np.full(3 * k + 2, n - 1 + it), jnp.float32)
        same(("order", it, "gather"), g, np.repeat(np.arange(n)[:, None], 2 * k + 1, 1), jnp.int32)
    if it % 40 == 0:  # eager calls interleave with the queued jitted ones
        same(("order-eager", it), cj.broadcast(jnp.arange(4.0) + r, root=0), np.arange(4.0),
             jnp.float32)
emit("order", iterations=200, seconds=round(time.time() - t0, 2))

# grad: the transpose of a sum-allreduce is a sum-allreduce of the cotangents
x = jnp.arange(4.0) + r
for op, want in (("sum", n * (n + 1) / 2), ("mean", (n + 1) / 2)):
    f = lambda a: jnp.sum(cj.allreduce(a, op=op) * (r + 1))
    same(("grad", op), jax.grad(f)(x), np.full(4, want), jnp.float32, exact=False)
    same(("grad-jit", op), jax.jit(jax.grad(f))(x), np.full(4, want), jnp.float32, exact=False)
    _, t = jax.jvp(lambda a: cj.allreduce(a, op=op), (x,), (jnp.ones(4) * (r + 1),))
    same(("jvp", op), t, np.full(4, want), jnp.float32, exact=False)
for bad in (lambda a: jnp.sum(cj.allreduce(a, op="max")), lambda a: jnp.sum(cj.allgather(a))):
    try:
        jax.grad(bad)(x)
        fail("grad-unsupported", "no error")
    except NotImplementedError:
        pass

# vmap: the collective runs once on the whole batched array
X = jnp.stack([jnp.arange(3.0) + 10 * j + r for j in range(5)])  # (5, 3)
same("vmap-allreduce", jax.vmap(cj.allreduce)(X),
     np.stack([n * (np.arange(3.0) + 10 * j) + n * (n - 1) / 2 for j in range(5)]), jnp.float32)
same("vmap-allreduce-axis1", jax.vmap(cj.allreduce, in_axes=1, out_axes=1)(X),
     np.asarray(jax.vmap(cj.allreduce)(X)), jnp.float32)
G = jax.jit(jax.vmap(cj.allgather))(X)  # (5, n, 3)
same("vmap-allgather", G, np.stack([[np.arange(3.0) + 10 * j + k for k in range(n)]
                                    for j in range(5)]), jnp.float32)
same("vmap-broadcast", jax.vmap(partial(cj.broadcast, root=n - 1))(X),
     np.asarray(X) - r + n - 1, jnp.float32)

# argument errors are raised before anything is sent
for call, exc in ((lambda: cj.allreduce(jnp.ones(2, jnp.uint32)), TypeError),
                  (lambda: cj.allreduce(jnp.ones(2), op="xor"), ValueError),
                  (lambda: cj.broadcast(jnp.ones(2), root=n), ValueError),
                  (lambda: cj.allgather(jnp.float32(1), tiled=True), ValueError)):
    try:
        call()
        fail("argument-error", f"no {exc.__name__}")
    except exc:
        pass

# op="mean" on integers follows jax.lax.pmean: the float mean (float32 without x64)
m = cj.allreduce({"i": jnp.arange(3, dtype=jnp.int32) + r}, op="mean")["i"]
emit("int-mean", dtype=str(m.dtype), values=np.asarray(m, np.float64).tolist())

jax.config.update("jax_enable_x64", True)
run_grid(x64=True)

# Last (it breaks the communicator): ranks that disagree get an error naming
# both sides, raised in Python, and the process lives on.
if n > 1:
    try:
        jax.jit(cj.allreduce)(jnp.ones(5 + r)).block_until_ready()
        fail("mismatch", "no error")
    except Exception as e:
        emit("mismatch", type=type(e).__name__, message=str(e))
'''


@pytest.mark.timeout(150)
# 1 (no peer), 2 and 3 (odd; roots 0 and n - 1 distinct from the ends of a pair):
# collectives.jax has no other rank-count-dependent code, and the core's algorithms at
# 4 to 8 ranks are checked by the MPI grids (test_allreduce, test_collectives, ...)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_collectives_grid_order_grad_vmap(n, jax_env):
    res = run_world(n, GRID_BODY, launcher=True, timeout=140, env=jax_env).assert_ok()
    for rank in range(n):
        assert len(res[rank].get("grid")) == 2, res.report()
        assert res[rank].one("order")["iterations"] == 200
        assert res[rank].one("done")["failures"] == 0
        int_mean = res[rank].one("int-mean")
        assert int_mean["dtype"] == "float32"
        assert int_mean["values"] == [k + (n - 1) / 2 for k in range(3)]
        if n > 1:  # every rank raises; the ones that see the bad header name the mismatch
            assert f"rank {rank}" in res[rank].one("mismatch")["message"]
    if n > 1:
        assert any("count mismatch" in res[k].one("mismatch")["message"] for k in range(n))


@pytest.mark.timeout(120)
def test_data_parallel_example_matches_one_process(jax_env, tmp_path):
    steps = 8
    dump = tmp_path / "params.npz"
    script = str(REPO / "examples" / "jax_data_parallel.py")
    run_world(2, script=script, args=["--steps", str(steps), "--dump", str(dump)],
              launcher=True, timeout=100, env=jax_env).assert_ok()
    spec = importlib.util.spec_from_file_location("jax_data_parallel", script)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    reference = example.train(steps)  # one process, the whole global batch, no collective
    got = np.load(dump)
    assert set(got.files) == set(reference)
    for name, value in reference.items():
        np.testing.assert_allclose(got[name], np.asarray(value), atol=1e-5, rtol=0)


def test_missing_compiler_is_a_clear_error(monkeypatch):
    import collectives.jax as cj

    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(cj.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="C\\+\\+17 compiler"):
        cj._compiler()
