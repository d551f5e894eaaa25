"""Fuzzing the parsers a peer's bytes reach (issue 20, section 4); see tests/_fuzz.py.

Targets: the store's frame splitter and field parser (pure functions); the
store server over real sockets, unauthenticated and authenticated (mutated
frames that carry valid MACs, so the mutations reach the parser and the
handlers); a rank's listener (mutated link openings and abort notices, and,
once a link is authenticated with the right key, mutated message headers and
payloads, which reach the wire header check of native/wire.c). Invariants:
no crash (the test process hosts the C code), no hang (every wait is
bounded), nothing allocated or buffered for an advertised size that is not
bounded and authenticated first, the server keeps serving.
"""
from __future__ import annotations

import os
import random
import socket
import struct
import threading
import time

import numpy as np
import pytest

import _fuzz
import _outsider
from collectives.rendezvous import auth as _auth, store as _store
from collectives._core import Communicator
from collectives.rendezvous.store import StoreClient, StoreServer

SECRET = b"fuzzing-secret-0123456789abcdef"
# Each target's deadline: its fuzzing time, plus start-up and the checks after.
DEADLINE = 2 * _fuzz.seconds() + 60


def _fail(name: str, i: int, data: bytes, why: str) -> None:
    path = _fuzz.save_crash(f"{name}-{_fuzz.seed()}-{i}.bin", data)
    pytest.fail(f"{name}: input {i} (seed {_fuzz.seed()}, saved as {path}): {why}")


def test_corpus_is_there():
    for kind in ("store", "link", "wire"):
        assert len(_fuzz.load(kind)) >= 2, kind


# ------------------------------------------------------------ store parser

@pytest.mark.timeout(DEADLINE)
def test_fuzz_store_frame_parser():
    rng = random.Random(_fuzz.seed())
    corpus = _fuzz.load("store")
    gen = _fuzz.inputs(rng, corpus)
    limit = 1 << 16  # a small frame limit, so that mutations reach it

    def step(i: int) -> None:
        data = next(gen)
        t0 = time.perf_counter()
        try:
            split = _store.split_frame(data, limit)
            if split is not None:
                op, nfields, used = split
                if used > _store._REQ_HEAD.size + limit + _store._MAC:
                    _fail("store-parser", i, data, f"frame of {used} bytes passed a {limit} limit")
                body = data[_store._REQ_HEAD.size:used - _store._MAC]
                if len(data) >= used:
                    fields = _store.parse_fields(body, nfields)
                    if sum(len(f) for f in fields) > len(body) or len(fields) != nfields:
                        _fail("store-parser", i, data, "fields do not fit the body")
        except _store._Malformed:
            pass
        except Exception as exc:  # noqa: BLE001 -- anything else is a bug
            _fail("store-parser", i, data, f"{type(exc).__name__}: {exc}")
        if time.perf_counter() - t0 > 0.5:
            _fail("store-parser", i, data, "took over 0.5 s")

    n = _fuzz.run_for(_fuzz.seconds(), step)
    print(f"{n} inputs")
    assert n > len(corpus)


# ------------------------------------------------------------ store server

class _Session:
    """An authenticated raw connection to the store (its counters kept here)."""

    def __init__(self, port: int) -> None:
        self.client = StoreClient("127.0.0.1", port, timeout=5, secret=SECRET)
        self.sock = self.client._sock
        self.session = self.client._session

    def send(self, frame: bytes, valid_mac: bool) -> None:
        tag = _store._request_tag(self.session, self.client._rseq, frame) if valid_mac \
            else os.urandom(32)
        self.client._rseq += 1
        self.sock.sendall(frame + tag)

    def close(self) -> None:
        self.client.close()


def _fix_head(data: bytes) -> bytes:
    """The head's body length set to what follows, so the fields are what is mutated."""
    if len(data) < _store._REQ_HEAD.size:
        return data
    magic, op, nfields, _ = _store._REQ_HEAD.unpack_from(data)
    return _store._REQ_HEAD.pack(b"CS", op, nfields, len(data) - _store._REQ_HEAD.size) + \
        data[_store._REQ_HEAD.size:]


