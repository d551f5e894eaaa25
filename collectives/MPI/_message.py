"""Matched probes (mpi4py's Comm.Mprobe/Improbe/mprobe/improbe and MPI.Message).

A matched probe takes the message out of matching at once, so that no other receive can
match it and only the Message receives it. Here Mprobe probes with the core (coll_probe:
the envelope, the sender's dtype included) and then receives that very message with a
receive of any size from its source and tag (the first message from that source with that
tag is the probed one: the probe returned the earliest that matches, and any earlier one
from the same source and tag would have matched too); the Message holds its bytes, and
Message.Recv copies them into the caller's buffer (one copy more than MPI's Mrecv).
"""
from __future__ import annotations

import pickle
from typing import Any, Optional

import numpy as np

from .. import _core
from .._core import ANY_SOURCE, ANY_TAG
from ._request import Request
from ._types import ERR_REQUEST, ERR_TRUNCATE, ERR_TYPE, ArgumentError, Status

PROC_NULL = _core.PROC_NULL


class _Taken:
    """A finished core request's stand-in for a Request made by Message.Irecv/irecv (the
    message was already here: it completed when it started)."""

    active = False

    def __init__(self, status: tuple) -> None:
        self._status = status

    def Wait(self) -> None:
        """Nothing to wait for."""

    def Test(self) -> bool:
        """Always done."""
        return True


class Message:
    """A message a matched probe took out of matching (mpi4py's MPI.Message): receive it
    with Recv/Irecv (into a buffer) or recv/irecv (a pickled object). Message() and a
    received one are MESSAGE_NULL (false); a probe of PROC_NULL gives MESSAGE_NO_PROC."""

    def __init__(self, message: Optional["Message"] = None) -> None:
        self._comm: Any = None
        self._status: Optional[tuple] = None  # (source, tag, count, bytes, nbytes)
        self._dtype = "uint8"
        self._kind = "null"  # "null", "noproc" or "msg"
        if message is not None:
            self._comm, self._status, self._dtype, self._kind = \
                message._comm, message._status, message._dtype, message._kind

    def __bool__(self) -> bool:
        return self._kind != "null"

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self._kind == other._kind and (self._kind != "msg" or self._status is other._status)

    def __hash__(self) -> int:
        return hash(self._kind) if self._kind != "msg" else id(self._status)

    def __repr__(self) -> str:
        return f"<collectives.MPI.Message {self._kind}>"

    # -- probes ----------------------------------------------------------------------
    @classmethod
    def Probe(cls, comm: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
              status: Optional[Status] = None, *, timeout: Optional[float] = None) -> "Message":
        """Block until a message from source with tag can be received and take it out of
        matching; status gets its envelope."""
        return cls._probe(comm, source, tag, status, True, timeout)

    @classmethod
    def Iprobe(cls, comm: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Optional[Status] = None) -> Optional["Message"]:
        """As Probe, without waiting: None when no such message is here yet."""
        return cls._probe(comm, source, tag, status, False, None)

    @classmethod
    def _probe(cls, comm: Any, source: int, tag: int, status: Optional[Status], block: bool,
               timeout: Optional[float]) -> Optional["Message"]:
        from . import _msg
        _msg(None)  # point-to-point is in use (finalization drains it)
        env = comm._call(_core.p2p_probe, comm._core, source, tag, block, timeout)
        if env is None:
            return None
        msg = cls()
        msg._comm = comm
        if env[0] == PROC_NULL:
            msg._kind = "noproc"
            msg._status = (PROC_NULL, ANY_TAG, 0, b"", 0)
        else:
            req = comm._call(_core.p2p_irecv, comm._core, None, env[0], env[1], timeout, env[4])
            comm._call(req.Wait)
            msg._kind = "msg"
            msg._status = req._status
            msg._dtype = env[4]
        if status is not None:
            status._fill(msg._status)
        return msg

    # -- receives ----------------------------------------------------------------------
    def _take(self) -> tuple:
        if self._kind == "null":
            raise ArgumentError(1, "Message: MESSAGE_NULL has no message to receive", ERR_REQUEST)
        got, self._kind, self._status = self._status, "null", None
        return got

    def Recv(self, buf: Any, status: Optional[Status] = None) -> None:
        """Receive the message into buf (a buffer or message spec); status gets its
        envelope. The Message is MESSAGE_NULL afterwards."""
        from . import _msg
        b, dtype = _msg(buf)
        if self._kind == "msg":  # check before taking: a refused buffer keeps the message
            want = np.dtype("uint16" if self._dtype == "bfloat16" else self._dtype)
            if b is None:
                out = np.empty(0, want)
            else:
                out = _core.host_array(b, "buf", True, dtype)
            if self._status[2] and dtype is None and out.dtype != want or \
                    dtype is not None and dtype != self._dtype and self._status[2]:
                raise ArgumentError(1, f"Message.Recv: the message holds {self._dtype} "
                                       f"elements, the buffer takes {dtype or out.dtype}",
                                    ERR_TYPE)
            if self._status[4] > out.nbytes:
                raise ArgumentError(1, f"Message.Recv: the message holds {self._status[2]} "
                                       f"elements, the buffer {out.size}", ERR_TRUNCATE)
            data = self._status[3] or b""
            out.view(np.uint8)[:len(data)] = np.frombuffer(data, np.uint8)
        got = self._take()
        if status is not None:
            status._fill(got)

    def Irecv(self, buf: Any) -> Request:
        """Start receiving the message into buf; the message is here, so the Request is
        complete at once (its status is the message's)."""
        got = self._status
        self.Recv(buf)
        return _done(self._comm, got, False)

    def recv(self, status: Optional[Status] = None) -> Any:
        """Receive the message as a pickled object (sent with send/isend) and return it."""
        got = self._take()
        if status is not None:
            status._fill(got)
        return None if got[0] == PROC_NULL or not got[3] else _core_loads(got[3])

    def irecv(self) -> Request:
        """Start receiving a pickled object; the Request's wait() returns it."""
        got = self._take()
        return _done(self._comm, got, True)


def _core_loads(data: bytes) -> Any:
    from ._request import _peer_loads
    return _peer_loads(data)


def _done(comm: Any, status: tuple, pickled: bool) -> Request:
    req = Request()
    req._req, req._comm, req._pickled, req._active = _Taken(status), comm, pickled, True
    return req


MESSAGE_NULL = Message()
MESSAGE_NO_PROC = Message()
MESSAGE_NO_PROC._kind = "noproc"
MESSAGE_NO_PROC._status = (PROC_NULL, ANY_TAG, 0, b"", 0)
