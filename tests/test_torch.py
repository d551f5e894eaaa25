"""collectives.torch: Horovod's ops and the torch.distributed backend, as real ranks.

Each test launches one world (``python -m collectives.run -np N``) that runs
many cases against a single-process computation of the same data, and
reports wrong values through ``_worker.check``/``fail`` records.
"""
from __future__ import annotations

import importlib
import inspect

import pytest

torch = pytest.importorskip("torch")

from conftest import free_port, run_world  # noqa: E402

OPS_BODY = r'''
import numpy as np
import torch
import collectives.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
emit("world", size=n, cross=(hvd.cross_rank(), hvd.cross_size()), local=(hvd.local_rank(), hvd.local_size()))

def data(rank, shape, dtype, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    v = torch.randint(-3, 4, shape, generator=g)
    if dtype in (torch.uint8, torch.bool):
        v = v.abs()
    return v.to(dtype)

def expect_eq(case, got, want, atol=0.0):
    if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
        fail(case, f"got {got.dtype}{tuple(got.shape)}, expected {want.dtype}{tuple(want.shape)}")
        return
    a, b = got.to(torch.float64), want.to(torch.float64)
    if not torch.allclose(a, b, atol=atol, rtol=0):
        fail(case, f"max diff {(a - b).abs().max().item()}: got {got.flatten()[:6].tolist()}, expected {want.flatten()[:6].tolist()}")

DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]
OPS = {"Sum": torch.sum, "Min": lambda s, dim: s.min(dim).values, "Max": lambda s, dim: s.max(dim).values,
       "Product": torch.prod}
for dtype in DTYPES:
    for shape in [(), (1,), (7,), (3, 5), (2, 0)]:
        everyone = torch.stack([data(k, shape, dtype).to(torch.float64) for k in range(n)])
        mine = data(r, shape, dtype)
        for opname, fn in OPS.items():
            if dtype == torch.bool and opname != "Sum":
                continue
            case = dict(f="allreduce", dtype=str(dtype), shape=shape, op=opname)
            want = fn(everyone, dim=0)
            if dtype == torch.bool:
                want = want != 0
            want = want.to(dtype)
            got = hvd.allreduce(mine, op=getattr(hvd, opname))
            expect_eq(case, got, want)
            expect(torch.equal(mine, data(r, shape, dtype)), case, "input modified")
            t = mine.clone()
            hvd.allreduce_(t, op=getattr(hvd, opname))
            expect_eq(dict(case, f="allreduce_"), t, want)
            h = hvd.allreduce_async(mine, op=getattr(hvd, opname), name=f"x{dtype}{shape}{opname}")
            expect_eq(dict(case, f="allreduce_async"), hvd.synchronize(h), want)
        if dtype.is_floating_point:
            want = everyone.mean(0)
            expect_eq(dict(f="allreduce avg", dtype=str(dtype), shape=shape), hvd.allreduce(mine),
                      want.to(dtype), atol=1e-2)
            got = hvd.allreduce(mine, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
            expect_eq(dict(f="allreduce scaled", dtype=str(dtype), shape=shape), got,
                      (everyone.sum(0) * 1.5).to(dtype), atol=1e-2)
        # allgather: different first dims per rank
        rows = [(k % 3) for k in range(n)]
        pieces = [data(k, (rows[k],) + tuple(shape[1:]), dtype, seed=2) for k in range(n)]
        if len(shape) >= 1:
            got = hvd.allgather(pieces[r])
            expect_eq(dict(f="allgather", dtype=str(dtype), shape=shape), got, torch.cat(pieces))
            got = hvd.synchronize(hvd.allgather_async(pieces[r]))
            expect_eq(dict(f="allgather_async", dtype=str(dtype), shape=shape), got, torch.cat(pieces))
        for root in range(n):
            t = data(r, shape, dtype, seed=3)
            want = data(root, shape, dtype, seed=3)
            expect_eq(dict(f="broadcast", dtype=str(dtype), shape=shape, root=root), hvd.broadcast(t, root), want)
            expect(torch.equal(t, data(r, shape, dtype, seed=3)), dict(f="broadcast", root=root), "input modified")
            hvd.broadcast_(t, root)
            expect_eq(dict(f="broadcast_", dtype=str(dtype), shape=shape, root=root), t, want)

# non-contiguous input and in-place output
base = torch.arange(24, dtype=torch.float32).reshape(4, 6) + r
nc = base.t()
want = sum(torch.arange(24, dtype=torch.float32).reshape(4, 6) + k for k in range(n)).t()
expect_eq("noncontig allreduce", hvd.allreduce(nc, op=hvd.Sum), want)
hvd.allreduce_(nc, op=hvd.Sum)
expect_eq("noncontig allreduce_", nc, want)

# grouped allreduce, mixed dtypes, in place and not
ts = [data(r, (3,), torch.float32, 5), data(r, (2, 2), torch.int64, 6), data(r, (), torch.float64, 7)]
wants = [sum(data(k, t.shape, t.dtype, s) for k in range(n)) for t, s in zip(ts, (5, 6, 7))]
for got, want in zip(hvd.grouped_allreduce(ts, op=hvd.Sum), wants):
    expect_eq("grouped_allreduce", got, want)
h = hvd.grouped_allreduce_async_([t.clone() for t in ts], op=hvd.Sum)
for got, want in zip(hvd.synchronize(h), wants):
    expect_eq("grouped_allreduce_async_", got, want)

# compression
x = torch.linspace(-1, 1, 50, dtype=torch.float32) * (r + 1)
got = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
expect(got.dtype == torch.float32, "fp16", f"dtype {got.dtype}")
expect_eq("fp16 compression", got, sum(torch.linspace(-1, 1, 50) * (k + 1) for k in range(n)), atol=2e-2)

# alltoall: even and with splits
t = torch.arange(2 * n) + 100 * r
want = torch.cat([torch.arange(2 * n)[2 * r:2 * r + 2] + 100 * k for k in range(n)])
expect_eq("alltoall", hvd.alltoall(t), want)
splits = [(k + r) % 3 for k in range(n)]
t = torch.arange(sum(splits) * 2, dtype=torch.float32).reshape(-1, 2) + 1000 * r
out, recv = hvd.alltoall(t, splits=splits)
parts = []
for k in range(n):
    sk = [(j + k) % 3 for j in range(n)]
    tk = torch.arange(sum(sk) * 2, dtype=torch.float32).reshape(-1, 2) + 1000 * k
    parts.append(tk[sum(sk[:r]):sum(sk[:r]) + sk[r]])
expect_eq("alltoall splits", out, torch.cat(parts))
expect(recv.tolist() == [(r + k) % 3 for k in range(n)], "alltoall splits", f"received_splits {recv.tolist()}")

# reducescatter: even and uneven first dims
for d0 in (2 * n, 2 * n + 1, 1):
    t = torch.arange(d0 * 3, dtype=torch.float32).reshape(d0, 3) + r
    full = sum(torch.arange(d0 * 3, dtype=torch.float32).reshape(d0, 3) + k for k in range(n))
    rows = [d0 // n + (1 if k < d0 % n else 0) for k in range(n)]
    lo = sum(rows[:r])
    expect_eq(dict(f="reducescatter", d0=d0), hvd.reducescatter(t, op=hvd.Sum), full[lo:lo + rows[r]])
    expect_eq(dict(f="reducescatter avg", d0=d0), hvd.reducescatter(t), full[lo:lo + rows[r]] / n, atol=1e-6)

# autograd through allreduce / allgather / broadcast
x = torch.ones(3, requires_grad=True)
(hvd.allreduce(x, op=hvd.Sum) * (r + 1)).sum().backward()
expect_eq("allreduce grad", x.grad, torch.full((3,), float(sum(k + 1 for k in range(n)))))
x = torch.ones(r + 1, 2, requires_grad=True)
g = hvd.allgather(x)
(g * torch.arange(g.shape[0], dtype=torch.float32)[:, None]).sum().backward()
off = sum(k + 1 for k in range(r))
# Horovod averages the gradient over ranks (every rank's weights are equal here)
expect_eq("allgather grad", x.grad, torch.arange(off, off + r + 1, dtype=torch.float32)[:, None].expand(r + 1, 2))
x = torch.ones(2, requires_grad=True)
hvd.broadcast(x, 0).sum().backward()
expect_eq("broadcast grad", x.grad, torch.full((2,), 1.0 if r == 0 else 0.0))

# objects, parameters, optimizer state
expect(hvd.broadcast_object({"r": r, "t": torch.ones(2) * r}, root_rank=n - 1)["r"] == n - 1, "broadcast_object", "")
expect(hvd.allgather_object(("x", r)) == [("x", k) for k in range(n)], "allgather_object", "")
torch.manual_seed(r)
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
extra = torch.arange(3, dtype=torch.float64) + r
hvd.broadcast_parameters(dict(model.state_dict(), extra=extra), root_rank=0)
torch.manual_seed(0)
ref = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
for (k, a), (_, b) in zip(model.state_dict().items(), ref.state_dict().items()):
    expect_eq(f"broadcast_parameters {k}", a, b)
expect_eq("broadcast_parameters extra", extra, torch.arange(3, dtype=torch.float64))
opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
if r == 0:
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
hvd.broadcast_optimizer_state(opt, root_rank=0)
states = hvd.allgather_object({k: {kk: (vv.tolist() if torch.is_tensor(vv) else vv) for kk, vv in v.items()}
                               for k, v in opt.state_dict()["state"].items()})
expect(all(s == states[0] for s in states) and len(states[0]) == 6, "broadcast_optimizer_state", f"{len(states[0])} entries")
expect(opt.param_groups[0]["lr"] == 0.01, "broadcast_optimizer_state lr", str(opt.param_groups[0]["lr"]))
empty = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
hvd.broadcast_optimizer_state(empty, root_rank=0)
expect(empty.param_groups[0]["lr"] == 0.1 and not empty.state, "broadcast_optimizer_state empty", "")

# handles, barrier, join
hs = [hvd.allreduce_async(torch.ones(1000) * k, op=hvd.Sum) for k in range(5)]
hvd.barrier()
expect(all(hvd.poll(h) for h in hs), "poll after barrier", "")
expect(all(hvd.synchronize(h)[0].item() == k * n for k, h in enumerate(hs)), "queued", "")
expect(0 <= hvd.join() < n, "join", "")

# errors: CUDA-less checks, unsupported dtype, mismatched shapes
for bad, exc in [(torch.ones(2, dtype=torch.complex64), TypeError), ([1, 2], TypeError)]:
    try:
        hvd.allreduce(bad)
        fail("error", f"no {exc.__name__} for {type(bad)}")
    except exc:
        pass
try:
    if n == 1:
        raise hvd.LayoutMismatch("single rank")
    hvd.allreduce(torch.ones(6).reshape((2, 3) if r == 0 else (3, 2)), name="shape-mismatch")
    fail("mismatch", "no error for different shapes")
except hvd.LayoutMismatch as e:
    emit("mismatch", message=str(e))
try:
    if n == 1:
        raise ValueError("single rank")
    hvd.allgather(torch.ones(2, 2 + (r == 1)))
    fail("mismatch", "no error for allgather trailing dims")
except ValueError as e:
    emit("mismatch", message=str(e))
hvd.allreduce(torch.ones(1))  # the world still works after the mismatch
hvd.shutdown()
expect(not hvd.is_initialized(), "shutdown", "")
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 3])
def test_ops_match_single_process(n):
    res = run_world(n, OPS_BODY, launcher=True, timeout=100).assert_ok()
    for rank in range(n):
        assert res[rank].one("done")["failures"] == 0
        assert len(res[rank].get("mismatch")) == 2, res.report()
    if n > 1:
        assert "different arguments" in res[0].get("mismatch")[0]["message"]


BACKEND_BODY = r'''
import os
import torch
import torch.distributed as dist
import collectives.torch  # registers the backend

