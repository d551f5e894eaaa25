"""collectives: collective communication for data-parallel training.

Ring, tree and butterfly allreduce, allgather and broadcast over TCP, behind
an mpi4py-like communicator (``from collectives import MPI``). Importing this
package opens no socket and prints nothing; the world communicator is created
on first use (``MPI.COMM_WORLD``) or by ``init()``.
"""
from __future__ import annotations


def _defer_to_installed() -> bool:
    """In a checkout whose native core is not built, become the installed package.

    ``python -m pytest`` or ``python -m collectives.config`` run from a clone's root
    put the clone first on sys.path, so its ``collectives/`` (source only, no
    ``_core``) would shadow the package ``pip install .`` built. When this
    directory has no ``_core`` extension and a later directory on sys.path holds
    a ``collectives`` that has one, that package's directory becomes this
    package's ``__path__`` (and ``__file__``): every submodule (``collectives.config``,
    ``collectives.run``, ``collectives._core``) is then the installed one. A
    checkout built in place (or installed editable) is used as it is.
    """
    import importlib.machinery
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))

    def has_core(directory: str) -> bool:
        return any(os.path.isfile(os.path.join(directory, "_core" + suffix))
                   for suffix in importlib.machinery.EXTENSION_SUFFIXES)

    if has_core(here):
        return False
    for entry in sys.path:
        candidate = os.path.join(os.path.abspath(entry or os.curdir), "collectives")
        init = os.path.join(candidate, "__init__.py")
        try:
            if os.path.samefile(candidate, here) or not (os.path.isfile(init) and has_core(candidate)):
                continue
        except OSError:  # no such directory
            continue
        __path__[:] = [candidate]  # noqa: F821 (this package's search path)
        spec = globals().get("__spec__")
        if spec is not None:
            spec.submodule_search_locations = __path__  # noqa: F821
            spec.origin = init
        globals()["__file__"] = init
        return True
    return False


_defer_to_installed()

__version__ = "0.1.0"
__all__ = ["init", "finalize", "is_initialized", "shrink", "grow", "join", "cuda_available",
           "cuda_built", "__version__"]


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
    from .rendezvous import world as _world

    _world.finalize()


def shrink(timeout: float | None = None):
    """Collective over the survivors: after a rank failed, a new world of the ranks alive.

    Every surviving rank calls it (typically after a collective raised naming the dead
    rank). They agree through the job's store on who is alive (a rank that died, before
    or during the agreement, is left out; the agreement is bounded by the timeout), and
    get a new world communicator of those ranks, renumbered 0..n-1 in their old order,
    with fresh links and the next communicator generation (a message from an earlier
    generation is refused). It becomes the world: ``MPI.COMM_WORLD`` and ``init()``
    return it; the broken one is closed. Works on a world that is not broken, too.

    Args:
        timeout: seconds for the agreement, and again for the new world to form
            (default COLLECTIVES_TIMEOUT); a rank that neither answers nor is seen dead
            (its listener refuses connections) is left out when the first passes.

    Returns:
        The new world ``collectives.MPI.Comm``.

    Raises:
        RuntimeError: (collectives.elastic.membership.ElasticError) the store is gone (it lives
            in rank 0 when collectives-run or a plain environment started the job, so
            the world cannot re-form once rank 0 died), this rank was left out, or the
            deadline passed; the text names the ranks.
    """
    from .elastic import reform as _reform
    from .MPI import Comm
    return _reform.shrink(timeout, Comm._from_core)


def grow(min_new: int = 0, timeout: float | None = None):
    """Collective at a step boundary: a new world with the processes waiting in join().

    Every rank of the world calls it; the processes that called ``collectives.join()``
    by then (at least ``min_new`` of them: it waits up to the timeout for them) are
    admitted after the current ranks (which keep their numbers). The new world has
    fresh links and the next generation, and becomes the world as for shrink().

    Args:
        min_new: joiners to wait for (0: admit those waiting, maybe none).
        timeout: seconds (default COLLECTIVES_TIMEOUT).

    Returns:
        The new world ``collectives.MPI.Comm``.
    """
    from .elastic import reform as _reform
    from .MPI import Comm
    return _reform.grow(min_new, timeout, Comm._from_core)


def join(timeout: float | None = None):
    """Join a running job as a new process: wait until its ranks call grow(), then return
    the new world communicator (this process has the last ranks).

    The process finds the job's store as its ranks do (COLLECTIVES_STORE_ADDR, else
    MASTER_ADDR/MASTER_PORT) and proves the same job secret (COLLECTIVES_JOB_SECRET).

    Args:
        timeout: seconds to wait for admission and for the world to form (default
            COLLECTIVES_TIMEOUT).
    """
    from .elastic import reform as _reform
    from .MPI import Comm
    return _reform.join(timeout, Comm._from_core)


def is_initialized() -> bool:
    """True between init() (or first use of MPI.COMM_WORLD) and finalize()."""
    from .rendezvous import world as _world

    return _world.is_initialized()


def cuda_built() -> bool:
    """True if the CUDA parts of the core were compiled (nvcc was found at build time)."""
    from . import _core

    return _core.cuda_built()


def cuda_available() -> bool:
    """True if GPU buffers can be used: CUDA built, a driver and a device present."""
    from . import _core

    return _core.cuda_built() and _core.cuda_device_count() > 0


def _register_torch_backend() -> None:
    """torch's ``torch.backends`` entry point (pyproject.toml): make the backend
    ``"collectives"`` known to ``torch.distributed`` at ``import torch``.

    torch calls it at the end of its own import, for every package that declares
    one, so it must be cheap and must never raise (an exception here would make
    ``import torch`` fail): it registers a creator that imports
    ``collectives.torch.distributed`` on the first ``init_process_group("collectives")``
    or ``new_group(backend="collectives")``, and nothing else. Set
    ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` to turn torch's autoloading off (then
    ``import collectives.torch`` registers the backend, as before).
    """
    try:
        import torch.distributed as dist

        if not dist.is_available() or "COLLECTIVES" in getattr(dist.Backend, "_plugins", {}):
            return

        def create(*args, **kwargs):
            from .torch.distributed.backend import _create_group

            return _create_group(*args, **kwargs)

        dist.Backend.register_backend("collectives", create, extended_api=True,
                                      devices=["cpu", "cuda"])
    except Exception:  # noqa: BLE001 (never break `import torch`)
        pass
