"""Elastic worlds: a worker's side of ``collectives-run --elastic``.

Under the elastic launcher a process is a *worker* with a stable id
(``COLLECTIVES_ELASTIC_ID``), not a fixed rank. The launcher (the driver,
``collectives/launcher/elastic_driver.py``) hosts the store for the whole job, so the
store outlives any worker, and it decides who is in each *generation* of the
world. All keys are the driver's except the ones a worker writes:

    elastic/gen              counter: the newest generation (0: none yet)
    elastic/members/<g>      "upd\\nid,id,...\\ncomm-id hex": the update count
                             when g was published, the workers in rank order
    elastic/updates          counter: host updates announced so far
    elastic/update/<n>       "added" or "removed": what update n was
    elastic/ready/<id>       set by worker <id> when it first reaches the store
    g<g>/addr/<rank> ...     generation g's own rendezvous and failure reports
                             (collectives/rendezvous/world.py), under the prefix g<g>/

A worker's init (:func:`rendezvous`) waits for the newest generation that
lists it, publishes its address under that generation's prefix and reads its
peers'. If the driver publishes a newer generation meanwhile (a peer died, or
joined), the worker drops the half-made world and joins the newer one. Keys
of generation g are never read by generation g+1, so no stale address or
failure report of a previous world is ever taken for a current one.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Optional

from ..rendezvous import auth as _auth, env as _env, store as _store
from .. import config

__all__ = ["ID_VAR", "is_elastic", "worker_id", "Generation", "current", "rendezvous",
           "host_updates", "PrefixedClient", "parse_members", "format_members"]

ID_VAR = "COLLECTIVES_ELASTIC_ID"
POLL_S = 0.005
MAX_UPDATES_READ = 64

_announced = False
_current: Optional["Generation"] = None


def is_elastic() -> bool:
    """True in a worker started by ``collectives-run --elastic``."""
    return bool(os.environ.get(ID_VAR))


def worker_id() -> str:
    """This worker's stable id (COLLECTIVES_ELASTIC_ID)."""
    return os.environ[ID_VAR]


def format_members(updates: int, ids: list, comm_id: bytes) -> bytes:
    """The record of a generation: update count, member ids in rank order, comm id."""
    return f"{updates}\n{','.join(map(str, ids))}\n{comm_id.hex()}".encode()


def parse_members(raw: bytes) -> tuple:
    """(updates, [ids], comm_id) from a record written by format_members."""
    upd, ids, comm = raw.decode().split("\n")
    return int(upd), [i for i in ids.split(",") if i], bytes.fromhex(comm)


class Generation:
    """The generation of the world this worker is in: number, rank, size, members."""

    def __init__(self, number: int, rank: int, ids: list, updates: int,
                 client: "_store.StoreClient") -> None:
        self.client = client  # the store's (closed with the world)
        self.number = number
        self.rank = rank
        self.ids = ids
        self.size = len(ids)
        self.updates = updates


def current() -> Optional[Generation]:
    """The generation of the world formed last (None before the first)."""
    return _current


class PrefixedClient:
    """A store client whose keys all get a prefix (one generation's namespace)."""

    def __init__(self, inner: "_store.StoreClient", prefix: str) -> None:
        self.inner = inner
        self.prefix = prefix
        self.address = inner.address

    @property
    def timeout(self) -> float:
        """The inner client's default timeout."""
        return self.inner.timeout

    def set(self, key: str, value: bytes, timeout: Optional[float] = None) -> None:
        """Set prefix+key."""
        self.inner.set(self.prefix + key, value, timeout=timeout)

    def get(self, key: str, timeout: Optional[float] = None,
            io_timeout: Optional[float] = None) -> bytes:
        """Get prefix+key (waiting as StoreClient.get)."""
        return self.inner.get(self.prefix + key, timeout=timeout, io_timeout=io_timeout)

    def check(self, keys, timeout: Optional[float] = None) -> bool:
        """True if every prefix+key exists."""
        keys = [keys] if isinstance(keys, str) else keys
        return self.inner.check([self.prefix + k for k in keys], timeout=timeout)

    def add(self, key: str, amount: int) -> int:
        """Add to the counter prefix+key."""
        return self.inner.add(self.prefix + key, amount)

    def delete(self, key: str) -> bool:
        """Remove prefix+key."""
        return self.inner.delete(self.prefix + key)

    def close(self) -> None:
        """Close the inner client."""
        self.inner.close()