r, n = int(os.environ.get("RANK", os.environ.get("COLLECTIVES_RANK"))), int(os.environ.get("WORLD_SIZE", os.environ.get("COLLECTIVES_SIZE")))
if "TORCH_PORT" not in os.environ:  # torchrun's variables (torchrun or collectives-run)
    dist.init_process_group("collectives")
else:
    dist.init_process_group("collectives", init_method=f"tcp://127.0.0.1:{os.environ['TORCH_PORT']}", rank=r, world_size=n)
emit("backend", name=dist.get_backend())

def eq(case, got, want):
    if not torch.allclose(got.double(), want.double()):
        fail(case, f"got {got.tolist()}, expected {want.tolist()}")

vals = [torch.arange(5, dtype=torch.float32) * (k + 1) - k for k in range(n)]
for opname, fn in [("SUM", lambda s: s.sum(0)), ("AVG", lambda s: s.mean(0)), ("MIN", lambda s: s.min(0).values),
                   ("MAX", lambda s: s.max(0).values), ("PRODUCT", lambda s: s.prod(0))]:
    for dtype in (torch.float32, torch.float64, torch.int64, torch.int16, torch.bfloat16):
        if opname == "AVG" and not dtype.is_floating_point:
            continue
        t = vals[r].to(dtype, copy=True)
        w = dist.all_reduce(t, op=getattr(dist.ReduceOp, opname), async_op=True)
        w.wait()
        eq(("all_reduce", opname, str(dtype)), t, fn(torch.stack(vals)).to(dtype))
