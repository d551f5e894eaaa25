"""COLLECTIVES_ENCRYPT=1: TCP links sealed in AES-256-GCM records (native/transport/crypt.h).

The cipher and key derivation through the loaded libcrypto against RFC 5869's
and the GCM specification's vectors; every collective family, point-to-point
and a subcommunicator at 2 and 3 ranks over TCP, on one and on four sockets
per link; an independent implementation of the record format in this file
(HKDF from hmac, AES-GCM from the core's sealing of the vectors) reading and
writing a live link; ranks that disagree on the variable, a job without a
secret, a libcrypto that cannot be loaded; and records altered on the wire
(a flipped bit, a replayed record, an overlong length) breaking the
communicator with an error naming the peer, never delivered.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
import subprocess
import sys

import pytest

from conftest import base_env, free_port, run_world

SECRET = "encrypt-tests-secret-0123456789abcdef"
ENC = {"COLLECTIVES_ENCRYPT": "1", "COLLECTIVES_JOB_SECRET": SECRET}


def _core():
    from collectives import _core
    return _core


def _hkdf(ikm: bytes, salt: bytes, info: bytes, n: int) -> bytes:
    """RFC 5869 from hmac alone, to check the library's and the links' key schedule."""
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    out, block, i = b"", b"", 1
    while len(out) < n:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:n]


def test_hkdf_and_aes_gcm_through_libcrypto_match_the_published_vectors():
    core = _core()
    assert core.crypt_lib_error() is None
    # RFC 5869 A.1 and A.3 (no salt, no info)
    okm = core.crypt_hkdf(b"\x0b" * 22, bytes(range(13)), bytes(range(0xf0, 0xfa)), 42)
    assert okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
                         "34007208d5b887185865")
    okm = core.crypt_hkdf(b"\x0b" * 22, b"", b"", 42)
    assert okm.hex() == ("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d"
                         "9d201395faa4b61a96c8")
    assert _hkdf(b"\x0b" * 22, b"", b"", 42) == okm
    # The GCM specification's test case 16: AES-256, 60-byte plaintext, 20 bytes of AAD
    key = bytes.fromhex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308")
    pt = bytes.fromhex("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
                       "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39")
    aad = bytes.fromhex("feedfacedeadbeeffeedfacedeadbeefabaddad2")
    sealed = core.crypt_seal(key, bytes.fromhex("cafebabefacedbaddecaf888"), aad, pt)
    assert sealed.hex() == ("522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
                            "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
                            "76fc6ece0f4e1768cddf8853bb2d551b")


GRID = r"""
import os
import numpy as np
from collectives import MPI
from collectives.rendezvous import world as _world
comm = MPI.COMM_WORLD
core = _world._state.core
n, r = comm.size, comm.rank
# float32 counts around a record (64 KiB = 16384 elements) and a segment
COUNTS = (0, 1, 7, 16383, 16384, 16385, 262147, 1 << 21)
for algo in ("ring", "tree", "butterfly"):
    for cnt in COUNTS:
        base = (np.arange(cnt) % 251).astype(np.float32)
        y = np.full(cnt, -1, np.float32)
        core.allreduce(base * (r + 1), y, algorithm=algo)
        check(dict(c="allreduce", algo=algo, count=cnt), y, base * (n * (n + 1) // 2), "float32")
for dtype in ("int8", "int32", "int64", "float64"):
    for cnt in (5, 70001):
        x = np.full(cnt, r + 1, dtype)
        comm.Allreduce(MPI.IN_PLACE, x, op=MPI.MAX)
        check(dict(c="max", dtype=dtype, count=cnt), x, np.full(cnt, n, dtype), dtype)
for root in range(n):
    for cnt in (0, 1, 65535, 65537, 300001):
        buf = (np.arange(cnt) % 253).astype(np.uint8) if r == root else np.zeros(cnt, np.uint8)
        comm.Bcast(buf, root=root)
        check(dict(c="bcast", root=root, count=cnt), buf, (np.arange(cnt) % 253).astype(np.uint8), "uint8")
for cnt in (0, 3, 70001):
    mine = np.full(cnt, r + 1, np.int8)
    out = np.zeros(cnt * n, np.int8)
    comm.Allgather(mine, out)
    check(dict(c="allgather", count=cnt), out, np.repeat(np.arange(1, n + 1, dtype=np.int8), cnt), "int8")
    send = np.arange(cnt * n, dtype=np.int32) + 1000 * r
    got = np.zeros(cnt * n, np.int32)
    comm.Alltoall(send, got)
    want = np.concatenate([np.arange(r * cnt, (r + 1) * cnt, dtype=np.int32) + 1000 * q for q in range(n)]) \
        if cnt else np.zeros(0, np.int32)
    check(dict(c="alltoall", count=cnt), got, want, "int32")
for cnt in (1, 40000):
    x = np.full(cnt * n, r + 1, np.float64)
    out = np.zeros(cnt, np.float64)
    comm.Reduce_scatter_block(x, out)
    check(dict(c="reduce_scatter", count=cnt), out, np.full(cnt, n * (n + 1) / 2), "float64")
obj = comm.bcast({"from": 0, "data": list(range(100))} if r == 0 else None, root=0)
check(dict(c="bcast_obj"), np.array(obj["data"]), np.arange(100), "int64")
for peer in range(n):
    if peer == r:
        continue
    for cnt in (1, 100003, 1 << 20):
        send = (np.arange(cnt) * (r + 3) % 256).astype(np.uint8)
        got = np.zeros(cnt, np.uint8)
        comm.Sendrecv(send, dest=peer, sendtag=cnt, recvbuf=got, source=peer, recvtag=cnt)
        check(dict(c="sendrecv", peer=peer, count=cnt), got,
              (np.arange(cnt) * (peer + 3) % 256).astype(np.uint8), "uint8")
sub = comm.Split(color=r % 2, key=r)
x = np.full(100003, r, np.float64)
sub.Allreduce(MPI.IN_PLACE, x)
check(dict(c="sub"), x, np.full(100003, sum(q for q in range(n) if q % 2 == r % 2), np.float64), "float64")
sub.Free()
comm.Barrier()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,k", [(2, 1), (3, 1), (2, 4), (3, 4)])
def test_collective_grid_over_encrypted_tcp(n, k):
    env = {**ENC, "COLLECTIVES_TRANSPORT": "tcp", "COLLECTIVES_NSOCKS": str(k),
           "COLLECTIVES_DEBUG": "INFO", "COLLECTIVES_DEBUG_SUBSYS": "NET"}
    res = run_world(n, GRID, env=env, timeout=110).assert_ok()
    for rank in range(n):  # every link of the rank says it encrypts
        links = [l for l in res[rank].stderr.splitlines() if "<-> rank" in l]
        assert len(links) == n - 1 and all("AES-256-GCM" in l for l in links), res.report()


@pytest.mark.timeout(60)
def test_shared_memory_links_are_not_encrypted():
    # Same host, default transport: shm links carry the bytes and no record
    # is sealed, so even the flipping fault (which hits a sealed record) changes nothing.
    env = {**ENC, "COLLECTIVES_ENCRYPT_FAULT": "flip", "COLLECTIVES_DEBUG": "INFO",
           "COLLECTIVES_DEBUG_SUBSYS": "NET"}
    body = ("import numpy as np\nfrom collectives import MPI\nc = MPI.COMM_WORLD\n"
            "for cnt in (7, 1 << 20):\n"
            "    x = np.ones(cnt, np.float32)\n    c.Allreduce(MPI.IN_PLACE, x)\n"
            "    check(dict(count=cnt), x, np.full(cnt, c.size, np.float32), 'float32')\n")
    res = run_world(3, body, env=env, timeout=50).assert_ok()
    for rank in range(3):
        links = [l for l in res[rank].stderr.splitlines() if "<-> rank" in l]
        assert links and all("via shm" in l and "AES" not in l for l in links), res.report()


RESULT = r"""
import numpy as np
try:
    from collectives import MPI
    comm = MPI.COMM_WORLD
    for i in range(3):
        y = np.ones(1 << 18, np.float32)
        comm.Allreduce(MPI.IN_PLACE, y)
    emit("result", ok=True)
except Exception as exc:
    emit("result", ok=False, kind=type(exc).__name__, error=str(exc))
"""


def _errors(res, n):
    return {rank: res[rank].one("result") for rank in range(n)}


@pytest.mark.timeout(60)
def test_ranks_that_disagree_on_encryption_all_fail_naming_the_variable():
    port = free_port()

    def rank_env(rank, n):
        return {"COLLECTIVES_RANK": rank, "COLLECTIVES_SIZE": n, "COLLECTIVES_LOCAL_RANK": rank,
                "COLLECTIVES_LOCAL_SIZE": n, "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{port}",
                "COLLECTIVES_ENCRYPT": "0" if rank == 1 else "1"}

    res = run_world(3, RESULT, rank_env=rank_env, timeout=50,
                    env={"COLLECTIVES_TRANSPORT": "tcp", "COLLECTIVES_JOB_SECRET": SECRET})
    assert not res.timed_out and res.elapsed < 20, res.report()
    for rank, e in _errors(res, 3).items():
        assert not e["ok"] and e["kind"] == "ValueError", res.report()
        assert ("COLLECTIVES_ENCRYPT=0 on rank 1; COLLECTIVES_ENCRYPT=1 on ranks 0, 2"
                in e["error"]), res.report()


@pytest.mark.timeout(60)
def test_encryption_without_a_job_secret_is_refused():
    res = run_world(2, RESULT, env={"COLLECTIVES_ENCRYPT": "1", "COLLECTIVES_TRANSPORT": "tcp"},
                    timeout=50)
    for e in _errors(res, 2).values():
        assert not e["ok"] and "COLLECTIVES_ENCRYPT=1 needs a job secret" in e["error"], res.report()
        assert "COLLECTIVES_JOB_SECRET" in e["error"]


@pytest.mark.timeout(60)
def test_a_libcrypto_that_cannot_be_loaded_is_named():
    env = {**ENC, "COLLECTIVES_TRANSPORT": "tcp",
           "COLLECTIVES_CRYPTO_LIB": "/nonexistent/libcrypto.so.3"}
    res = run_world(2, RESULT, env=env, timeout=50)
    for e in _errors(res, 2).values():
        assert not e["ok"] and "/nonexistent/libcrypto.so.3" in e["error"], res.report()
        assert "COLLECTIVES_ENCRYPT=1 needs OpenSSL's libcrypto" in e["error"], res.report()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault,k,text", [
    ("flip", 1, "failed authentication"), ("replay", 1, "failed authentication"),
    ("length", 1, "claims 2147483647 bytes"), ("flip", 4, "failed authentication")])
