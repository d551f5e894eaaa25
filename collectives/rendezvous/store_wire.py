"""The store's wire protocol (store.py's docstring describes it): constants, frame
parsing and message tags, shared by the server and the client in store.py."""
from __future__ import annotations

import math
import struct
from typing import Optional

from . import auth as _auth

_MAGIC = b"CS"
_VERSION = 3
_NONCE = 16
_MAC = 32
_KNOCK = struct.Struct(">2sB16s")               # magic, version, nonce_c (client first)
_SERVER_HELLO = struct.Struct(">2sB16s")        # magic, version, nonce_s
_PROOF = struct.Struct(">32s")                  # the client's mac
_ANSWER = struct.Struct(">B32s")                # 0 ok / 1 refused, mac
_REQ_HEAD = struct.Struct(">2sBII")             # magic, op, nfields, body length
_RESP_HEAD = struct.Struct(">2sBI")             # magic, status, payload length
_FIELD_LEN = struct.Struct(">I")
_SEQ = struct.Struct(">Q")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")

MAX_FRAME = 16 << 20          # bytes of one request body or reply payload
_MAX_FIELDS = 1 << 16
MAX_WAIT_S = 7 * 24 * 3600.0  # longest wait a GET (or a client timeout) may ask for
_OP_SET, _OP_GET, _OP_ADD, _OP_CHECK, _OP_DELETE = 1, 2, 3, 4, 5
_OK, _TIMEOUT = 0, 1
_CONNECT_RETRY_S = 0.05
AUTH_WAIT_S = 5.0  # for a connection to complete its handshake (both sides)
# One connect attempt waits this long for the SYN's answer, then a fresh socket
# sends a fresh SYN. A listener whose accept queue a flood keeps full drops SYNs,
# and the kernel's own retransmissions back off (1, 2, 4, 8 s): one dropped SYN
# would cost the whole backoff. 1 s is the kernel's initial retransmission
# timeout (RFC 6298), longer than any round trip of a working network.
CONNECT_ATTEMPT_S = 1.0
# The client gives the server this long beyond a get's deadline to answer
# TIMEOUT itself before deciding the server is gone.
_GET_SLACK_S = 5.0



class _Malformed(Exception):
    """A client sent bytes that are not a request: drop its connection."""


def clamp_wait(seconds: float, what: str = "timeout") -> float:
    """seconds as a wait the store can serve: 0 <= t <= MAX_WAIT_S (inf included).

    Raises:
        ValueError: seconds is NaN or not a number.
    """
    try:
        t = float(seconds)
    except (TypeError, ValueError):
        raise ValueError(f"{what}={seconds!r} is not a number of seconds") from None
    if math.isnan(t):
        raise ValueError(f"{what} is NaN")
    return min(max(t, 0.0), MAX_WAIT_S)


def split_frame(buf: bytes | bytearray | memoryview,
                limit: int = MAX_FRAME) -> Optional[tuple[int, int, int]]:
    """(op, nfields, frame length) of the request at the start of buf, None if incomplete.

    Checks only the fixed head: magic, field count and a body length bounded
    by ``limit`` (so nothing is buffered for a frame that can never be valid).

    Raises:
        _Malformed: the head is not a request's.
    """
    if len(buf) >= 2 and bytes(buf[:2]) != _MAGIC:
        raise _Malformed("bad magic")
    if len(buf) < _REQ_HEAD.size:
        return None
    _, op, nfields, body_len = _REQ_HEAD.unpack_from(buf, 0)
    if nfields > _MAX_FIELDS or body_len > limit or nfields * _FIELD_LEN.size > body_len:
        raise _Malformed(f"bad head: {nfields} fields in {body_len} bytes")
    return op, nfields, _REQ_HEAD.size + body_len + _MAC


def parse_fields(body: bytes | bytearray | memoryview, nfields: int) -> list[bytes]:
    """The nfields length-prefixed fields that exactly fill body (one pass).

    Raises:
        _Malformed: the lengths do not add up to the body.
    """
    view = memoryview(body)
    fields, pos, end = [], 0, len(view)
    for _ in range(nfields):
        if pos + 4 > end:
            raise _Malformed("field lengths overrun the body")
        (length,) = _FIELD_LEN.unpack_from(view, pos)
        pos += 4
        if length > end - pos:
            raise _Malformed("field lengths overrun the body")
        fields.append(bytes(view[pos:pos + length]))
        pos += length
    if pos != end:
        raise _Malformed("bytes left after the last field")
    return fields


def _request_tag(session: bytes, seq: int, head_and_body) -> bytes:
    return _auth.mac(session, b"C", _SEQ.pack(seq), head_and_body)


def _response_tag(session: bytes, seq: int, head_and_payload) -> bytes:
    return _auth.mac(session, b"S", _SEQ.pack(seq), head_and_payload)


class _Closed(Exception):
    """The server side went away or answered nonsense (client side)."""


class _Refused(ConnectionError):
    """The store is not this job's: retrying cannot help (client side)."""
