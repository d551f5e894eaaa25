"""GPU buffers on real hardware, beyond the grid of test_cuda.py (issue 26):
stream ordering under load through torch and CuPy, the PyTorch adapter and
the torch.distributed backend training on CUDA tensors, DGC on CUDA, and no
leak of CUDA IPC mappings or device memory over many calls with fresh
buffers. Every rank runs on device 0 (CUDA IPC between processes on one GPU).

The tests marked ``cuda`` skip without a CUDA build and a GPU; the IPC
mapping test also runs on the emulated GPU (COLLECTIVES_CUDA_FAKE=1), which
packs small allocations into shared regions the way the CUDA driver does.
"""
import pytest

import collectives
from conftest import free_port, run_world

cuda = pytest.mark.skipif(not collectives.cuda_available(),
                          reason="needs a CUDA build and a GPU (collectives.cuda_available())")


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


# -- stream ordering -------------------------------------------------------------------------

TORCH_STREAMS_BODY = r"""
import torch
import collectives.torch as hvd
hvd.init()
n, r = hvd.size(), hvd.rank()
dev = torch.device("cuda", 0)
rng = np.random.default_rng(7)   # the same sizes and delays on every rank
s = torch.cuda.Stream(dev)
iters = int(sys.argv[1])
for it in range(iters):
    count = int(rng.integers(1, 1 << 20))
    delay = int(rng.integers(0, 2_000_000))
    mode = it % 3
    with torch.cuda.stream(s):
        # A long kernel, then the producer, queued on torch's current (non-default)
        # stream and never synchronized: the collective must wait for them.
        torch.cuda._sleep(delay)
        x = torch.full((count,), float(r + 1), device=dev) * 3 + it
        if mode == 0:
            y = hvd.allreduce(x, op=hvd.Sum)
        elif mode == 1:
            y = hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum))
        else:
            hvd.allreduce_(x, op=hvd.Sum)
            y = x
        z = y * 2 - 1           # the consumer, right after, on the same stream
    s.synchronize()  # torch's streams do not wait for each other: .cpu() runs on the default one
    want = 2.0 * (3 * n * (n + 1) / 2 + n * it) - 1
    got = z.cpu().numpy()
    check(dict(it=it, count=count, mode=mode), got, np.full(count, want, np.float32), "float32")
emit("iters", count=iters)
"""


@cuda
@pytest.mark.cuda
@pytest.mark.timeout(300)
def test_torch_stream_ordering_under_load():
    _torch_cuda()
    res = run_world(2, TORCH_STREAMS_BODY, timeout=280, collective_timeout=60,
                    args=["400"]).assert_ok()
    assert all(rr.one("iters")["count"] == 400 for rr in res.ranks)


CUPY_STREAMS_BODY = r"""
import cupy as cp
from collectives import MPI
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
spin = cp.RawKernel(r'''
extern "C" __global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
}''', "spin")
rng = np.random.default_rng(11)
s = cp.cuda.Stream(non_blocking=True)
iters = int(sys.argv[1])
for it in range(iters):
    count = int(rng.integers(1, 1 << 20))
    delay = int(rng.integers(0, 2_000_000))
    with s:
        spin((1,), (1,), (cp.int64(delay),))
        x = cp.full(count, r + 1, dtype=cp.float32) * 3 + it
        if it % 2 == 0:
            comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        else:
            comm.Iallreduce(MPI.IN_PLACE, x, op=MPI.SUM).Wait()
        z = x * 2 - 1
    s.synchronize()  # a non-blocking stream: asnumpy() below runs on the null stream
    want = 2.0 * (3 * n * (n + 1) / 2 + n * it) - 1
    check(dict(it=it, count=count), cp.asnumpy(z), np.full(count, want, np.float32), "float32")
emit("iters", count=iters)
"""


@cuda
@pytest.mark.cuda
@pytest.mark.timeout(300)
def test_cupy_stream_ordering_under_load():
    pytest.importorskip("cupy")
    res = run_world(2, CUPY_STREAMS_BODY, timeout=280, collective_timeout=60,
                    args=["300"]).assert_ok()
    assert all(rr.one("iters")["count"] == 300 for rr in res.ranks)