def test_altered_records_break_the_communicator_naming_the_peer(fault, k, text):
    env = {**ENC, "COLLECTIVES_TRANSPORT": "tcp", "COLLECTIVES_ENCRYPT_FAULT": fault,
           "COLLECTIVES_NSOCKS": str(k)}
    res = run_world(2, RESULT, env=env, timeout=50)
    assert not res.timed_out and res.elapsed < 20, res.report()
    errs = _errors(res, 2)
    # rank 0 (the lower rank) altered its 4th record to rank 1, which refuses it
    assert not errs[1]["ok"] and text in errs[1]["error"], res.report()
    assert "from rank 0 (connection 0)" in errs[1]["error"], res.report()
    assert not errs[0]["ok"] and "rank 1" in errs[0]["error"], res.report()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("k", [1, 4])
def test_keys_change_in_step_on_both_ends(k):
    # COLLECTIVES_ENCRYPT_FAULT=rekey: every 3 records instead of 2^20. On
    # both ranks the calls succeed; on one only, the other's next record fails.
    env = {**ENC, "COLLECTIVES_TRANSPORT": "tcp", "COLLECTIVES_NSOCKS": str(k),
           "COLLECTIVES_ENCRYPT_FAULT": "rekey"}
    res = run_world(2, RESULT, env=env, timeout=50)
    assert all(e["ok"] for e in _errors(res, 2).values()), res.report()
    port = free_port()

    def rank_env(rank, n):
        return {"COLLECTIVES_RANK": rank, "COLLECTIVES_SIZE": n, "COLLECTIVES_LOCAL_RANK": rank,
                "COLLECTIVES_LOCAL_SIZE": n, "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{port}",
                "COLLECTIVES_ENCRYPT_FAULT": "rekey" if rank == 0 else "0"}

    res = run_world(2, RESULT, env={**env, "COLLECTIVES_ENCRYPT_FAULT": ""}, rank_env=rank_env,
                    timeout=50)
    # whichever end reads a record sealed under the other key first refuses it
    errs = [e.get("error", "") for e in _errors(res, 2).values()]
    assert all(errs) and any("encrypted record #3 from rank" in e and "failed authentication" in e
                             for e in errs), res.report()


