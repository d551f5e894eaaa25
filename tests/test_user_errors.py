"""Errors a new user meets in the first hour say what to do, in the user's terms.

Buffer arguments: a Python list, a strided view and an unsupported element type
are named as such (numpy/torch words, never struct-module codes like 'Zf'),
with what is expected. Start-up: a rank that never arrives is named, with what
to check, in one exception.
"""
from __future__ import annotations

import array

import numpy as np
import pytest

from collectives import MPI
from collectives._core import Communicator

SUPPORTED = "int8, uint8, int32, int64, float16, bfloat16, float32, float64"


@pytest.fixture(scope="module")
def comm():
    """A one-rank MPI.Comm over its own core (no rendezvous, no socket)."""
    core = Communicator(0, 1)
    c = MPI.Comm._from_core(core, 0, 1)
    yield c
    core.close()


def _message(fn, *args, exc=Exception) -> str:
    with pytest.raises(exc) as info:
        fn(*args)
    return str(info.value)


@pytest.mark.parametrize("send,recv,name", [
    ([1.0, 2.0], [0.0, 0.0], "recvbuf"),          # a list of numbers, not a [buf, type] spec
    (np.ones(2), [0.0, 0.0], "recvbuf"),
    ((1, 2), np.zeros(2, np.int64), "sendbuf"),
    (3.0, np.zeros(1), "sendbuf"),
    (MPI.IN_PLACE, None, "recvbuf"),
])
def test_not_a_buffer_says_what_is_expected(comm, send, recv, name) -> None:
    text = _message(comm.Allreduce, send, recv, exc=TypeError)
    assert text.startswith(f"{name} must be a numpy array, a torch tensor, or any object with "
                           "the buffer protocol, __dlpack__ or __cuda_array_interface__"), text
    assert "(float)" not in text and "does not expose" not in text
    if isinstance(recv if name == "recvbuf" else send, (list, tuple, float)):
        assert "numpy.asarray" in text


def test_list_in_bcast_is_not_taken_for_a_spec(comm) -> None:
    text = _message(comm.Bcast, [1.0, 2.0], exc=TypeError)
    assert text.startswith("buf must be a numpy array"), text


@pytest.mark.parametrize("make", ["numpy-T", "numpy-step", "torch-t"])
def test_strided_view_suggests_contiguous(comm, make) -> None:
    if make == "numpy-T":
        recv = np.zeros((4, 4)).T
    elif make == "numpy-step":
        recv = np.zeros(8, np.float32)[::2]
    else:
        torch = pytest.importorskip("torch")
        recv = torch.zeros(4, 4).t()
    text = _message(comm.Allreduce, MPI.IN_PLACE, recv, exc=ValueError)
    assert text.startswith("recvbuf is not contiguous in memory"), text
    assert ".contiguous()" in text and "numpy.ascontiguousarray" in text
    assert "ndarray is not C-contiguous" != text


@pytest.mark.parametrize("make,name", [
    (lambda: np.zeros(2, np.complex64), "complex64"),
    (lambda: np.zeros(2, np.int16), "int16"),
    (lambda: np.zeros(2, np.bool_), "bool"),
    (lambda: np.zeros(2, np.uint32), "uint32"),
    (lambda: array.array("h", [1, 2]), "int16"),
    (lambda: memoryview(np.zeros(2, np.complex128)), "complex128"),
])
def test_unsupported_dtype_is_named(comm, make, name) -> None:
    text = _message(comm.Allreduce, MPI.IN_PLACE, make(), exc=TypeError)
    assert text == (f"recvbuf has element type {name}, which collectives does not support; "
                    f"supported: {SUPPORTED}"), text


@pytest.mark.parametrize("name", ["complex64", "int16", "bool"])
def test_unsupported_torch_dtype_is_named(comm, name) -> None:
    torch = pytest.importorskip("torch")
    text = _message(comm.Allreduce, MPI.IN_PLACE, torch.zeros(2, dtype=getattr(torch, name)),
                    exc=TypeError)
    assert f"element type {name}," in text and SUPPORTED in text, text
    assert "'Zf'" not in text and "'h'" not in text


