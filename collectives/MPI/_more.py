"""More of mpi4py's Comm: synchronous-mode sends, probes, Isendrecv, groups, and the
non-blocking all-to-all and reduce-scatter. Ssend/Issend and Probe/Iprobe are the core's
(coll_ssend, coll_probe: the receiver acks a synchronous message when a receive matches
it; a probe reads the envelope of a message that arrived and is kept, without receiving
it); the rest is composed of the communicator's own calls. ``collectives.MPI.Comm``
inherits them from CommMore.
"""
from __future__ import annotations

import pickle
from typing import Any, Optional, Sequence

import numpy as np

from .. import _core
from .._core import ANY_SOURCE, ANY_TAG, count_of
from . import _group
from ._request import Request
from ._specs import _dtype_name, _pair, _vbuf
from ._types import IN_PLACE, Datatype, Status


def _msg(spec: Any) -> tuple:
    from . import _msg as msg  # marks point-to-point as used (finalization drains it)
    return msg(spec)


class CommMore:
    """Mixin of collectives.MPI.Comm (see the module docstring)."""

    # -- synchronous mode ------------------------------------------------------
    def Ssend(self, buf: Any, dest: int, tag: int = 0, *, timeout: Optional[float] = None) -> None:
        """Send buf to rank dest in synchronous mode: returns once a receive on dest has
        matched the message (never on the link's buffering alone)."""
        b, dtype = _msg(buf)
        self._call(_core.p2p_ssend, self._core, b, dest, tag, timeout, dtype)

    def Issend(self, buf: Any, dest: int, tag: int = 0, *,
               timeout: Optional[float] = None) -> Request:
        """Start an Ssend; its Request completes once a receive on dest matched it."""
        b, dtype = _msg(buf)
        return Request(self._call(_core.p2p_issend, self._core, b, dest, tag, timeout, dtype),
                       self)

    def ssend(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Send a Python object (pickled) in synchronous mode (see Ssend)."""
        self.Ssend(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), dest, tag)

    def issend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        """Start sending a Python object in synchronous mode; returns a Request."""
        return self.Issend(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), dest, tag)

    # -- probes ------------------------------------------------------------------
    def _probe(self, source: int, tag: int, status: Optional[Status], block: bool,
               timeout: Optional[float]) -> bool:
        _msg(None)
        env = self._call(_core.p2p_probe, self._core, source, tag, block, timeout)
        if env is None:
            return False
        if status is not None:
            status._fill((env[0], env[1], env[2], None, env[3]))
        return True

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
              status: Optional[Status] = None, *, timeout: Optional[float] = None) -> bool:
        """Block until a message from source with tag (ANY_SOURCE/ANY_TAG match any) can be
        received, without receiving it; status gets its source, tag and size. Returns True."""
        return self._probe(source, tag, status, True, timeout)

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Optional[Status] = None) -> bool:
        """Whether a message from source with tag can be received now (status filled if so)."""
        return self._probe(source, tag, status, False, None)

    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
              status: Optional[Status] = None) -> bool:
        """Same as Probe (mpi4py's lowercase name: the size is of the pickle)."""
        return self.Probe(source, tag, status)

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Optional[Status] = None) -> bool:
        """Same as Iprobe (mpi4py's lowercase name)."""
        return self.Iprobe(source, tag, status)

    # -- matched probes (_message.py) ------------------------------------------------
    def Mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Optional[Status] = None, *, timeout: Optional[float] = None) -> Any:
        """Block until a message from source with tag is here and take it out of matching;
        returns the Message that alone receives it (MESSAGE_NO_PROC for PROC_NULL)."""
        from ._message import Message
        return Message.Probe(self, source, tag, status, timeout=timeout)

    def Improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
                status: Optional[Status] = None) -> Any:
        """As Mprobe, without waiting: None when no such message is here yet."""
        from ._message import Message
        return Message.Iprobe(self, source, tag, status)

    def mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Optional[Status] = None) -> Any:
        """Same as Mprobe (mpi4py's lowercase name: receive the Message with recv)."""
        return self.Mprobe(source, tag, status)

    def improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG,
                status: Optional[Status] = None) -> Any:
        """Same as Improbe (mpi4py's lowercase name)."""
        return self.Improbe(source, tag, status)

    # -- Isendrecv -----------------------------------------------------------------
    def _check_dest(self, dest: int, tag: int) -> None:
        from . import PROC_NULL
        if dest != PROC_NULL and not 0 <= dest < self.size:
            self._call(_raise, ValueError(f"send: rank {dest} out of range for {self.size} ranks"))
        if not 0 <= tag <= _core.TAG_MAX:
            self._call(_raise, ValueError(f"send: invalid tag {tag}"))

    def Isendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                  source: int = ANY_SOURCE, recvtag: int = ANY_TAG, *,
                  timeout: Optional[float] = None) -> Request:
        """Start a Sendrecv; the Request completes when both the send and the receive
        have (its status is the receive's)."""
        self._check_dest(dest, sendtag)
        rreq = self.Irecv(recvbuf, source, recvtag, timeout=timeout)
        rreq._partner = self.Isend(sendbuf, dest, sendtag, timeout=timeout)
        return rreq

    def Isendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0,
                          source: int = ANY_SOURCE, recvtag: int = ANY_TAG, *,
                          timeout: Optional[float] = None) -> Request:
        """Start a Sendrecv_replace: a copy of buf is sent, buf receives (it stays in use
        until the Request completes)."""
        from ._extras import _array
        self._check_dest(dest, sendtag)
        if buf is None:
            buf = np.empty(0, np.uint8)  # mpi4py: no buffer is an empty message
        arr = _array(buf, "buf", True)
        typed = isinstance(buf, (list, tuple)) and isinstance(buf[-1], (Datatype, str))
        copy = arr.copy()  # first: a message already kept lands in arr as Irecv is posted
        rreq = self.Irecv([arr, buf[-1]] if typed else arr, source, recvtag, timeout=timeout)
        rreq._partner = self.Isend([copy, buf[-1]] if typed else copy, dest, sendtag,
                                   timeout=timeout)
        return rreq

    # -- groups -----------------------------------------------------------------------
    def Get_group(self) -> "_group.Group":
        """The group of this communicator's processes, in its rank order."""
        return _group.get_group(self)

    @property
    def group(self) -> "_group.Group":
        """Get_group() as a property (mpi4py)."""
        return self.Get_group()

    def Create(self, group: "_group.Group") -> Any:
        """Collective: a communicator over group's processes (ranked in group's order) on
        its members, COMM_NULL on the other ranks."""
        return _group.create(self, group)

    def Create_group(self, group: "_group.Group", tag: int = 0) -> Any:
        """A communicator over group's processes, made by group's members alone (the other
        ranks call nothing; members call it in the same order)."""
        made = self.__dict__.setdefault("_groups_made", {})
        return self._call(_group.create_group, self, group, tag, made)

    # -- non-blocking all-to-all, reduce-scatter ---------------------------------------
    def Ialltoall(self, sendbuf: Any, recvbuf: Any, *,
                  timeout: Optional[float] = None) -> Request:
        """Start an Alltoall; returns a Request (the buffers stay in use until it completes)."""
        sbuf, rbuf, dtype = _pair(sendbuf, recvbuf, self.size, self.size)
        counts = self._even_blocks(rbuf, dtype, "Ialltoall")
        if sbuf is not None and count_of(sbuf, dtype) != sum(counts):
            raise ValueError(f"Ialltoall: sendbuf has {count_of(sbuf, dtype)} elements, "
                             f"recvbuf {sum(counts)}")
        return Request(self._call(_core.ialltoallv, self._core, sbuf, rbuf, counts, counts,
                                  None, None, timeout, dtype), self)

    def Ialltoallv(self, sendbuf: Any, recvbuf: Any, *,
                   timeout: Optional[float] = None) -> Request:
        """Start an Alltoallv; returns a Request."""
        rbuf, rcounts, rdispls, rtype = _vbuf(recvbuf, self.size)
        if sendbuf is IN_PLACE:
            sbuf, scounts, sdispls, stype = None, rcounts, rdispls, None
        else:
            sbuf, scounts, sdispls, stype = _vbuf(sendbuf, self.size)
        return Request(self._call(_core.ialltoallv, self._core, sbuf, rbuf, scounts, rcounts,
                                  sdispls, rdispls, timeout, _dtype_name(stype, rtype)), self)

    def Ireduce_scatter(self, sendbuf: Any, recvbuf: Any,
                        recvcounts: Optional[Sequence[int]] = None, op: Any = None, *,
                        timeout: Optional[float] = None) -> Request:
        """Start a Reduce_scatter; returns a Request (recvbuf is written when it completes).
        recvcounts None is agreed on first (a blocking exchange of the ranks' sizes)."""
        return self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, timeout, True)


def _raise(exc: BaseException) -> None:
    raise exc

