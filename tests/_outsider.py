"""An outsider on loopback: a process that is not part of the job and tries to get in.

Run as ``python _outsider.py MODE ...``; it prints one JSON line per finding
(``{"what": ..., ...}``) and exits 0 when it ran to the end (whatever it
found). The tests (test_security.py, test_store_hardening.py) judge the
findings. It knows everything about a job that is not secret: the store
address, the ranks' ports and, to be as strong as possible, the job's
comm_id (which torch's store, for one, shows anyone). It does not know the
job secret.

Modes:
  attack DIR STORE_HOST STORE_PORT   the job scenario (test_security.py)
  serve NOFILE                       a store in this process, with RLIMIT_NOFILE lowered;
                                     prints its port, runs until stdin closes
  hold HOST PORT N SECONDS           open N connections, hold them, say how many got in
  flood HOST PORT MIB                send MIB MiB of junk on one connection
  get-wait HOST PORT SECRET MS       (knows the secret) GET a missing key waiting MS ms
  big-frame HOST PORT SECRET LEN MIB (knows the secret) advertise a LEN-byte request
  many-fields HOST PORT SECRET N B   (knows the secret) CHECK N keys of B bytes
  half-frame HOST PORT SECRET S      (knows the secret) half a request, then wait S s
"""
from __future__ import annotations

import hmac
import json
import os
import pickle
import socket
import struct
import sys
import time

# The tests start it with conftest.base_env(), whose PYTHONPATH reaches the
# collectives under test (the checkout, or none: an installed wheel); it puts
# nothing on sys.path itself, since the tests also import it in-process.

HELLO_MAGIC, ABORT_MAGIC, OPENING_VERSION = 0x49484C43, 0x42414C43, 3
HELLO_PART, OFFER, MAC = 48, 96, 32
CHALLENGE = 16 + MAC  # nonce_a, and the acceptor's proof of the key over it and the hello
OPENING = HELLO_PART + OFFER + MAC
REASON = 96


def say(what: str, **data) -> None:
    """One finding on stdout."""
    print(json.dumps({"what": what, **data}), flush=True)


def hello_part(comm_id: bytes, frm: int, to: int, magic: int = HELLO_MAGIC, key: bytes = b"",
               sock: int = 0, nsocks: int = 1) -> bytes:
    """The first part of a link opening (wire.h), with a random nonce: the comm_id goes as
    a tag under key (the link key; an outsider's guess), so only the job recognizes it."""
    nonce = os.urandom(16)
    tag = hmac.new(key, b"collectives hello" + comm_id + nonce, "sha256").digest()[:16]
    return struct.pack("<IHBB16sII", magic, OPENING_VERSION, sock, nsocks - 1, tag, frm, to) + \
        nonce


def abort_notice(key: bytes, comm_id: bytes, frm: int, to: int, reason: bytes) -> bytes:
    """An abort notice (wire.h) MAC'd under key (the outsider's guess of the link key)."""
    body = hello_part(comm_id, frm, to, ABORT_MAGIC, key) + reason.ljust(REASON, b"\0")[:REASON]
    return body + hmac.new(key, b"collectives abort" + body, "sha256").digest()


def wire_header(coll: int, seq: int, nbytes: int, aux: int, count: int, offset: int,
                dtype: int = 0, ctx: int = 0) -> bytes:
    """A message header (wire.h, version 2: 48 bytes) as a rank would send it; ctx is the
    communicator's context id (0: a world communicator)."""
    return struct.pack("<IBBBBIIIIQQII", 0x4C4C4F43, 2, coll, 0, dtype, seq, nbytes, aux, 0,
                       count, offset, ctx, 0)


