"""A root communicator with links of its own over the ranks of an existing one.

Why: the core's rule is that every collective on communicators sharing links
(a root and its Split/Dup subcommunicators, native/comm/subcomm.c) runs in
the same order on every rank, since links are FIFO and there are no
per-context receive queues. A front end that issues collectives from a
thread of its own (Horovod's negotiation in collectives.torch) cannot keep
that order with the user's thread, which may call MPI.COMM_WORLD,
torch.distributed or JAX on the world's links meanwhile, in a different
interleaving on each rank. A communicator with its own listener, links,
lock and progress thread has no such constraint: its messages never share a
link with the world's.

``own_links(core)`` makes one. It is a collective on ``core``: for the world,
an exchange through the world's store (rank 0's new context id, every rank's
address), so the world's own links are not connected for it; for another
communicator, a broadcast and an allgather on it. Every rank calls it at the
same point of its program, from the thread that issues core's other
collectives. The new communicator has core's ranks and
size, the job's link key, core's generation, and the same host policy
(spin, oversubscription, host ids: so same-host peers use shared memory and
a failure names the peer's host as the world's do).
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

import numpy as np

from . import auth as _auth
from . import env as _env
from . import world as _world

__all__ = ["own_links", "own_links_many", "advertise_of"]

MAX_RECORD = 64 << 10  # bytes of one rank's address record (a bound on what a peer sends)


def advertise_of(core: Any) -> str:
    """The address this rank publishes for new links: routed towards the world's store when
    there is one (as the world's rendezvous and the elastic re-form choose it), else the
    environment's store address, else loopback; ``COLLECTIVES_IFNAME`` wins as always."""
    state = _world._state
    client = getattr(state, "client", None) if state is not None else None
    inner = getattr(client, "inner", client)  # an elastic world's PrefixedClient wraps one
    if inner is not None and hasattr(inner, "host"):
        return _env.advertise_address(inner.host, inner.port)
    host = os.environ.get("COLLECTIVES_STORE_ADDR", "") or os.environ.get("MASTER_ADDR", "")
    return _env.advertise_address(host.rsplit(":", 1)[0] if host else None, None)


def _gather_records(core: Any, mine: dict) -> list:
    """Every rank's record (a dict of str -> bytes), gathered over core's links."""
    blob = json.dumps({k: v.hex() for k, v in mine.items()}).encode()
    if len(blob) > MAX_RECORD:
        raise ValueError(f"own_links: this rank's address record is {len(blob)} bytes, over "
                         f"{MAX_RECORD}")
    lens = np.empty(core.size, dtype=np.int64)
    core.allgatherv(np.array([len(blob)], dtype=np.int64), lens, [1] * core.size)
    if int(lens.min()) < 2 or int(lens.max()) > MAX_RECORD:  # a peer's sizes, bounded first
        raise ValueError(f"own_links: ranks announced records of {lens.tolist()} bytes")
    out = np.empty(int(lens.sum()), dtype=np.uint8)
    core.allgatherv(np.frombuffer(blob, dtype=np.uint8), out, [int(n) for n in lens])
    records, pos = [], 0
    for n in lens:
        text = bytes(out[pos:pos + int(n)])
        pos += int(n)
        records.append({k: bytes.fromhex(v) for k, v in json.loads(text).items()})
    return records


def _store_records(client: Any, ns: str, rank: int, size: int, mine: dict,
                   timeout: float) -> list:
    """Every rank's record, through the world's store under ns."""
    blob = json.dumps({k: v.hex() for k, v in mine.items()}).encode()
    client.set(f"{ns}{rank}", blob)
    out = []
    for peer in range(size):
        text = client.get(f"{ns}{peer}", timeout=timeout)
        if len(text) > MAX_RECORD:
            raise ValueError(f"own_links: rank {peer} published {len(text)} bytes")
        out.append({k: bytes.fromhex(v) for k, v in json.loads(text).items()})
    return out


def own_links(core: Any, advertise: Optional[str] = None) -> Any:
    """A new root ``collectives._core.Communicator`` over core's ranks with links of its own.

    Args:
        core: a live communicator (the world, a subcommunicator or another root); every
            rank of it calls own_links at the same point (a collective on core).
        advertise: the address to listen on and publish (default: advertise_of(core)).

    Returns:
        The new communicator; rank i of it is rank i of core. Close it with ``close()``.
    """
    return own_links_many(core, 1, advertise)[0]


def own_links_many(core: Any, count: int, advertise: Optional[str] = None) -> list:
    """`count` communicators as own_links makes one, for the cost of one exchange (their
    context ids from rank 0, then every rank's addresses)."""
    from .._core import Communicator, comm_generation, comm_set_generation

    rank, size = core.rank, core.size
    if size == 1:
        return [Communicator(0, 1) for _ in range(count)]
    state = _world._state
    client = getattr(state, "client", None) if state is not None else None
    if client is not None and state.core is core:
        # the world itself: exchange through its store, not its links, so that a front end
        # that never uses the world's links does not connect them (each costs a handshake)
        state.links_made = getattr(state, "links_made", 0) + 1  # equal on every rank
        ns = f"{state.prefix}links/{state.links_made}/"
        timeout = _world._default_timeout()
        if rank == 0:
            client.set(ns + "ids", os.urandom(16 * count))
        ids = np.frombuffer(client.get(ns + "ids", timeout=timeout), dtype=np.uint8)
        if ids.size != 16 * count:
            raise ValueError(f"own_links: rank 0 published {ids.size} bytes of context ids")
        records: Any = lambda mine: _store_records(client, ns, rank, size, mine, timeout)
    else:
        ids = np.frombuffer(os.urandom(16 * count), dtype=np.uint8).copy()
        core.broadcast(ids, 0)  # rank 0's ids: equal on every rank, new for these links
        records = lambda mine: _gather_records(core, mine)  # noqa: E731
    host = advertise if advertise is not None else advertise_of(core)
    key = _auth.link_key(_auth.job_secret(rank))
    generation = comm_generation(core)
    made: list = []
    try:
        for i in range(count):
            new = Communicator(rank, size, host, ids[16 * i:16 * (i + 1)].tobytes())
            made.append(new)
            new.set_link_key(key)
            if generation:  # an elastic world's number: a message of another one is refused
                comm_set_generation(new, generation)
        # One gather for all: every rank's record as exchange_addresses publishes it for
        # the first communicator ("addr/<rank>": address, port, host id, CPUs, shared
        # settings, encryption), plus the ports of all; the others' records are the
        # first's with their own port (the second line).
        mine: dict = {"ports": ",".join(str(new.port) for new in made).encode()}
        gathered: list = []

        def put(key: str, value: bytes) -> None:
            if gathered:  # exchange_addresses publishes all before it reads: one gather
                raise RuntimeError(f"own_links: {key!r} published after the exchange")
            mine[key] = value

        def get(key: str, i: int = 0) -> bytes:
            if not gathered:
                gathered.extend(records(mine))
            peer = int(key.rpartition("/")[2])
            value = gathered[peer][key]
            if i and key.startswith("addr/"):
                fields = value.decode().split("\n")
                fields[1] = gathered[peer]["ports"].decode().split(",")[i]
                value = "\n".join(fields).encode()
            return value

        for i, new in enumerate(made):
            hosts, host_cpus = _world.exchange_addresses(
                new, rank, size, host, put if i == 0 else (lambda k, v: None),
                lambda k, i=i: get(k, i))
            _world.apply_host_policy(new, *_world.local_place(hosts, rank), host_cpus)
    except BaseException:
        for new in made:
            new.close()
        raise
    return made
