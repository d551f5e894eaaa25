"""collectives.MPI.Request: mpi4py's non-blocking request and its completion calls.

Kept apart from MPI/__init__.py for size; ``collectives.MPI.Request`` is this class.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from .. import _core
from ..rendezvous.safe_pickle import loads as _peer_loads
from . import _missing
from .._core import CollectivesError, Request as _CoreRequest

from ._types import ANY_SOURCE, ANY_TAG, PROC_NULL, UNDEFINED, Status


class _RequestType(type):
    """Request's class: mpi4py's class-level names it lacks (Request.Cancel...) raise
    NotImplementedError naming them, as instance lookups do."""

    def __getattr__(cls, name: str) -> Any:
        raise _missing.missing("collectives.MPI.Request", name, _missing.MPI4PY_REQUEST,
                               "mpi4py's MPI.Request", instance=True)


class Request(metaclass=_RequestType):
    """A non-blocking operation (mpi4py's Request subset).

    Uppercase Wait/Test finish it; lowercase wait/test also return the
    object a pickled irecv brought (None for other requests). As in mpi4py,
    a request whose completion a call has reported is inactive (it is then
    MPI_REQUEST_NULL there): ``bool(req)`` is False, waiting on or testing it
    returns at once with an empty status and no object, and the *any/*some
    calls skip it.
    """

    def __init__(self, core_request: Any = None, comm: Any = None, pickled: bool = False) -> None:
        # Request() is a null request (inactive, equal to REQUEST_NULL); Request(req) a
        # second handle to req (mpi4py's constructors).
        if isinstance(core_request, Request):  # (its _then stays with the original)
            core_request, comm, pickled = core_request._req, core_request._comm, \
                core_request._pickled
        elif core_request is not None and not isinstance(core_request, _CoreRequest):
            raise TypeError(f"Request() takes a request, not {type(core_request).__name__}")
        self._req = core_request
        self._comm = comm
        self._pickled = pickled
        self._active = core_request is not None
        self._then: Optional[Any] = None  # run once on success (Iscan's local fold)
        self._partner: Optional["Request"] = None  # Isendrecv's send, finished with it

    def __bool__(self) -> bool:
        return self._active

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return (not self._active and not other._active) or \
            (self._active and other._active and self._req is other._req)

    def __hash__(self) -> int:
        return id(self._req) if self._active else 0

    def __getattr__(self, name: str) -> Any:
        raise _missing.missing("collectives.MPI.Request", name, _missing.MPI4PY_REQUEST,
                               "mpi4py's MPI.Request", instance=True)

    def _outcome(self, status: Optional[Status]) -> Any:
        """Mark the request inactive and return what it brought (filling status)."""
        if not self._active:  # MPI_REQUEST_NULL: an empty status, no object
            if status is not None:
                Request._empty(status)
            return None
        self._active = False
        outcome = self._req._status
        if status is not None:
            status._fill(outcome)
        if self._pickled and outcome is not None:
            # an empty message (a PROC_NULL receive, or Send of no buffer) is None, as in mpi4py
            return None if outcome[0] == PROC_NULL or not outcome[3] else _peer_loads(outcome[3])
        return None

    def _finish(self, status: Optional[Status]) -> Any:
        """Complete it (raising MPI.Exception if it failed) and report it."""
        partner, self._partner = self._partner, None
        if partner is not None and self._active:
            try:
                partner._finish(None)
            except CollectivesError:
                self._active = False
                raise
        if self._active:
            try:
                self._comm._call(self._req.Wait)
            except CollectivesError:
                self._active = False
                raise
            then, self._then = self._then, None
            if then is not None:
                then()
        return self._outcome(status)

    def _done(self) -> bool:
        """Whether it has completed, without reporting it (raising if it failed)."""
        if not self._active:
            return True
        if self._partner is not None and not self._partner._done():
            return False
        try:
            return self._comm._call(self._req.Test)
        except CollectivesError:
            self._active = False
            raise

    def Wait(self, status: Optional[Status] = None) -> bool:
        """Block until done (raising MPI.Exception if it failed); fills status."""
        self._finish(status)
        return True

    def Test(self, status: Optional[Status] = None) -> bool:
        """True once done (raising if it failed); fills status then."""
        if not self._done():
            return False
        self._finish(status)
        return True

    def Get_status(self, status: Optional[Status] = None) -> bool:
        """Whether it has completed, filling status then, without making it inactive."""
        if not self._done():
            return False
        if status is not None:
            if self._active:
                status._fill(self._req._status)
            else:
                self._outcome(status)
        return True

    def wait(self, status: Optional[Status] = None) -> Any:
        """Wait(); returns the object a pickled irecv received (else None)."""
        return self._finish(status)

    def test(self, status: Optional[Status] = None) -> tuple:
        """(done, object): the object a pickled irecv received once done, else None."""
        if not self._done():
            return False, None
        return True, self._finish(status)

    def get_status(self, status: Optional[Status] = None) -> bool:
        """Same as Get_status (mpi4py's lowercase name)."""
        return self.Get_status(status)

    @staticmethod
    def Waitall(requests: Sequence["Request"], statuses: Optional[list] = None) -> bool:
        """Wait for every request; the first failure is raised after all have finished."""
        Request.waitall(requests, statuses)
        return True

    @staticmethod
    def waitall(requests: Sequence["Request"], statuses: Optional[list] = None) -> list:
        """Wait for every request; returns each one's object (see wait). A statuses list
        shorter than requests is extended with new Status objects (as mpi4py does)."""
        if isinstance(statuses, list):
            statuses.extend(Status() for _ in range(len(requests) - len(statuses)))
        objs, first = [], None
        for i, r in enumerate(requests):
            st = statuses[i] if statuses is not None and i < len(statuses) else None
            try:
                objs.append(r.wait(st))
            except CollectivesError as exc:
                first = first or exc
                objs.append(None)
        if first is not None:
            raise first
        return objs

    @staticmethod
    def Waitany(requests: Sequence["Request"], status: Optional[Status] = None) -> int:
        """Block until one active request completes; its index (UNDEFINED if none is active)."""
        return Request.waitany(requests, status)[0]

    @staticmethod
    def waitany(requests: Sequence["Request"], status: Optional[Status] = None) -> tuple:
        """(index, object) of the first active request to complete (UNDEFINED, None if
        none is active)."""
        reqs = list(requests)
        i = Request._wait_one(reqs)
        if i == UNDEFINED:
            if status is not None:
                Request._empty(status)
            return UNDEFINED, None
        return i, reqs[i].wait(status)

    @staticmethod
    def _wait_one(reqs: list) -> int:
        """The index of an active request that has completed, blocking until one has,
        without reporting it (UNDEFINED if none is active)."""
        live = [i for i, r in enumerate(reqs) if r._active]
        if not live:
            return UNDEFINED
        for i in live:  # one a Test already saw complete, not yet reported
            if not reqs[i]._req.active:
                return i
        j = reqs[live[0]]._comm._call(_core.request_wait_any, [reqs[i]._req for i in live])
        return live[j] if j >= 0 else UNDEFINED

    @staticmethod
    def Testall(requests: Sequence["Request"], statuses: Optional[list] = None) -> bool:
        """True if every request has completed (then finished, statuses filled); else
        False, and none is finished by this call beyond what completed meanwhile."""
        return Request.testall(requests, statuses)[0]

    @staticmethod
    def testall(requests: Sequence["Request"], statuses: Optional[list] = None) -> tuple:
        """(True, objects) once every request has completed, else (False, None)."""
        if not all([r._done() for r in requests]):
            return False, None
        return True, Request.waitall(requests, statuses)

    @staticmethod
    def Testany(requests: Sequence["Request"], status: Optional[Status] = None) -> tuple:
        """(index, True) of a completed active request; (UNDEFINED, False) if none has
        completed; (UNDEFINED, True) if none is active."""
        index, flag, _ = Request.testany(requests, status)
        return index, flag

    @staticmethod
    def testany(requests: Sequence["Request"], status: Optional[Status] = None) -> tuple:
        """(index, flag, object): as Testany, with the object a pickled irecv brought."""
        live = [i for i, r in enumerate(requests) if r._active]
        if not live:
            if status is not None:
                Request._empty(status)
            return UNDEFINED, True, None
        for i in live:
            if requests[i]._done():
                return i, True, requests[i].wait(status)
        return UNDEFINED, False, None

    @staticmethod
    def Waitsome(requests: Sequence["Request"], statuses: Optional[list] = None) -> Optional[list]:
        """Block until at least one active request completes; the indices of all that
        have completed (None if none is active)."""
        return Request.waitsome(requests, statuses)[0]

    @staticmethod
    def waitsome(requests: Sequence["Request"], statuses: Optional[list] = None) -> tuple:
        """(indices, objects) as Waitsome, or (None, None) if none is active."""
        reqs = list(requests)
        first = Request._wait_one(reqs)
        if first == UNDEFINED:
            return None, None
        return Request._some(reqs, statuses, [first])

    @staticmethod
    def Testsome(requests: Sequence["Request"], statuses: Optional[list] = None) -> Optional[list]:
        """The indices of the active requests that have completed (finishing them); an
        empty list if none has, None if none is active."""
        return Request.testsome(requests, statuses)[0]

    @staticmethod
    def testsome(requests: Sequence["Request"], statuses: Optional[list] = None) -> tuple:
        """(indices, objects) as Testsome, or (None, None) if none is active."""
        if not any(r._active for r in requests):
            return None, None
        return Request._some(list(requests), statuses, [])

    @staticmethod
    def _some(reqs: list, statuses: Optional[list], known: list) -> tuple:
        done = sorted(set(known) | {i for i, r in enumerate(reqs) if r._active and r._done()})
        if isinstance(statuses, list):  # one Status per completed request, as mpi4py extends it
            statuses.extend(Status() for _ in range(len(done) - len(statuses)))
        objs = []
        for k, i in enumerate(done):
            st = statuses[k] if statuses is not None and k < len(statuses) else None
            objs.append(reqs[i].wait(st))
        return done, objs

    @staticmethod
    def _empty(status: Status) -> None:
        status.source, status.tag, status.error, status._nbytes = ANY_SOURCE, ANY_TAG, 0, 0
