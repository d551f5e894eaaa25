"""COLLECTIVES_NSOCKS: a TCP link of k connections, its stream striped over them.

Correctness at 2, 3 and 4 ranks for k = 2 and 4 (every collective family,
point-to-point and a subcommunicator, sizes around the 64 KiB stripe unit,
zero-length and odd ones), k connections per connected peer counted from
/proc, ranks that disagree on k failing at once naming each other, and
hostile openings (a bad or duplicate connection index, a k that differs,
shared memory offered on a later connection) refused with an error naming
the peer, never taken into a link.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest

from conftest import base_env, free_port, run_world

BODY = r"""
import os
import socket
import time
import numpy as np
from collectives import MPI
from collectives.rendezvous import world as _world
comm = MPI.COMM_WORLD
core = _world._state.core
n, r = comm.size, comm.rank
K = int(os.environ["COLLECTIVES_NSOCKS"])
tcp = os.environ.get("COLLECTIVES_TRANSPORT") == "tcp"

light = os.environ.get("NSOCKS_LIGHT") == "1"  # many ranks: the link set-up is what counts
if light:
    # Every lower rank dials the last one while it sleeps, so that all their
    # connections wait in its backlog and it accepts them in one go.
    one = np.zeros(1, np.int32)
    if r < n - 1:
        comm.Send(np.full(1, r, np.int32), dest=n - 1)
    else:
        time.sleep(1.5)
        for src in range(n - 1):
            comm.Recv(one, source=src)
            check(dict(c="first", src=src), one, np.full(1, src, np.int32), "int32")
# float32 elements: the stripe unit is 16384 of them
for algo in ("ring", "tree", "butterfly"):
    for cnt in ((7, 262147) if light else (0, 1, 7, 16383, 16384, 16385, 49157, 262147, 1 << 21)):
        base = (np.arange(cnt) % 251).astype(np.float32)
        x = base * (r + 1)
        y = np.full(cnt, -1, np.float32)
        core.allreduce(x, y, algorithm=algo)
        check(dict(c="allreduce", algo=algo, count=cnt), y, base * (n * (n + 1) // 2), "float32")
for cnt in (0, 1, 65535, 65537, 300001):
    buf = (np.arange(cnt) % 253).astype(np.uint8) if r == n - 1 else np.zeros(cnt, np.uint8)
    comm.Bcast(buf, root=n - 1)
    check(dict(c="bcast", count=cnt), buf, (np.arange(cnt) % 253).astype(np.uint8), "uint8")
for cnt in (0, 3, 70001):
    mine = np.full(cnt, r + 1, np.int8)
    out = np.zeros(cnt * n, np.int8)
    comm.Allgather(mine, out)
    check(dict(c="allgather", count=cnt), out, np.repeat(np.arange(1, n + 1, dtype=np.int8), cnt),
          "int8")
# point-to-point with every peer (so every pair has a link), odd sizes
for peer in range(n):
    if peer == r:
        continue
    for cnt in (1, 100003):
        send = (np.arange(cnt) * (r + 3) % 256).astype(np.uint8)
        got = np.zeros(cnt, np.uint8)
        comm.Sendrecv(send, dest=peer, sendtag=cnt, recvbuf=got, source=peer, recvtag=cnt)
        check(dict(c="sendrecv", peer=peer, count=cnt), got,
              (np.arange(cnt) * (peer + 3) % 256).astype(np.uint8), "uint8")
# a subcommunicator over the parent's links
sub = comm.Split(color=r % 2, key=r)
x = np.full(100003, r, np.float64)
sub.Allreduce(MPI.IN_PLACE, x)
check(dict(c="sub"), x, np.full(100003, sum(q for q in range(n) if q % 2 == r % 2), np.float64),
      "float64")
sub.Free()

ports = comm.allgather(core.port)
accepted, dialed = 0, {}
for fd in os.listdir("/proc/self/fd"):
    try:
        if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:["):
            continue
        s = socket.socket(fileno=os.dup(int(fd)))
    except OSError:
        continue
    try:  # a connected TCP socket's two ends (not /proc/net/tcp: it skips rows under churn)
        if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6):
            lport, rport = s.getsockname()[1], s.getpeername()[1]
            if lport == ports[r]:
                accepted += 1
            elif rport in ports:
                dialed[ports.index(rport)] = dialed.get(ports.index(rport), 0) + 1
    except OSError:
        pass  # a listener: no peer
    finally:
        s.close()
emit("sockets", accepted=accepted, dialed=dialed, k=K if tcp else 1)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n,k,transport", [(2, 2, "tcp"), (2, 4, "tcp"), (3, 2, "tcp"),
                                           (3, 4, "tcp"), (4, 2, "tcp"), (4, 4, "tcp"),
                                           (3, 4, "")])
