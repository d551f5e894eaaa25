"""Elastic communicators in the core (issue 23 section 1): shrink after a rank is
killed, a failure during the agreement, grow with a joiner, and the communicator
generation in the wire header that keeps a stale peer's messages out."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

from collectives.rendezvous import auth as _auth
from collectives._core import (CollectivesError, Communicator, comm_dup, comm_generation,
                               comm_set_generation, p2p_recv, p2p_send)
from conftest import free_port, run_world

SECRET = "elastic-core-test-secret-0123456789"
ENV = {"COLLECTIVES_JOB_SECRET": SECRET}


def _pair(gen0: int, gen1: int):
    cid = os.urandom(16)
    key = _auth.link_key(SECRET.encode())
    comms = [Communicator(r, 2, "127.0.0.1", cid) for r in range(2)]
    for c, g in zip(comms, (gen0, gen1)):
        c.set_link_key(key)
        comm_set_generation(c, g)
        for r, peer in enumerate(comms):
            c.set_peer(r, "127.0.0.1", peer.port)
    return comms


def _both(comms, fn):
    out = [None, None]

    def run(i):
        try:
            out[i] = ("ok", fn(comms[i], i))
        except Exception as exc:  # noqa: BLE001 -- reported to the test
            out[i] = ("error", str(exc))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    return out


def _allreduce(c, i):
    x, y = np.full(8, i + 1, np.int32), np.zeros(8, np.int32)
    c.allreduce(x, y, timeout=5)
    return y.tolist()


@pytest.mark.timeout(30)
def test_generation_in_header_same_generation_works():
    comms = _pair(3, 3)
    try:
        assert _both(comms, _allreduce) == [("ok", [3] * 8)] * 2
        assert comm_generation(comms[0]) == 3
        assert comm_generation(comms[1]) == 3
    finally:
        for c in comms:
            c.close()


@pytest.mark.timeout(30)
def test_stale_generation_message_is_refused_naming_both():
    # Rank 1 is a stale peer of generation 4 talking to rank 0 of generation 5 (same
    # comm id and key, so only the header's generation tells them apart).
    comms = _pair(5, 4)
    try:
        out = _both(comms, _allreduce)
        assert out[0][0] == "error", out
        assert "generation 4" in out[0][1] and "generation 5" in out[0][1], out
        assert "stale" in out[0][1], out
        assert out[1][0] == "error", out  # never a silent result on either side
    finally:
        for c in comms:
            c.close()


@pytest.mark.timeout(30)
def test_stale_generation_point_to_point_is_refused():
    comms = _pair(7, 6)

    def p2p(c, i):
        if i == 1:
            p2p_send(c, np.arange(4, dtype=np.int32), 0, 3, timeout=5)
            return None
        buf = np.zeros(4, np.int32)
        p2p_recv(c, buf, 1, 3, timeout=5)
        return buf.tolist()

    try:
        out = _both(comms, p2p)
        assert out[0][0] == "error" and "generation 6" in out[0][1] \
            and "generation 7" in out[0][1], out
    finally:
        for c in comms:
            c.close()


@pytest.mark.timeout(30)
def test_generation_is_set_before_traffic_and_on_the_root_only():
    comms = _pair(1, 1)
    try:
        assert _both(comms, _allreduce) == [("ok", [3] * 8)] * 2
        with pytest.raises(CollectivesError, match="before its first message"):
            comm_set_generation(comms[0], 2)
        dup = _both(comms, lambda c, i: comm_dup(c, timeout=5))
        sub = dup[0][1]
        with pytest.raises(ValueError, match="root"):
            comm_set_generation(sub, 2)
        assert comm_generation(sub) == 1
    finally:
        for c in comms:
            c.close()


_SHRINK_BODY = """
import os, signal, time
import numpy as np
import collectives
from collectives import MPI
from collectives.elastic import membership as _elastic
from collectives._core import comm_generation

