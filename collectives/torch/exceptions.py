"""Horovod's exception classes (``horovod.common.exceptions``), for ``except`` clauses.

``HorovodInternalError`` is what a failed collective raises in
``collectives.torch`` (a peer died, sent garbage, or the call timed out): the
core's ``CollectivesError`` is re-raised as it, so a script written for
Horovod (``except hvd.HorovodInternalError``, or ``except RuntimeError``) and
one written for collectives (``except collectives.MPI.Exception``) both catch
it. ``HostsUpdatedInterrupt`` is raised by ``state.commit()`` under
``collectives-run --elastic`` when workers joined or hosts went away
(``collectives.torch.elastic``).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from .._core import CollectivesError

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "internal_error"]


class HorovodInternalError(CollectivesError):
    """A collective failed (a peer died or disagreed, or the call timed out).

    A RuntimeError as in Horovod, and a ``collectives.MPI.Exception``
    (``CollectivesError``) whose ``error_code`` is the core's.

    Args:
        message: the text (or the exception it wraps).
        error_code: the core's result code; 0 where there is none.
    """

    def __init__(self, message: Any = "", error_code: int = 0) -> None:
        super().__init__(error_code, str(message))


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod elastic: the set of hosts changed (raised by ``state.commit()``).

    Args:
        skip_sync: as Horovod, whether the state need not be synchronized again.
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the set of hosts changed")
        self.skip_sync = skip_sync


def internal_error(exc: BaseException, members: Optional[Sequence[int]] = None) -> BaseException:
    """`exc` as a HorovodInternalError if it is a core CollectivesError, else `exc`.

    The text is explained as the world's failures are (rendezvous.world.explain_failure:
    this rank's report goes to the store and the cause other ranks reported comes first),
    since Horovod's own links (rendezvous.links) break where the world's would: a rank
    that sees only "rank 1 closed the connection" learns that rank 3 died. members: the
    world ranks of the op's process set (None: every rank)."""
    if isinstance(exc, CollectivesError) and not isinstance(exc, HorovodInternalError):
        from ..rendezvous import world as _world
        text = str(exc)
        state = _world._state
        if state is not None and state.core is not None:
            try:
                text = _world.explain_failure(state.core.rank, text, members)
            except Exception:  # noqa: BLE001 -- best effort: the core's own words stand
                pass
        err = HorovodInternalError(text, exc.error_code)
        err.__cause__ = exc
        return err
    return exc


class LayoutMismatch(RuntimeError, ValueError):
    """Ranks passed different arguments (shape, dtype, root, op, name) to the same call,
    or another rank's call failed before any data moved: every rank raises it, and the
    communicator stays usable."""