t = torch.ones(4) * r
fut = dist.all_reduce(t, async_op=True).get_future()
eq("future", fut.wait()[0], torch.ones(4) * sum(range(n)))
for root in range(n):
    t = torch.ones(3, dtype=torch.int32) * r
    dist.broadcast(t, root)
    eq(("broadcast", root), t, torch.ones(3) * root)
out = [torch.empty(2, 2) for _ in range(n)]
dist.all_gather(out, torch.ones(2, 2) * r)
eq("all_gather", torch.stack(out), torch.stack([torch.ones(2, 2) * k for k in range(n)]))
big = torch.empty(2 * n, 3)
dist.all_gather_into_tensor(big, torch.ones(2, 3) * r)
eq("all_gather_into_tensor", big, torch.cat([torch.ones(2, 3) * k for k in range(n)]))
o = torch.empty(2)
dist.reduce_scatter_tensor(o, torch.arange(2.0 * n) + r)
eq("reduce_scatter_tensor", o, sum(torch.arange(2.0 * n) + k for k in range(n))[2 * r:2 * r + 2])
dist.reduce_scatter_tensor(o, torch.arange(2.0 * n) + r, op=dist.ReduceOp.AVG)
eq("reduce_scatter_tensor avg", o, sum(torch.arange(2.0 * n) + k for k in range(n))[2 * r:2 * r + 2] / n)
t = torch.ones(2) * (r + 1)
dist.reduce(t, dst=0)
eq("reduce", t, torch.ones(2) * (sum(range(1, n + 1)) if r == 0 else r + 1))
inp = torch.arange(n, dtype=torch.float32) + 10 * r
outp = torch.empty(n)
dist.all_to_all_single(outp, inp)
eq("all_to_all_single", outp, torch.tensor([10.0 * k + r for k in range(n)]))
dist.barrier()
sub = dist.new_group(backend="collectives")
t = torch.ones(1)
dist.all_reduce(t, group=sub)
eq("new_group", t, torch.ones(1) * n)
dist.destroy_process_group()
# The completion threads are joined, not left to die in interpreter finalization
# (a daemon thread completing a torch Future there aborts the process).
import threading
left = [t.name for t in threading.enumerate() if t.name == "collectives-torch-pg"]
if left:
    fail("completion threads after destroy_process_group", str(left))
