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