def test_striped_links_are_correct_and_have_k_sockets(n, k, transport):
    env = {"COLLECTIVES_NSOCKS": str(k), "COLLECTIVES_TRANSPORT": transport}
    res = run_world(n, BODY, env=env, timeout=80).assert_ok()
    _check_sockets(res, n, k, transport)


@pytest.mark.timeout(90)
def test_sixteen_sockets_from_five_lower_ranks_at_once():
    # 80 connections opening at rank 5 together: more than the 64 half-open
    # ones a listener used to keep before evicting the oldest.
    env = {"COLLECTIVES_NSOCKS": "16", "COLLECTIVES_TRANSPORT": "tcp", "NSOCKS_LIGHT": "1"}
    res = run_world(6, BODY, env=env, timeout=80).assert_ok()
    _check_sockets(res, 6, 16, "tcp")


def _check_sockets(res, n, k, transport):
    for rank in range(n):
        rec = res[rank].one("sockets")
        per = rec["k"]  # shared-memory links keep one socket, their doorbell
        assert per == (k if transport == "tcp" else 1)
        assert rec["accepted"] == per * rank, res.report()
        assert {int(p): c for p, c in rec["dialed"].items()} == \
            {p: per for p in range(rank + 1, n)}, res.report()


MISMATCH_BODY = r"""
import numpy as np
from collectives import MPI
comm = MPI.COMM_WORLD
try:
    x = np.ones(100000, np.float32)
    comm.Allreduce(MPI.IN_PLACE, x)
    emit("result", ok=True)
except Exception as exc:
    emit("result", ok=False, error=str(exc))
"""


@pytest.mark.timeout(60)
def test_ranks_that_disagree_on_nsocks_fail_naming_each_other():
    port = free_port()

    def rank_env(rank, n):
        return {"COLLECTIVES_RANK": rank, "COLLECTIVES_SIZE": n, "COLLECTIVES_LOCAL_RANK": rank,
                "COLLECTIVES_LOCAL_SIZE": n, "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{port}",
                "COLLECTIVES_NSOCKS": "4" if rank == 2 else "2"}

    res = run_world(3, MISMATCH_BODY, rank_env=rank_env, timeout=50, collective_timeout=30,
                    env={"COLLECTIVES_TRANSPORT": "tcp"})
    assert not res.timed_out and res.elapsed < 20, res.report()
    errs = {rank: res[rank].one("result") for rank in range(3)}
    for rank in (0, 1):
        e = errs[rank].get("error", "")
        # either it dialed rank 2 and was refused, or it heard of that from a peer
        assert "COLLECTIVES_NSOCKS" in e and "rank 2" in e, res.report()
    e2 = errs[2].get("error", "")
    assert "COLLECTIVES_NSOCKS=2" in e2 and "this rank with 4" in e2, res.report()
    assert "rank 0" in e2 or "rank 1" in e2, res.report()