'''


@pytest.mark.timeout(60)
def test_backend_collectives_under_launcher():
    res = run_world(3, BACKEND_BODY, launcher=True, timeout=50,
                    env={"TORCH_PORT": str(free_port())}).assert_ok()
    assert res[0].one("backend")["name"] == "collectives"


@pytest.mark.timeout(60)
def test_backend_through_torch_store_like_torchrun():
    """Under torchrun the groups rendezvous through torch's store, and still learn which
    peers share their host: those links use shared memory, as in a collectives world."""
    port = free_port()

    def torchrun_env(rank, n):
        return {"RANK": rank, "WORLD_SIZE": n, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": n,
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TORCHELASTIC_RUN_ID": "none"}

    res = run_world(2, BACKEND_BODY, rank_env=torchrun_env, timeout=50,
                    env={"COLLECTIVES_DEBUG": "INFO", "COLLECTIVES_DEBUG_SUBSYS": "NET"}).assert_ok()
    assert res[1].one("backend")["name"] == "collectives"
    for rr in res.ranks:  # two links: the default group's and new_group's own (issue 37)
        assert rr.stderr.count(" via shm ") == 2 and " via tcp " not in rr.stderr, rr.stderr


@pytest.mark.timeout(60)
def test_backend_exit_without_destroy_process_group():
    # The completion thread is not a daemon; an exit hook must end it, or the
    # interpreter would wait on it forever. Also: collectives-run sets
    # torchrun's variables, so init_process_group needs no init_method.
    body = r'''