comm = collectives.init()
me = comm.rank
KILL = int(os.environ["KILL"])
x = np.zeros(1000, np.float64)

def loop(comm, victim, tag):
    try:
        for step in range(200):
            if comm.rank == victim and step == 5:
                emit("kill", t=time.time())
                os.kill(os.getpid(), signal.SIGKILL)
            comm.Allreduce(np.full(1000, comm.rank + 1.0), x)
            n = comm.size
            expect(x[0] == n * (n + 1) / 2, (tag, step), f"got {x[0]}")
    except MPI.Exception as exc:
        emit("error", phase=tag, message=str(exc))

if os.environ.get("DIE_IN_AGREEMENT") and me == 2:
    agree = _elastic.agree_survivors
    def dying(*args, **kwargs):
        rec = agree(*args, **kwargs)  # in the members record, then gone before forming
        os.kill(os.getpid(), signal.SIGKILL)
    _elastic.agree_survivors = dying

loop(comm, KILL, "g0")
t0 = time.monotonic()
new = comm.Shrink() if os.environ.get("USE_MPI") else collectives.shrink(timeout=20)
new.Allreduce(np.full(1000, new.rank + 1.0), x)
emit("shrunk", t=time.time(), secs=time.monotonic() - t0, new_rank=new.rank, size=new.size,
     value=float(x[0]), gen=comm_generation(new._core), world=MPI.COMM_WORLD is new,
     old_closed=comm._core.closed)
for alg in ("ring", "tree", "butterfly"):
    new.Allreduce(np.full(7, new.rank + 1.0), x[:7], algorithm=alg)
    expect(x[0] == new.size * (new.size + 1) / 2, alg, f"got {x[0]}")
flag = 0b101 if new.rank == 1 else 0b111
emit("agree", value=new.Agree(flag))
if os.environ.get("AGAIN"):
    # A second failure: the new world's last rank dies, the rest shrink once more.
    loop(new, new.size - 1, "g1")
    newer = collectives.shrink(timeout=20)
    newer.Allreduce(np.full(1000, newer.rank + 1.0), x)
    emit("shrunk2", new_rank=newer.rank, size=newer.size, value=float(x[0]),
         gen=comm_generation(newer._core))
collectives.finalize()
"""


@pytest.mark.timeout(60)
def test_sigkill_one_of_four_then_survivors_shrink_twice():
    res = run_world(4, _SHRINK_BODY, timeout=50, env={**ENV, "KILL": "2", "AGAIN": "1"})
    assert res[2].returncode == -signal.SIGKILL, res.report()
    # Old rank 3 (new rank 2) is the second victim.
    assert res[3].returncode == -signal.SIGKILL and res[3].get("kill"), res.report()
    for r in (0, 1, 3):
        assert r == 3 or res[r].returncode == 0, res.report()
        assert not res[r].get("fail"), res.report()
        first = [e for e in res[r].get("error") if e["phase"] == "g0"]
        assert len(first) == 1 and "rank 2" in first[0]["message"], res.report()
    shrunk = {r: res[r].one("shrunk") for r in (0, 1, 3)}
    # Renumbered in old-rank order, the next generation, installed as the world.
    assert [shrunk[r]["new_rank"] for r in (0, 1, 3)] == [0, 1, 2], shrunk
    assert all(s["size"] == 3 and s["value"] == 6.0 and s["gen"] == 1 and s["world"]
               and s["old_closed"] for s in shrunk.values()), shrunk
    assert {res[r].one("agree")["value"] for r in (0, 1, 3)} == {0b101}
    second = {r: res[r].one("shrunk2") for r in (0, 1)}
    assert [second[r]["new_rank"] for r in (0, 1)] == [0, 1]
    assert all(s["size"] == 2 and s["value"] == 3.0 and s["gen"] == 2
               for s in second.values()), second


@pytest.mark.timeout(60)
def test_rank_dying_during_the_agreement_is_left_out():
    res = run_world(4, _SHRINK_BODY, timeout=50, env={**ENV, "KILL": "3", "DIE_IN_AGREEMENT": "1",
                                                       "USE_MPI": "1"})
    assert res[3].returncode == -signal.SIGKILL and res[2].returncode == -signal.SIGKILL, \
        res.report()
    for r in (0, 1):
        assert res[r].returncode == 0 and not res[r].get("fail"), res.report()
        s = res[r].one("shrunk")
        assert (s["new_rank"], s["size"], s["value"], s["gen"]) == (r, 2, 3.0, 1), s
        assert s["secs"] < 10, s


_RANK0_BODY = """
import os, signal, time
import numpy as np
import collectives
from collectives import MPI