# -- training on CUDA tensors ------------------------------------------------------------------

TRAIN_BODY = r"""
import torch
import collectives.torch as hvd
hvd.init()
n, r = hvd.size(), hvd.rank()

def train(device, steps=30):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 8)).double().to(device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(100 + r)       # each rank its own data
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 32, generator=g, dtype=torch.float64).to(device)
        y = (x[:, :8] * 0.5).tanh()     # learnable: the loss must fall
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach().cpu() for p in model.parameters()], losses

on_gpu, gpu_losses = train(torch.device("cuda", 0))
on_cpu, cpu_losses = train(torch.device("cpu"))
worst = max(float((a - b).abs().max() / (b.abs().max() + 1e-12)) for a, b in zip(on_gpu, on_cpu))
emit("train", worst=worst, first=gpu_losses[0], last=gpu_losses[-1])
expect(worst < 1e-9, dict(what="cuda vs cpu parameters"), f"relative difference {worst}")
"""


@cuda
@pytest.mark.cuda
@pytest.mark.timeout(240)
def test_distributed_optimizer_on_cuda_matches_the_cpu_run():
    _torch_cuda()
    res = run_world(2, TRAIN_BODY, timeout=220, collective_timeout=60).assert_ok()
    for rr in res.ranks:
        got = rr.one("train")
        assert got["worst"] < 1e-9 and got["last"] < got["first"], got


DDP_BODY = r"""
import torch
import torch.distributed as dist
import collectives.torch
from datetime import timedelta
r, n = int(os.environ["COLLECTIVES_RANK"]), int(os.environ["COLLECTIVES_SIZE"])
dist.init_process_group("collectives", init_method=f"tcp://127.0.0.1:{os.environ['TORCH_PORT']}",
                        rank=r, world_size=n, timeout=timedelta(seconds=60))

def train(device, steps=20):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4)).double().to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(10 + r)
    for _ in range(steps):
        x = torch.randn(8, 32, generator=g, dtype=torch.float64).to(device)
        y = torch.randn(8, 4, generator=g, dtype=torch.float64).to(device)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().cpu() for p in model.parameters()]

on_gpu = train(torch.device("cuda", 0))
on_cpu = train(torch.device("cpu"))
worst = max(float((a - b).abs().max() / (b.abs().max() + 1e-12)) for a, b in zip(on_gpu, on_cpu))
flat = torch.cat([p.reshape(-1) for p in on_gpu]).cuda()
others = [torch.empty_like(flat) for _ in range(n)]
dist.all_gather(others, flat)               # every rank holds the same parameters
spread = max(float((o - flat).abs().max()) for o in others)
emit("ddp", worst=worst, spread=spread)
expect(worst < 1e-9, dict(what="ddp cuda vs cpu"), f"relative difference {worst}")
expect(spread == 0.0, dict(what="ddp ranks agree"), f"ranks differ by {spread}")
dist.destroy_process_group()
"""


@cuda
@pytest.mark.cuda
@pytest.mark.timeout(240)
def test_ddp_on_cuda_tensors_through_the_backend():
    _torch_cuda()
    res = run_world(2, DDP_BODY, timeout=220, collective_timeout=60,
                    env={"TORCH_PORT": str(free_port())}).assert_ok()
    assert all(rr.one("ddp")["spread"] == 0.0 for rr in res.ranks)


DGC_BODY = r"""
import torch
import collectives.torch as hvd
from collectives.torch import DGC, DGCSGD
hvd.init()
n, r = hvd.size(), hvd.rank()
dev = torch.device("cuda", 0)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 10)).to(dev)
opt = hvd.DistributedOptimizer(DGCSGD(model.parameters(), lr=0.05, momentum=0.9),
                               named_parameters=model.named_parameters(),
                               compression=DGC(compress_ratio=0.01, momentum=0.9, min_numel=0))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
g = torch.Generator().manual_seed(5)               # one data set, split by rank
X = torch.randn(512, 64, generator=g)
Y = (X[:, :10] * 2).argmax(1)
mine = slice(r * 512 // n, (r + 1) * 512 // n)
losses = []
for step in range(60):
    x, y = X[mine].to(dev), Y[mine].to(dev)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
assert flat.is_cuda
others = hvd.allgather(flat.unsqueeze(0))
spread = float((others - flat.unsqueeze(0)).abs().max())
emit("dgc", first=losses[0], last=losses[-1], spread=spread)
expect(spread == 0.0, dict(what="dgc ranks agree"), f"ranks differ by {spread}")
expect(losses[-1] < 0.7 * losses[0], dict(what="dgc learns"), f"loss {losses[0]} -> {losses[-1]}")
"""


