"""Link openings at one rank's listener (issue 37, section 2).

Every lower rank may dial all of its COLLECTIVES_NSOCKS connections before a
rank first serves its listener; with 17 lower ranks x 16 connections that is
272 half-open openings, more than the fixed table of 256 that evicted the
oldest (their dialers then failed). The ranks here are communicators of one
process (one thread each), so that the openings can be made to pile up first:
the last rank serves only once the kernel holds them all (23 lower ranks x 16:
368 at once).
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import base_env

pytestmark = pytest.mark.timeout(120)

N, NSOCKS = 24, 16

SCRIPT = r"""
import os, sys, threading, time
import numpy as np
from collectives._core import Communicator, p2p_recv, p2p_send
from collectives.rendezvous import auth

N, LAST = int(sys.argv[1]), int(sys.argv[1]) - 1
cid = os.urandom(16)
key = auth.link_key(b"openings-secret-0123456789abcdef")
comms = [Communicator(r, N, "127.0.0.1", cid) for r in range(N)]
for c in comms:
    c.set_link_key(key)
    for r, peer in enumerate(comms):
        c.set_peer(r, "127.0.0.1", peer.port)
errors = []

def send(r):
    try:
        p2p_send(comms[r], np.full(4, r, np.int32), LAST, 7, timeout=20)
    except Exception as exc:
        errors.append(f"rank {r}: {exc}")

def held(port):
    # connections to the last rank's port the kernel holds (accepted or not)
    n = 0
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if int(f[1].split(":")[1], 16) == port and f[3] == "01":
            n += 1
    return n

senders = [threading.Thread(target=send, args=(r,), daemon=True) for r in range(LAST)]
for t in senders:
    t.start()
want, end = LAST * int(os.environ["COLLECTIVES_NSOCKS"]), time.monotonic() + 30
while held(comms[LAST].port) < want and time.monotonic() < end:
    time.sleep(0.02)
time.sleep(0.5)  # the last of them reach the listener's accept queue
print("held", held(comms[LAST].port), "of", want, flush=True)
got = []
for r in range(LAST):
    buf = np.zeros(4, np.int32)
    try:
        p2p_recv(comms[LAST], buf, r, 7, timeout=5)
        got.append(int(buf[0]))
    except Exception as exc:
        errors.append(f"rank {LAST} from {r}: {exc}")
for t in senders:
    t.join(25)
print("got", got, flush=True)
for e in errors:
    print("error", e, flush=True)
os._exit(1 if errors or got != list(range(LAST)) else 0)
"""


def test_every_lower_rank_dialing_all_its_connections_at_once_gets_through(tmp_path):
    path = tmp_path / "openings.py"
    path.write_text(SCRIPT)
    env = base_env({"COLLECTIVES_NSOCKS": str(NSOCKS), "COLLECTIVES_TRANSPORT": "tcp"})
    out = subprocess.run([sys.executable, str(path), str(N)], capture_output=True, env=env,
                         timeout=100)
    text = out.stdout.decode() + out.stderr.decode()[-3000:]
    assert f"held {(N - 1) * NSOCKS} of {(N - 1) * NSOCKS}" in text, text
    assert out.returncode == 0, text


def test_a_ranks_listener_binds_only_the_address_the_job_uses():
    """A rank listens on the address it publishes, not on every address of the host:
    another local address (127.0.0.2, also this host's) finds nothing there."""
    import socket

    from collectives._core import Communicator

    core = Communicator(0, 2, "127.0.0.1")
    try:
        socket.create_connection(("127.0.0.1", core.port), timeout=2).close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", core.port), timeout=2).close()
    finally:
        core.close()


def test_an_impostor_at_a_peers_address_learns_neither_the_comm_id_nor_the_shm_path():
    """A process at a peer's address (poisoned outside the store) gets only the hello:
    the comm_id travels as a tag under the job's key, and the offer (which names the
    shared-memory segment) waits for the acceptor to prove the key, which it cannot."""
    import os
    import socket
    import threading

    import numpy as np

    from collectives._core import Communicator, CollectivesError
    from collectives.rendezvous import auth

    key = auth.link_key(b"impostor-test-secret-0123456789ab")
    cid = os.urandom(16)
    impostor = socket.socket()
    impostor.bind(("127.0.0.1", 0))
    impostor.listen(4)
    heard = bytearray()

    def serve():
        impostor.settimeout(10)
        try:
            conn, _ = impostor.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(3)
            try:
                heard.extend(conn.recv(4096))
                conn.sendall(os.urandom(48))  # a challenge it cannot back with the key
                while True:
                    b = conn.recv(4096)
                    if not b:
                        break
                    heard.extend(b)
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    core = Communicator(0, 2, "127.0.0.1", cid)
    try:
        core.set_link_key(key)
        core.set_peer(0, "127.0.0.1", core.port)
        core.set_peer(1, "127.0.0.1", impostor.getsockname()[1])
        for r in range(2):
            core.set_peer_host(r, "one-host")  # so that the link would offer shared memory
        with pytest.raises(CollectivesError, match="does not prove this job's secret"):
            core.allreduce(np.ones(4, np.float32), np.zeros(4, np.float32), timeout=5)
    finally:
        core.close()
        t.join(10)
        impostor.close()
    assert len(heard) == 48, bytes(heard)  # the hello part, nothing after it
    assert cid not in bytes(heard) and b"/dev/shm" not in bytes(heard) \
        and b"collectives-" not in bytes(heard), bytes(heard)