def _wait_json(path: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            time.sleep(0.05)
    raise TimeoutError(path)


def _recv_some(sock: socket.socket, n: int, timeout: float) -> bytes:
    sock.settimeout(timeout)
    out = b""
    try:
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                break
            out += chunk
    except OSError:  # a timeout or a reset: what arrived so far
        pass
    return out


def attack(directory: str, store_host: str, store_port: int) -> None:
    """Everything an outsider tries against a running job (see test_security.py)."""
    from collectives.rendezvous import store as _store

    # 1. The store: join it, read the ranks' addresses and the comm_id, write a key.
    try:
        with _store.StoreClient(store_host, store_port, timeout=5.0) as c:
            say("store-joined", addr0=c.get("addr/0", timeout=1.0).decode(errors="replace"))
            c.set("addr/1", b"6.6.6.6\n1\nevil\n0")
    except (ConnectionError, TimeoutError) as exc:
        say("store-refused", error=str(exc))
    # The old protocol's 33-byte GET, and a GET with an absurd wait.
    old_get = b"CS\x01\x02\x00\x00\x00\x02" + struct.pack(">I", 6) + b"addr/0" + \
        struct.pack(">I", 8) + struct.pack(">Q", 1 << 40)
    with socket.create_connection((store_host, store_port), timeout=5) as s:
        s.sendall(old_get)
        got = _recv_some(s, 4096, 3.0)
        say("store-raw-get", got=got.hex(), leaked=b"addr" in got or b"127.0.0.1" in got)

    # 2. Rank 2's port, as "rank 0", before the real rank 0 connects: a link
    #    that would carry forged Bcast data and a forged pickle.
    info0 = _wait_json(os.path.join(directory, "rank0.json"), 30)
    info1 = _wait_json(os.path.join(directory, "rank1.json"), 30)
    info2 = _wait_json(os.path.join(directory, "rank2.json"), 30)
    comm_id = bytes.fromhex(info0["comm_id"])
    forged = socket.create_connection(("127.0.0.1", info2["port"]), timeout=5)
    forged.sendall(hello_part(comm_id, 0, 2))
    # 3. A fake abort notice to rank 1 under guessed keys (none, zeros, the comm_id).
    for key in (b"", bytes(32), comm_id):
        try:
            with socket.create_connection(("127.0.0.1", info1["port"]), timeout=5) as s:
                s.sendall(abort_notice(key, comm_id, 0, 1, b"ATTACKER: stop the job"))
        except OSError as exc:
            say("abort-not-sent", error=str(exc))
    say("abort-sent")
    # The ranks go on to their Bcast now.
    with open(os.path.join(directory, "attacked"), "w") as fh:
        fh.write("1")
    challenge = _recv_some(forged, CHALLENGE, 20.0)
    say("challenge", got=len(challenge))
    marker = os.path.join(directory, "pwned")
    payload = pickle.dumps(_Pwn(marker))
    try:
        forged.sendall(bytes(OFFER) + os.urandom(MAC))
        data = struct.pack("<4i", 66, 66, 66, 66)
        forged.sendall(wire_header(3, 0, len(data), 0, 4, 0) + data)
        forged.sendall(wire_header(3, 1, len(payload), 0, len(payload), 0) + payload)
    except OSError:
        pass
    answer = _recv_some(forged, 36, 5.0)
    say("link-answer", got=len(answer))
    forged.close()


class _Pwn:
    """A pickle that creates a file when it is loaded."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def serve(nofile: int) -> None:
    """A store server with few descriptors; its port on stdout; until stdin closes."""
    import resource

    from collectives.rendezvous import store as _store
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    secret = os.environ.get("COLLECTIVES_JOB_SECRET", "").encode()
    srv = _store.StoreServer("127.0.0.1", 0, secret=secret)
    say("port", port=srv.port, pid=os.getpid())
    sys.stdin.read()
    srv.close()


def hold(host: str, port: int, n: int, seconds: float, source: str = "") -> None:
    """Open n connections (from the loopback address source if given) and hold them for
    `seconds`."""
    if source and not source.startswith("127."):
        raise SystemExit("loopback sources only")
    socks, failed = [], 0
    for _ in range(n):
        try:
            socks.append(socket.create_connection((host, port), timeout=2,
                                                  source_address=(source, 0) if source else None))
        except OSError:
            failed += 1
    say("held", opened=len(socks), failed=failed)
    time.sleep(seconds)
    alive = 0
    for s in socks:  # alive: no end of stream after what the server sent
        s.setblocking(False)
        try:
            while s.recv(4096):
                pass
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
        s.close()
    say("released", alive=alive)


def flood(host: str, port: int, mib: int) -> None:
    """Send mib MiB of junk starting with the store magic on one connection."""
    sent = 0
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            block = b"CS" + os.urandom(1 << 20)
            for _ in range(mib):
                s.sendall(block)
                sent += len(block)
    except OSError as exc:
        say("flood-cut", sent=sent, error=type(exc).__name__)
        return
    say("flood-done", sent=sent)


def _client(host: str, port: int, secret: str):
    from collectives.rendezvous import store as _store
    return _store.StoreClient(host, port, timeout=5.0, secret=secret.encode())


def get_wait(host: str, port: int, secret: str, wait_ms: int) -> None:
    """A client that knows the secret asks for a missing key with an absurd wait."""
    from collectives.rendezvous import store as _store
    c = _client(host, port, secret)
    try:
        c._call(_store._OP_GET, [b"missing", struct.pack(">Q", wait_ms)], "missing", 1.0)
        say("get-answered")
    except (TimeoutError, ConnectionError) as exc:
        say("get-pending", error=type(exc).__name__)


def big_frame(host: str, port: int, secret: str, body_len: int, mib: int) -> None:
    """A client that knows the secret advertises a body_len-byte request and streams mib MiB."""
    from collectives.rendezvous import store as _store
    c = _client(host, port, secret)
    sock = c._sock
    sent = 0
    try:
        sock.sendall(_store._REQ_HEAD.pack(b"CS", 1, 2, body_len))
        block = os.urandom(1 << 20)
        for _ in range(mib):
            sock.sendall(block)
            sent += len(block)
        say("big-sent", sent=sent)
    except OSError as exc:
        say("big-cut", sent=sent, error=type(exc).__name__)


def many_fields(host: str, port: int, secret: str, nfields: int, size: int) -> None:
    """A CHECK of nfields keys of size bytes each, sent in 64 KiB pieces; the time to answer."""
    c = _client(host, port, secret)
    keys = [(b"%08d" % i).ljust(size, b"k").decode() for i in range(nfields)]
    start = time.monotonic()
    c.check(keys)
    say("checked", seconds=time.monotonic() - start, nbytes=nfields * (size + 4))


def half_frame(host: str, port: int, secret: str, seconds: float) -> None:
    """Send half a request and wait; did the store close the connection?"""
    from collectives.rendezvous import store as _store
    c = _client(host, port, secret)
    c._sock.sendall(_store._REQ_HEAD.pack(b"CS", 1, 2, 100) + b"\0" * 10)
    got = _recv_some(c._sock, 1, seconds)
    say("half-frame", closed=got == b"")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "attack":
        attack(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif mode == "serve":
        serve(int(sys.argv[2]))
    elif mode == "hold":
        hold(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), *sys.argv[6:7])
    elif mode == "get-wait":
        get_wait(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    elif mode == "big-frame":
        big_frame(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    elif mode == "many-fields":
        many_fields(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    elif mode == "half-frame":
        half_frame(sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
    elif mode == "flood":
        flood(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown mode {mode}")
