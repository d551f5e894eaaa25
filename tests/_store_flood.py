"""Floods of a store (test_store_flood.py, test_store_totals.py).

``python _store_flood.py connect HOST PORT SECONDS MAX_CONNECTIONS HOLD``
(an outsider): for
at most SECONDS, open connections to HOST:PORT as fast as one thread can
(non-blocking connects, never more than MAX_CONNECTIONS in all), keep the
newest HOLD of them open without sending a byte (older ones are closed), and
close everything at the end, or at SIGTERM. It starts before the port
listens (a refused connect counts as an attempt). It prints a JSON line
``{"flooding": true}`` once 100 attempts are made (the test starts its job
then, under the flood), and at the end one with attempts, connected (accepted
by the kernel), seconds, rate. Only loopback is allowed.

``python _store_flood.py frames HOST PORT SECRET N MIB`` (knows the secret):
open N authenticated connections and on each send the head of a 16 MiB
request and MIB MiB of its body, leaving it unfinished; then wait for a line
on stdin and say how many of them the store cut.
"""
from __future__ import annotations

import collections
import errno
import json
import signal
import socket
import sys
import time


def main(host: str, port: int, seconds: float, max_connections: int, hold: int) -> None:
    if host not in ("127.0.0.1", "::1", "localhost"):
        raise SystemExit("loopback only")
    seconds = min(seconds, 30.0)
    held: collections.deque = collections.deque()
    attempts = connected = 0
    start = time.monotonic()
    stop = [start + seconds]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, 0.0))
    while attempts < max_connections and time.monotonic() < stop[0]:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        attempts += 1
        if attempts == 100:
            print(json.dumps({"flooding": True}), flush=True)
        rc = s.connect_ex((host, port))
        if rc in (0, errno.EINPROGRESS):
            connected += 1
            held.append(s)
            while len(held) > hold:
                held.popleft().close()
        else:
            s.close()
            if rc == errno.ECONNREFUSED:
                time.sleep(0.001)  # not listening yet
    took = time.monotonic() - start
    for s in held:
        s.close()
    print(json.dumps({"attempts": attempts, "connected": connected, "seconds": took,
                      "rate": attempts / max(took, 1e-9)}), flush=True)


def frames(host: str, port: int, secret: str, n: int, mib: int) -> None:
    from collectives.rendezvous import store as _store
    if host not in ("127.0.0.1", "::1", "localhost"):
        raise SystemExit("loopback only")
    clients = [_store.StoreClient(host, port, timeout=10, secret=secret.encode())
               for _ in range(min(n, 64))]
    block = b"\0" * (1 << 20)
    cut = 0
    for c in clients:
        c._sock.settimeout(10)
        try:
            c._sock.sendall(_store._REQ_HEAD.pack(b"CS", 1, 2, _store.MAX_FRAME))
            for _ in range(min(mib, 15)):
                c._sock.sendall(block)
        except OSError:
            cut += 1
    print(json.dumps({"sent": len(clients)}), flush=True)
    sys.stdin.readline()
    for c in clients:
        try:
            c._sock.settimeout(0.2)
            if c._sock.recv(1) == b"":
                cut += 1
        except socket.timeout:
            pass
        except OSError:
            cut += 1
    print(json.dumps({"cut": cut}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "connect":
        main(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    elif sys.argv[1] == "frames":
        frames(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]}")