@pytest.mark.timeout(DEADLINE)
def test_fuzz_store_server():
    rng = random.Random(_fuzz.seed() + 1)
    corpus = _fuzz.load("store")
    gen = _fuzz.inputs(rng, corpus)
    srv = StoreServer("127.0.0.1", secret=SECRET)
    sess = None
    try:
        def step(i: int) -> None:
            nonlocal sess
            data = next(gen)
            mode = rng.randrange(4)
            try:
                if mode == 0:  # an outsider: bytes instead of a handshake
                    with socket.create_connection(("127.0.0.1", srv.port), timeout=2) as s:
                        s.sendall(data)
                        s.settimeout(0.05)
                        try:
                            s.recv(4096)
                        except (socket.timeout, OSError):
                            pass
                    return
                if sess is None:
                    sess = _Session(srv.port)
                frame = _fix_head(data) if mode in (1, 2) else data
                sess.send(frame, valid_mac=mode != 3)
                sess.sock.settimeout(0.05)
                try:
                    sess.sock.recv(1 << 16)
                except socket.timeout:
                    pass  # waiting (a GET) or wanting more bytes
                sess.close()  # each input on a connection of its own
                sess = None
            except OSError:
                if sess is not None:
                    sess.close()
                sess = None
            if not srv._thread.is_alive():
                _fail("store-server", i, data, "the server thread died")
            for conn in list(srv._conns.values()):  # what it buffers, bounded
                cap = max(_store._KNOCK.size, _store._PROOF.size) if conn.session is None else \
                    2 * (_store.MAX_FRAME + _store._REQ_HEAD.size + _store._MAC)
                if len(conn.inbuf) > cap:
                    _fail("store-server", i, data, f"buffered {len(conn.inbuf)} bytes")

        n = _fuzz.run_for(_fuzz.seconds(), step)
        print(f"{n} inputs")
        assert n > len(corpus)
        with StoreClient("127.0.0.1", srv.port, timeout=5, secret=SECRET) as c:
            c.set("after", b"fuzz")
            assert c.get("after", timeout=1) == b"fuzz"
        assert srv._thread.is_alive()
    finally:
        if sess is not None:
            sess.close()
        srv.close()


# ------------------------------------------------ link opening + wire header

KEY = _auth.link_key(SECRET)


def _waiting_rank(cid: bytes, timeout: float):
    c1 = Communicator(1, 2, "127.0.0.1", cid)
    c1.set_link_key(KEY)
    c1.set_peer(0, "127.0.0.1", 1)
    c1.set_peer(1, "127.0.0.1", c1.port)
    out = {}

    def run():
        x = np.arange(4, dtype=np.int32)
        y = np.zeros(4, dtype=np.int32)
        try:
            c1.allreduce(x, y, algorithm=random.choice(["ring", "tree"]), timeout=timeout)
            out["ok"] = True
        except RuntimeError as exc:
            out["error"] = str(exc)
        except BaseException as exc:  # noqa: BLE001 -- reported
            out["bug"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return c1, t, out


_recv = _outsider._recv_some  # up to n bytes, whatever arrived before the timeout


@pytest.mark.timeout(DEADLINE)
def test_fuzz_link_opening_and_wire_header():
    rng = random.Random(_fuzz.seed() + 2)
    links = _fuzz.load("link")
    wires = _fuzz.load("wire")
    gen = _fuzz.inputs(rng, links)
    wgen = _fuzz.inputs(rng, wires)
    cid = os.urandom(16)
    wait = 0.3

    def step(i: int) -> None:
        data = bytearray(next(gen))
        if len(data) >= 24 and rng.random() < 0.7:
            data[8:24] = cid  # as an outsider who read the comm_id
        c1, t, out = _waiting_rank(cid, wait)
        sent = bytes(data)
        try:
            with socket.create_connection(("127.0.0.1", c1.port), timeout=2) as s:
                if rng.random() < 0.5:  # raw bytes: an outsider
                    s.sendall(sent)
                    _recv(s, 64, 0.05)
                else:  # knows the key: a link is made, then mutated messages
                    hello = _outsider.hello_part(cid, 0, 1, key=KEY)
                    s.sendall(hello)
                    challenge = _recv(s, _outsider.CHALLENGE, 1.0)[:16]
                    offer = bytes(sent[:96]).ljust(96, b"\0")
                    mac = _auth.mac(KEY, b"collectives open", challenge, hello, offer)
                    s.sendall(offer + mac)
                    if len(_recv(s, 36, 1.0)) == 36:
                        for _ in range(rng.randint(1, 3)):
                            msg = next(wgen)
                            sent += msg
                            s.sendall(msg + rng.randbytes(rng.choice([0, 8, 16, 64])))
                        _recv(s, 4096, 0.05)
        except OSError:
            pass
        t.join(wait + 5)
        if t.is_alive():
            _fail("link", i, sent, "the waiting rank did not return within its timeout + 5 s")
        if "bug" in out:
            _fail("link", i, sent, out["bug"])
        c1.close()

    n = _fuzz.run_for(_fuzz.seconds(), step)
    print(f"{n} inputs")
    assert n >= 2
