"""GPU buffers: the CUDA build, the clean skip without a GPU, and (marker
``cuda``, on a machine with a GPU) every collective on device memory over CUDA
IPC and over pinned-host staging, with 2, 3 and 4 processes on device 0.

The GPU workers use collectives._core.DeviceBuffer (plain cudaMalloc memory
with __cuda_array_interface__), so they need neither CuPy nor a CUDA build of
PyTorch; the PyTorch test runs where torch.cuda is available.
"""
import os
import shutil

import numpy as np
import pytest

import collectives
from collectives import _core
from conftest import run_world


def _nvcc_at_build_time() -> bool:
    """What setup.py's find_cuda() sees on this machine (CI builds here)."""
    if os.environ.get("COLLECTIVES_CUDA", "auto").lower() in ("0", "no", "off", "false"):
        return False
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    return any(r and os.path.exists(os.path.join(r, "bin", "nvcc")) for r in roots)


def _gpu_present() -> bool:
    return any(os.path.exists(f"/dev/nvidia{i}") for i in range(16))


def test_cuda_built_when_nvcc_is_present():
    assert collectives.cuda_built() == _nvcc_at_build_time()
    assert _core.cuda_built() == collectives.cuda_built()


def test_cuda_available_matches_the_machine():
    if not _gpu_present():
        assert collectives.cuda_available() is False
        assert _core.cuda_device_count() == 0
    else:
        assert collectives.cuda_available() == collectives.cuda_built()


class _FakeDeviceArray:
    """Claims to be a GPU array but points at host memory."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr
        self.__cuda_array_interface__ = {"shape": arr.shape, "typestr": arr.dtype.str,
                                         "data": (arr.ctypes.data, False), "version": 3,
                                         "strides": None, "stream": None}


def test_cuda_array_interface_over_host_memory_is_read_in_place():
    """A __cuda_array_interface__ whose pointer the CUDA runtime does not know as device
    memory (no driver at all here) is host memory, read and written in place as mpi4py
    hands the pointer to MPI (issue 39); no CUDA call is made, the communicator stays
    usable, and a read-only one is refused before any byte."""
    if collectives.cuda_available():
        pytest.skip("on a GPU machine the runtime is asked about the pointer")
    comm = _core.Communicator(0, 1)
    try:
        arr = np.arange(4, dtype=np.float32)
        buf = _FakeDeviceArray(arr)
        comm.allreduce(np.full(4, 3.0, np.float32), buf)
        assert arr.tolist() == [3.0, 3.0, 3.0, 3.0]  # written into the caller's memory
        comm.broadcast(buf)
        ro = _FakeDeviceArray(np.ones(4, np.float32))
        ro.__cuda_array_interface__["data"] = (ro.arr.ctypes.data, True)
        with pytest.raises((TypeError, ValueError), match="read-only"):
            comm.allreduce(None, ro)
        x = np.ones(4, np.float32)
        comm.allreduce(None, x)  # still usable
        assert x.tolist() == [1.0] * 4
    finally:
        comm.close()


def test_host_helpers_reject_device_views():
    if not collectives.cuda_available():
        pytest.skip("needs a GPU to make a device buffer")
    buf = _core.DeviceBuffer(16, "float32")
    with pytest.raises(TypeError, match="host memory"):
        _core.reduce_local(buf, buf, buf)


def test_device_buffer_needs_a_gpu():
    if collectives.cuda_available():
        pytest.skip("a GPU is present")
    with pytest.raises(Exception, match="no CUDA support|cuda|CUDA"):
        _core.DeviceBuffer(16, "float32")


cuda = pytest.mark.skipif(not collectives.cuda_available(),
                          reason="needs a CUDA build and a GPU (collectives.cuda_available())")

GRID_BODY = r"""
import collectives
from collectives import MPI, _core
comm = MPI.COMM_WORLD
core = comm._core
n, r = comm.size, comm.rank
DEV = 0  # every rank on device 0: CUDA IPC between processes on one GPU

def on_device(arr, dtype):
    d = _core.DeviceBuffer(arr.nbytes, dtype, DEV)
    if arr.nbytes:
        d.copy_from(arr)
    return d

