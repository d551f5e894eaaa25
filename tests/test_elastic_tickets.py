"""grow decides between a joiner's two store writes (issue 37, section 2).

A joiner takes a ticket (ADD reform/joiners) and then writes its key
(reform/joiner/<t>); grow's decision, made in between, must neither skip that
joiner for good nor wait past its deadline for one that died in between. The
store and the agreement run in this process: the race is made certain by
holding the joiner between its two writes.
"""
from __future__ import annotations

import threading
import time

import pytest

from collectives.elastic import membership as _membership
from collectives.rendezvous.store import StoreClient, StoreServer

pytestmark = pytest.mark.timeout(60)

SECRET = b"tickets-secret-0123456789abcdef"


@pytest.fixture
def store():
    srv = StoreServer("127.0.0.1", secret=SECRET)
    yield srv
    srv.close()


def _client(srv) -> StoreClient:
    return StoreClient("127.0.0.1", srv.port, timeout=10, secret=SECRET)


def _membership_of_one() -> _membership.Membership:
    return _membership.Membership("w", 0, "", [("127.0.0.1", 1)])


def test_grow_admits_a_joiner_caught_between_its_two_writes(store):
    joiner = _client(store)
    ticket = joiner.add("reform/joiners", 1)  # counted, key not written yet
    released = threading.Event()

    def finish_taking():
        released.wait(10)
        joiner.set(f"reform/joiner/{ticket}", b"")

    t = threading.Thread(target=finish_taking)
    t.start()
    rank = _client(store)
    threading.Timer(0.5, released.set).start()
    try:
        rec = _membership.admit_joiners(rank, _membership_of_one(), 0, 1,
                                        time.monotonic() + 10)
    finally:
        released.set()
        t.join()
    assert rec["members"] == [("r", 0), ("j", ticket)], rec
    admitted = _membership._decode_members(joiner.get(f"reform/admit/{ticket}", timeout=1))
    assert admitted["members"] == rec["members"]
    assert rec["next_ticket"] == ticket + 1


def test_a_joiner_that_died_between_its_writes_costs_at_most_the_deadline(store):
    _client(store).add("reform/joiners", 1)  # and never writes its key
    t0 = time.monotonic()
    with pytest.raises(_membership.ElasticError, match="0 process"):
        _membership.admit_joiners(_client(store), _membership_of_one(), 0, 1,
                                  time.monotonic() + 1.0)
    assert time.monotonic() - t0 < 4.0
