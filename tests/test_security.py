"""Nobody outside the job gets in (issue 20, section 1).

The job secret (collectives/rendezvous/auth.py) authenticates the store (challenge-
response, then an HMAC per request), every link opening (a challenge-
response: native/wire.h) and every abort notice. Tested here: the core's
HMAC-SHA256 against hashlib; links between two communicators in this
process, through a recording relay (a replayed opening, a forged one, a
forged abort, a wrong key); whole jobs on loopback with an outsider process
(tests/_outsider.py) that knows the store address, the ranks' ports and even
the comm_id, but not the secret; a second job on the same store address;
the secret's plumbing (launchers, COLLECTIVES_REQUIRE_AUTH, files).

Pickled objects are only loaded from authenticated peers: the object
collectives (collectives/MPI/_objects.py) read only bytes that arrived on a
link, and a link exists only after its opening proved the secret over a
fresh challenge. test_outsider_cannot_get_into_a_job sends a forged pickle
and checks it never ran.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import importlib.util
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from collectives.rendezvous import auth as _auth, store as _store
from collectives._core import Communicator, hmac_sha256, shm_path_ok
from conftest import TESTS, base_env, free_port, run_world

import _outsider

SECRET = "s3cret-for-tests-" + "0123456789abcdef" * 2


# ------------------------------------------------------------ HMAC-SHA256 in C

RFC4231 = [  # (key, data, HMAC-SHA256)
    (b"\x0b" * 20, b"Hi There",
     "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (b"Jefe", b"what do ya want for nothing?",
     "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
    (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First",
     "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
]


@pytest.mark.parametrize("key,data,want", RFC4231)
def test_core_hmac_matches_rfc4231(key, data, want):
    assert hmac_sha256(key, data).hex() == want


def test_core_hmac_matches_hashlib_at_every_block_boundary():
    rng = np.random.default_rng(7)
    for n in list(range(0, 140)) + [1000, 4095, 65536 + 3]:
        for keylen in (0, 1, 32, 63, 64, 65, 200):
            key = rng.bytes(keylen)
            msg = rng.bytes(n)
            assert hmac_sha256(key, msg) == hmac.new(key, msg, hashlib.sha256).digest(), (n, keylen)


# -------------------------------------------------------- shared-memory paths

def test_shm_path_must_be_exactly_ours():
    token = 0x1234abcd
    good = f"/dev/shm/collectives-4242-0-1-{token:x}"
    assert shm_path_ok(good, 0, 1, token)
    for bad in [
        f"/dev/shm/collectives-4242-0-1-{token:x}/../../../etc/passwd",
        f"/dev/shm/collectives-../../etc/passwd",
        f"/dev/shm/collectives-4242-0-1-{token:x}.w0",
        f"/tmp/collectives-4242-0-1-{token:x}",
        f"/dev/shm/../shm/collectives-4242-0-1-{token:x}",
        f"/dev/shm/collectives-4242-0-2-{token:x}",   # another link's
        f"/dev/shm/collectives-4242-1-1-{token:x}",   # another sender's
        f"/dev/shm/collectives-4242-0-1-{token + 1:x}",  # another token
        f"/dev/shm/collectives-+4242-0-1-{token:x}",  # not the canonical spelling
        f"/dev/shm/collectives-0-0-1-{token:x}",
        "",
    ]:
        assert not shm_path_ok(bad, 0, 1, token), bad


# ------------------------------------------- links inside this process

class _Relay:
    """Forwards one TCP connection to target, recording both directions."""

    def __init__(self, target_port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target = target_port
        self.up = bytearray()    # connecting side -> target
        self.down = bytearray()  # target -> connecting side
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _pump(self, src, dst, record) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                record += data
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _run(self) -> None:
        a, _ = self.listener.accept()
        b = socket.create_connection(("127.0.0.1", self.target))
        t = threading.Thread(target=self._pump, args=(b, a, self.down), daemon=True)
        t.start()
        self._pump(a, b, self.up)
        t.join(5)
        a.close()
        b.close()
        self.listener.close()


def _comms(key0: bytes, key1: bytes, comm_id: bytes):
    c0 = Communicator(0, 2, "127.0.0.1", comm_id)
    c1 = Communicator(1, 2, "127.0.0.1", comm_id)
    c0.set_link_key(key0)
    c1.set_link_key(key1)
    for c in (c0, c1):
        c.set_peer(0, "127.0.0.1", c0.port)
        c.set_peer(1, "127.0.0.1", c1.port)
    return c0, c1


def _allreduce_in_thread(comm, value: int, timeout: float):
    out = {}

    def run():
        x = np.full(4, value, dtype=np.int32)
        y = np.zeros(4, dtype=np.int32)
        try:
            comm.allreduce(x, y, timeout=timeout)
            out["result"] = y.tolist()
        except Exception as exc:  # noqa: BLE001 -- reported to the test
            out["error"] = str(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


KEY = _auth.link_key(SECRET.encode())


@pytest.mark.timeout(30)
def test_link_with_the_right_key_works_and_a_wrong_key_never_links():
    cid = os.urandom(16)
    c0, c1 = _comms(KEY, KEY, cid)
    t, out = _allreduce_in_thread(c1, 2, 10)
    x, y = np.full(4, 1, dtype=np.int32), np.zeros(4, dtype=np.int32)
    c0.allreduce(x, y, timeout=10)
    t.join(10)
    assert y.tolist() == [3] * 4 and out == {"result": [3] * 4}
    c0.close(), c1.close()

    c0, c1 = _comms(KEY, _auth.link_key(b"another job's secret, 32 bytes.."), cid)
    t, out = _allreduce_in_thread(c1, 2, 1.5)
    with pytest.raises(Exception) as info:
        c0.allreduce(np.ones(4, np.int32), np.zeros(4, np.int32), timeout=1.5)
    t.join(10)
    # The connecting side learns nothing but a closed connection; the
    # accepting side never took the link and ran into its deadline.
    assert "rank 1" in str(info.value)
    assert "timed out" in out.get("error", "") and "rank 0" in out["error"], out
    c0.close(), c1.close()


@pytest.mark.timeout(40)
def test_a_recorded_opening_cannot_be_replayed(capfd):
    cid = os.urandom(16)
    c0, c1 = _comms(KEY, KEY, cid)
    relay = _Relay(c1.port)
    c0.set_peer(1, "127.0.0.1", relay.port)
    t, out = _allreduce_in_thread(c1, 2, 10)
    c0.allreduce(np.full(4, 1, np.int32), np.zeros(4, np.int32), timeout=10)
    t.join(10)
    assert out == {"result": [3] * 4}
    c0.close(), c1.close()
    relay.thread.join(5)
    recorded = bytes(relay.up)
    assert len(recorded) > _outsider.OPENING
    # The same job's rank 1 again (same comm_id and key), waiting for rank 0:
    # the recorded opening and data, replayed, must not become its link.
    c1b = Communicator(1, 2, "127.0.0.1", cid)
    c1b.set_link_key(KEY)
    c1b.set_peer(0, "127.0.0.1", 1)
    c1b.set_peer(1, "127.0.0.1", c1b.port)
    t, out = _allreduce_in_thread(c1b, 2, 2.0)
    with socket.create_connection(("127.0.0.1", c1b.port), timeout=5) as s:
        s.sendall(recorded[:_outsider.HELLO_PART])
        challenge = _outsider._recv_some(s, _outsider.CHALLENGE, 5.0)
        assert len(challenge) == _outsider.CHALLENGE and challenge[:16] != bytes(relay.down[:16])
        try:
            s.sendall(recorded[_outsider.HELLO_PART:])
        except OSError:
            pass
        answer = _outsider._recv_some(s, 36, 5.0)
    t.join(10)
    assert answer == b""  # dropped, never answered
    assert "timed out waiting for rank 0" in out.get("error", ""), out
    assert "does not prove this job's secret" in capfd.readouterr().err
    c1b.close()


def _abort_to_waiting_rank(key: bytes, cid_for_notice: bytes, wait: float):
    cid = os.urandom(16) if cid_for_notice is None else cid_for_notice
    c1 = Communicator(1, 2, "127.0.0.1", cid)
    c1.set_link_key(KEY)
    c1.set_peer(0, "127.0.0.1", 1)
    c1.set_peer(1, "127.0.0.1", c1.port)
    t, out = _allreduce_in_thread(c1, 2, wait)
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", c1.port), timeout=5) as s:
        s.sendall(_outsider.abort_notice(key, cid, 0, 1, b"ATTACKER says stop"))
    t.join(wait + 5)
    c1.close()
    return out, time.monotonic() - start


@pytest.mark.timeout(30)
def test_abort_notice_needs_the_key(capfd):
    cid = os.urandom(16)
    out, took = _abort_to_waiting_rank(KEY, cid, 5.0)  # the job's own: fails at once
    assert "ATTACKER says stop" in out.get("error", "") and took < 3.0, out
    for forged_key in (b"", bytes(32), cid):
        out, took = _abort_to_waiting_rank(forged_key, cid, 1.0)
        err = out.get("error", "")
        assert "ATTACKER" not in err and "timed out" in err, out
    # Under another key the notice does not even name this communicator (wire.h).
    assert "an abort notice not for this job and rank" in capfd.readouterr().err


@pytest.mark.timeout(30)
def test_forged_opening_with_the_comm_id_is_dropped(capfd):
    cid = os.urandom(16)
    c1 = Communicator(1, 2, "127.0.0.1", cid)
    c1.set_link_key(KEY)
    c1.set_peer(0, "127.0.0.1", 1)
    c1.set_peer(1, "127.0.0.1", c1.port)
    t, out = _allreduce_in_thread(c1, 2, 2.0)
    with socket.create_connection(("127.0.0.1", c1.port), timeout=5) as s:
        # The hello an outsider who read the comm_id would send (its tag under no key):
        # it does not name the communicator under the job's key, so it is not even
        # challenged; what follows (an offer, a MAC, data) is never read.
        s.sendall(_outsider.hello_part(cid, 0, 1))
        forged = bytes(_outsider.OFFER)
        mac = hmac.new(b"", b"collectives open" + bytes(16), "sha256")
        try:
            s.sendall(forged + mac.digest())
            data = struct.pack("<4i", 66, 66, 66, 66)
            s.sendall(_outsider.wire_header(1, 0, 16, 0, 4, 0, dtype=2) + data)
        except OSError:
            pass
        assert _outsider._recv_some(s, _outsider.CHALLENGE + 36, 5.0) == b""
    t.join(10)
    assert "timed out waiting for rank 0" in out.get("error", ""), out
    assert "does not prove this job's secret" in capfd.readouterr().err
    c1.close()


# ------------------------------------------------------------- whole jobs

_JOB_BODY = r"""
import json, os, time
import numpy as np
from collectives import MPI
from collectives.rendezvous import world as _world
comm = MPI.COMM_WORLD
state = _world._state
d = os.environ["SEC_DIR"]
info = {"port": state.core.port}
if comm.rank == 0:
    info["comm_id"] = state.client.get("comm_id").hex()
