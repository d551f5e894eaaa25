"""One two-rank communicator per (server, worker) pair, made through the world's store.

Why not the world communicator: the core treats a peer that dies as the end
of the communicator (every link closed, every later call refused), which is
right for a collective but would let one dead worker take the servers down
with it. A pair communicator breaks alone: the server drops that worker and
goes on with the others, while a worker whose server dies gets an error on
that pair, which names the server. Rank 0 of a pair is the server, rank 1
the worker; links are authenticated with the job's key like any other.
"""
from __future__ import annotations

import os
import time

from ..rendezvous import auth as _auth, env as _env, world as _world

SERVER, WORKER = 0, 1  # ranks inside a pair communicator


def _store():
    state = _world._state
    if state is None or state.client is None:
        raise RuntimeError("collectives.ps needs the world (collectives.init()) of >= 2 ranks "
                           "first")
    return state.client


def open_pairs(rank: int, size: int, peers: list, am_server: bool, timeout: float) -> dict:
    """Communicators between this rank and each rank in peers (servers: every worker;
    workers: every server), as {peer rank: Communicator}; every rank of the job calls this
    once, at the same point, and waits until every rank has made its pairs (so that rank 0,
    which hosts the store, cannot close it under a rank still reading)."""
    from .._core import Communicator

    client = _store()
    info = _env.detect()
    advertise = _env.advertise_address(info.store_host, info.store_port)
    key = _auth.link_key(_auth.job_secret())
    get = lambda k: client.get(k, timeout=timeout)  # noqa: E731
    comms = {}
    try:
        for peer in peers:
            srank, wrank = (rank, peer) if am_server else (peer, rank)
            prefix = f"ps/pair/{srank}/{wrank}/"
            if am_server:
                client.set(prefix + "id", os.urandom(16))
            core = Communicator(SERVER if am_server else WORKER, 2, advertise, get(prefix + "id"))
            comms[peer] = core
            core.set_link_key(key)
            # Handler threads wait in poll(), not spinning: a server runs one per worker.
            core.set_spin(0)
            _world.exchange_addresses(core, SERVER if am_server else WORKER, 2, advertise,
                                      lambda k, v, p=prefix: client.set(p + k, v),
                                      lambda k, p=prefix: get(p + k))
        deadline = time.monotonic() + timeout
        # Two rounds: every rank has made its pairs ("ready"), and every rank has seen that
        # ("seen"). Rank 0, which hosts the store, leaves only after the second, so no rank
        # is still reading the store when rank 0 goes on (and may exit, or die).
        stages = ("ready", "seen") if rank == 0 else ("ready",)
        client.set(f"ps/ready/{rank}", b"")
        for stage in stages:
            keys = [f"ps/{stage}/{r}" for r in range(size)]
            while not client.check(keys):
                if time.monotonic() > deadline:
                    missing = [r for r in range(size) if not client.check([f"ps/{stage}/{r}"])]
                    raise TimeoutError(f"rank {rank}: ranks {missing} did not set up the "
                                       f"parameter server within {timeout:g} s")
                time.sleep(0.01)
            if stage == "ready":
                client.set(f"ps/seen/{rank}", b"")
    except BaseException:
        for core in comms.values():
            core.close()
        raise
    return comms
