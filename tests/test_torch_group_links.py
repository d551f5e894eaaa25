"""torch.distributed groups on the "collectives" backend have links of their own (issue 37,
section 2), as gloo's groups have contexts of their own: a group op that times out (one
member never calls it) raises on the members that called, within the timeout, naming the
missing rank, and afterwards the default group and another group still give right results;
ops on two groups issued in different orders on different ranks complete. Every body runs
on "collectives" and on gloo in the same test, and both must behave alike.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import free_port, run_world  # noqa: E402

PREAMBLE = r'''
import os, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
import collectives.torch  # registers the backend

backend = sys.argv[1]
r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group(backend, timeout=timedelta(seconds=20))
T = lambda v, k=4: torch.full((k,), float(v))
'''

# 3 ranks. First, two groups whose common members issue their ops in opposite orders
# (as gloo allows: the groups have contexts, here links, of their own; the ops are started
# with async_op=True and waited for afterwards). Then g (every rank, timeout 2 s), whose
# all_reduce rank 2 never calls: ranks 0 and 1 raise within the timeout; afterwards the
# default group, g2 = {0, 1} and the first groups still give right results.
BODY = PREAMBLE + r"""
ga = dist.new_group([0, 1, 2])
gb = dist.new_group([1, 2])
g = dist.new_group([0, 1, 2], timeout=timedelta(seconds=2))
g2 = dist.new_group([0, 1])
dist.barrier()
mine = [(q, ranks) for q, ranks in ((ga, [0, 1, 2]), (gb, [1, 2])) if r in ranks]
if r == 2:
    mine.reverse()  # rank 2 issues gb first, rank 1 ga first
def both(it):
    # each group: all_reduce, broadcast, all_gather_into_tensor, all_gather, barrier (the
    # same order in a group on every rank; the groups' order differs between ranks 1 and 2)
    works, checks = [], []
    for q, ranks in mine:
        t = T(r + 1 + it, 1000)
        works.append(dist.all_reduce(t, group=q, async_op=True))
        checks.append((("order", ranks, it), t, T(sum(k + 1 + it for k in ranks), 1000)))
        b = T(r * 10 + it, 300)
        works.append(dist.broadcast(b, src=ranks[-1], group=q, async_op=True))
        checks.append((("broadcast order", ranks, it), b, T(ranks[-1] * 10 + it, 300)))
        g = torch.empty(len(ranks) * 3)
        works.append(dist.all_gather_into_tensor(g, T(r + it, 3), group=q, async_op=True))
        checks.append((("all_gather order", ranks, it), g,
                       torch.cat([T(k + it, 3) for k in ranks])))
        outs = [torch.empty(2) for _ in ranks]
        works.append(dist.all_gather(outs, T(-r - it, 2), group=q, async_op=True))
        checks.append((("all_gather list order", ranks, it), outs,
                       [T(-k - it, 2) for k in ranks]))
        works.append(dist.barrier(group=q, async_op=True))
    for w in works:
        w.wait()
    for case, got, want in checks:
        same = all(map(torch.equal, got, want)) if isinstance(got, list) else torch.equal(got, want)
        expect(same, case, str(got)[:200])
for it in range(3):
    both(it)
emit("orders")

if r in (0, 1):
    start = time.monotonic()
    try:
        dist.all_reduce(T(1), group=g)
        fail("timeout", "no error")
    except Exception as exc:
        error_record(exc, start)
arrive(f"raised {r}")
expect(wait_for("raised 0", "raised 1", "raised 2"), "raised", "a rank never got there")
t = T(r + 1)
dist.all_reduce(t)  # the default group, unharmed
expect(torch.equal(t, T(n * (n + 1) / 2)), "default after", str(t))
if r in (0, 1):
    t = T(r + 1)
    dist.all_reduce(t, group=g2)
    expect(torch.equal(t, T(3)), "g2 after", str(t))
    outs = [torch.empty(2) for _ in range(2)]
    dist.all_gather(outs, torch.full((2,), float(r)), group=g2)
    expect([o[0].item() for o in outs] == [0.0, 1.0], "g2 all_gather after", str(outs))
both(3)  # the groups of the first part, in opposite orders again
t = T(r)
dist.broadcast(t, src=n - 1)
expect(torch.equal(t, T(n - 1)), "default broadcast after", str(t))
emit("finished")
dist.destroy_process_group()
"""


def _torchrun_env(port):
    def env(rank, n):
        return {"RANK": rank, "WORLD_SIZE": n, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": n,
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TORCHELASTIC_RUN_ID": "none"}
    return env


@pytest.mark.timeout(90)
@pytest.mark.parametrize("backend", ["collectives", "gloo"])
def test_groups_are_independent_as_on_gloo(backend):
    res = run_world(3, BODY, args=[backend], rank_env=_torchrun_env(free_port()),
                    timeout=60, collective_timeout=None)
    res.assert_ok()
    for r in (0, 1):
        rec = res[r].one("error")
        assert rec is not None, res.report()
        assert rec["elapsed"] < 2 + 4, res.report()  # within the timeout (+ a loaded host)
        if backend == "collectives":
            # the first rank named is the one that never called (its neighbour that timed
            # out, or closed the links, comes after)
            assert f"rank {r}: rank 2 reported no error" in rec["message"], res.report()
    for rank in res.ranks:
        assert rank.one("orders") is not None and rank.one("finished") is not None, \
            res.report()


def test_a_group_reads_its_members_addresses_in_one_round_trip():
    """Building a group's links costs each member one wait and one multi_get for all the
    members' addresses, whatever the group's size (not one get per member)."""
    from collectives.torch.distributed.backend import _addresses_reader

    class Store:
        def __init__(self):
            self.calls = []
            self.data = {f"ns/addr/{q}": f"a{q}".encode() for q in range(64)}

        def wait(self, keys):
            self.calls.append(("wait", len(keys)))

        def multi_get(self, keys):
            self.calls.append(("multi_get", len(keys)))
            return [self.data[k] for k in keys]

        def get(self, key):
            self.calls.append(("get", key))
            return b"x"

    store = Store()
    get = _addresses_reader(store, "ns/", 64)
    assert [get(f"addr/{q}") for q in range(64)] == [f"a{q}".encode() for q in range(64)]
    assert store.calls == [("wait", 64), ("multi_get", 64)]
    assert get("encrypt_seen/3") == b"x" and store.calls[-1] == ("get", "ns/encrypt_seen/3")