# ---- start-up: a rank that never arrives ------------------------------------

_START_BODY = """
import collectives
try:
    collectives.init()
except TimeoutError as exc:
    emit("err", message=str(exc),
         chained=exc.__cause__ is not None or not exc.__suppress_context__)
else:
    fail("init", "no TimeoutError")
"""


@pytest.mark.timeout(40)
def test_start_timeout_names_the_missing_rank(world) -> None:
    """Two ranks of a job of three start; both name rank 2 and what to check."""
    from conftest import free_port

    port = free_port()

    def rank_env(rank: int, n: int) -> dict:
        return {"COLLECTIVES_RANK": rank, "COLLECTIVES_SIZE": 3,
                "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{port}", "COLLECTIVES_TIMEOUT": "2"}

    res = world(2, _START_BODY, rank_env=rank_env, collective_timeout=None, timeout=30)
    assert not res.timed_out, res.report()
    for r in range(2):
        rec = res[r].one("err")
        text = rec["message"]
        assert text.startswith(f"start-up timed out after 2 s: rank 2 of 3 did not arrive at "
                               f"the store at 127.0.0.1:{port} (from COLLECTIVES_STORE_ADDR)"),\
            (r, text)
        for hint in ("same command", "reachable", "COLLECTIVES_START_TIMEOUT",
                     "COLLECTIVES_TIMEOUT"):
            assert hint in text, text
        assert not rec["chained"], "the store's own TimeoutError is chained under it"


@pytest.mark.timeout(40)
def test_start_timeout_without_rank0_says_the_store_was_not_reached(world) -> None:
    from conftest import free_port

    port = free_port()

    def rank_env(rank: int, n: int) -> dict:
        return {"COLLECTIVES_RANK": 1, "COLLECTIVES_SIZE": 2,
                "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{port}", "COLLECTIVES_TIMEOUT": "1"}

    res = world(1, _START_BODY, rank_env=rank_env, collective_timeout=None, timeout=30)
    assert not res.timed_out, res.report()
    rec = res[0].one("err")
    assert rec["message"].startswith(f"rank 1 of 2 could not reach the store at 127.0.0.1:{port} "
                                     f"(from COLLECTIVES_STORE_ADDR) (rank 0 hosts it) within 1 s"), \
        rec["message"]
    assert "is rank 0 running?" in rec["message"], rec["message"]
    assert not rec["chained"]


# ---- the same words for GPU buffers (one GPU emulated in host memory) -------

_GPU_BODY = """
from collectives import _core
d = _core.DeviceBuffer(64, "float32", 0)
cai = d.__cuda_array_interface__

class Gpu:
    def __init__(self, **kw):
        self.__cuda_array_interface__ = dict(cai, version=3, **kw)

comm = _core.Communicator(0, 1)
for obj in (Gpu(shape=(4,), strides=(8,)), Gpu(shape=(4,), typestr="<c8"),
            Gpu(shape=(8,), typestr="<i2")):
    try:
        comm.allreduce(None, obj)
        print("no error")
    except (TypeError, ValueError) as exc:
        print(type(exc).__name__, exc)
comm.close()
"""


@pytest.mark.timeout(60)
def test_gpu_buffers_get_the_same_messages() -> None:
    import subprocess
    import sys

    from collectives import _core
    from conftest import base_env

    if not _core.cuda_built():
        pytest.skip("this build has no CUDA support (no nvcc when it was built)")
    res = subprocess.run([sys.executable, "-c", _GPU_BODY], capture_output=True, text=True,
                         env=base_env({"COLLECTIVES_CUDA_FAKE": "1"}), timeout=50)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("ValueError recvbuf is not contiguous in memory"), lines
    assert ".contiguous()" in lines[0]
    for line, name in zip(lines[1:], ("complex64", "int16")):
        assert line == (f"DatatypeError recvbuf has element type {name}, which collectives "
                        f"does not support; supported: {SUPPORTED}"), line  # a TypeError
