"""A small TCP key-value store hosted by rank 0, used for rendezvous.

Rank 0 runs a :class:`StoreServer`; every rank (rank 0 included) talks to it
through a :class:`StoreClient`: ranks publish their listening addresses with
``set`` and read their peers' with ``get``, which waits on the server until
the key exists.

Wire format (all integers big-endian, no pickle, nothing is evaluated)::

    request  = "CS" version:u8 op:u8 nfields:u32 { len:u32 bytes }*nfields
    response = "CS" status:u8 len:u32 payload

    op       fields                         OK payload
    SET  1   key, value                     -
    GET  2   key, wait_ms (u64 field)       value    (status TIMEOUT if not set in time)
    ADD  3   key, amount (i64 field)        new value as i64
    CHECK 4  key, key, ...                  u8 1 if all exist else 0
    DELETE 5 key                            u8 1 if it existed else 0

Anything else (bad magic or version, unknown op, wrong field count, a frame
over 1 GiB) closes that client's connection; the server goes on serving the
others. Counters made by ADD are stored as ASCII decimals, so ``get`` on a
counter returns e.g. ``b"3"``.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
import time
from typing import Iterable, Optional

from ._env import format_addr

__all__ = ["StoreServer", "StoreClient", "barrier"]

_MAGIC = b"CS"
_VERSION = 1
_REQ_HEAD = struct.Struct(">2sBBI")   # magic, version, op, nfields
_RESP_HEAD = struct.Struct(">2sBI")   # magic, status, payload length
_FIELD_LEN = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_MAX_FRAME = 1 << 30  # larger frames are treated as garbage, not buffered
_MAX_FIELDS = 1 << 16

_OP_SET, _OP_GET, _OP_ADD, _OP_CHECK, _OP_DELETE = 1, 2, 3, 4, 5
_OK, _TIMEOUT = 0, 1
_CONNECT_RETRY_S = 0.05
# The client gives the server this long beyond a get's deadline to answer
# TIMEOUT itself before deciding the server is gone.
_GET_SLACK_S = 5.0


class _Malformed(Exception):
    """A client sent bytes that are not a request: drop its connection."""


def _parse_request(buf: bytearray) -> Optional[tuple[int, list[bytes], int]]:
    """(op, fields, bytes consumed) for the first request in buf, None if incomplete."""
    if len(buf) >= 2 and bytes(buf[:2]) != _MAGIC:
        raise _Malformed("bad magic")
    if len(buf) < _REQ_HEAD.size:
        return None
    _, version, op, nfields = _REQ_HEAD.unpack_from(buf, 0)
    if version != _VERSION or nfields > _MAX_FIELDS:
        raise _Malformed("bad version or field count")
    pos, fields = _REQ_HEAD.size, []
    for _ in range(nfields):
        if len(buf) < pos + 4:
            return None
        (length,) = _FIELD_LEN.unpack_from(buf, pos)
        if pos + 4 + length > _MAX_FRAME:
            raise _Malformed("frame too large")
        if len(buf) < pos + 4 + length:
            return None
        fields.append(bytes(buf[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    return op, fields, pos


def _response(status: int, payload: bytes = b"") -> bytes:
    return _RESP_HEAD.pack(_MAGIC, status, len(payload)) + payload


class _Closed(Exception):
    """The server side went away or answered nonsense (client side)."""


class _Conn:
    """Server-side state of one client connection."""

    __slots__ = ("sock", "inbuf", "outbuf", "waiting", "deadline")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.waiting: Optional[bytes] = None  # key of a pending GET
        self.deadline = 0.0


class StoreServer:
    """Serves the store on (host, port) from one daemon thread.

    One ``selectors`` loop handles every client, so an idle store costs no
    CPU. ``port=0`` picks a free port; read it back from :attr:`port`.
    ``host`` may be an IPv4 or IPv6 address or a name; "" or "::" listen on
    all addresses (both families where the system allows).
    """

    def __init__(self, host: str, port: int = 0) -> None:
        """Bind, listen and start serving."""
        self.host = host
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        family, kind, proto, _, sockaddr = infos[0]
        self._listener = socket.socket(family, kind, proto)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and host in ("", "::"):
                self._listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                self._listener.bind(sockaddr)
            except OSError as exc:
                raise OSError(exc.errno, f"store cannot listen on "
                              f"{format_addr(host, port)}: {exc.strerror}") from None
            self._listener.listen(1024)  # every rank connects at once at start-up
            self._listener.setblocking(False)
        except BaseException:
            self._listener.close()
            raise
        self.port: int = self._listener.getsockname()[1]
        self._data: dict[bytes, bytes] = {}
        self._waiters: dict[bytes, list[_Conn]] = {}
        self._conns: dict[int, _Conn] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._closing = False
        self._close_lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="collectives-store",
                                        daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """"host:port" of the listening socket, IPv6 in brackets."""
        return format_addr(self.host, self.port)

    def __enter__(self) -> "StoreServer":
        """Return self; the server is already running."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the server."""
        self.close()

    def close(self) -> None:
        """Stop serving, join the thread and close every socket (idempotent)."""
        with self._close_lock:
            if self._closing:
                return
            self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._wake_w.close()

    # -- the loop; everything below runs on the server thread only --

    def _serve(self) -> None:
        try:
            while not self._closing:
                for key, events in self._sel.select(self._next_timeout()):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        pass
                    else:
                        self._service(key.data, events)
                self._expire_waiters()
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn)
            self._sel.close()
            self._listener.close()
            self._wake_r.close()

    def _next_timeout(self) -> Optional[float]:
        deadlines = [c.deadline for c in self._conns.values() if c.waiting is not None]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. EMFILE, ECONNABORTED: try again on next event
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock)
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _service(self, conn: _Conn, events: int) -> None:
        try:
            if events & selectors.EVENT_READ:
                try:
                    chunk = conn.sock.recv(1 << 16)
                except (BlockingIOError, InterruptedError):
                    chunk = None
                if chunk == b"":
                    raise ConnectionResetError
                if chunk:
                    conn.inbuf += chunk
                    self._process(conn)
            if conn.outbuf:
                self._flush(conn)
        except (_Malformed, OSError):
            self._drop(conn)

    def _process(self, conn: _Conn) -> None:
        # Requests are answered in order: while a GET waits, later bytes stay
        # buffered (clients do not pipeline, so this is only a safeguard).
        while conn.waiting is None:
            parsed = _parse_request(conn.inbuf)
            if parsed is None:
                return
            op, fields, used = parsed
            del conn.inbuf[:used]
            self._handle(conn, op, fields)

    def _handle(self, conn: _Conn, op: int, fields: list[bytes]) -> None:
        if op == _OP_SET and len(fields) == 2:
            key, value = fields
            self._data[key] = value
            conn.outbuf += _response(_OK)
            self._wake_waiters(key)
        elif op == _OP_GET and len(fields) == 2 and len(fields[1]) == 8:
            key = fields[0]
            if key in self._data:
                conn.outbuf += _response(_OK, self._data[key])
            else:
                conn.waiting = key
                conn.deadline = time.monotonic() + _U64.unpack(fields[1])[0] / 1000.0
                self._waiters.setdefault(key, []).append(conn)
        elif op == _OP_ADD and len(fields) == 2 and len(fields[1]) == 8:
            key = fields[0]
            try:
                current = int(self._data.get(key, b"0"))
            except ValueError:
                raise _Malformed("add on a key that is not a counter") from None
            value = current + _I64.unpack(fields[1])[0]
            self._data[key] = str(value).encode()
            conn.outbuf += _response(_OK, _I64.pack(value))
            self._wake_waiters(key)
        elif op == _OP_CHECK:
            conn.outbuf += _response(_OK, bytes([all(k in self._data for k in fields)]))
        elif op == _OP_DELETE and len(fields) == 1:
            existed = self._data.pop(fields[0], None) is not None
            conn.outbuf += _response(_OK, bytes([existed]))
        else:
            raise _Malformed(f"bad request op={op} nfields={len(fields)}")

    def _wake_waiters(self, key: bytes) -> None:
        for waiter in self._waiters.pop(key, []):
            if waiter.sock.fileno() < 0:
                continue
            waiter.waiting = None
            waiter.outbuf += _response(_OK, self._data[key])
            try:
                self._flush(waiter)
                self._process(waiter)
            except (_Malformed, OSError):
                self._drop(waiter)

    def _expire_waiters(self) -> None:
        now = time.monotonic()
        for conn in list(self._conns.values()):
            if conn.waiting is not None and conn.deadline <= now:
                waiters = self._waiters.get(conn.waiting, [])
                if conn in waiters:
                    waiters.remove(conn)
                    if not waiters:
                        del self._waiters[conn.waiting]
                conn.waiting = None
                conn.outbuf += _response(_TIMEOUT)
                try:
                    self._flush(conn)
                    self._process(conn)
                except (_Malformed, OSError):
                    self._drop(conn)

    def _flush(self, conn: _Conn) -> None:
        while conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            del conn.outbuf[:sent]
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        if self._sel.get_key(conn.sock).events != want:
            self._sel.modify(conn.sock, want, conn)

    def _drop(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd < 0:
            return
        self._conns.pop(fd, None)
        if conn.waiting is not None:
            waiters = self._waiters.get(conn.waiting, [])
            if conn in waiters:
                waiters.remove(conn)
            if not waiters:
                self._waiters.pop(conn.waiting, None)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()


class StoreClient:
    """A connection to the store; one request at a time (calls are serialised).

    The constructor retries every ~50 ms until ``timeout`` seconds have passed,
    since rank 0 may start its server after the other ranks start connecting.

    Raises (from every method):
        TimeoutError: naming the key and the store address.
        ConnectionError: the store closed the connection or is unreachable.
    """

    def __init__(self, host: str, port: int, timeout: float = 300.0) -> None:
        """Connect to the store at (host, port), retrying until ``timeout``."""
        self.host, self.port, self.timeout = host, port, float(timeout)
        self.address = format_addr(host, port)
        self._lock = threading.Lock()
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
                                                timeout=min(remaining, 10.0))
            except OSError as exc:  # refused, unreachable, not resolvable yet
                last = exc
                time.sleep(min(_CONNECT_RETRY_S, max(0.0, deadline - time.monotonic())))
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock

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

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``, waking any ``get`` waiting for it."""
        self._call(_OP_SET, [key.encode(), bytes(value)], key, self.timeout)

    def get(self, key: str, timeout: Optional[float] = None) -> bytes:
        """The value of ``key``, waiting on the server until it is set.

        Raises:
            TimeoutError: the key was not set within ``timeout`` seconds
                (default: the client's timeout).
        """
        wait = self.timeout if timeout is None else max(0.0, float(timeout))
        payload = self._call(_OP_GET, [key.encode(), _U64.pack(int(wait * 1000))],
                             key, wait + _GET_SLACK_S)
        if payload is None:
            raise TimeoutError(f"key {key!r} was not set in the store at "
                               f"{self.address} within {wait:g} s")
        return payload

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter ``key`` (0 if new); the new value."""
        payload = self._call(_OP_ADD, [key.encode(), _I64.pack(amount)], key, self.timeout)
        assert payload is not None
        return _I64.unpack(payload)[0]

    def check(self, keys: Iterable[str]) -> bool:
        """True if every key exists now (does not wait)."""
        names = [k.encode() for k in ([keys] if isinstance(keys, str) else keys)]
        payload = self._call(_OP_CHECK, names, ",".join(k.decode() for k in names),
                             self.timeout)
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
        frame = bytearray(_REQ_HEAD.pack(_MAGIC, _VERSION, op, len(fields)))
        for field in fields:
            frame += _FIELD_LEN.pack(len(field)) + field
        with self._lock:
            sock = self._require("request", key)
            try:
                sock.settimeout(io_timeout)
                sock.sendall(frame)
                head = self._recv_exact(sock, _RESP_HEAD.size)
                magic, status, length = _RESP_HEAD.unpack(head)
                if magic != _MAGIC:
                    raise _Closed("the reply is not from a collectives store")
                payload = self._recv_exact(sock, length)
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
