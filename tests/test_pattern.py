"""Pure rank arithmetic of native/algorithms/pattern.h, in one process, for n = 1..64 (no sockets)."""

import pytest

from collectives._core import pattern

pytestmark = pytest.mark.timeout(60)

SIZES = range(1, 65)


def _roots(n):
    return sorted({0, 1 % n, n // 2, n - 1})


@pytest.mark.parametrize("count", [0, 1, 2, 5, 63, 64, 65, 1000, 4097])
def test_split_partitions_exactly(count):
    for parts in SIZES:
        pieces = [pattern("split", count, parts, i) for i in range(parts)]
        pos = 0
        for i, (off, ln) in enumerate(pieces):
            assert off == pos, (count, parts, i, pieces)
            pos += ln
        assert pos == count, (count, parts)
        lens = [ln for _, ln in pieces]
        assert max(lens) - min(lens) <= 1, (count, parts, lens)
        assert lens == sorted(lens, reverse=True), "the larger parts come first"


def test_ring_reduce_scatter_and_allgather():
    for n in SIZES:
        steps = range(n - 1)
        for r in range(n):
            prev = (r - 1) % n
            for s in steps:
                # what r receives in step s is what its left neighbour sends in step s
                assert pattern("ring_rs_recv", r, n, s) == pattern("ring_rs_send", prev, n, s)
                assert pattern("ring_ag_recv", r, n, s) == pattern("ring_ag_send", prev, n, s)
            rs_recv = [pattern("ring_rs_recv", r, n, s) for s in steps]
            ag_recv = [pattern("ring_ag_recv", r, n, s) for s in steps]
            # every chunk but one is received exactly once per phase
            assert len(set(rs_recv)) == n - 1, (n, r, rs_recv)
            assert len(set(ag_recv)) == n - 1, (n, r, ag_recv)
            owned = (r + 1) % n
            # reduce-scatter: a chunk is sent only after it was received (or it is one's own
            # start chunk), and the last chunk received is the one owned afterwards
            if n > 1:
                assert rs_recv[-1] == owned, (n, r, rs_recv)
                assert pattern("ring_rs_send", r, n, 0) == r
                for s in range(1, n - 1):
                    assert pattern("ring_rs_send", r, n, s) == rs_recv[s - 1]
                # allgather starts by sending the owned chunk; receives everything else
                assert pattern("ring_ag_send", r, n, 0) == owned
                assert set(ag_recv) | {owned} == set(range(n)), (n, r, ag_recv)
                for s in range(1, n - 1):
                    assert pattern("ring_ag_send", r, n, s) == ag_recv[s - 1]
        # after reduce-scatter the owners are a permutation
        assert sorted((r + 1) % n for r in range(n)) == list(range(n))


def test_tree_parent_child_consistent():
    for n in SIZES:
        for root in _roots(n):
            assert pattern("tree_parent", root, n, root) == -1
            parents = {}
            for r in range(n):
                p = pattern("tree_parent", r, n, root)
                if r != root:
                    assert 0 <= p < n and p != r, (n, root, r, p)
                    parents[r] = p
                    kids = [pattern("tree_child", p, n, root, w) for w in (0, 1)]
                    assert kids.count(r) == 1, (n, root, r, p, kids)
                for w in (0, 1):
                    c = pattern("tree_child", r, n, root, w)
                    if c != -1:
                        assert 0 <= c < n and pattern("tree_parent", c, n, root) == r
            # no cycles, root reached from everywhere
            for r in range(n):
                seen, x = set(), r
                while x != root:
                    assert x not in seen, (n, root, r)
                    seen.add(x)
                    x = parents[x]
                assert len(seen) <= n


def test_binomial_parent_children_spanning():
    for n in SIZES:
        for root in _roots(n):
            assert pattern("binomial_parent", root, n, root) == -1
            child_of = {}
            for r in range(n):
                kids = pattern("binomial_children", r, n, root)
                assert len(set(kids)) == len(kids)
                for c in kids:
                    assert 0 <= c < n and c != root
                    assert c not in child_of, f"n={n} root={root}: {c} has two parents"
                    child_of[c] = r
                    assert pattern("binomial_parent", c, n, root) == r, (n, root, r, c)
            assert set(child_of) == set(range(n)) - {root}, (n, root)
            for r in range(n):
                if r != root:
                    assert child_of[r] == pattern("binomial_parent", r, n, root)
                seen, x = set(), r
                while x != root:
                    assert x not in seen
                    seen.add(x)
                    x = child_of[x]
                # depth is at most ceil(log2 n)
                assert len(seen) <= max(1, (n - 1).bit_length())


def test_butterfly_vrank_real_inverse():
    for n in SIZES:
        p = pattern("pow2_floor", n)
        assert p <= n < 2 * p and p & (p - 1) == 0
        vranks = [pattern("bfly_vrank", r, n) for r in range(n)]
        active = [v for v in vranks if v != -1]
        assert sorted(active) == list(range(p)), (n, vranks)
        assert vranks.count(-1) == n - p
        for r, v in enumerate(vranks):
            if v == -1:
                # an extra rank folds into r + 1, which takes part
                assert r + 1 < n and vranks[r + 1] != -1, (n, r)
            else:
                assert pattern("bfly_real", v, n) == r
        for v in range(p):
            assert pattern("bfly_vrank", pattern("bfly_real", v, n), n) == v