# ------------------------------------------------ the record format, from outside
# One process: rank 1 of a 2-rank communicator (COLLECTIVES_ENCRYPT=1) runs an
# allreduce; this script plays rank 0 with its own implementation of the
# opening and of the records (keys by _hkdf, AES-GCM by the core's sealing:
# GCM's counter mode is its own inverse, and a record is accepted only when
# sealing its plaintext again gives its tag).
PEER = r"""
import hashlib, hmac, json, os, socket, struct, sys, threading, time
import numpy as np
from collectives.rendezvous import auth as _auth
from collectives._core import Communicator, crypt_seal
import _outsider
from test_encrypt import _hkdf
case = sys.argv[1]
KEY = _auth.link_key(os.environ["COLLECTIVES_JOB_SECRET"].encode())

def recv_exact(s, n):
    got = b""
    while len(got) < n:
        b = s.recv(n - len(got))
        if not b:
            raise EOFError(f"closed after {len(got)} of {n} bytes")
        got += b
    return got

def keys(cid, frm, to, salt):
    okm = _hkdf(KEY, salt, b"collectives aead v1" + cid + struct.pack("<IIB", frm, to, 0), 44)
    return okm[:32], okm[32:]

def nonce(iv, seq):
    return iv[:4] + bytes(a ^ b for a, b in zip(iv[4:], struct.pack("<Q", seq)))

cid = os.urandom(16)
c1 = Communicator(1, 2, "127.0.0.1", cid)
c1.set_link_key(KEY)
c1.set_peer(0, "127.0.0.1", 1)
c1.set_peer(1, "127.0.0.1", c1.port)
out = {}
mine = np.arange(1, 5, dtype=np.int32)
res = np.zeros(4, np.int32)
def run():
    try:
        c1.allreduce(mine, res, timeout=8.0)
        out["result"] = res.tolist()
    except Exception as exc:
        out["error"] = str(exc)
t = threading.Thread(target=run, daemon=True)
t.start()
s = socket.create_connection(("127.0.0.1", c1.port), timeout=5)
h = _outsider.hello_part(cid, 0, 1, key=KEY)
s.sendall(h)
challenge = recv_exact(s, _outsider.CHALLENGE)[:16]
offer = struct.pack("<II", 0, 0 if case == "plain_offer" else 1).ljust(96, b"\0")
s.sendall(offer + _auth.mac(KEY, b"collectives open", challenge, h, offer))
answer = recv_exact(s, 36)
out["word"] = struct.unpack("<I", answer[:4])[0]
if out["word"] == 0:
    salt = h[32:48] + challenge
    rx_key, rx_iv = keys(cid, 1, 0, salt)
    tx_key, tx_iv = keys(cid, 0, 1, salt)
    plain, raw, seq = b"", b"", 0
    while len(plain) < 48 + 16:  # rank 1's header and its four int32
        head = recv_exact(s, 4)
        n = struct.unpack("<I", head)[0]
        body = recv_exact(s, n + 16)
        raw += head + body
        ct, tag = body[:n], body[n:]
        pt = crypt_seal(rx_key, nonce(rx_iv, seq), b"", ct)[:n]
        assert crypt_seal(rx_key, nonce(rx_iv, seq), head, pt) == ct + tag, "tag"
        plain += pt
        seq += 1
    out["magic"] = plain[:4].hex()
    out["clear_on_wire"] = plain[:16] in raw or mine.tobytes() in raw
    reply = plain[:48] + np.array([10, 20, 30, 40], np.int32).tobytes()
    head = struct.pack("<I", len(reply))
    rec = head + crypt_seal(tx_key, nonce(tx_iv, 0), head, reply)
    if case == "flip":
        rec = rec[:10] + bytes([rec[10] ^ 1]) + rec[11:]
    if case == "replay":  # a valid record, then the same bytes again
        head = struct.pack("<I", 48)
        rec = head + crypt_seal(tx_key, nonce(tx_iv, 0), head, plain[:48])
        rec += rec
    if case == "clear":  # what a peer that does not encrypt would send
        rec = reply
    s.sendall(rec)
t.join(10)
s.close()
c1.close()
print(json.dumps(out))
"""


