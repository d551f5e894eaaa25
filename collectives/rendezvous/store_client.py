"""The store's client side (store.py's docstring describes the protocol): a connection to
the store that proves the job secret both ways and then signs every request, and
``barrier`` on top of it. ``collectives.rendezvous.store`` exports both."""
from __future__ import annotations

import os
import socket
import threading
import time
from typing import Iterable, Optional

from . import auth as _auth
from .env import format_addr
from .store_wire import (AUTH_WAIT_S, CONNECT_ATTEMPT_S, MAX_FRAME, _ANSWER, _CONNECT_RETRY_S,
                         _FIELD_LEN, _GET_SLACK_S, _I64, _KNOCK, _MAC, _MAGIC, _NONCE, _PROOF,
                         _OP_ADD, _OP_CHECK, _OP_DELETE, _OP_GET, _OP_SET, _REQ_HEAD, _RESP_HEAD,
                         _SERVER_HELLO, _TIMEOUT, _U64, _VERSION, _Closed, _Refused, _request_tag,
                         _response_tag, clamp_wait)

__all__ = ["StoreClient", "barrier"]


class StoreClient:
    """A connection to the store; one request at a time (calls are serialised).

    The constructor retries every ~50 ms until ``timeout`` seconds have passed,
    since rank 0 may start its server after the other ranks start connecting;
    then both sides prove they know ``secret`` (the job secret). A store that
    refuses it, or cannot prove it knows it, is an error at once: it belongs
    to another job.

    Raises (from every method):
        TimeoutError: naming the key and the store address.
        ConnectionError: the store closed the connection, is unreachable, or
            is not this job's (a different secret).
        ValueError: a timeout that is NaN or not a number.
    """

    def __init__(self, host: str, port: int, timeout: float = 300.0,
                 secret: bytes = b"") -> None:
        """Connect to the store at (host, port) and authenticate, retrying until ``timeout``."""
        self.host, self.port = host, port
        self.timeout = clamp_wait(timeout)
        self.address = format_addr(host, port)
        self._key = _auth.store_key(secret)
        self._lock = threading.Lock()
        self._session = b""
        self._rseq = self._sseq = 0
        self._sock: Optional[socket.socket] = self._connect()

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self.timeout
        last: Optional[BaseException] = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"could not connect to the store at {self.address} "
                                   f"within {self.timeout:g} s (last error: {last})")
            try:
                sock = socket.create_connection((self.host, self.port),
                                                timeout=min(remaining, CONNECT_ATTEMPT_S))
            except OSError as exc:  # refused, unreachable, not resolvable yet
                last = exc
                time.sleep(min(_CONNECT_RETRY_S, max(0.0, deadline - time.monotonic())))
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(max(0.05, min(deadline - time.monotonic(), AUTH_WAIT_S)))
                self._handshake(sock)
                return sock
            except _Refused:
                sock.close()
                raise
            except (_Closed, OSError) as exc:
                # Closed before answering: a store that is starting or shedding
                # load; try again.
                sock.close()
                last = exc
                time.sleep(min(_CONNECT_RETRY_S, max(0.0, deadline - time.monotonic())))
            except BaseException:
                sock.close()
                raise

    def _handshake(self, sock: socket.socket) -> None:
        nonce_c = os.urandom(_NONCE)
        sock.sendall(_KNOCK.pack(_MAGIC, _VERSION, nonce_c))
        hello = self._recv_exact(sock, _SERVER_HELLO.size)
        magic, version, nonce_s = _SERVER_HELLO.unpack(hello)
        if magic != _MAGIC or version != _VERSION:
            raise _Refused(f"{self.address} is not a collectives store of this version "
                                  f"(it answered with {hello[:3]!r})")
        sock.sendall(_PROOF.pack(_auth.mac(self._key, b"client", nonce_s, nonce_c)))
        status, tag = _ANSWER.unpack(self._recv_exact(sock, _ANSWER.size))
        if status != 0:
            raise _Refused(f"the store at {self.address} refused this process: it "
                                  f"belongs to a job with another secret (is another job "
                                  f"using this address, or do the ranks' "
                                  f"COLLECTIVES_JOB_SECRET differ?)")
        if not _auth.hmac.compare_digest(tag, _auth.mac(self._key, b"server", nonce_s, nonce_c)):
            raise _Refused(f"the store at {self.address} does not know this job's "
                                  f"secret: it is another job's, or an impostor's")
        self._session = _auth.mac(self._key, b"session", nonce_s, nonce_c)
        self._rseq = self._sseq = 0

    def __enter__(self) -> "StoreClient":
        """Return self."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the connection."""
        self.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def local_address(self) -> str:
        """The local IP address of this connection (the route towards the store)."""
        with self._lock:
            return self._require("local_address", "").getsockname()[0]

    def _io(self, timeout: Optional[float]) -> float:
        return self.timeout if timeout is None else max(0.01, clamp_wait(timeout))

    def set(self, key: str, value: bytes, timeout: Optional[float] = None) -> None:
        """Store ``value`` under ``key``, waking any ``get`` waiting for it.

        ``timeout``: how long the server may take to answer (default: the
        client's timeout); past it, TimeoutError and the connection is closed.
        """
        self._call(_OP_SET, [key.encode(), bytes(value)], key, self._io(timeout))

    def get(self, key: str, timeout: Optional[float] = None,
            io_timeout: Optional[float] = None) -> bytes:
        """The value of ``key``, waiting on the server until it is set.

        ``io_timeout`` bounds the whole call (default: the wait plus a few
        seconds for the server to answer TIMEOUT itself).

        Raises:
            TimeoutError: the key was not set within ``timeout`` seconds
                (default: the client's timeout; at most MAX_WAIT_S).
        """
        wait = self.timeout if timeout is None else clamp_wait(timeout)
        io = wait + _GET_SLACK_S if io_timeout is None else self._io(io_timeout)
        payload = self._call(_OP_GET, [key.encode(), _U64.pack(int(wait * 1000))], key, io)
        if payload is None:
            raise TimeoutError(f"key {key!r} was not set in the store at "
                               f"{self.address} within {wait:g} s")
        return payload

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter ``key`` (0 if new); the new value."""
        payload = self._call(_OP_ADD, [key.encode(), _I64.pack(amount)], key, self.timeout)
        assert payload is not None
        return _I64.unpack(payload)[0]

    def check(self, keys: Iterable[str], timeout: Optional[float] = None) -> bool:
        """True if every key exists now (does not wait; ``timeout`` as for set)."""
        names = [k.encode() for k in ([keys] if isinstance(keys, str) else keys)]
        payload = self._call(_OP_CHECK, names, ",".join(k.decode() for k in names),
                             self._io(timeout))
        return payload == b"\x01"

    def delete(self, key: str) -> bool:
        """Remove ``key``; True if it existed."""
        return self._call(_OP_DELETE, [key.encode()], key, self.timeout) == b"\x01"

    # -- transport --

    def _require(self, op: str, key: str) -> socket.socket:
        if self._sock is None:
            raise ConnectionError(f"store client for {self.address} is closed "
                                  f"({op} {key!r})")
        return self._sock

    def _call(self, op: int, fields: list[bytes], key: str,
              io_timeout: float) -> Optional[bytes]:
        """Send one request and read its response; None means TIMEOUT status."""
        body = bytearray()
        for field in fields:
            body += _FIELD_LEN.pack(len(field)) + field
        if len(body) > MAX_FRAME:
            raise ValueError(f"store request for key {key!r} is {len(body)} bytes; the store "
                             f"takes at most {MAX_FRAME}")
        frame = bytearray(_REQ_HEAD.pack(_MAGIC, op, len(fields), len(body))) + body
        with self._lock:
            sock = self._require("request", key)
            try:
                frame += _request_tag(self._session, self._rseq, frame)
                self._rseq += 1
                sock.settimeout(io_timeout)
                sock.sendall(frame)
                head = self._recv_exact(sock, _RESP_HEAD.size)
                magic, status, length = _RESP_HEAD.unpack(head)
                if magic != _MAGIC or length > MAX_FRAME:
                    raise _Closed("the reply is not from a collectives store")
                payload = self._recv_exact(sock, length)
                tag = self._recv_exact(sock, _MAC)
                if not _auth.hmac.compare_digest(
                        tag, _response_tag(self._session, self._sseq, head + payload)):
                    raise _Closed("a reply failed its MAC (forged or out of order)")
                self._sseq += 1
            except socket.timeout:
                # The reply may still arrive; the stream is no longer in step.
                self._sock = None
                sock.close()
                raise TimeoutError(f"store at {self.address} did not answer for key "
                                   f"{key!r} within {io_timeout:g} s") from None
            except (OSError, _Closed) as exc:
                self._sock = None
                sock.close()
                raise ConnectionError(f"lost the store at {self.address} "
                                      f"(key {key!r}): {exc}") from None
        return None if status == _TIMEOUT else payload

    @staticmethod
    def _recv_exact(sock: socket.socket, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise _Closed("the store closed the connection")
            buf += chunk
        return bytes(buf)


def barrier(client: StoreClient, name: str, size: int,
            timeout: Optional[float] = None) -> None:
    """Wait until ``size`` processes have called ``barrier`` with this ``name``.

    Reusable: the n-th arrival belongs to round (n - 1) // size, and each round
    waits on its own key.

    Raises:
        TimeoutError: naming the barrier and how many processes arrived.
    """
    arrived = client.add(f"{name}/arrived", 1)
    generation = (arrived - 1) // size
    done_key = f"{name}/done/{generation}"
    if arrived == (generation + 1) * size:
        client.set(done_key, b"1")
    try:
        client.get(done_key, timeout)
    except TimeoutError as exc:
        try:
            count = int(client.get(f"{name}/arrived", 1.0)) - generation * size
            seen = f"{min(count, size)} of {size}"
        except (TimeoutError, ConnectionError, ValueError):
            seen = f"? of {size}"
        raise TimeoutError(f"barrier {name!r} on the store at {client.address}: "
                           f"only {seen} processes arrived ({exc})") from None