class _Superseded(Exception):
    """A newer generation was published while this one was forming."""


def _store_addr() -> tuple:
    text = os.environ.get("COLLECTIVES_STORE_ADDR", "")
    if not text:
        raise RuntimeError(f"{ID_VAR} is set but COLLECTIVES_STORE_ADDR is not: elastic workers "
                           f"are started by collectives-run --elastic")
    return _env.parse_addr(text)


def rendezvous(timeout: float, exchange: Callable, place: Callable) -> tuple:
    """Join the newest generation that lists this worker.

    Waits (up to ``timeout`` seconds) for the driver to list this worker in a
    generation newer than the last one it was in; a new worker waits there
    until the running ones reach their next commit. ``exchange`` and ``place``
    are collectives.rendezvous.world's exchange_addresses and local_place (which calls
    this: the world module sits above this one).

    Returns:
        (core, client, local_rank, local_size, host_cpus) as _world's own
        rendezvous: the native communicator and the generation's store client.
    """
    global _announced, _current
    from .._core import Communicator

    config.check_env()
    secret = _auth.job_secret()
    host, port = _store_addr()
    ident = worker_id()
    last = _current.number if _current is not None else 0
    deadline = time.monotonic() + timeout
    client = _store.StoreClient(host, port, timeout=timeout, secret=secret)
    try:
        if not _announced:
            client.set(f"elastic/ready/{ident}", str(os.getpid()).encode())
            _announced = True
        while True:
            g = client.add("elastic/gen", 0)
            if g > last:
                updates, ids, comm_id = parse_members(client.get(f"elastic/members/{g}"))
                if ident in ids:
                    try:
                        formed = _form(client, g, ids.index(ident), ids, comm_id, deadline,
                                       host, port, secret, Communicator, exchange, place)
                    except _Superseded:
                        continue
                    _current = Generation(g, ids.index(ident), ids, updates, client)
                    return formed
            if time.monotonic() >= deadline:
                raise TimeoutError(f"elastic worker {ident}: no generation of the world listed "
                                   f"it within {timeout:g} s (the launcher stopped admitting "
                                   f"workers, or the job is over)")
            time.sleep(0.02)
    except BaseException:
        client.close()
        raise


def _form(client, g: int, rank: int, ids: list, comm_id: bytes, deadline: float,
          host: str, port: int, secret: bytes, Communicator, exchange, place) -> tuple:
    size = len(ids)
    scoped = PrefixedClient(client, f"g{g}/")
    advertise = _env.advertise_address(host, port)
    core = Communicator(rank, size, advertise, comm_id)
    try:
        core.set_link_key(_auth.link_key(secret))

        def get(key: str) -> bytes:
            while not scoped.check([key]):
                if client.add("elastic/gen", 0) != g:
                    raise _Superseded
                if time.monotonic() >= deadline:
                    missing = [ids[r] for r in range(size) if not scoped.check([f"addr/{r}"])]
                    raise TimeoutError(f"elastic generation {g}: worker(s) "
                                       f"{', '.join(missing)} did not arrive in time")
                time.sleep(POLL_S)
            return scoped.get(key)

        hosts, host_cpus = exchange(core, rank, size, advertise, scoped.set, get)
        scoped.set(f"joined/{rank}", b"")
    except BaseException:
        core.close()
        raise
    local_rank, local_size = place(hosts, rank)
    return core, scoped, local_rank, local_size, host_cpus


def host_updates(since: int) -> tuple:
    """(count, removed_only): the host updates announced so far, and whether every one
    after `since` removed hosts (Horovod's skip_sync). Reads the store of the world."""
    if _current is None:
        return since, False
    inner = _current.client
    count = inner.add("elastic/updates", 0)
    # the last few updates decide (a count from the store is bounded before use)
    kinds = [inner.get(f"elastic/update/{n}", timeout=5.0).decode()
             for n in range(max(since + 1, count - MAX_UPDATES_READ + 1), count + 1)]
    return count, bool(kinds) and all(k == "removed" for k in kinds)