with open(os.path.join(d, f"rank{comm.rank}.json.tmp"), "w") as fh:
    json.dump(info, fh)
os.rename(os.path.join(d, f"rank{comm.rank}.json.tmp"), os.path.join(d, f"rank{comm.rank}.json"))
deadline = time.monotonic() + 30
while not os.path.exists(os.path.join(d, "attacked")) and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(0.5)  # the outsider's abort notices and hello are on their way
buf = np.arange(4, dtype=np.int32) * 10 if comm.rank == 0 else np.zeros(4, dtype=np.int32)
comm.Bcast(buf, root=0)
expect(buf.tolist() == [0, 10, 20, 30], "Bcast", f"got {buf.tolist()}")
obj = comm.bcast({"genuine": comm.rank} if comm.rank == 0 else None, root=0)
expect(obj == {"genuine": 0}, "bcast", f"got {obj!r}")
x = np.full(3, comm.rank + 1, dtype=np.int64)
y = np.zeros(3, dtype=np.int64)
comm.Allreduce(x, y)
expect(y.tolist() == [6, 6, 6], "Allreduce", f"got {y.tolist()}")
addr1 = state.client.get("addr/1").decode()
comm.Barrier()  # rank 0 hosts the store: no rank leaves before every rank has read it
emit("finished", addr1=addr1)
"""


def _store_env(port: int, extra: dict):
    def rank_env(rank, n):
        return {"COLLECTIVES_RANK": rank, "COLLECTIVES_SIZE": n,
                "COLLECTIVES_LOCAL_RANK": rank, "COLLECTIVES_LOCAL_SIZE": n,
                "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{port}", **extra}
    return rank_env


@pytest.mark.timeout(90)
def test_outsider_cannot_get_into_a_job(tmp_path):
    port = free_port()
    outsider = subprocess.Popen(
        [sys.executable, str(TESTS / "_outsider.py"), "attack", str(tmp_path), "127.0.0.1",
         str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=base_env(),
        start_new_session=True)
    try:
        res = run_world(3, _JOB_BODY, timeout=60,
                        rank_env=_store_env(port, {"SEC_DIR": str(tmp_path),
                                                   "COLLECTIVES_JOB_SECRET": SECRET,
                                                   "COLLECTIVES_TRANSPORT": "tcp"}))
        text, _ = outsider.communicate(timeout=30)
    finally:
        if outsider.poll() is None:
            outsider.kill()
            outsider.wait()
    findings = [json.loads(line) for line in text.decode().splitlines() if line.startswith("{")]
    kinds = {f["what"]: f for f in findings}
    report = res.report() + "\n--- outsider\n" + text.decode()
    res.assert_ok()
    assert all(len(res[r].get("finished")) == 1 for r in range(3)), report
    # The store: refused, read nothing, wrote nothing.
    assert "store-refused" in kinds and "store-joined" not in kinds, report
    assert "refused this process" in kinds["store-refused"]["error"], report
    assert kinds["store-raw-get"]["leaked"] is False, report
    assert res[0].one("finished")["addr1"].startswith("127.0.0.1\n"), report
    assert "does not know this job's secret" in res[0].stderr, report  # the store's WARN
    # Rank 2 dropped the forged "rank 0" before any challenge; its Bcast and
    # bcast took the real rank 0's data; the forged pickle never ran.
    assert kinds["challenge"]["got"] == 0 and kinds["link-answer"]["got"] == 0, report
    assert not (tmp_path / "pwned").exists(), report
    assert "does not prove this job's secret" in res[2].stderr, report
    # Rank 1 dropped the fake abort notices and did not break.
    assert "abort notice" in res[1].stderr and "ATTACKER" not in res[1].stderr, report


_SECOND_JOB_BODY = r"""
import time
import numpy as np
from collectives import MPI
comm = MPI.COMM_WORLD
time.sleep(float(os.environ.get("HOLD", "0")))
x = np.full(2, comm.rank + 1, dtype=np.int64)
y = np.zeros(2, dtype=np.int64)
comm.Allreduce(x, y)
expect(y.tolist() == [3, 3], "Allreduce", f"got {y.tolist()}")
emit("finished")
"""


@pytest.mark.timeout(90)
def test_second_job_on_the_same_store_address_cannot_join_or_break_the_first():
    port = free_port()
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("a", run_world(
        2, "import os\n" + _SECOND_JOB_BODY, timeout=60,
        rank_env=_store_env(port, {"COLLECTIVES_JOB_SECRET": SECRET, "HOLD": "4"}))))
    first.start()
    time.sleep(2.0)  # job A's store is up and its ranks hold
    results["b"] = run_world(2, "import os\n" + _SECOND_JOB_BODY, timeout=40,
                             rank_env=_store_env(port, {"COLLECTIVES_JOB_SECRET": "x" * 40,
                                                        "COLLECTIVES_START_TIMEOUT": "5"}))
    first.join(70)
    a, b = results["a"], results["b"]
    a.assert_ok()
    assert all(len(a[r].get("finished")) == 1 for r in range(2)), a.report()
    # Job B: its rank 0 cannot take the address, its rank 1 is refused by A's store.
    assert all(b[r].returncode not in (0, None) for r in range(2)), b.report()
    assert "store cannot listen" in b[0].stderr and "another job" in b[0].stderr, b.report()
    assert "refused this process" in b[1].stderr, b.report()


# -------------------------------------------------------------- the secret

def test_require_auth_refuses_without_a_secret():
    res = run_world(2, "from collectives import MPI\nMPI.COMM_WORLD.Barrier()\n", timeout=30,
                    env={"COLLECTIVES_REQUIRE_AUTH": "1"})
    for r in range(2):
        assert res[r].returncode not in (0, None), res.report()
        assert "COLLECTIVES_REQUIRE_AUTH=1 but neither COLLECTIVES_JOB_SECRET" in res[r].stderr


def test_without_a_secret_the_job_warns_once_and_runs():
    """Once per job (rank 0), not once per rank (issue 38, item 6)."""
    body = ("from collectives import MPI\nimport numpy as np\nc = MPI.COMM_WORLD\n"
            "for _ in range(3): c.Barrier()\nemit('done')\n")
    res = run_world(3, body, timeout=30).assert_ok()
    counts = [res[r].stderr.count("this job is unauthenticated") for r in range(3)]
    assert counts == [1, 0, 0], res.report()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_torchrun_job_without_a_secret_warns_once():
    """A torch.distributed script under torchrun's variables: one warning for the job."""
    body = """
        import torch, torch.distributed as dist
        import collectives.torch
        dist.init_process_group("collectives")
        t = torch.ones(2); dist.all_reduce(t)
        expect(t.tolist() == [3.0, 3.0], "sum", str(t))
        dist.destroy_process_group()
        emit("done")
    """
    port = free_port()

    def torchrun(rank, n):
        return {"RANK": rank, "WORLD_SIZE": n, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": n,
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    res = run_world(3, body, rank_env=torchrun, timeout=90).assert_ok()
    counts = [res[r].stderr.count("this job is unauthenticated") for r in range(3)]
    assert counts == [1, 0, 0], res.report()


def test_short_secret_and_unreadable_file_are_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("COLLECTIVES_JOB_SECRET_FILE", raising=False)
    monkeypatch.setenv("COLLECTIVES_JOB_SECRET", "short")
    with pytest.raises(ValueError, match="at least 16"):
        _auth.job_secret()
    monkeypatch.delenv("COLLECTIVES_JOB_SECRET")
    monkeypatch.setenv("COLLECTIVES_JOB_SECRET_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="cannot be read"):
        _auth.job_secret()
    f = tmp_path / "secret"
    f.write_text(SECRET + "\n")
    f.chmod(0o600)
    monkeypatch.setenv("COLLECTIVES_JOB_SECRET_FILE", str(f))
    assert _auth.job_secret() == SECRET.encode()


def test_secret_file_authenticates_a_job(tmp_path):
    f = tmp_path / "secret"
    f.write_text(SECRET)
    f.chmod(0o600)
    body = ("from collectives import MPI\nimport numpy as np\nc = MPI.COMM_WORLD\n"
            "x = np.ones(2); y = np.zeros(2); c.Allreduce(x, y)\n"
            "expect(y.tolist() == [2.0, 2.0], 'sum', str(y))\nemit('done')\n")
    res = run_world(2, body, timeout=30, env={"COLLECTIVES_JOB_SECRET_FILE": str(f)}).assert_ok()
    assert "unauthenticated" not in res[0].stderr + res[1].stderr, res.report()


def test_launcher_gives_every_rank_the_same_fresh_secret():
    body = ("import hashlib, os\nfrom collectives import MPI\nMPI.COMM_WORLD.Barrier()\n"
            "s = os.environ['COLLECTIVES_JOB_SECRET']\n"
            "emit('secret', n=len(s), h=hashlib.sha256(s.encode()).hexdigest())\n")
    runs = [run_world(2, body, timeout=60, launcher=True) for _ in range(2)]
    hashes = []
    for res in runs:
        res.assert_ok()
        got = [res[r].one("secret") for r in range(2)]
        assert got[0]["h"] == got[1]["h"] and got[0]["n"] == 64, res.report()
        assert "unauthenticated" not in res.launcher_output, res.report()
        hashes.append(got[0]["h"])
    assert hashes[0] != hashes[1]


def test_remote_ranks_get_the_secret_on_stdin_not_argv():
    from collectives.launcher.cli import build_rank_commands
    cmds = build_rank_commands(["python", "-c", "pass"], [("localhost", 1), ("farhost", 1)], 2,
                               "127.0.0.1:1234", secret="abc" * 10)
    local, remote = cmds
    assert local.env["COLLECTIVES_JOB_SECRET"] == "abc" * 10 and local.stdin_data == b""
    assert "abc" * 10 not in " ".join(remote.argv) and remote.stdin_data == b"abc" * 10 + b"\n"
    # The remote script, run here by sh instead of over ssh, reads it from stdin.
    script = remote.argv[-1][len("sh -c "):]
    import shlex
    script = shlex.split(script)[0].replace("python -c pass",
                                             "sh -c 'echo got:$COLLECTIVES_JOB_SECRET'")
    # stdin stays open while the rank should run (EOF stops it), as ssh's does.
    p = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         start_new_session=True)
    try:
        p.stdin.write(remote.stdin_data)
        p.stdin.flush()
        import select
        ready, _, _ = select.select([p.stdout], [], [], 20)
        line = p.stdout.readline() if ready else b""
        assert p.wait(timeout=20) == 0  # the command ended by itself, stdin still open
        p.stdin.close()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert line.strip() == b"got:" + b"abc" * 10


# ------------------------------------------------- the torch.distributed backend

_TORCH_BODY = r"""
import os
import torch
import torch.distributed as dist
import collectives.torch  # registers the backend
dist.init_process_group("collectives")
t = torch.ones(3) * (dist.get_rank() + 1)
try:
    dist.all_reduce(t)
    emit("sum", value=t.tolist())
except Exception as exc:
    emit("error", message=str(exc))
"""


def _torchrun_env(port: int, secrets: list):
    def env(rank, n):
        return {"RANK": rank, "WORLD_SIZE": n, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": n,
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TORCHELASTIC_RUN_ID": "none",
                "COLLECTIVES_JOB_SECRET": secrets[rank], "COLLECTIVES_TRANSPORT": "tcp"}
    return env


@pytest.mark.timeout(90)
def test_torch_backend_links_prove_the_secret():
    """torch's store trusts the network, so the backend's links prove the secret themselves:
    ranks with the same secret link; a rank whose peer does not know it never links."""
    pytest.importorskip("torch")
    res = run_world(2, _TORCH_BODY, rank_env=_torchrun_env(free_port(), [SECRET, SECRET]),
                    timeout=60).assert_ok()
    for r in range(2):
        assert res[r].one("sum")["value"] == [3.0] * 3, res.report()
        assert "unauthenticated" not in res[r].stderr
    other = "another-secret-of-32-bytes......."
    res = run_world(2, _TORCH_BODY, rank_env=_torchrun_env(free_port(), [SECRET, other]),
                    timeout=60, collective_timeout=3)
    assert not res.timed_out, res.report()
    for r in range(2):
        assert res[r].get("error") and not res[r].get("sum"), res.report()
    assert "does not prove this job's secret" in res[1].stderr, res.report()