def _peer(case: str, tmp_path) -> dict:
    (tmp_path / "peer.py").write_text(PEER)
    env = base_env({**ENC})
    env["PYTHONPATH"] += os.pathsep + os.path.dirname(__file__)
    proc = subprocess.run([sys.executable, str(tmp_path / "peer.py"), case], capture_output=True,
                          text=True, env=env, timeout=40)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"] = proc.stderr
    return out


@pytest.mark.timeout(60)
def test_an_outside_implementation_of_the_records_reads_and_writes_a_live_link(tmp_path):
    out = _peer("ok", tmp_path)
    assert out["word"] == 0 and out["magic"] == "434f4c4c", out  # "COLL": a wire header
    assert out["clear_on_wire"] is False, out
    assert out.get("result") == [11, 22, 33, 44], out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case,text", [
    ("flip", "encrypted record #0 from rank 0 (connection 0) failed authentication"),
    ("replay", "encrypted record #1 from rank 0 (connection 0) failed authentication"),
    ("clear", "from rank 0 (connection 0) claims")])
def test_records_altered_by_an_outsider_are_refused(case, text, tmp_path):
    out = _peer(case, tmp_path)
    assert text in out.get("error", ""), out
    assert "result" not in out, out


@pytest.mark.timeout(60)
def test_an_opening_that_does_not_encrypt_is_refused_naming_the_variable(tmp_path):
    out = _peer("plain_offer", tmp_path)
    # refused (2), reason 3 (COLLECTIVES_ENCRYPT), acceptor's NSOCKS 1 and ENCRYPT 1
    assert out["word"] == 2 | 3 << 8 | 1 << 16 | 1 << 24, out
    assert ("rank 0 runs with COLLECTIVES_ENCRYPT=0, this rank with 1" in out.get("error", "")), out


def test_encrypt_variables_are_declared_and_checked():
    from collectives import config
    rows = {name: (default, allowed) for name, default, _desc, allowed in config.params()}
    assert rows["COLLECTIVES_ENCRYPT"] == ("0", "one of: 0, 1")
    assert rows["COLLECTIVES_ENCRYPT_FAULT"][0] == "0"
    config.check_env({"COLLECTIVES_ENCRYPT": "1"})
    with pytest.raises(ValueError, match="COLLECTIVES_ENCRYPT"):
        config.check_env({"COLLECTIVES_ENCRYPT": "yes"})