def fetch(d, count, dtype):
    out = np.empty(count, dtype=np_dtype(dtype))
    if count:
        d.copy_to(out)
    return out

cases = 0
QUICK = sys.argv[1] == "quick"
counts = sorted({0, 1, n + 1, 4097, 3 * (1 << 20) // 4 + 5})
for alg in ALGORITHMS[:3] if QUICK else ALGORITHMS:
    for dtype in DTYPES:
        for op in OPS:
            for count in counts:
                for inplace in ((count % 2 == 1,) if QUICK else (False, True)):
                    case = dict(n=n, alg=alg, op=op, dtype=dtype, count=count, inplace=inplace)
                    host = store(rank_values(op, dtype, count, r), dtype)
                    send = on_device(host, dtype)
                    recv = send if inplace else on_device(np.zeros_like(host), dtype)
                    guarded(case, core.allreduce, None if inplace else send, recv, op, alg, None,
                            dtype)
                    got = fetch(recv, count, dtype)
                    check(case, got, expected_stored(op, dtype, count, n), dtype)
                    record_hash(case, got)
                    cases += 1

# allgatherv, broadcast and reduce_scatter on device buffers
for dtype in ("float32", "int8", "bfloat16"):
    for count in (0, 5, 300000):
        counts_v = [count + i for i in range(n)]
        mine = store(rank_values("sum", dtype, counts_v[r], r), dtype)
        out = on_device(np.zeros(sum(counts_v), np_dtype(dtype)), dtype)
        case = dict(what="allgatherv", dtype=dtype, count=count)
        guarded(case, core.allgatherv, on_device(mine, dtype), out, counts_v, None, None, dtype)
        want = np.concatenate([store(rank_values("sum", dtype, counts_v[i], i), dtype)
                               for i in range(n)])
        check(case, fetch(out, sum(counts_v), dtype), want, dtype)
        root = count % n
        b = store(rank_values("sum", dtype, count, root), dtype)
        dbuf = on_device(b if r == root else np.zeros_like(b), dtype)
        case = dict(what="broadcast", dtype=dtype, count=count, root=root)
        guarded(case, core.broadcast, dbuf, root, None, dtype)
        check(case, fetch(dbuf, count, dtype), b, dtype)
        full = store(rank_values("sum", dtype, count * n, r), dtype)
        rs = on_device(np.zeros(count, np_dtype(dtype)), dtype)
        case = dict(what="reduce_scatter", dtype=dtype, count=count)
        guarded(case, core.reduce_scatter_block, on_device(full, dtype), rs, "sum", None, dtype)
        check(case, fetch(rs, count, dtype),
              expected_stored("sum", dtype, count * n, n)[r * count:(r + 1) * count], dtype)
        cases += 3

# non-blocking, ordered after work queued on a stream
host = store(rank_values("sum", "float32", 1 << 20, r), "float32")
d = on_device(host, "float32")
req = core.iallreduce(None, d, "sum", "auto", None, "float32")
req.Wait()
check(dict(what="iallreduce"), fetch(d, 1 << 20, "float32"),
      expected_stored("sum", "float32", 1 << 20, n), "float32")
verify_hashes(comm)
emit("cases", count=cases)
"""


@cuda
@pytest.mark.cuda
@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("path", ["ipc", "staged-shm", "staged-tcp"])
def test_gpu_collectives(n, path):
    env = {"ipc": {}, "staged-shm": {"COLLECTIVES_CUDA_IPC": "0"},
           "staged-tcp": {"COLLECTIVES_TRANSPORT": "tcp"}}[path]
    res = run_world(n, GRID_BODY, timeout=580, env=env, collective_timeout=120,
                    args=["full"]).assert_ok()
    assert all(rr.one("cases")["count"] > 1000 for rr in res.ranks)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n,path", [(2, "ipc"), (3, "ipc"), (3, "staged-tcp"), (4, "staged-shm"),
                                    (3, "ipc-segmented")])
def test_device_executor_on_emulated_gpu(n, path):
    """The same grid on one GPU emulated in host memory (COLLECTIVES_CUDA_FAKE=1):
    the device executor, pinned staging and the CUDA IPC records, without a GPU.
    ipc-segmented: 64 KiB segments, so the larger cases run in many (the default,
    64 MiB, leaves every case of the grid in one)."""
    env = {"ipc": {}, "staged-shm": {"COLLECTIVES_CUDA_IPC": "0"},
           "staged-tcp": {"COLLECTIVES_TRANSPORT": "tcp"},
           "ipc-segmented": {"COLLECTIVES_CUDA_SEGMENT_BYTES": "64K"}}[path]
    env["COLLECTIVES_CUDA_FAKE"] = "1"
    res = run_world(n, GRID_BODY, timeout=280, env=env, collective_timeout=60,
                    args=["quick"]).assert_ok()
    assert all(rr.one("cases")["count"] > 500 for rr in res.ranks)


MISMATCH_BODY = r"""
os.environ["COLLECTIVES_CUDA_IPC"] = "0" if RANK == 1 else "1"  # read once, at first use
from collectives import MPI, _core
core = MPI.COMM_WORLD._core
buf = _core.DeviceBuffer(1 << 20, "float32", 0)
t0 = time.monotonic()
try:
    core.allreduce(None, buf, "sum", "ring", None, "float32")
    emit("result", ok=True)
except Exception as exc:
    emit("result", ok=False, error=str(exc), seconds=time.monotonic() - t0)
"""


@cuda
@pytest.mark.cuda
@pytest.mark.timeout(120)
def test_gpu_ranks_configured_differently_fail_with_a_clear_error():
    res = run_world(2, MISMATCH_BODY, timeout=100, collective_timeout=20)
    results = [rr.one("result") for rr in res.ranks]
    assert not any(r["ok"] for r in results)
    assert any("CUDA IPC" in r["error"] for r in results), results
    assert all(r["seconds"] < 15 for r in results), results


TORCH_BODY = r"""
import torch
import collectives.torch as hvd
hvd.init()
dev = torch.device("cuda", 0)
x = torch.arange(1 << 16, dtype=torch.float32, device=dev) + hvd.rank()
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    y = x * 2          # queued on s: the allreduce must wait for it
    out = hvd.allreduce(y, op=hvd.Sum)
want = (torch.arange(1 << 16, dtype=torch.float64) * 2 * hvd.size()
        + hvd.size() * (hvd.size() - 1)).to(torch.float32)
check(dict(what="torch cuda allreduce"), out.cpu().numpy(), want.numpy(), "float32")
emit("device", where=str(out.device))
"""


@cuda
@pytest.mark.cuda
@pytest.mark.timeout(180)
def test_torch_cuda_tensors():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    res = run_world(2, TORCH_BODY, timeout=160).assert_ok()
    assert all(rr.one("device")["where"].startswith("cuda") for rr in res.ranks)


DEATH_BODY = r"""
from collectives import MPI, _core
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
buf = _core.DeviceBuffer(8 << 20, "float32", 0)
comm.Allreduce(MPI.IN_PLACE, buf, algorithm="ring")  # links up, all well
MPI.COMM_WORLD.Barrier()
if r == n - 1:
    os._exit(3)  # dies before the next collective
t0 = time.monotonic()
try:
    comm.Allreduce(MPI.IN_PLACE, buf, algorithm="ring")
    emit("result", ok=True)
except MPI.Exception as exc:
    emit("result", ok=False, error=str(exc), seconds=time.monotonic() - t0)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["ipc", "staged-tcp"])
def test_dead_peer_fails_a_device_collective_naming_it(path):
    env = {"COLLECTIVES_CUDA_FAKE": "1"}
    if path == "staged-tcp":
        env["COLLECTIVES_TRANSPORT"] = "tcp"
    res = run_world(3, DEATH_BODY, timeout=100, env=env, collective_timeout=30)
    survivors = [rr.one("result") for rr in res.ranks[:2]]
    assert res.ranks[2].returncode == 3
    for got in survivors:
        assert not got["ok"]
        assert "rank 2" in got["error"], got
        assert got["seconds"] < 25, got
