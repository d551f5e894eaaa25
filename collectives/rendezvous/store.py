"""A small TCP key-value store hosted by rank 0, used for rendezvous.

Rank 0 runs a :class:`StoreServer`; every rank (rank 0 included) talks to it
through a :class:`StoreClient`: ranks publish their listening addresses with
``set`` and read their peers' with ``get``, which waits on the server until
the key exists.

Every connection opens with a challenge-response over the job's store key
(collectives/rendezvous/auth.py), both ways, so neither side talks to anyone who does
not know the job secret, and a recorded handshake cannot be replayed (each
side brings a fresh nonce). Then every request and reply carries an HMAC
under a key made for this connection, with a counter, so no frame can be
forged, replayed or reordered. Wire format (integers big-endian, no pickle,
nothing is evaluated)::

    client knock  = "CS" version:u8 nonce_c[16]       (sent as soon as it connects)
    server hello  = "CS" version:u8 nonce_s[16]
    client proof  = mac(K, "client" nonce_s nonce_c)
    server answer = 0:u8 mac(K, "server" nonce_s nonce_c)   (or 1:u8, "refused", then close)
    session key   = mac(K, "session" nonce_s nonce_c)
    request  = head body tag;  head = "CS" op:u8 nfields:u32 body_len:u32
               body = { len:u32 bytes }*nfields;  tag = mac(S, "C" seq:u64 head body)
    response = head payload tag;  head = "CS" status:u8 len:u32
               tag = mac(S, "S" seq:u64 head payload)

    op       fields                         OK payload
    SET  1   key, value                     -
    GET  2   key, wait_ms (u64 field)       value    (status TIMEOUT if not set in time)
    ADD  3   key, amount (i64 field)        new value as i64
    CHECK 4  key, key, ...                  u8 1 if all exist else 0
    DELETE 5 key                            u8 1 if it existed else 0

The server survives hostile clients: a connection that has not proved the
secret within AUTH_WAIT_S is closed, reads nothing beyond the fixed-size
handshake and allocates nothing it advertises; at most MAX_UNAUTHENTICATED
such connections are held and MAX_CONNECTIONS in all, both lowered to fit
the process's descriptor limit (the store lives in rank 0, whose links need
descriptors too: it takes at most half of them); when the process runs out
of descriptors the listener pauses instead of spinning. When the handshake
table is full, a newcomer replaces the oldest connection that has had
UNAUTH_GRACE_S to answer, else it is closed at once, before anything is
allocated for it: a flood of silent connections then costs an accept and a
close each, and a rank's connection, which answers within the grace, is
never pushed out by the ones after it. The client speaks first: a newcomer
whose knock has already arrived when it is accepted displaces the oldest
connection that has not sent a byte, whatever its age or source, so silent
connections never keep a client out, however fast they come. Once the handshake table is full, a
source holding more than half of it yields: a newcomer from another source
replaces that source's oldest handshake at once, and one from the source
itself replaces only the source's own oldest (past the grace) or is closed at
once; a source holds at most three quarters of all connections (a job on one
host connects from one address, so that leaves it nearly all). A flood from
one address, however fast, leaves the other sources' ranks room to connect
and prove the secret, and a job whose ranks share the flood's address starts
as it did before there were shares. Each round of the loop serves the
connections that have something first and accepts at most ACCEPT_BATCH new
ones, so a flood never starves the clients already in. A frame is at most
MAX_FRAME bytes and must arrive within FRAME_WAIT_S of its first byte; it
is parsed once, when complete, in linear time; the bytes buffered for all
connections together (requests being read, replies not yet taken) are at
most MAX_BUFFERED, past which the connection holding the most is dropped.
Waits are clamped to MAX_WAIT_S. Anything malformed or unauthenticated
closes that connection with a WARN; the server goes on serving the others.
Counters made by ADD are stored as ASCII decimals, so ``get`` on a counter
returns e.g. ``b"3"``.
"""

from __future__ import annotations

import collections
import mmap
import os
import selectors
import socket
import threading
import time
from typing import Callable, Optional