comm = collectives.init()
x = np.zeros(4)
try:
    for step in range(100):
        if comm.rank == 0 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        comm.Allreduce(np.ones(4), x)
except MPI.Exception as exc:
    pass
t0 = time.monotonic()
try:
    collectives.shrink(timeout=20)
    emit("shrunk")
except RuntimeError as exc:
    emit("error", message=str(exc), secs=time.monotonic() - t0)
"""


@pytest.mark.timeout(60)
def test_shrink_after_the_store_host_died_fails_clearly():
    res = run_world(3, _RANK0_BODY, timeout=50, env=ENV)
    assert res[0].returncode == -signal.SIGKILL, res.report()
    for r in (1, 2):
        err = res[r].one("error")
        assert "store" in err["message"] and "rank 0" in err["message"], err
        assert err["secs"] < 15, err


_GROW_BODY = """
import os, time
import numpy as np
import collectives
from collectives import MPI
from collectives._core import comm_generation

x = np.zeros(5, np.float64)
if os.environ.get("JOINER"):
    comm = collectives.join(timeout=20)
else:
    comm = collectives.init()
    for step in range(3):
        comm.Allreduce(np.full(5, comm.rank + 1.0), x)
        expect(x[0] == 3.0, step, f"got {x[0]}")
    comm = collectives.grow(min_new=1, timeout=20)
comm.Allreduce(np.full(5, comm.rank + 1.0), x)
emit("grown", new_rank=comm.rank, size=comm.size, value=float(x[0]),
     gen=comm_generation(comm._core), world=MPI.COMM_WORLD is comm)
b = np.arange(5, dtype=np.float64) if comm.rank == 0 else np.zeros(5)
comm.Bcast(b, root=0)
expect(b.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0], "bcast", str(b))
collectives.finalize()
"""


@pytest.mark.timeout(60)
def test_two_ranks_grow_to_three_with_a_joiner():
    port = free_port()

    def rank_env(rank, n):
        common = {"COLLECTIVES_STORE_ADDR": f"127.0.0.1:{port}"}
        if rank == 2:
            return {**common, "JOINER": "1"}
        return {**common, "COLLECTIVES_RANK": rank, "COLLECTIVES_SIZE": 2,
                "COLLECTIVES_LOCAL_RANK": rank, "COLLECTIVES_LOCAL_SIZE": 2}

    res = run_world(3, _GROW_BODY, timeout=50, env=ENV, rank_env=rank_env).assert_ok()
    grown = [res[r].one("grown") for r in range(3)]
    assert [g["new_rank"] for g in grown] == [0, 1, 2], grown
    assert all(g["size"] == 3 and g["value"] == 6.0 and g["gen"] == 1 and g["world"]
               for g in grown), grown


_LATE_BODY = """
import os, time
import numpy as np
import collectives
from collectives.rendezvous import world as _world

comm = collectives.init()
me = comm.rank
x = np.zeros(3)
if me == 3:
    time.sleep(3)  # alive (its listener answers), but reaches shrink after the deadline
    try:
        collectives.shrink(timeout=10)
        emit("shrunk")
    except RuntimeError as exc:
        emit("error", message=str(exc))
    _world._state.client.set("test/late-done", b"")
