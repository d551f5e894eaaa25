"""collectives: collective communication for data-parallel training.

Ring, tree and butterfly allreduce, allgather and broadcast over TCP, behind
an mpi4py-like communicator (``from collectives import MPI``). Importing this
package opens no socket and prints nothing; the world communicator is created
on first use (``MPI.COMM_WORLD``) or by ``init()``.
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["init", "finalize", "is_initialized", "cuda_available", "cuda_built", "__version__"]


def init(timeout: float | None = None):
    """Join the world (rendezvous through the store) and return the world communicator.

    Args:
        timeout: seconds to wait for the other ranks at start-up (default
            COLLECTIVES_TIMEOUT).

    Returns:
        The world ``collectives.MPI.Comm``; calling init again returns the same one.
    """
    from .MPI import _init_world

    return _init_world(timeout)


def finalize() -> None:
    """Close the world communicator: every socket and thread of the library ends."""
    from . import _world

    _world.finalize()


def is_initialized() -> bool:
    """True between init() (or first use of MPI.COMM_WORLD) and finalize()."""
    from . import _world

    return _world.is_initialized()


def cuda_built() -> bool:
    """True if the CUDA parts of the core were compiled (nvcc was found at build time)."""
    from . import _core

    return _core.cuda_built()


def cuda_available() -> bool:
    """True if GPU buffers can be used: CUDA built, a driver and a device present."""
    from . import _core

    return _core.cuda_built() and _core.cuda_device_count() > 0
