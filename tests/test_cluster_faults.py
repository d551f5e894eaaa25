"""Faults of a cluster, in network namespaces (issue 37, section 1; tests/_faults.py).

Ranks of H hosts x L ranks stream verified allreduces of 8 B to 16 MiB over
every algorithm (flat and two-level) while the test kills a host, takes its
link down (for good, or for a second), throttles it to 1 Mbit/s, partitions
the hosts or SIGSTOPs a host's ranks. Every survivor must raise within
timeout + 2 s naming the lost host and its ranks; nothing is silently wrong;
nothing hangs; after a lost host the survivors shrink and finish the training
from the last commit with the result a fresh run of the smaller world gives.
The README's reliability table comes from ``python bench/cluster_faults.py``.
"""
import pytest

from _faults import run_trial, summarize

pytestmark = pytest.mark.timeout(180)

TIMEOUT = 4.0

# (fault, hosts' rank counts, placement): the shapes rotate over the faults
LOST = [("kill", [4, 4], "cyclic"), ("down", [2, 2, 2], "block"),
        ("partition", [2, 2, 2], "cyclic"), ("stop", [2, 2], "cyclic")]


@pytest.mark.parametrize("fault,sizes,placement", LOST,
                         ids=[f"{f}-{'x'.join(map(str, s))}-{p}" for f, s, p in LOST])
def test_survivors_raise_in_time_naming_the_lost_host(fault, sizes, placement):
    t = run_trial(fault, sizes, placement, seed=37, timeout=TIMEOUT)
    s = summarize(t)
    report = f"{s}\n" + t.result.report(1500)
    assert s["wrong"] == 0 and s["hung"] == 0, report
    assert s["raised"] == s["survivors"] > 0, report
    assert s["named"] == s["survivors"], report
    assert s["max_s"] < TIMEOUT + 2, report
    for q in t.records:  # a survivor's call ends within timeout + 2 s; a cut-off rank's
        rec = t.records[q].get("raised")  # after at most the 2 s it asks the store too
        bound = TIMEOUT + (2 if q in t.survivors else 4.5)
        assert rec is None or rec["call_s"] < bound, report
    if fault != "kill":  # the cut-off ranks end too, with an error, not at the deadline
        for q in t.lost:
            assert "raised" in t.records[q], report


def test_a_link_down_for_a_second_costs_nothing():
    t = run_trial("blip", [2, 2], "cyclic", seed=5, timeout=TIMEOUT)
    s = summarize(t)
    report = f"{s}\n" + t.result.report(1500)
    assert t.healed_at > t.injected_at
    assert s["wrong"] == 0 and s["hung"] == 0, report
    for q in t.records:
        assert "completed" in t.records[q] and "raised" not in t.records[q], report


def test_a_crawling_link_fails_the_calls_that_cannot_finish_within_the_timeout():
    """The timeout bounds each call's whole duration (README, "Failures"): at 1 Mbit/s
    the stream's MiB-sized allreduces cannot finish in 4 s, so the first that cannot
    fails on every rank, no call outlives timeout + 2 s, and nothing is wrong."""
    t = run_trial("crawl", [2, 2], "block", seed=11, timeout=TIMEOUT)
    s = summarize(t)
    report = f"{s}\n" + t.result.report(1500)
    assert s["wrong"] == 0 and s["hung"] == 0, report
    for q in t.records:
        rec = t.records[q].get("raised")
        assert rec is not None, report
        assert rec["call_s"] < TIMEOUT + 2, report
    assert any("timed out" in t.records[q]["raised"]["message"] for q in t.records), report


def test_survivors_shrink_and_finish_as_the_smaller_world_would():
    t = run_trial("kill", [2, 2, 2], "block", seed=3, timeout=TIMEOUT, mode="shrink")
    report = t.result.report(1500)
    n, m = len(t.placement), len(t.survivors)
    states = set()
    for q in t.survivors:
        rec = t.records[q].get("resumed")
        assert rec is not None, report
        assert rec["size"] == m, report
        s0 = rec["s0"]
        # closed forms: step s adds the mean of (rank + s) over the world that ran it
        assert rec["committed"] == sum((n - 1) / 2 + s for s in range(s0)), report
        assert rec["state"] == rec["committed"] + sum((m - 1) / 2 + s
                                                      for s in range(s0, s0 + 6)), report
        states.add((s0, rec["state"]))
    assert len(states) == 1, report
    assert summarize(t)["wrong"] == 0