# ---------------------------------------------------------- hostile openings
# One process: rank 1 of a 2-rank communicator (COLLECTIVES_NSOCKS=2) waits
# in an allreduce for rank 0, whose connections this script opens by hand
# with the job's key and fills with the case's hello.
HOSTILE = r"""
import json, os, socket, struct, sys, threading, time
import numpy as np
import _outsider
from collectives.rendezvous import auth as _auth
from collectives._core import Communicator
KEY = _auth.link_key(b"s3cret-for-nsocks-tests-0123456789abcdef")
case = sys.argv[1]

def recv_some(s, n, timeout):
    s.settimeout(timeout)
    got = b""
    try:
        while len(got) < n:
            b = s.recv(n - len(got))
            if not b:
                break
            got += b
    except OSError:
        pass
    return got

def hello(cid, sock, k, key):
    return _outsider.hello_part(cid, 0, 1, key=key, sock=sock, nsocks=k)

def opening(port, cid, sock, k, kind=0, key=KEY):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    h = hello(cid, sock, k, key)
    s.sendall(h)
    challenge = recv_some(s, _outsider.CHALLENGE, 3.0)[:16]
    offer = struct.pack("<I", kind).ljust(96, b"\0")
    s.sendall(offer + _auth.mac(key, b"collectives open", challenge, h, offer))
    answer = recv_some(s, 36, 3.0)
    word = struct.unpack("<I", answer[:4])[0] if len(answer) == 36 else None
    if word is not None:
        assert answer[4:] == _auth.mac(KEY, b"collectives answer", challenge, h, answer[:4])
    return s, word

cid = os.urandom(16)
c1 = Communicator(1, 2, "127.0.0.1", cid)
c1.set_link_key(KEY)
c1.set_peer(0, "127.0.0.1", 1)
c1.set_peer(1, "127.0.0.1", c1.port)
out = {}
def run():
    try:
        c1.allreduce(np.ones(4, np.int32), np.zeros(4, np.int32), timeout=4.0)
        out["result"] = "linked"
    except Exception as exc:
        out["error"] = str(exc)
t = threading.Thread(target=run, daemon=True)
t.start()
start = time.monotonic()
socks, words = [], []
plan = {"duplicate": [(0, 2, 0), (0, 2, 0)], "mismatch": [(0, 4, 0)], "bad_index": [(3, 2, 0)],
        "shm_later": [(1, 2, 1)], "wrong_key": [(0, 4, 0)]}[case]
for sock, k, kind in plan:
    s, w = opening(c1.port, cid, sock, k, kind, key=bytes(32) if case == "wrong_key" else KEY)
    socks.append(s)
    words.append(w)
t.join(10)
out["took"] = time.monotonic() - start
out["words"] = words
for s in socks:
    s.close()
c1.close()
print(json.dumps(out))
"""

REFUSED = 2


def _hostile(case: str, tmp_path) -> dict:
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE)
    proc = subprocess.run([sys.executable, str(script), case], capture_output=True, text=True,
                          env=base_env({"COLLECTIVES_NSOCKS": "2"}), timeout=30)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


def _refusal(reason: int) -> int:
    return REFUSED | reason << 8 | 2 << 16  # the acceptor's COLLECTIVES_NSOCKS=2


@pytest.mark.timeout(40)
@pytest.mark.parametrize("case,words,text", [
    ("duplicate", [0, _refusal(2)], "rank 0 opened connection 0 of its link twice"),
    ("mismatch", [_refusal(1)], "rank 0 opens its links with COLLECTIVES_NSOCKS=4 TCP "
                                "connections, this rank with 2"),
    ("bad_index", [_refusal(2)], "rank 0 named connection 3 of a link of 2"),
    ("shm_later", [_refusal(2)], "rank 0 offered shared memory on connection 1 of a link of 2"),
])
def test_hostile_opening_is_refused_naming_the_peer(case, words, text, tmp_path):
    out = _hostile(case, tmp_path)
    assert out["words"] == words, out
    # the waiting rank fails at once (its timeout is 4 s), naming rank 0
    assert text in out.get("error", "") and out["took"] < 3.0, out
    assert "refused a link opening from rank 0" in out["stderr"]


@pytest.mark.timeout(40)
def test_opening_without_the_key_cannot_make_a_rank_refuse(tmp_path):
    # Unauthenticated bytes are dropped as noise: no answer, no error in
    # the rank's name, the waiting rank just runs into its own deadline.
    out = _hostile("wrong_key", tmp_path)
    assert out["words"] == [None], out
    assert "timed out waiting for rank 0" in out.get("error", ""), out
    assert "COLLECTIVES_NSOCKS" not in out.get("error", ""), out


def test_nsocks_is_declared_and_checked():
    from collectives import config
    rows = {name: (default, allowed) for name, default, _desc, allowed in config.params()}
    assert rows["COLLECTIVES_NSOCKS"] == ("1", "integer, 1 to 16")
    config.check_env({"COLLECTIVES_NSOCKS": "16"})
    for bad in ("0", "17", "two"):
        with pytest.raises(ValueError, match="COLLECTIVES_NSOCKS"):
            config.check_env({"COLLECTIVES_NSOCKS": bad})