@cuda
@pytest.mark.cuda
@pytest.mark.timeout(240)
def test_dgc_on_cuda_tensors():
    _torch_cuda()
    res = run_world(2, DGC_BODY, timeout=220, collective_timeout=60).assert_ok()
    assert all(rr.one("dgc")["spread"] == 0.0 for rr in res.ranks)


# -- CUDA IPC mappings and device memory over many calls ---------------------------------------

FRESH_BODY = r"""
from collectives import MPI, _core
comm = MPI.COMM_WORLD
core = comm._core
n, r = comm.size, comm.rank
calls, fake = int(sys.argv[1]), os.environ.get("COLLECTIVES_CUDA_FAKE") == "1"
rng = np.random.default_rng(3)   # the same sizes on every rank

def used():
    if fake:
        return 0
    import torch
    free, total = torch.cuda.mem_get_info(0)
    return total - free

def one(i):
    # Fresh buffers every call: small ones (which the driver packs into shared
    # regions) and large ones; in place and not.
    count = int(rng.integers(1, 1 << 12)) if i % 2 else int(rng.integers(1 << 18, 1 << 20))
    inplace = i % 3 == 0
    host = np.full(count, r + 1 + (i % 7), np.float32)
    send = _core.DeviceBuffer(host.nbytes, "float32", 0)
    send.copy_from(host)
    recv = send if inplace else _core.DeviceBuffer(host.nbytes, "float32", 0)
    core.allreduce(None if inplace else send, recv, "sum", "auto", None, "float32")
    if i % 50 == 0:
        got = np.empty(count, np.float32)
        recv.copy_to(got)
        check(dict(call=i, count=count), got,
              np.full(count, n * (n + 1) / 2 + n * (i % 7), np.float32), "float32")

for i in range(20):
    one(i)
comm.Barrier()
start = used()
most = 0
for i in range(20, 20 + calls):
    one(i)
    most = max(most, _core.cuda_ipc_mappings())
comm.Barrier()
end = used()
maps_end = _core.cuda_ipc_mappings()
comm.Barrier()
MPI.Finalize()
emit("fresh", calls=calls, start=start, end=end, after=used(), most=most, maps_end=maps_end,
     maps_after=_core.cuda_ipc_mappings())
"""


def _check_fresh(res, calls: int) -> None:
    for rr in res.ranks:
        got = rr.one("fresh")
        assert got["calls"] == calls
        assert got["most"] <= 128, got          # the cache's bound
        assert got["maps_after"] == 0, got      # nothing left mapped once the world is gone
        # Device memory held for peers' freed buffers stays bounded by the cache,
        # and is all given back with the world.
        assert got["end"] - got["start"] < (128 * 4 << 20) + (64 << 20), got
        assert got["after"] - got["start"] < 64 << 20, got


@pytest.mark.timeout(240)
def test_ipc_mappings_stay_bounded_on_the_emulated_gpu():
    """Fresh buffers every call, small ones packed into shared regions: before the
    process-wide mapping cache, the second buffer of a region failed with
    "already mapped" (found on the H100 first)."""
    calls = 300
    res = run_world(2, FRESH_BODY, timeout=220, collective_timeout=60,
                    env={"COLLECTIVES_CUDA_FAKE": "1"}, args=[str(calls)]).assert_ok()
    _check_fresh(res, calls)


@cuda
@pytest.mark.cuda
@pytest.mark.timeout(400)
def test_no_leak_over_ten_thousand_calls_with_fresh_buffers():
    _torch_cuda()
    calls = 10_000
    res = run_world(2, FRESH_BODY, timeout=380, collective_timeout=60,
                    args=[str(calls)]).assert_ok()
    _check_fresh(res, calls)
    print(res.ranks[0].one("fresh"))
