"""The world communicator re-formed: shrink, grow, join and agree over the job's store.

collectives/elastic/membership.py holds the agreements; this module applies them to the world
that collectives/rendezvous/world.py made (its store client, its rank-0 store server, its host
policy) and installs the new world, so ``MPI.COMM_WORLD``, ``collectives.init()`` and
the adapters built on them see the new communicator from then on.
"""
from __future__ import annotations

import time
from typing import Optional

from ..rendezvous import auth as _auth, env as _env, world as _world
from . import membership as _membership


def _timeout(timeout: Optional[float]) -> float:
    return float(timeout) if timeout else _world._default_timeout()


def _store_gone(client, exc: BaseException) -> _membership.ElasticError:
    where = ("the launcher hosts it (COLLECTIVES_STORE_EXTERNAL=1): is the launcher gone?"
             if _world.store_external() else
             "it lives in rank 0 of the job as started (collectives-run, or a plain "
             "environment), so a world whose rank 0 died cannot re-form; a launcher that "
             "hosts the store (COLLECTIVES_STORE_EXTERNAL=1) keeps it alive")
    return _membership.ElasticError(f"the job's store at {client.address} is gone ({exc}): "
                                 f"{where}")


def _current_membership(state) -> _membership.Membership:
    """The current world's membership: kept from the last re-form, or read once from the
    initial rendezvous's addresses (this world's own keys)."""
    if state.membership is None:
        addrs = []
        for r in range(state.core.size):
            host, port = state.client.get(f"{state.prefix}addr/{r}",
                                          timeout=5.0).decode().split("\n")[:2]
            addrs.append((host, int(port)))
        state.membership = _membership.Membership(f"w{_world._generation}", 0, "", addrs)
    return state.membership


def _core_maker(client, generation: int):
    from .._core import Communicator, comm_set_generation

    advertise = _env.advertise_address(client.host, client.port)
    key = _auth.link_key(_auth.job_secret())

    def make(rank: int, size: int, comm_id: bytes):
        core = Communicator(rank, size, advertise, comm_id)
        try:
            core.set_link_key(key)
            comm_set_generation(core, generation)
        except BaseException:
            core.close()
            raise
        return core

    def exchange(core, rank, size, put, get):
        return _world.exchange_addresses(core, rank, size, advertise, put, get)

    return make, exchange


def _install(old, client, server, rec: dict, formed, wrap):
    """Make the new world this process's world (wrap(core, local_rank, local_size) makes the
    front end's communicator, as for _world.init); close the old communicator."""
    core, rank, size, hosts, host_cpus, addrs = formed
    local_rank, local_size = _world.local_place(hosts, rank)
    _world.apply_host_policy(core, local_rank, local_size, host_cpus)
    comm = wrap(core, local_rank, local_size)
    ms = _membership.Membership(rec["world"], rec["generation"], rec["base"], addrs,
                             rec["next_ticket"])
    if old is not None:
        old.core.close()
    _world._state = _world._World(comm, core, server, client, prefix=rec["base"], membership=ms)
    return comm


def _world_state(what: str):
    state = _world._state
    if state is None:
        raise _membership.ElasticError(f"{what} needs the world communicator: call "
                                    f"collectives.init() first")
    if state.client is None:
        raise _membership.ElasticError(f"{what} needs a world formed through the job's store "
                                    f"(this one has a single rank)")
    return state


def check_world(comm, what: str) -> None:
    """Refuse an elastic operation on a communicator other than the world."""
    state = _world._state
    if state is None or state.comm is not comm:
        raise NotImplementedError(f"Comm.{what} works on the world communicator (COMM_WORLD "
                                  f"as it is now), not on one made by Split/Dup or closed")