from . import auth as _auth
from .env import format_addr
from .store_client import StoreClient, barrier
from .store_wire import (AUTH_WAIT_S, MAX_FRAME, MAX_WAIT_S, _ANSWER, _I64, _KNOCK, _MAC,
                         _MAGIC, _NONCE, _OK, _OP_ADD, _OP_CHECK, _OP_DELETE, _OP_GET, _OP_SET,
                         _PROOF, _REQ_HEAD, _RESP_HEAD, _SERVER_HELLO, _TIMEOUT, _U64, _VERSION,
                         _Malformed, _request_tag, _response_tag, parse_fields, split_frame)

__all__ = ["StoreServer", "StoreClient", "barrier", "MAX_FRAME", "MAX_WAIT_S",
           "MAX_CONNECTIONS", "MAX_UNAUTHENTICATED", "AUTH_WAIT_S", "FRAME_WAIT_S",
           "MAX_BUFFERED", "UNAUTH_GRACE_S", "ACCEPT_BATCH", "source_caps"]

MAX_CONNECTIONS = 16384       # connections held at once (further ones are closed at once)
MAX_UNAUTHENTICATED = 256     # connections still in their handshake
UNAUTH_GRACE_S = 0.25         # a handshake is not evicted for a newcomer before this
ACCEPT_BATCH = 64             # new connections taken per round of the loop
MAX_BUFFERED = 4 * MAX_FRAME  # bytes buffered for all connections together
_BIG_FRAME = 1 << 20  # a request this long is read into a block of its size
FRAME_WAIT_S = 30.0           # for a frame to arrive whole once it has begun
_PAUSE_ACCEPT_S = 0.1         # the listener rests this long when descriptors run out

