"""Init and shutdown cycles: hvd, collectives and torch.distributed, 100 times in a row.

Issue 24: ``for i in range(10): hvd.init(); hvd.barrier(); hvd.shutdown()``
failed with "ConnectionError: lost the store" or hung, because a rank that
re-initialized quickly reached rank 0's store of the previous world and read
its stale keys. Each API here is cycled 100 times at 2 and 4 ranks in one
launch per rank count; every cycle checks a collective's result, and after
the cycles no fd or thread is left beyond what one cycle leaves (lazily
created torch state), and rank 0's store port no longer accepts connections.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from conftest import free_port, run_world  # noqa: E402

LIFE_BODY = r'''
import os, socket, threading, time
import torch
import torch.distributed as dist
import collectives
import collectives.torch as hvd

cycles = int(os.environ["CYCLES"])
port = int(os.environ["COLLECTIVES_STORE_ADDR"].rsplit(":", 1)[1])

def names():
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))

def settled(baseline):
    """(fds, OS threads, Python threads), waiting up to 2 s for them to come back to
    baseline: a joined thread's OS thread ends just after join() returns."""
    deadline = time.monotonic() + 2.0
    while True:
        now = (fd_count(), task_count(), threading.active_count())
        if now == baseline or time.monotonic() > deadline:
            return now
        time.sleep(0.01)

def world_sum(case, value):
    want = sum(range(1, n + 1))
    expect(value == want, case, f"got {value}, expected {want}")

def cycle_hvd(i):
    hvd.init()
    hvd.barrier()
    world_sum(("hvd", i), int(hvd.allreduce(torch.tensor([hvd.rank() + 1]), op=hvd.Sum)))
    hvd.shutdown()

def cycle_collectives(i):
    comm = collectives.init()
    world_sum(("collectives", i), comm.allreduce(comm.rank + 1))
    collectives.finalize()

def cycle_dist(i):
    dist.init_process_group("collectives", store=dist.PrefixStore(f"cycle{i}/", torch_store),
                            rank=r, world_size=n)
    t = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(t)
    world_sum(("dist", i), int(t))
    dist.destroy_process_group()
    collectives.finalize()

r, n = int(os.environ["COLLECTIVES_RANK"]), int(os.environ["COLLECTIVES_SIZE"])
# torch's own store lives across the cycles (torch cannot rebind a tcp:// port at once, with
# any backend); each process group gets a fresh prefix of it
torch_store = dist.TCPStore("127.0.0.1", int(os.environ["TORCH_PORT"]), n, r == 0)
for name, fn in [("hvd", cycle_hvd), ("collectives", cycle_collectives), ("dist", cycle_dist)]:
    start = time.monotonic()
    fn(0)  # lazily created state (torch's, the interpreter's) exists from here on
    time.sleep(0.1)  # let the threads joined in that cycle end
    baseline = (fd_count(), task_count(), threading.active_count())
    before = names()
    for i in range(1, cycles):
        fn(i)
    emit("cycles", api=name, seconds=round(time.monotonic() - start, 2))
    now = settled(baseline)
    expect(now == baseline, name, f"fds, OS threads, Python threads {baseline} after one "
           f"cycle, {now} after {cycles} (OS threads {before}, then {names()})")
    expect(not collectives.is_initialized(), name, "still initialized")
if r == 0:  # rank 0's store is gone with its world
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        fail("store", "the store still accepts connections after finalize")
    except ConnectionRefusedError:
        pass
    finally:
        s.close()
'''


@pytest.mark.timeout(90)
# 2: the smallest world (and, on CI's 2 cores, not oversubscribed); 4: the most ranks racing
# for rank 0's new store each cycle (oversubscribed there, as 3 was: same code, no rank-count
# branch in the rendezvous or the teardown); 3 ranks cycle in the torchrun-style test below
@pytest.mark.parametrize("n", [2, 4])
def test_shutdown_then_init_100_times(n):
    res = run_world(n, LIFE_BODY, timeout=80, env={"CYCLES": 100, "TORCH_PORT": free_port()})
    res.assert_ok()
    for rank in range(n):
        assert [c["api"] for c in res[rank].get("cycles")] == ["hvd", "collectives", "dist"], \
            res.report()


OWNED_BODY = r'''
import os, threading, time
import torch
import torch.distributed as dist
import collectives
import collectives.torch  # registers the backend

r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), n, r == 0)
for i in range(int(os.environ["CYCLES"])):
    dist.init_process_group("collectives", store=dist.PrefixStore(f"cycle{i}/", store),
                            rank=r, world_size=n)
    t = torch.tensor([r + 1])
    dist.all_reduce(t)
    expect(int(t) == n * (n + 1) // 2, ("dist", i), f"got {int(t)}")
    dist.destroy_process_group()
    if i == 0:
        time.sleep(0.1)
        baseline = (fd_count(), task_count(), threading.active_count())
deadline = time.monotonic() + 2.0
while (fd_count(), task_count(), threading.active_count()) != baseline and time.monotonic() < deadline:
    time.sleep(0.01)
now = (fd_count(), task_count(), threading.active_count())
expect(now == baseline, "leak", f"fds, OS threads, Python threads {baseline} after one cycle, {now} after all")
expect(not collectives.is_initialized(), "world", "the backend made a world of its own")
emit("cycled")
'''


@pytest.mark.timeout(60)
def test_torchrun_style_process_group_100_times():
    """Without collectives-run, the backend builds (and owns) its communicator through
    torch's store: destroy_process_group closes it, the next init builds another (one
    rank count: the rendezvous here is torch's, the cycles above cover 2 and 4)."""
    n = 3
    port = free_port()

    def torchrun_env(rank, size):
        return {"RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": size,
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TORCHELASTIC_RUN_ID": "none"}

    res = run_world(n, OWNED_BODY, rank_env=torchrun_env, timeout=50, env={"CYCLES": 100})
    res.assert_ok()
    for rank in range(n):
        res[rank].one("cycled")