else:
    t0 = time.monotonic()
    new = collectives.shrink(timeout=1.5)
    new.Allreduce(np.full(3, 1.0), x)
    emit("shrunk", size=new.size, value=float(x[0]), secs=time.monotonic() - t0)
    if me == 0:  # the store lives here: keep it for rank 3's answer
        _world._state.client.get("test/late-done", timeout=20)
collectives.finalize()
"""


@pytest.mark.timeout(60)
def test_a_late_rank_reaching_shrink_after_the_deadline_is_left_out():
    res = run_world(4, _LATE_BODY, timeout=50, env=ENV).assert_ok()
    for r in (0, 1, 2):
        s = res[r].one("shrunk")
        assert s["size"] == 3 and s["value"] == 3.0 and 1.4 < s["secs"] < 10, s
    err = res[3].one("error")["message"]
    assert "rank 3 was left out of generation 1" in err, err


@pytest.mark.timeout(30)
def test_join_without_a_grow_times_out_clearly(monkeypatch):
    import collectives
    from collectives.rendezvous import store as _store

    with _store.StoreServer("127.0.0.1", 0, secret=SECRET.encode()) as server:
        monkeypatch.setenv("COLLECTIVES_STORE_ADDR", server.address)
        monkeypatch.setenv("COLLECTIVES_JOB_SECRET", SECRET)
        with pytest.raises(RuntimeError, match="no rank of the job admitted this process"):
            collectives.join(timeout=1)
        assert not collectives.is_initialized()


@pytest.mark.timeout(60)
def test_rank0_killed_with_a_launcher_hosted_store_survivors_shrink():
    # As a launcher that hosts the store would: the store lives outside the ranks.
    from collectives.rendezvous import store as _store

    with _store.StoreServer("127.0.0.1", 0, secret=SECRET.encode()) as server:
        res = run_world(4, _SHRINK_BODY, timeout=50,
                        env={**ENV, "KILL": "0", "COLLECTIVES_STORE_EXTERNAL": "1",
                             "COLLECTIVES_STORE_ADDR": server.address},
                        rank_env=lambda r, n: {"COLLECTIVES_RANK": r, "COLLECTIVES_SIZE": n,
                                               "COLLECTIVES_STORE_ADDR": server.address})
    assert res[0].returncode == -signal.SIGKILL, res.report()
    for r in (1, 2, 3):
        assert res[r].returncode == 0 and not res[r].get("fail"), res.report()
        s = res[r].one("shrunk")
        assert (s["new_rank"], s["size"], s["value"], s["gen"]) == (r - 1, 3, 6.0, 1), s


_GROW_DEATH_BODY = """
import os, signal, time
import numpy as np
import collectives

comm = collectives.init()
x = np.zeros(2)
comm.Allreduce(np.ones(2), x)
if comm.rank == 2:
    os.kill(os.getpid(), signal.SIGKILL)  # dies at the step boundary, before grow
t0 = time.monotonic()
try:
    collectives.grow(timeout=10)
    emit("grown")
except RuntimeError as exc:
    emit("error", message=str(exc), secs=time.monotonic() - t0)
new = collectives.shrink(timeout=10)
new.Allreduce(np.ones(2), x)
emit("shrunk", size=new.size, value=float(x[0]))
collectives.finalize()
"""


@pytest.mark.timeout(60)
def test_a_rank_dying_before_grow_fails_it_naming_the_rank_then_shrink_works():
    res = run_world(3, _GROW_DEATH_BODY, timeout=50, env=ENV)
    assert res[2].returncode == -signal.SIGKILL, res.report()
    for r in (0, 1):
        assert res[r].returncode == 0, res.report()
        err = res[r].one("error")
        assert "grow failed" in err["message"] and "rank 2" in err["message"], err
        assert err["secs"] < 8, err
        assert res[r].one("shrunk") == {**res[r].one("shrunk"), "size": 2, "value": 2.0}