def _connection_caps() -> tuple[int, int]:
    """(connections, of which in their handshake) a store may hold: MAX_CONNECTIONS and
    MAX_UNAUTHENTICATED, within half the process's descriptor limit."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        soft = -1
    room = MAX_CONNECTIONS if soft < 0 else max(16, soft // 2)
    total = min(MAX_CONNECTIONS, room)
    return total, max(4, min(MAX_UNAUTHENTICATED, total // 4))


def source_caps(total: int, unauth: int) -> tuple[int, int]:
    """(connections, of which in their handshake) one source address may hold, of a
    store holding at most total and unauth: three quarters and half, so that one
    source never takes every slot (at least 1 each)."""
    return max(1, total - total // 4), max(1, unauth // 2)


def _knocked(sock: socket.socket) -> bool:
    """Whether a just-accepted (non-blocking) connection's first bytes are a client's knock."""
    try:
        return sock.recv(len(_MAGIC), socket.MSG_PEEK) == _MAGIC
    except OSError:
        return False


def _source(addr: object) -> str:
    """The source address of an accepted connection (its host part, without the port)."""
    return str(addr[0]) if isinstance(addr, tuple) else "?"


class _Conn:
    """Server-side state of one client connection."""

    __slots__ = ("sock", "peer", "source", "inbuf", "outbuf", "waiting", "deadline", "expires",
                 "nonce", "nonce_c", "session", "rseq", "sseq", "born", "counted", "frame",
                 "filled")

    def __init__(self, sock: socket.socket, peer: str, nonce: bytes, source: str = "?") -> None:
        self.born = time.monotonic()
        self.source = source                  # the peer's address without its port
        self.counted = 0                      # its bytes in the server's _buffered
        self.sock = sock
        self.peer = peer
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        # A large request whose head has come is read straight into a block of
        # its exact size (anonymous memory: pages count only once written, and
        # go back to the system when it closes), not grown chunk by chunk: a
        # growing buffer leaves its old copies in the heap, and the process's
        # memory then exceeds what it holds by a multiple.
        self.frame: Optional[mmap.mmap] = None
        self.filled = 0
        self.waiting: Optional[bytes] = None  # key of a pending GET
        self.deadline = 0.0                   # of that GET
        self.expires = 0.0                    # handshake or partial frame deadline; 0: none
        self.nonce = nonce
        self.nonce_c: Optional[bytes] = None  # the client's, from its knock
        self.session: Optional[bytes] = None  # set once the client proved the secret
        self.rseq = 0
        self.sseq = 0


class StoreServer:
    """Serves the store on (host, port) from one daemon thread.

    One ``selectors`` loop handles every client, so an idle store costs no
    CPU. ``port=0`` picks a free port; read it back from :attr:`port`.
    ``host`` may be an IPv4 or IPv6 address or a name; "" or "::" listen on
    all addresses (both families where the system allows). ``secret`` is the
    job secret (collectives/rendezvous/auth.py); b"" authenticates nothing.
    """

    def __init__(self, host: str, port: int = 0, secret: bytes = b"") -> None:
        """Bind, listen and start serving."""
        self.host = host
        self._key = _auth.store_key(secret)
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
        # Connections still in their handshake, oldest first (fd -> conn), and those of
        # them that have not sent a byte yet.
        self._unauth: "collections.OrderedDict[int, _Conn]" = collections.OrderedDict()
        self._silent: "collections.OrderedDict[int, _Conn]" = collections.OrderedDict()
        self._accept_paused_until = 0.0
        self._max_conns, self._max_unauth = _connection_caps()
        self._source_conns, self._source_unauth = source_caps(self._max_conns, self._max_unauth)
        # per source address: [connections held, of which in their handshake]
        self._per_source: dict[str, list] = {}
        self._buffered = 0  # bytes in every connection's inbuf and outbuf
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

    def connection_count(self) -> tuple[int, int]:
        """(connections held, of which still unauthenticated); for tests and diagnostics."""
        return len(self._conns), len(self._unauth)

    def source_count(self, source: str) -> tuple[int, int]:
        """(connections held, of which still unauthenticated) from one source address."""
        held = self._per_source.get(source, [0, 0])
        return held[0], held[1]

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
                ready = self._sel.select(self._next_timeout())
                # Clients that have something first, new connections last (at most
                # ACCEPT_BATCH a round): a flood must not starve those already in.
                ready.sort(key=lambda kv: kv[0].data == "listen")
                for key, events in ready:
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        try:
                            self._wake_r.recv(64)
                        except OSError:
                            pass
                    elif key.data.sock.fileno() >= 0:
                        self._service(key.data, events)
                self._expire()
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn)
            self._sel.close()
            self._listener.close()
            self._wake_r.close()

    def _next_timeout(self) -> Optional[float]:
        times = [c.deadline for c in self._conns.values() if c.waiting is not None]
        times += [c.expires for c in self._conns.values() if c.expires]
        if self._accept_paused_until:
            times.append(self._accept_paused_until)
        if not times:
            return None
        return min(MAX_WAIT_S, max(0.0, min(times) - time.monotonic()))

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (24, 23) and self._unauth:  # EMFILE, ENFILE
                    self._drop(next(iter(self._unauth.values())))
                    continue
                if exc.errno in (24, 23, 105, 12):  # no descriptors/buffers: rest, do not spin
                    _auth.warn(f"store on {self.address}: cannot accept ({exc.strerror}); "
                               f"pausing new connections", key="store-emfile")
                    self._sel.unregister(self._listener)
                    self._accept_paused_until = time.monotonic() + _PAUSE_ACCEPT_S
                return  # e.g. ECONNABORTED: try again on the next event
            peer = format_addr(str(addr[0]), int(addr[1])) if isinstance(addr, tuple) else "?"
            if len(self._conns) >= self._max_conns:
                _auth.warn(f"store on {self.address}: {self._max_conns} connections held; "
                           f"refused {peer}", key="store-full")
                sock.close()
                continue
            source = _source(addr)
            held = self._per_source.get(source, [0, 0])
            full = len(self._unauth) >= self._max_unauth
            sock.setblocking(False)
            spoke = full and _knocked(sock)
            if spoke and self._silent and held[0] < self._source_conns:
                # A client knocks as it connects: one whose knock is here displaces the
                # oldest connection that has said nothing, whatever its age or source,
                # so silent connections, however many and fast, never keep a rank out.
                self._drop(next(iter(self._silent.values())))
            elif held[1] >= self._source_unauth and full:
                # This source holds its share of the handshake table: it may replace only
                # its own oldest handshake, so that a flood from one address never pushes
                # out, or crowds out, another source's.
                old = next(c for c in self._unauth.values() if c.source == source)
                if time.monotonic() - old.born < UNAUTH_GRACE_S:
                    _auth.warn(f"store on {self.address}: {source} has {held[1]} connections "
                               f"in their handshake, its most; turning its new ones away",
                               key="store-source-unauth")
                    sock.close()
                    continue
                self._drop(old)
            elif held[0] >= self._source_conns:
                _auth.warn(f"store on {self.address}: {source} holds {held[0]} connections, "
                           f"its most; refused {peer}", key="store-source-full")
                sock.close()
                continue
            if len(self._unauth) >= self._max_unauth:
                # A source over its share of the table yields at once to one under it;
                # otherwise the oldest handshake goes, once it had the grace to answer.
                over = next((c for c in self._unauth.values()
                             if self._per_source.get(c.source, [0, 0])[1] > self._source_unauth),
                            None)
                old = over if over is not None else next(iter(self._unauth.values()))
                if over is None and time.monotonic() - old.born < UNAUTH_GRACE_S:
                    # Every handshake is young: turn the newcomer away at once, before
                    # anything is spent on it (a client retries; a flood's goes).
                    _auth.warn(f"store on {self.address}: {self._max_unauth} connections "
                               f"are in their handshake; turning new ones away",
                               key="store-unauth-full")
                    sock.close()
                    continue
                self._drop(old)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, peer, os.urandom(_NONCE), source)
            conn.expires = time.monotonic() + AUTH_WAIT_S
            self._conns[sock.fileno()] = conn
            self._unauth[sock.fileno()] = conn
            self._silent[sock.fileno()] = conn
            counts = self._per_source.setdefault(source, [0, 0])
            counts[0] += 1
            counts[1] += 1
            self._sel.register(sock, selectors.EVENT_READ, conn)
            if spoke:
                self._service(conn, selectors.EVENT_READ)

    def _guarded(self, conn: _Conn, step: Callable[[], None]) -> None:
        """Run step for conn; a malformed or broken connection is dropped (with a WARN
        for the malformed one), never the server."""
        try:
            step()
        except _Malformed as exc:
            _auth.warn(f"store on {self.address}: dropped {conn.peer}: {exc}",
                       key="store-malformed")
            self._drop(conn)
        except OSError:
            self._drop(conn)
        else:
            self._account(conn)

    def _account(self, conn: _Conn) -> None:
        """Count conn's buffered bytes; past MAX_BUFFERED in all, drop whoever holds most."""
        if conn.sock.fileno() < 0:
            return  # dropped: _drop took its bytes off
        now = len(conn.inbuf) + len(conn.outbuf) + (conn.filled if conn.frame else 0)
        self._buffered += now - conn.counted
        conn.counted = now
        while self._buffered > MAX_BUFFERED:
            big = max(self._conns.values(), key=lambda c: c.counted)
            _auth.warn(f"store on {self.address}: {self._buffered} bytes buffered for all "
                       f"connections, over {MAX_BUFFERED}; dropped {big.peer}, which held "
                       f"{big.counted}", key="store-buffered")
            self._drop(big)

    def _service(self, conn: _Conn, events: int) -> None:
        def step() -> None:
            if events & selectors.EVENT_READ:
                # Before the handshake, read no more than its next message.
                if conn.frame is not None:
                    self._read_frame(conn)
                    return
                if conn.session is not None:
                    want = 1 << 16
                else:
                    want = (_KNOCK if conn.nonce_c is None else _PROOF).size - len(conn.inbuf)
                try:
                    chunk = conn.sock.recv(want)
                except (BlockingIOError, InterruptedError):
                    chunk = None
                if chunk == b"":
                    raise ConnectionResetError
                if chunk:
                    conn.inbuf += chunk
                    if conn.session is None:
                        self._silent.pop(conn.sock.fileno(), None)
                        self._handshake(conn)
                    else:
                        self._process(conn)
            if conn.outbuf:
                self._flush(conn)
        self._guarded(conn, step)

    def _read_frame(self, conn: _Conn) -> None:
        """Read more of the large request conn.frame; process it once whole."""
        assert conn.frame is not None
        try:
            n = conn.sock.recv_into(memoryview(conn.frame)[conn.filled:],
                                    min(1 << 20, len(conn.frame) - conn.filled))
        except (BlockingIOError, InterruptedError):
            return
        if n == 0:
            raise ConnectionResetError
        conn.filled += n
        if conn.filled == len(conn.frame):
            conn.inbuf = bytearray(conn.frame)
            self._close_frame(conn)
            self._process(conn)
        if conn.outbuf:
            self._flush(conn)

    @staticmethod
    def _close_frame(conn: _Conn) -> None:
        if conn.frame is not None:
            conn.frame.close()
            conn.frame = None
            conn.filled = 0

    def _handshake(self, conn: _Conn) -> None:
        if conn.nonce_c is None:  # the knock: magic, version, the client's nonce
            if bytes(conn.inbuf[:2]) != _MAGIC[:len(conn.inbuf[:2])]:
                raise _Malformed("not a collectives store client")
            if len(conn.inbuf) < _KNOCK.size:
                return
            _, version, conn.nonce_c = _KNOCK.unpack(bytes(conn.inbuf))
            conn.inbuf.clear()
            if version != _VERSION:
                raise _Malformed(f"protocol version {version}, not {_VERSION} (a collectives "
                                 f"of another version)")
            conn.outbuf += _SERVER_HELLO.pack(_MAGIC, _VERSION, conn.nonce)
            return
        if len(conn.inbuf) < _PROOF.size:
            return
        nonce_c = conn.nonce_c
        (tag,) = _PROOF.unpack(bytes(conn.inbuf))
        conn.inbuf.clear()
        if not _auth.hmac.compare_digest(tag, _auth.mac(self._key, b"client", conn.nonce, nonce_c)):
            conn.outbuf += _ANSWER.pack(1, bytes(_MAC))
            try:
                self._flush(conn)
            except OSError:
                pass
            raise _Malformed("it does not know this job's secret (another job, or a "
                             "different COLLECTIVES_JOB_SECRET)")
        conn.outbuf += _ANSWER.pack(0, _auth.mac(self._key, b"server", conn.nonce, nonce_c))
        conn.session = _auth.mac(self._key, b"session", conn.nonce, nonce_c)
        conn.expires = 0.0
        if self._unauth.pop(conn.sock.fileno(), None) is not None:
            self._per_source[conn.source][1] -= 1

    def _process(self, conn: _Conn) -> None:
        # Requests are answered in order: while a GET waits, later bytes stay
        # buffered (clients do not pipeline, so this is only a safeguard), up
        # to one more frame; replies a client does not read stop its requests.
        assert conn.session is not None
        while conn.waiting is None and len(conn.outbuf) < MAX_FRAME:
            split = split_frame(conn.inbuf)
            if split is not None and split[2] >= _BIG_FRAME and len(conn.inbuf) < split[2]:
                # the rest of a large request goes straight to its place (_read_frame)
                conn.frame = mmap.mmap(-1, split[2])
                conn.frame[:len(conn.inbuf)] = conn.inbuf
                conn.filled = len(conn.inbuf)
                conn.inbuf = bytearray()
            if split is None or len(conn.inbuf) < split[2]:
                break
            op, nfields, used = split
            frame = memoryview(conn.inbuf)[:used]
            try:
                tag = bytes(frame[used - _MAC:])
                if not _auth.hmac.compare_digest(
                        tag, _request_tag(conn.session, conn.rseq, frame[:used - _MAC])):
                    raise _Malformed("a request failed its MAC (forged or out of order)")
                fields = parse_fields(frame[_REQ_HEAD.size:used - _MAC], nfields)
            finally:
                frame.release()
            conn.rseq += 1
            del conn.inbuf[:used]
            self._handle(conn, op, fields)
        if len(conn.inbuf) > 2 * MAX_FRAME + 2 * _REQ_HEAD.size + 2 * _MAC:
            raise _Malformed("buffered more than two frames")
        partial = conn.inbuf or conn.frame is not None
        conn.expires = time.monotonic() + FRAME_WAIT_S if partial and not conn.expires \
            else (conn.expires if partial else 0.0)

    def _reply(self, conn: _Conn, status: int, payload: bytes = b"") -> None:
        assert conn.session is not None
        head = _RESP_HEAD.pack(_MAGIC, status, len(payload))
        conn.outbuf += head
        conn.outbuf += payload
        conn.outbuf += _response_tag(conn.session, conn.sseq, head + payload)
        conn.sseq += 1

    def _handle(self, conn: _Conn, op: int, fields: list[bytes]) -> None:
        if op == _OP_SET and len(fields) == 2:
            key, value = fields
            self._data[key] = value
            self._reply(conn, _OK)
            self._wake_waiters(key)
        elif op == _OP_GET and len(fields) == 2 and len(fields[1]) == 8:
            key = fields[0]
            if key in self._data:
                self._reply(conn, _OK, self._data[key])
            else:
                wait_ms = min(_U64.unpack(fields[1])[0], int(MAX_WAIT_S * 1000))
                conn.waiting = key
                conn.deadline = time.monotonic() + wait_ms / 1000.0
                self._waiters.setdefault(key, []).append(conn)
        elif op == _OP_ADD and len(fields) == 2 and len(fields[1]) == 8:
            key = fields[0]
            try:
                current = int(self._data.get(key, b"0"))
            except ValueError:
                raise _Malformed("add on a key that is not a counter") from None
            value = current + _I64.unpack(fields[1])[0]
            if not -(1 << 63) <= value < (1 << 63):
                raise _Malformed("counter overflow")
            self._data[key] = str(value).encode()
            self._reply(conn, _OK, _I64.pack(value))
            self._wake_waiters(key)
        elif op == _OP_CHECK:
            self._reply(conn, _OK, bytes([all(k in self._data for k in fields)]))
        elif op == _OP_DELETE and len(fields) == 1:
            existed = self._data.pop(fields[0], None) is not None
            self._reply(conn, _OK, bytes([existed]))
        else:
            raise _Malformed(f"bad request op={op} nfields={len(fields)}")

    def _resume(self, conn: _Conn) -> None:
        def step() -> None:
            self._flush(conn)
            self._process(conn)
            self._flush(conn)
        self._guarded(conn, step)

    def _wake_waiters(self, key: bytes) -> None:
        for waiter in self._waiters.pop(key, []):
            if waiter.sock.fileno() < 0:
                continue
            waiter.waiting = None
            self._reply(waiter, _OK, self._data[key])
            self._resume(waiter)

    def _expire(self) -> None:
        now = time.monotonic()
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        for conn in list(self._conns.values()):
            if conn.sock.fileno() < 0:
                continue  # dropped by an earlier one's turn
            if conn.expires and conn.expires <= now:
                what = "did not complete its handshake" if conn.session is None else \
                    "left a request half-sent"
                _auth.warn(f"store on {self.address}: dropped {conn.peer}: it {what} in time",
                           key="store-idle")
                self._drop(conn)
            elif conn.waiting is not None and conn.deadline <= now:
                waiters = self._waiters.get(conn.waiting, [])
                if conn in waiters:
                    waiters.remove(conn)
                    if not waiters:
                        del self._waiters[conn.waiting]
                conn.waiting = None
                self._reply(conn, _TIMEOUT)
                self._resume(conn)

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
        counts = self._per_source.get(conn.source)
        if self._conns.pop(fd, None) is not None:
            self._buffered -= conn.counted
            conn.counted = 0
            if counts is not None:
                counts[0] -= 1
        self._close_frame(conn)
        self._silent.pop(fd, None)
        if self._unauth.pop(fd, None) is not None and counts is not None:
            counts[1] -= 1
        if counts is not None and counts[0] <= 0:
            del self._per_source[conn.source]
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