import torch
import torch.distributed as dist
import collectives.torch
dist.init_process_group("collectives")
emit("env", rank=os.environ["RANK"], world=os.environ["WORLD_SIZE"], local=os.environ["LOCAL_RANK"])
t = torch.ones(3)
dist.all_reduce(t, async_op=True).wait()
emit("sum", value=t.tolist())
'''
    res = run_world(2, body, launcher=True, timeout=50).assert_ok()
    assert res[0].one("sum")["value"] == [2.0, 2.0, 2.0]
    assert [(res[r].one("env")["rank"], res[r].one("env")["world"]) for r in (0, 1)] == \
        [("0", "2"), ("1", "2")]


def test_public_names_have_docstrings_and_hints():
    for modname in ("collectives.torch", "collectives.torch.basics", "collectives.torch.mpi_ops",
                    "collectives.torch.functions", "collectives.torch.gather_ops",
                    "collectives.torch.exceptions", "collectives.torch._lane",
                    "collectives.torch.process_sets", "collectives.torch.sync_batch_norm",
                    "collectives.torch.timeline", "collectives.torch.adasum",
                    "collectives.torch._join",
                    "collectives.torch.optimizer", "collectives.torch.compression",
                    "collectives.torch.distributed.backend"):
        mod = importlib.import_module(modname)
        assert (mod.__doc__ or "").strip(), modname
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            assert (obj.__doc__ or "").strip(), f"{modname}.{name} has no docstring"
            if inspect.isfunction(obj):
                sig = inspect.signature(obj)
                assert sig.return_annotation is not inspect.Signature.empty, f"{modname}.{name}"
                for p in sig.parameters.values():
                    assert p.annotation is not inspect.Parameter.empty, f"{modname}.{name}({p.name})"
            else:
                for mname, m in vars(obj).items():
                    if inspect.isfunction(m) and not mname.startswith("_"):
                        assert (m.__doc__ or "").strip(), f"{modname}.{name}.{mname}"


def test_cuda_tensor_rejected_before_init_needed():
    import collectives.torch as hvd
    from collectives.torch._context import check_tensor

    with pytest.raises(TypeError, match="takes CPU and CUDA tensors"):
        check_tensor(torch.empty(2, device="meta"))
    with pytest.raises(ValueError, match="init"):
        hvd.rank()


@pytest.mark.timeout(60)
def test_barrier_waits_for_queued_async_work_at_one_rank():
    """hvd.barrier() returns after the async calls queued before it, at one rank too (it
    did nothing there: 21 of 300 rounds still had a handle pending)."""
    body = r"""
import torch
import collectives.torch as hvd
hvd.init()
pending = 0
for i in range(300):
    hs = [hvd.allreduce_async(torch.ones(1000) * k, op=hvd.Sum) for k in range(5)]
    hvd.barrier()
    pending += not all(hvd.poll(h) for h in hs)
    for h in hs:
        hvd.synchronize(h)
emit("pending", rounds=pending)
"""
    res = run_world(1, body, timeout=50).assert_ok()
    assert res[0].one("pending")["rounds"] == 0
