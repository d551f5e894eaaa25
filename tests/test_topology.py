"""Topology arithmetic and host-aware schedules, in one process without a socket.

The host picture (native/algorithms/topology.h) is checked for many shapes
and placements. Then every rank's allreduce schedule is built by the core
(dryrun_allreduce) and all of them are run together in a small simulator of
the executor's rules: steps wait for their predecessors, each link delivers
in the order steps were added, a send completes into at most CAP bytes of
link buffer (or hands over directly to a waiting receive). The simulator
checks that every message matches its receive (size and offset), that
nothing waits forever, that every rank ends with the exact sum, and counts
the bytes that leave each host.
"""
import random

import numpy as np
import pytest

from collectives._core import dryrun, topology

pytestmark = pytest.mark.timeout(120)

SEND, RECV, RECV_REDUCE, COPY = 0, 1, 2, 3
CAP = 64 * 1024  # link buffering assumed by the simulator: below any real socket's


def block(hosts):
    """Labels for consecutive ranks per host: block([2, 3]) == [0, 0, 1, 1, 1]."""
    return [h for h, k in enumerate(hosts) for _ in range(k)]


def cyclic(hosts):
    """Labels dealt round robin over the hosts that still have ranks (srun -m cyclic)."""
    left, out = list(hosts), []
    while any(left):
        for h in range(len(left)):
            if left[h]:
                out.append(h)
                left[h] -= 1
    return out


def shuffled(hosts, seed):
    labels = block(hosts)
    random.Random(seed).shuffle(labels)
    return labels


SHAPES = [[1], [4], [1, 1], [1, 1, 1], [2, 2], [2, 4], [4, 2], [3, 3], [2, 2, 2],
          [2, 2, 2, 2], [2, 3], [3, 2], [1, 3], [4, 1, 2], [1, 2, 2, 3]]


def placements(hosts):
    yield "block", block(hosts)
    yield "cyclic", cyclic(hosts)
    yield "random", shuffled(hosts, sum(hosts) * 7 + len(hosts))


def test_topology_groups_hosts_and_orders_ranks_host_by_host():
    for hosts in SHAPES + [[5, 1, 7], [8] * 8, [1] * 64]:
        for name, labels in placements(hosts):
            n = len(labels)
            t = topology(labels)
            # hosts by rank count (most first), ties by their lowest rank; ranks
            # ascending inside a host
            firsts = [min(r for r in range(n) if labels[r] == lab) for lab in labels]
            expect_hosts = []
            for r in range(n):
                if firsts[r] == r:
                    expect_hosts.append([q for q in range(n) if labels[q] == labels[r]])
            expect_hosts.sort(key=lambda h: (-len(h), h[0]))
            assert t["hosts"] == expect_hosts, (hosts, name)
            assert t["order"] == [r for h in expect_hosts for r in h]
            assert sorted(t["order"]) == list(range(n))
            for v, r in enumerate(t["order"]):
                assert t["pos"][r] == v
            for h, ranks in enumerate(expect_hosts):
                for l, r in enumerate(ranks):
                    assert t["host"][r] == h and t["local"][r] == l
            sizes = [len(h) for h in expect_hosts]
            assert (t["min_local"], t["max_local"]) == (min(sizes), max(sizes))
            assert t["two_level"] == (len(sizes) >= 2 and max(sizes) >= 2)
            # slice j is owned on host h by its local rank j mod L_h
            for h, ranks in enumerate(expect_hosts):
                assert t["owners"][h] == [ranks[j % len(ranks)] for j in range(max(sizes))]


def test_topology_of_one_host_or_unknown_hosts_is_the_identity():
    for n in range(1, 17):
        for labels in ([0] * n, list(range(n))):
            t = topology(labels)
            assert t["order"] == list(range(n)) and t["pos"] == list(range(n))
            assert not t["two_level"]


