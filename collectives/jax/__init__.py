"""Collectives on JAX arrays and pytrees, eager and under ``jax.jit``.

The JAX counterpart of mpi4jax, over the collectives core instead of MPI::

    import collectives.jax as cj

    @jax.jit
    def step(params, batch):
        grads = jax.grad(loss)(params, batch)
        grads = cj.allreduce(grads, op="mean")      # average over the ranks
        return jax.tree.map(lambda p, g: p - lr * g, params, grads)

started with ``collectives-run -np N python train.py``. ``allreduce``,
``allgather``, ``broadcast`` and ``barrier`` take a JAX array (or anything
``jnp.asarray`` takes) or a pytree of them, return the same structure, and
run on ``comm=`` (a ``collectives.MPI.Comm``; default: the world,
``collectives.init()``). Every leaf is one collective, in the tree's
flattening order, so every rank must pass the same structure, shapes and
dtypes. ``send``, ``recv``, ``sendrecv``, ``gather``, ``scatter``, ``reduce``
and ``alltoall`` take one array each, with mpi4jax's signatures and results
(at the end of this file).

Ordering: an ordered effect
    Each collective is a JAX primitive whose abstract evaluation declares
    ``CollectiveEffect``, registered as an *ordered* effect. JAX then threads
    one token through every such primitive of a program in program order,
    the custom call takes that token as an operand and returns the next one,
    and XLA can neither reorder two collectives (each depends on the token
    of the one before) nor drop one whose result is unused (effects are never
    dead code). Across calls of jitted functions JAX keeps a runtime token,
    so executions with collectives also run in dispatch order. We chose this
    over mpi4jax's explicit ``token=`` arguments: programs stay plain JAX and
    no caller can forget to chain a token. The price: the order is the
    order of the traced program, so ranks must trace the same program.

Native side
    The custom calls are typed XLA FFI handlers (``native/jax/ffi.cc``) that
    call the core through its function table (``_core.api_table()``); the
    communicator handle and the table address travel as int64 attributes,
    with op / algorithm / root / size. A failed collective comes back as an
    ``XlaRuntimeError`` carrying the core's message (rank, peer, values); the
    process is never aborted.

No copy of a kept input (issue 21)
    ``allreduce`` (and ``broadcast``, ``recv``, ``sendrecv`` for their
    templates) aliases its output to its input only where that input is an
    intermediate or a donated argument: XLA then reduces in place. For an
    argument the caller keeps (``jax.jit(f)(x)`` without ``donate_argnums``)
    an alias would make XLA copy ``x`` into a fresh buffer first; instead the
    custom call gets its own output, which the core's out-of-place allreduce
    writes directly (it reads ``x`` once and never copies it), with huge
    pages requested for that fresh output (its page faults cost more than
    the reduction). These primitives are lowered inline (not as cached
    per-primitive functions) so that the check sees each call's own operand.

Building the handler
    The package build has no jax, so the handler is compiled on first use
    (the first collective called, not the import) with the system C++
    compiler (``$CXX``, else ``c++``/``g++``/``clang++``)::

        c++ -O2 -shared -fPIC -std=c++17 -isystem <jax.ffi.include_dir()> -I native

    into ``$COLLECTIVES_CACHE_DIR`` (default ``$XDG_CACHE_HOME/collectives``
    or ``~/.cache/collectives``), named by a hash of the source, ``coll.h``,
    the jaxlib and Python versions and the compiler. Ranks that start together
    take a file lock; one compiles (to a temporary name, then ``os.replace``)
    and the others load its result. The library is loaded with ctypes and its
    handlers registered with ``jax.ffi.register_ffi_target(platform="cpu")``.
    No compiler: a ``RuntimeError`` says so and how to set ``CXX``.

Differentiation and vmap
    ``allreduce`` with ``op="sum"`` or ``"mean"`` is linear: its JVP is the
    same allreduce of the tangent, and its transpose is the same allreduce of
    the cotangent (rank j's input reaches every rank's output, so its
    cotangent is the sum, or mean, of all ranks' cotangents). This differs
    from mpi4jax, whose transpose is the identity. ``min``/``max``/``prod``
    are not differentiable here; ``allgather`` and ``broadcast`` have JVPs
    but no transpose yet (``jax.grad`` through them raises). Under ``vmap``
    the collective runs once on the whole batched array: every rank must then
    batch the same way.

Devices
    ``allreduce``, ``allgather``, ``broadcast`` and ``barrier`` also take NVIDIA
    GPU arrays (a CUDA build): the CUDA handlers run on XLA's stream, eager and
    in ``jit``. The other functions, and ROCm, raise ``NotImplementedError``
    for GPU arrays. Dtypes: allreduce takes int8, uint8, int32, int64,
    float16, bfloat16, float32, float64 (float64 needs ``jax_enable_x64``);
    allgather and broadcast move any dtype.

A jitted function captures the communicator by id: called after that
communicator was freed (``Comm.Free()``, ``collectives.finalize()``) it raises
JAX's runtime error saying so (trace it again with a live communicator); it
never touches the freed memory.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import operator
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from functools import partial
from pathlib import Path
from typing import Any, Optional

import numpy as np

try:
    import jax
except ModuleNotFoundError as _exc:  # say which extra brings it
    raise ModuleNotFoundError(f"collectives.jax needs JAX ({_exc}): pip install 'collectives[jax]'", name="jax") from None
import jax.numpy as jnp
from jax.extend.core import Effect, Primitive
from jax.interpreters import ad, batching, mlir

# JAX has no public way to declare an ordered effect or name the token aval;
# these two private modules are the only ones this file touches (and
# _tokens.py, JAX's runtime tokens).
from jax._src import core as _jax_core
from jax._src import effects as _jax_effects

from . import _tokens as _jax_tokens
from ._alias import caller_keeps as _caller_keeps

__all__ = ["allreduce", "allgather", "broadcast", "barrier", "CollectiveEffect",
           "send", "recv", "sendrecv", "gather", "scatter", "reduce", "alltoall"]

# coll_op_t / coll_algo_t codes (native/coll.h)
_OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "mean": 4, "avg": 4}
_ALGORITHMS = {"auto": 0, "ring": 1, "tree": 2, "butterfly": 3, "two_level": 4}
_SUM, _MEAN = 0, 4
# dtypes the core reduces (allreduce); allgather/broadcast move any dtype as bytes
_REDUCIBLE = {np.dtype(d) for d in ("int8", "uint8", "int32", "int64", "float16",
                                    "float32", "float64")} | {np.dtype(jnp.bfloat16)}


# ------------------------------------------------------------------ the effect

class CollectiveEffect(Effect):
    """The ordered effect of every collective: keeps them in program order, never dropped."""

    def __str__(self) -> str:
        return "collectives"


_effect = CollectiveEffect()
_jax_effects.lowerable_effects.add_type(CollectiveEffect)
_jax_effects.ordered_effects.add_type(CollectiveEffect)
_jax_effects.control_flow_allowed_effects.add_type(CollectiveEffect)
_jax_effects.custom_derivatives_allowed_effects.add_type(CollectiveEffect)
_jax_effects.remat_allowed_effects.add_type(CollectiveEffect)


_jax_tokens.fresh_token_after_failure(CollectiveEffect)


# ------------------------------------------------------- building the handler

_TARGETS = {  # custom-call target -> exported handler symbol in native/jax/ffi.cc
    "collectives_allreduce": "CollectivesAllreduce",
    "collectives_allgather": "CollectivesAllgather",
    "collectives_broadcast": "CollectivesBroadcast",
    "collectives_barrier": "CollectivesBarrier",
}
# The same targets on the GPU (platform "CUDA"), where the core takes device buffers.
_CUDA_TARGETS = {
    "collectives_allreduce": "CollectivesAllreduceCuda",
    "collectives_allgather": "CollectivesAllgatherCuda",
    "collectives_broadcast": "CollectivesBroadcastCuda",
    "collectives_barrier": "CollectivesBarrierCuda",
}
_load_lock = threading.Lock()
_library: Optional[ctypes.CDLL] = None  # kept referenced: XLA calls into it


def _native_dir() -> Path:
    """The directory with jax/ffi.cc and coll.h: shipped in the package, or the source tree."""
    pkg = Path(__file__).resolve().parents[1]  # collectives/, above this jax/ package
    for d in (pkg / "_native", pkg.parent / "native"):
        if (d / "jax" / "ffi.cc").is_file() and (d / "coll.h").is_file():
            return d
    raise RuntimeError(f"collectives.jax: jax/ffi.cc and coll.h not found in {pkg / '_native'} "
                       f"or {pkg.parent / 'native'}; the installation is incomplete")


def _cache_dir() -> Path:
    """$COLLECTIVES_CACHE_DIR, else $XDG_CACHE_HOME/collectives, else ~/.cache/collectives."""
    d = os.environ.get("COLLECTIVES_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "collectives")
    return Path(d)


def _compiler() -> str:
    """$CXX, else the first of c++, g++, clang++ on PATH."""
    cxx = os.environ.get("CXX")
    if cxx:
        return cxx
    for name in ("c++", "g++", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    raise RuntimeError("collectives.jax needs a C++17 compiler to build its XLA FFI handler on "
                       "first use, and found none (no $CXX, c++, g++ or clang++ on PATH); "
                       "install one (e.g. apt-get install g++) or set CXX")


def _build_library() -> Path:
    """Compile native/jax/ffi.cc into the cache (once per source/jaxlib/python) and return it."""
    import jaxlib

    src_dir = _native_dir()
    source = src_dir / "jax" / "ffi.cc"
    cxx = _compiler()
    cmd = [*cxx.split(), "-O2", "-shared", "-fPIC", "-std=c++17",
           "-isystem", jax.ffi.include_dir(), "-I", str(src_dir)]
    h = hashlib.sha256()
    for part in (source.read_bytes(), (src_dir / "coll.h").read_bytes(),
                 jaxlib.__version__.encode(), sys.version.encode(),
                 platform.machine().encode(), " ".join(cmd[:1]).encode()):
        h.update(part)
        h.update(b"\0")
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"jax_ffi-{h.hexdigest()[:20]}.so"
    if target.exists():
        return target
    # Ranks started together race here: the lock lets one compile while the
    # others wait, then find the file; the temp name + os.replace means no one
    # ever loads a half-written library, even without the lock (e.g. NFS).
    with open(cache / (target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if target.exists():
                return target
            fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp.so", dir=cache)
            os.close(fd)
            try:
                proc = subprocess.run([*cmd, str(source), "-o", tmp], capture_output=True,
                                      text=True)
                if proc.returncode != 0:
                    raise RuntimeError(
                        f"collectives.jax: building the XLA FFI handler failed:\n"
                        f"{' '.join(cmd)} {source} -o {tmp}\n{proc.stdout}{proc.stderr}")
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target


def _ensure_registered() -> None:
    """Build (or find) the handler library, load it, register its targets; once per process."""
    global _library
    if _library is not None:
        return
    with _load_lock:
        if _library is not None:
            return
        lib = ctypes.CDLL(str(_build_library()))
        # Dispatch is asynchronous: collectives may still be queued on JAX's
        # threads when the script calls finalize; let them finish first.
        from ..rendezvous import world as _world

        _world.add_finalize_hook(jax.effects_barrier)
        for name, symbol in _TARGETS.items():
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)),
                                        platform="cpu")
        if _has_cuda_backend():
            for name, symbol in _CUDA_TARGETS.items():
                jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)),
                                            platform="CUDA")
        _library = lib


def _has_cuda_backend() -> bool:
    """True when this JAX has an NVIDIA GPU backend with at least one device."""
    try:
        return any(d.platform == "gpu" for d in jax.devices("cuda"))
    except RuntimeError:  # no CUDA backend in this jaxlib, or no device
        return False


# ------------------------------------------------------------------ primitives

def _lowering(target: str, aliases: Optional[dict] = None, always_alias: bool = False):
    """The lowering: the FFI custom call with the effect's token as last operand/result.

    always_alias keeps every alias even for an argument the caller keeps (XLA then
    copies it first): the GPU broadcast handler cannot copy device memory itself.
    """

    def rule(ctx, *operands, **params):
        token = ctx.tokens_in.get(_effect)
        tok = _jax_core.abstract_token
        call_ctx = ctx.replace(avals_in=[*ctx.avals_in, tok], avals_out=[*ctx.avals_out, tok])
        attrs = {k: (np.int64(v) if k in ("comm", "api", "size") else np.int32(v))
                 for k, v in params.items()}
        kept = {i: o for i, o in (aliases or {}).items()
                if always_alias or not _caller_keeps(operands[i])}
        lower = jax.ffi.ffi_lowering(target, has_side_effect=True,
                                     operand_output_aliases=kept or None)
        *results, token = lower(call_ctx, *operands, token, **attrs)
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(mlir.TokenSet({_effect: token})))
        return results

    return rule


def _gpu_lowering(ctx, *args, **params):
    raise NotImplementedError("collectives.jax: this function takes CPU arrays only (GPU arrays "
                              "work with allreduce, allgather, broadcast and barrier on NVIDIA "
                              "GPUs); move the arrays to the CPU (jax.device_put(x, "
                              "jax.devices('cpu')[0])) or run JAX with JAX_PLATFORMS=cpu")


def _eager_impl(prim: Primitive):
    """Outside jit a primitive runs as a one-primitive jitted program (cached per params)."""

    @partial(jax.jit, static_argnames=("params",))
    def run(*args, params):
        return prim.bind(*args, **dict(params))

    def impl(*args, **params):
        return run(*args, params=tuple(sorted(params.items())))

    return impl


def _define(name: str, target: str, abstract, aliases=None, multiple_results=False,
            gpu: bool = False) -> Primitive:
    prim = Primitive(name)
    prim.multiple_results = multiple_results
    prim.def_impl(_eager_impl(prim))
    prim.def_effectful_abstract_eval(lambda *a, **p: (abstract(*a, **p), {_effect}))
    if aliases:
        # Lowered inline (not as a cached function shared by every call site),
        # so that _caller_keeps sees this call's own operands.
        try:
            mlir.register_lowering(prim, _lowering(target, aliases), platform="cpu",
                                   cacheable=False)
        except TypeError:  # a JAX without the flag: its lowering is inline already
            mlir.register_lowering(prim, _lowering(target, aliases), platform="cpu")
    else:
        mlir.register_lowering(prim, _lowering(target, aliases), platform="cpu")
    # GPU: the CUDA handlers, every alias kept (see _lowering), so not per call site
    mlir.register_lowering(prim, _lowering(target, aliases, always_alias=True) if gpu
                           else _gpu_lowering, platform="cuda")
    mlir.register_lowering(prim, _gpu_lowering, platform="rocm")
    return prim


# allreduce and broadcast alias their output to their input (the core works in
# place) unless the input is an argument the caller keeps (_caller_keeps):
# then the handler writes a fresh output instead of XLA copying the input.
allreduce_p = _define("collectives_allreduce", "collectives_allreduce",
                      lambda x, **_: jax.core.ShapedArray(x.shape, x.dtype), aliases={0: 0},
                      gpu=True)
allgather_p = _define("collectives_allgather", "collectives_allgather",
                      lambda x, size, **_: jax.core.ShapedArray((size, *x.shape), x.dtype),
                      gpu=True)
broadcast_p = _define("collectives_broadcast", "collectives_broadcast",
                      lambda x, **_: jax.core.ShapedArray(x.shape, x.dtype), aliases={0: 0},
                      gpu=True)
barrier_p = _define("collectives_barrier", "collectives_barrier", lambda **_: [],
                    multiple_results=True, gpu=True)


def _zero_like(aval) -> ad.Zero:
    return ad.Zero(aval.to_tangent_aval())


# allreduce: JVP and transpose for the linear ops (sum, mean); batching for all.
def _allreduce_jvp(primals, tangents, **params):
    (x,), (t,) = primals, tangents
    if params["op"] not in (_SUM, _MEAN):
        raise NotImplementedError("collectives.jax.allreduce is differentiable only for "
                                  "op='sum' and op='mean'")
    y = allreduce_p.bind(x, **params)
    if type(t) is ad.Zero:
        return y, _zero_like(jax.core.get_aval(y))
    return y, allreduce_p.bind(t, **params)


def _allreduce_transpose(ct, x, **params):
    # y_i = sum_j x_j on every rank i, so x_j's cotangent is sum_i ct_i: the
    # same allreduce (mean: (1/n) sum_i ct_i, the same mean-allreduce).
    if params["op"] not in (_SUM, _MEAN):
        raise NotImplementedError("the transpose of allreduce exists only for op='sum'/'mean'")
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval)]
    return [allreduce_p.bind(ct, **params)]


def _same_dim_batcher(prim):
    def rule(args, dims, **params):
        # the whole batched array is one collective; the batch axis stays put
        return prim.bind(*args, **params), dims[0]

    return rule


def _allgather_batcher(args, dims, **params):
    # the result stacks ranks in front, so the batch axis moves back by one
    return allgather_p.bind(args[0], **params), dims[0] + 1


def _linear_jvp(prim):
    def rule(primals, tangents, **params):
        (x,), (t,) = primals, tangents
        y = prim.bind(x, **params)
        if type(t) is ad.Zero:
            return y, _zero_like(jax.core.get_aval(y))
        return y, prim.bind(t, **params)

    return rule


def _no_transpose(what):
    def rule(ct, x, **params):
        raise NotImplementedError(f"collectives.jax.{what} has no transpose yet: reverse-mode "
                                  f"differentiation (jax.grad) through it is not supported")

    return rule


ad.primitive_jvps[allreduce_p] = _allreduce_jvp
ad.primitive_transposes[allreduce_p] = _allreduce_transpose
batching.primitive_batchers[allreduce_p] = _same_dim_batcher(allreduce_p)
for _prim, _what in ((allgather_p, "allgather"), (broadcast_p, "broadcast")):
    ad.primitive_jvps[_prim] = _linear_jvp(_prim)
    ad.primitive_transposes[_prim] = _no_transpose(_what)
batching.primitive_batchers[allgather_p] = _allgather_batcher
batching.primitive_batchers[broadcast_p] = _same_dim_batcher(broadcast_p)


# ------------------------------------------------------------------ public API

def _core_of(comm: Any):
    """The native Communicator behind `comm` (None: the world): any collectives.MPI
    communicator (COMM_WORLD, COMM_SELF, one from Split or Dup); TypeError for anything
    else (an mpi4py communicator is not one), MPI.Exception for a freed one or COMM_NULL,
    before anything is traced or sent."""
    from .. import _core

    if comm is None:
        import collectives

        comm = collectives.init()
    core = comm if isinstance(comm, _core.Communicator) else getattr(comm, "_core", None)
    if not isinstance(core, _core.Communicator):
        raise TypeError(f"comm must be a collectives.MPI communicator (COMM_WORLD, COMM_SELF, "
                        f"or one made by Split/Dup), got {type(comm).__module__}."
                        f"{type(comm).__qualname__}")
    if core.closed:
        raise _core.CollectivesError(2, "comm: the communicator is freed")
    return core


def _prepare(x: Any, comm: Any):
    """Flatten a pytree into arrays, check they are on the CPU or an NVIDIA GPU, load the handler."""
    core = _core_of(comm)
    leaves, tree = jax.tree_util.tree_flatten(x)
    arrays = []
    for leaf in leaves:
        if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer):
            platforms = {d.platform for d in leaf.devices()}
            if platforms == {"gpu"} and not _has_cuda_backend():
                _gpu_lowering(None)  # a ROCm GPU: raises the GPU error
            if platforms not in ({"cpu"}, {"gpu"}):
                raise ValueError(f"collectives.jax: an array spans devices of {sorted(platforms)}; "
                                 f"each rank's arrays must live on one platform")
        arrays.append(leaf if isinstance(leaf, jax.Array) else jnp.asarray(leaf))
    _ensure_registered()
    params = {"comm": core.ffi_id, "api": _api_table()}
    return core, arrays, tree, params


def _api_table() -> int:
    from .. import _core

    return _core.api_table()


def allreduce(x: Any, op: Any = "sum", *, comm: Any = None, algorithm: str = "auto") -> Any:
    """Reduce every leaf of `x` over all ranks; every rank gets the result.

    Args:
        x: a JAX array (or array-like) or a pytree of them; same structure,
            shapes and dtypes on every rank.
        op: "sum", "mean" (alias "avg"), "min", "max" or "prod", or a
            ``collectives.MPI`` op (``MPI.SUM``...). "mean" of an integer leaf
            is a float, as ``jax.lax.pmean`` gives: the integer sum divided by
            the number of ranks.
        comm: a ``collectives.MPI.Comm`` (default: the world).
        algorithm: "auto", "ring", "tree", "butterfly" or "two_level".

    Returns:
        The same structure with the reduced arrays. Differentiable for sum and mean.
    """
    op_name = str(getattr(op, "name", op)).lower()
    if op_name not in _OPS:
        raise ValueError(f"op must be one of {sorted(_OPS)}, got {op!r}")
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(_ALGORITHMS)}, got {algorithm!r}")
    core, arrays, tree, params = _prepare(x, comm)
    for a in arrays:
        if np.dtype(a.dtype) not in _REDUCIBLE:
            raise TypeError(f"allreduce: unsupported dtype {a.dtype} (supported: int8, uint8, "
                            f"int32, int64, float16, bfloat16, float32, float64)")
    params.update(op=_OPS[op_name], algo=_ALGORITHMS[algorithm])
    sum_params = dict(params, op=_SUM)

    def reduce(a):
        if params["op"] == _MEAN and not jnp.issubdtype(a.dtype, jnp.inexact):
            # As jax.lax.pmean: the integer sum, then a true division by the rank
            # count, which gives JAX's default float (float32; float64 for 64-bit
            # integers under jax_enable_x64).
            return allreduce_p.bind(a, **sum_params) / core.size
        return allreduce_p.bind(a, **params)
    return tree.unflatten([reduce(a) for a in arrays])


def allgather(x: Any, *, tiled: bool = False, comm: Any = None) -> Any:
    """Gather every leaf of `x` from all ranks, in rank order.

    Args:
        x: a JAX array or a pytree of them; same structure, shapes and dtypes
            on every rank.
        tiled: False (default): stack along a new axis 0, shape
            ``(size, *x.shape)``; True: concatenate along axis 0, shape
            ``(size * x.shape[0], *x.shape[1:])`` (as ``jax.lax.all_gather``).
        comm: a ``collectives.MPI.Comm`` (default: the world).

    Returns:
        The same structure with the gathered arrays.
    """
    core, arrays, tree, params = _prepare(x, comm)
    params["size"] = core.size
    out = []
    for a in arrays:
        if tiled and a.ndim == 0:
            raise ValueError("allgather(tiled=True) needs arrays with at least one axis")
        g = allgather_p.bind(a, **params)
        out.append(g.reshape((core.size * a.shape[0], *a.shape[1:])) if tiled else g)
    return tree.unflatten(out)


def broadcast(x: Any, root: int = 0, *, comm: Any = None) -> Any:
    """Every rank gets rank `root`'s value of each leaf of `x`.

    Args:
        x: a JAX array or a pytree of them; same structure, shapes and dtypes
            on every rank (only root's values matter).
        root: the rank whose values are sent.
        comm: a ``collectives.MPI.Comm`` (default: the world).

    Returns:
        The same structure holding root's arrays.
    """
    core = _core_of(comm)
    from .._core import check_root

    root = check_root(root, core.size)
    core, arrays, tree, params = _prepare(x, core)
    params["root"] = root
    return tree.unflatten([broadcast_p.bind(a, **params) for a in arrays])


def barrier(*, comm: Any = None) -> None:
    """Block until every rank reached this barrier (in program order inside jit).

    Args:
        comm: a ``collectives.MPI.Comm`` (default: the world).
    """
    _core, _arrays, _tree, params = _prepare((), comm)
    barrier_p.bind(**params)
    if _jax_core.trace_state_clean():
        # eager: the one-primitive program may still be running asynchronously
        jax.effects_barrier()


# ------------------------------------------- point-to-point and rooted patterns
#
# send, recv, sendrecv, gather, scatter, reduce and alltoall with mpi4jax's
# signatures and results (its token-free API), each a primitive with the
# ordered effect like the collectives above, over the core's point-to-point
# (native/schedule/p2p.c), rooted (native/algorithms/rooted.c) and alltoall
# (native/algorithms/alltoall.c) calls. Shapes that depend on the rank follow
# mpi4jax: gather and reduce return the result at the root and the input
# unchanged elsewhere; scatter takes (size, *shape) at the root and a template
# of shape elsewhere; under jit each rank traces its own program, so these
# shapes are static. Arguments are checked before anything is sent. A receive
# gets exactly its template's size: a message of another size or dtype fails
# the receive naming both sides (the core checks the dtype and a larger size,
# the handler a smaller one). One array per call (no pytrees), not
# differentiable, no vmap rules.

_TARGETS.update({
    "collectives_send": "CollectivesSend",
    "collectives_recv": "CollectivesRecv",
    "collectives_sendrecv": "CollectivesSendrecv",
    "collectives_gather": "CollectivesGather",
    "collectives_scatter": "CollectivesScatter",
    "collectives_reduce": "CollectivesReduce",
    "collectives_alltoall": "CollectivesAlltoall",
})

_ANY_SOURCE = -1  # coll.h COLL_ANY_SOURCE / COLL_ANY_TAG
_ANY_TAG = -1
_TAG_MAX = 0x7FFFFFFF


def _shaped(shape, dtype):
    return jax.core.ShapedArray(tuple(shape), dtype)


send_p = _define("collectives_send", "collectives_send", lambda x, **_: [],
                 multiple_results=True)
recv_p = _define("collectives_recv", "collectives_recv",
                 lambda t, **_: _shaped(t.shape, t.dtype), aliases={0: 0})
sendrecv_p = _define("collectives_sendrecv", "collectives_sendrecv",
                     lambda x, t, **_: _shaped(t.shape, t.dtype), aliases={1: 0})
gather_p = _define(
    "collectives_gather", "collectives_gather",
    lambda x, size, is_root, **_: _shaped((size, *x.shape) if is_root else (0,), x.dtype))
scatter_p = _define(
    "collectives_scatter", "collectives_scatter",
    lambda x, is_root, **_: _shaped(x.shape[1:] if is_root else x.shape, x.dtype))
reduce_p = _define(
    "collectives_reduce", "collectives_reduce",
    lambda x, is_root, **_: _shaped(x.shape if is_root else (0,), x.dtype))
alltoall_p = _define("collectives_alltoall", "collectives_alltoall",
                     lambda x, **_: _shaped(x.shape, x.dtype))


def _array(x: Any):
    """x as a CPU JAX array (or tracer); pytrees are not taken here, as in mpi4jax."""
    if isinstance(x, (list, tuple, dict)):
        raise TypeError("this function takes one array, not a pytree (map it over the leaves)")
    a = x if isinstance(x, jax.Array) else jnp.asarray(x)
    if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer):
        if {d.platform for d in a.devices()} != {"cpu"}:
            _gpu_lowering(None)  # raises the GPU error
    return a


def _start(x: Any, comm: Any):
    core = _core_of(comm)
    a = _array(x)
    _ensure_registered()
    return core, a, {"comm": core.ffi_id, "api": _api_table()}


def _rank(value: Any, size: int, name: str, any_ok: bool = False) -> int:
    """A peer rank in [0, size) (or ANY_SOURCE where any_ok), checked before sending."""
    try:
        r = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer rank, not {type(value).__name__} "
                        f"({value!r})") from None
    if any_ok and r == _ANY_SOURCE:
        return r
    if not 0 <= r < size:
        raise ValueError(f"{name} {r} out of range for {size} ranks")
    return r


def _tag(value: Any, name: str, any_ok: bool = False) -> int:
    try:
        t = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}") from None
    if any_ok and t == _ANY_TAG:
        return t
    if not 0 <= t <= _TAG_MAX:
        raise ValueError(f"{name} {t} out of range [0, {_TAG_MAX}]")
    return t


def _eager_wait() -> None:
    # Outside jit the one-primitive program is dispatched asynchronously;
    # waiting here makes an eager send complete (or raise) in its call, as
    # mpi4jax's does.
    if _jax_core.trace_state_clean():
        jax.effects_barrier()


def send(x: Any, dest: int, *, tag: int = 0, comm: Any = None) -> None:
    """Send array `x` to rank `dest` (MPI standard mode: returns once handed to the link).

    Args:
        x: a JAX array (or array-like); the receiver's template must have the
            same size and dtype.
        dest: the receiving rank.
        tag: an integer in [0, 2**31 - 1].
        comm: a ``collectives.MPI.Comm`` (default: the world).
    """
    core, a, params = _start(x, comm)
    params.update(dest=_rank(dest, core.size, "dest"), tag=_tag(tag, "tag"))
    send_p.bind(a, **params)
    _eager_wait()


def recv(x: Any, source: int = _ANY_SOURCE, *, tag: int = _ANY_TAG, comm: Any = None) -> Any:
    """Receive a message shaped like the template `x` from `source` (default: any rank).

    Args:
        x: template array: the result has its shape and dtype (its values are
            not used). The message must have exactly that many elements and
            that dtype; otherwise the call fails naming both sides.
        source: the sending rank, or ``collectives.MPI.ANY_SOURCE`` (-1).
        tag: the tag to match, or ``collectives.MPI.ANY_TAG`` (-1, default).
        comm: a ``collectives.MPI.Comm`` (default: the world).

    Returns:
        A new array with the received data.
    """
    core, a, params = _start(x, comm)
    params.update(source=_rank(source, core.size, "source", any_ok=True),
                  tag=_tag(tag, "tag", any_ok=True))
    return recv_p.bind(a, **params)


def sendrecv(sendbuf: Any, recvbuf: Any, source: int, dest: int, *, sendtag: int = 0,
             recvtag: int = _ANY_TAG, comm: Any = None) -> Any:
    """Send `sendbuf` to `dest` and receive a message shaped like `recvbuf` from `source`, at once.

    Neither half waits for the other, so a ring of sendrecv calls never deadlocks.

    Args:
        sendbuf: the array to send.
        recvbuf: template of the result (shape and dtype; values unused).
        source: the rank to receive from (or ``ANY_SOURCE``, -1).
        dest: the rank to send to.
        sendtag: the tag of the message sent.
        recvtag: the tag to match (default ``ANY_TAG``, -1).
        comm: a ``collectives.MPI.Comm`` (default: the world).

    Returns:
        A new array with the received data.
    """
    core, a, params = _start(sendbuf, comm)
    t = _array(recvbuf)
    params.update(source=_rank(source, core.size, "source", any_ok=True),
                  dest=_rank(dest, core.size, "dest"), sendtag=_tag(sendtag, "sendtag"),
                  recvtag=_tag(recvtag, "recvtag", any_ok=True))
    return sendrecv_p.bind(a, t, **params)


def gather(x: Any, root: int, *, comm: Any = None) -> Any:
    """Gather every rank's `x` at `root`, stacked along a new axis 0.

    Args:
        x: an array of the same shape and dtype on every rank.
        root: the rank that receives.
        comm: a ``collectives.MPI.Comm`` (default: the world).

    Returns:
        At the root, shape ``(size, *x.shape)`` in rank order; elsewhere `x`
        unchanged (as mpi4jax).
    """
    core, a, params = _start(x, comm)
    from .._core import check_root

    root = check_root(root, core.size)
    params.update(root=root, size=core.size, is_root=int(core.rank == root))
    out = gather_p.bind(a, **params)
    return out if core.rank == root else a


def scatter(x: Any, root: int, *, comm: Any = None) -> Any:
    """Send block i of the root's `x` (axis 0) to rank i.

    Args:
        x: at the root, shape ``(size, *shape)``; elsewhere a template of
            ``shape`` (values unused), same dtype.
        root: the rank that sends.
        comm: a ``collectives.MPI.Comm`` (default: the world).

    Returns:
        This rank's block, shape ``shape``.
    """
    core, a, params = _start(x, comm)
    from .._core import check_root

    root = check_root(root, core.size)
    if core.rank == root and (a.ndim == 0 or a.shape[0] != core.size):
        raise ValueError(f"scatter: the root's input must have shape (size, ...) = "
                         f"({core.size}, ...), got {tuple(a.shape)}")
    params.update(root=root, size=core.size, is_root=int(core.rank == root))
    return scatter_p.bind(a, **params)


def reduce(x: Any, op: Any, root: int, *, comm: Any = None) -> Any:
    """Reduce every rank's `x` with `op` into `root`.

    Args:
        x: an array of the same shape and dtype on every rank (int8, uint8,
            int32, int64, float16, bfloat16, float32, float64).
        op: "sum", "prod", "min", "max" or "mean" (alias "avg"), or a
            ``collectives.MPI`` op.
        root: the rank that receives the result.
        comm: a ``collectives.MPI.Comm`` (default: the world).

    Returns:
        At the root, the reduced array; elsewhere `x` unchanged (as mpi4jax).
    """
    op_name = str(getattr(op, "name", op)).lower()
    if op_name not in _OPS:
        raise ValueError(f"op must be one of {sorted(_OPS)}, got {op!r}")
    core, a, params = _start(x, comm)
    if np.dtype(a.dtype) not in _REDUCIBLE:
        raise TypeError(f"reduce: unsupported dtype {a.dtype} (supported: int8, uint8, int32, "
                        f"int64, float16, bfloat16, float32, float64)")
    if op_name in ("mean", "avg") and not jnp.issubdtype(a.dtype, jnp.inexact):
        raise TypeError("reduce: op='mean' needs a floating-point array")
    from .._core import check_root

    root = check_root(root, core.size)
    params.update(op=_OPS[op_name], root=root, is_root=int(core.rank == root))
    out = reduce_p.bind(a, **params)
    return out if core.rank == root else a


def alltoall(x: Any, *, comm: Any = None) -> Any:
    """Exchange blocks: block i of `x` (axis 0) goes to rank i; block j of the result came from rank j.

    Args:
        x: shape ``(size, ...)``, the same on every rank.
        comm: a ``collectives.MPI.Comm`` (default: the world).

    Returns:
        An array of `x`'s shape.
    """
    core, a, params = _start(x, comm)
    if a.ndim == 0 or a.shape[0] != core.size:
        raise ValueError(f"alltoall: the input must have shape (size, ...) = ({core.size}, ...), "
                         f"got {tuple(a.shape)}")
    params["size"] = core.size
    return alltoall_p.bind(a, **params)