def shrink(timeout: Optional[float], wrap):
    """The survivors' new world communicator (see collectives.shrink)."""
    with _world._lock:
        state = _world_state("shrink")
        client = state.client
        me = state.core.rank
        t = _timeout(timeout)
        attempt = 0
        try:
            ms = _current_membership(state)
            while True:
                # Each bound is fresh: the agreement may wait its whole timeout for a
                # rank that neither answers nor is seen dead, and forming then needs
                # time of its own (an attempt at most 2 t; at most one more attempt per
                # rank that dies meanwhile).
                rec = _membership.agree_survivors(client, ms, me, attempt, time.monotonic() + t)
                deadline = time.monotonic() + t
                if ("r", me) not in rec["members"]:
                    raise _membership.ElasticError(
                        f"rank {me} was left out of generation {rec['generation']}: the "
                        f"survivors agreed without it (it reached shrink after they decided)")
                make, exchange = _core_maker(client, rec["generation"])
                try:
                    formed = _membership.form(client, rec, ("r", me), ms, make, exchange, deadline)
                except _membership._Retry:
                    attempt += 1  # a member died during the agreement: again, without it
                    continue
                return _install(state, client, state.server, rec, formed, wrap)
        except ConnectionError as exc:
            raise _store_gone(client, exc) from None
        except TimeoutError as exc:
            raise _membership.ElasticError(f"shrink did not complete in time: {exc}") from None


def grow(min_new: int, timeout: Optional[float], wrap):
    """The world communicator with the waiting joiners added (see collectives.grow)."""
    if min_new < 0:
        raise ValueError(f"min_new must be >= 0, not {min_new}")
    with _world._lock:
        state = _world_state("grow")
        client = state.client
        me = state.core.rank
        deadline = time.monotonic() + _timeout(timeout)
        try:
            ms = _current_membership(state)
            rec = _membership.admit_joiners(client, ms, me, min_new, deadline)
            deadline = time.monotonic() + _timeout(timeout)  # forming: a bound of its own
            make, exchange = _core_maker(client, rec["generation"])
            try:
                formed = _membership.form(client, rec, ("r", me), ms, make, exchange, deadline)
            except _membership._Retry as exc:
                raise _membership.ElasticError(f"grow failed: {exc} died before the new world "
                                            f"formed; shrink, then grow again") from None
        except (ConnectionError, TimeoutError) as exc:
            raise _store_gone(client, exc) from None
        return _install(state, client, state.server, rec, formed, wrap)


def join(timeout: Optional[float], wrap):
    """This new process's world communicator, once a grow admits it (see collectives.join)."""
    with _world._lock:
        if _world._state is not None:
            raise _membership.ElasticError("join() is for a process that is not in a world yet")
        t = _timeout(timeout)
        deadline = time.monotonic() + t
        client = _membership.new_client(t)
        try:
            ticket = _membership.take_ticket(client)
            raw = client.get(f"reform/admit/{ticket}", timeout=t)
            rec = _membership._decode_members(raw)
            make, exchange = _core_maker(client, rec["generation"])
            formed = _membership.form(client, rec, ("j", ticket), None, make, exchange, deadline)
        except TimeoutError as exc:
            client.close()
            raise _membership.ElasticError(f"no rank of the job admitted this process within "
                                        f"{t:g} s (the ranks call collectives.grow() at a step "
                                        f"boundary): {exc}") from None
        except BaseException:
            client.close()
            raise
        return _install(None, client, None, rec, formed, wrap)


def agree(flag: int, timeout: Optional[float] = None) -> int:
    """The bitwise AND of flag over the live ranks of the world (see MPI.Comm.Agree)."""
    with _world._lock:
        state = _world_state("Agree")
        client = state.client
        me = state.core.rank
        deadline = time.monotonic() + _timeout(timeout)
        try:
            ms = _current_membership(state)
            ms.agreements += 1
            base = f"reform/{ms.world}.{ms.generation}/agree/{ms.agreements}/"
            return _membership.agree_flag(client, base, ms, me, int(flag), deadline,
                                       state.server is not None)
        except (ConnectionError, TimeoutError) as exc:
            raise _store_gone(client, exc) from None