def test_topology_rejects_an_empty_world():
    with pytest.raises(ValueError):
        topology([])


def simulate(labels, algorithm, count, segment_bytes=0, in_place=False, collective="allreduce"):
    """Runs every rank's schedule; returns (outputs, expected output, bytes leaving each host)."""
    n = len(labels)
    scheds = [dryrun(collective, labels, r, algorithm, count, "int64", segment_bytes, in_place)
              for r in range(n)]
    length = count * n if collective == "reduce_scatter" else count
    ins = [np.arange(length, dtype=np.int64) * (r + 1) + 1000 * r for r in range(n)]
    if collective == "reduce_scatter":  # out is the scratch; rank r's block is checked
        expect = sum(ins)
        bufs = [[x.copy(), np.full(length, -7, np.int64)] for x in ins]
    elif collective == "allreduce":
        expect = sum(ins)
        bufs = [[x.copy(), x.copy() if in_place else np.full(count, -7, np.int64)] for x in ins]
        if in_place:
            for b in bufs:
                b[0] = b[1]
    else:
        expect = np.concatenate(ins) if ins else np.empty(0, np.int64)
        bufs = []
        for r, x in enumerate(ins):
            out = np.full(n * count, -7, np.int64)
            if in_place:
                out[r * count:(r + 1) * count] = x
            bufs.append([x.copy(), out])
    npred, succ, done = [], [], []
    sq, rq = [], []  # per rank: peer -> step indices, in the order added
    for r, (steps, edges) in enumerate(scheds):
        npred.append([0] * len(steps))
        succ.append([[] for _ in steps])
        for p, s in edges:
            npred[r][s] += 1
            succ[r][p].append(s)
        done.append([False] * len(steps))
        sq.append({})
        rq.append({})
        for i, st in enumerate(steps):
            assert st[0] == COPY or (0 <= st[1] < n and st[1] != r), (r, i, st)
            if st[0] == SEND:
                sq[r].setdefault(st[1], []).append(i)
            elif st[0] in (RECV, RECV_REDUCE):
                rq[r].setdefault(st[1], []).append(i)
            for b in (st[4], st[6]):
                assert b in (-1, 0, 1), (r, i, st)
    chan = {}  # (src, dst) -> list of (nbytes, offset, data)
    sent_from_host = {}

    def view(r, buf, off, nbytes):
        assert off % 8 == 0 and nbytes % 8 == 0
        return bufs[r][buf][off // 8:(off + nbytes) // 8]

    def finish(r, i):
        done[r][i] = True
        for s in succ[r][i]:
            npred[r][s] -= 1

    def head(queue, r):
        while queue and done[r][queue[0]]:
            queue.pop(0)
        return queue[0] if queue else None

    def deliver(r, i, msg):
        st = scheds[r][0][i]
        nbytes, off, data = msg
        assert (nbytes, off) == (st[2], st[3]), f"rank {r} step {i} {st} got {nbytes} B at {off}"
        dst = view(r, st[6], st[7], st[2])
        if st[0] == RECV_REDUCE:
            dst[...] = view(r, st[4], st[5], st[2]) + data
        else:
            dst[...] = data
        finish(r, i)

    remaining = sum(len(s[0]) for s in scheds)
    while remaining:
        moved = 0
        for r in range(n):
            steps = scheds[r][0]
            for i, st in enumerate(steps):
                if st[0] == COPY and not done[r][i] and npred[r][i] == 0:
                    if st[2]:
                        view(r, st[6], st[7], st[2])[...] = view(r, st[4], st[5], st[2]).copy()
                    finish(r, i)
                    moved += 1
            for peer, queue in sq[r].items():
                i = head(queue, r)
                if i is None or npred[r][i]:
                    continue
                st = steps[i]
                q = chan.setdefault((r, peer), [])
                msg = (st[2], st[3], view(r, st[4], st[5], st[2]).copy())
                buffered = sum(m[0] for m in q)
                if buffered + st[2] <= CAP:
                    q.append(msg)
                else:
                    # too big for the buffer: only straight into a receive waiting for it
                    j = head(rq[peer].get(r, []), peer)
                    if q or j is None or npred[peer][j]:
                        continue
                    deliver(peer, j, msg)
                    moved += 1
                finish(r, i)
                moved += 1
                if labels[peer] != labels[r]:
                    sent_from_host[labels[r]] = sent_from_host.get(labels[r], 0) + st[2]
            for peer, queue in rq[r].items():
                i = head(queue, r)
                q = chan.get((peer, r))
                if i is None or npred[r][i] or not q:
                    continue
                deliver(r, i, q.pop(0))
                moved += 1
        remaining = sum(d.count(False) for d in done)
        if remaining and not moved:
            stuck = {r: [i for i, d in enumerate(done[r]) if not d][:4] for r in range(n)}
            raise AssertionError(f"{algorithm} {labels} count {count}: nothing can move; "
                                 f"first waiting steps per rank: {stuck}")
    assert all(not q for q in chan.values()), "messages nobody received"
    return [b[1] for b in bufs], expect, sent_from_host


ALGORITHMS = ["two_level", "ring", "butterfly", "tree"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_rank_gets_the_exact_sum_for_every_shape_and_placement(algorithm):
    for hosts in SHAPES:
        for name, labels in placements(hosts):
            n = len(labels)
            if n == 1 and algorithm != "two_level":
                continue  # one rank copies before any schedule (comm.c); only two_level builds one
            for count, seg in ((0, 0), (1, 0), (n + 1, 0), (37, 16), (1000, 256),
                               (5000, 4096)):
                for in_place in (False, True):
                    outs, expect, _ = simulate(labels, algorithm, count, seg, in_place)
                    for r, out in enumerate(outs):
                        assert np.array_equal(out, expect), (algorithm, hosts, name, count, seg,
                                                             in_place, r)


def test_two_level_sends_2_h_minus_1_over_h_of_the_message_per_host_link():
    count = 1 << 15  # 256 KiB of int64: several slices and segments
    S = count * 8
    for hosts in ([2, 2], [2, 4], [4, 2], [3, 2], [2, 3], [2, 2, 2, 2]):
        H = len(hosts)
        for name, labels in placements(hosts):
            _, _, out_two = simulate(labels, "two_level", count, 8192)
            for h in range(H):
                # each slice crosses each host link 2(H-1)/H times in a ring rail
                assert out_two.get(h, 0) <= 2 * (H - 1) / H * S * 1.01 + 64 * H, (hosts, name, h)
            _, _, out_ring = simulate(labels, "ring", count, 8192)
            n = len(labels)
            # the flat ring in host order: one hop leaves each host, 2(n-1)/n S through it
            for h in range(H):
                assert out_ring.get(h, 0) <= 2 * (n - 1) / n * S * 1.01 + 64, (hosts, name, h)
            if max(hosts) > 1:
                assert sum(out_two.values()) < sum(out_ring.values())


def test_placement_does_not_change_what_crosses_hosts():
    count = 1 << 14
    for hosts in ([2, 2], [2, 4], [4, 2], [2, 3]):
        for algorithm in ALGORITHMS:
            totals = set()
            for name, labels in placements(hosts):
                _, _, out = simulate(labels, algorithm, count, 8192)
                totals.add(sum(out.values()))
            # equal up to the one-element differences between balanced chunks
            assert max(totals) - min(totals) <= 8 * 4 * sum(hosts), (hosts, algorithm, totals)


@pytest.mark.parametrize("algorithm", ["two_level", "ring"])
def test_allgather_every_rank_gets_every_block_for_every_shape_and_placement(algorithm):
    for hosts in SHAPES:
        for name, labels in placements(hosts):
            n = len(labels)
            if n == 1 and algorithm != "two_level":
                continue
            for count, seg in ((0, 0), (1, 0), (n + 1, 0), (37, 16), (5000, 4096)):
                for in_place in (False, True):
                    outs, expect, _ = simulate(labels, algorithm, count, seg, in_place,
                                               "allgather")
                    for r, out in enumerate(outs):
                        assert np.array_equal(out, expect), (algorithm, hosts, name, count, seg,
                                                             in_place, r)


def test_allgather_two_level_sends_h_minus_1_over_h_per_host_link():
    count = 4096  # per rank
    for hosts in ([2, 2], [2, 4], [4, 2], [2, 3], [3, 3, 3]):
        n, H = sum(hosts), len(hosts)
        for name, labels in placements(hosts):
            _, _, out_two = simulate(labels, "two_level", count, 8192, collective="allgather")
            _, _, out_ring = simulate(labels, "ring", count, 8192, collective="allgather")
            for h in range(H):
                mine = labels.count(h)
                # each host's blocks go out once per other host: (H-1)/H of the buffer for
                # even hosts; a ring in host order sends n-1 blocks out of every host
                assert out_two.get(h, 0) == mine * count * 8 * (H - 1), (hosts, name, h)
                assert out_ring.get(h, 0) == (n - 1) * count * 8, (hosts, name, h)


@pytest.mark.parametrize("algorithm", ["two_level", "ring"])
def test_reduce_scatter_every_rank_gets_its_block_reduced(algorithm):
    for hosts in SHAPES:
        for name, labels in placements(hosts):
            n = len(labels)
            if n == 1:
                continue  # one rank copies (comm.c)
            for count, seg in ((0, 0), (1, 0), (n + 1, 0), (37, 16), (3000, 4096)):
                outs, expect, sent = simulate(labels, algorithm, count, seg,
                                              collective="reduce_scatter")
                for r, out in enumerate(outs):
                    blk = slice(r * count, (r + 1) * count)
                    assert np.array_equal(out[blk], expect[blk]), (algorithm, hosts, name, count,
                                                                   seg, r)
                if algorithm == "two_level":
                    H = len(hosts)
                    for h in range(H):  # one partial per destination on another host
                        mine = labels.count(h)
                        assert sent.get(h, 0) == (n - mine) * count * 8, (hosts, name, h, sent)


def test_dryrun_rejects_bad_arguments():
    with pytest.raises(ValueError):
        dryrun("allreduce", [0, 0], 0, "auto", 4)
    with pytest.raises(ValueError):
        dryrun("allreduce", [0, 0], 2, "ring", 4)
    with pytest.raises(ValueError):
        dryrun("allreduce", [0, 0], 0, "ring", 4, "complex")
    with pytest.raises(ValueError):
        dryrun("allgather", [0, 0], 0, "butterfly", 4)
    with pytest.raises(ValueError):
        dryrun("alltoall", [0, 0], 0, "ring", 4)


def test_rails_of_4_and_8_hosts_carry_medium_slices_exactly():
    """Slices of 32 KiB - 80 KiB (past the rails' full-exchange limit) on 4 and 8 hosts:
    exact sums, uneven element counts, every placement, in place or not, and
    2(H-1)/H of the message per host link."""
    for hosts in ([2, 2, 2, 2], [1, 2, 1, 2], [1] * 7 + [2]):
        H = len(hosts)
        for name, labels in placements(hosts):
            for count, seg in ((9001, 0), (20011, 16384)):  # int64: 36-80 KiB slices
                for in_place in (False, True):
                    outs, expect, sent = simulate(labels, "two_level", count, seg, in_place)
                    for r, out in enumerate(outs):
                        assert np.array_equal(out, expect), (hosts, name, count, in_place, r)
                    S = count * 8
                    for h in range(H):
                        assert sent.get(h, 0) <= 2 * (H - 1) / H * S * 1.01 + 64 * H, (hosts, h)
