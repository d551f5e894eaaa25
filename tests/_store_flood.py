"""An outsider that floods a TCP port with connections (test_store_flood.py).

Run as ``python _store_flood.py HOST PORT SECONDS MAX_CONNECTIONS HOLD``: for
at most SECONDS, open connections to HOST:PORT as fast as one thread can
(non-blocking connects, never more than MAX_CONNECTIONS in all), keep the
newest HOLD of them open without sending a byte (older ones are closed), and
close everything at the end. It starts before the port listens (a refused
connect counts as an attempt). It prints one JSON line: attempts, connected
(accepted by the kernel), seconds, rate. Only loopback is allowed.
"""
from __future__ import annotations

import collections
import errno
import json
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
    end = start + seconds
    while attempts < max_connections and time.monotonic() < end:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        attempts += 1
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


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
