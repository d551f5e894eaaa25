"""Survivors agree, joiners are admitted: ULFM-style shrink, grow and agree (issue 23).

The job's store is the coordinator, as the ULFM operations (MPIX_Comm_shrink,
MPIX_Comm_agree) and NCCL's ncclCommShrink need one agreement each:

shrink (every survivor of world generation g, numbered by its rank there):
  1. post ``<base>alive/<r>``, base = ``reform/<world>.<g+1>.<attempt>/``;
  2. wait until every rank of g has posted or is dead: a rank is dead when its
     listener (the broken communicator's, kept open until the new one exists)
     refuses a connection, which the kernel does at once for a process that
     exited or was killed; a rank that neither posts nor refuses (stopped, cut
     off) is waited for until the deadline, then left out;
  3. the first survivor to get there (an atomic ADD on ``<base>decide``)
     writes ``<base>members``: the ranks that posted, in their old order, and a
     fresh comm id; every survivor reads that one record, so all agree, and one
     that posted too late to be in it raises instead of joining;
  4. the members form generation g+1 exactly as init does (a new listener,
     addresses through the store under ``<base>``, the job's link key, fresh
     links on first use), with g+1 in every message header. A member that
     dies before publishing its address (its old listener refuses) turns the
     attempt into a retry (a second ADD decides the attempt's outcome once,
     for all), and the survivors run the agreement again without it. Every
     wait is bounded by the deadline; the error then names the ranks missing.

grow (every rank of generation g, plus the processes that called join()):
  a joiner takes a ticket (ADD ``reform/joiners``) and waits for
  ``reform/admit/<ticket>``; the first rank of g to call grow (ADD again)
  admits the tickets taken so far (waiting up to the deadline for at least
  min_new), writes the members (the ranks of g in order, then the joiners by
  ticket) and the admissions, and everyone forms generation g+1 as above.
  A ticket is counted before its key is written: the decision waits for the
  key of every ticket counted (a joiner between its two writes), up to the
  deadline.

Keys are never reused: each agreement and each world has its own prefix, and
the failure reports of a world (collectives/rendezvous/world.py) carry its prefix, so a
rank never reads what an earlier generation left in the store.

The store lives where the job's rendezvous put it: in rank 0 under
collectives-run and plain environments (collectives/rendezvous/world.py), so a shrink
after rank 0 died fails at once with an error saying the store went with it;
a launcher that hosts the store itself (COLLECTIVES_STORE_EXTERNAL=1 for its
ranks) keeps it alive, and the survivors of rank 0 shrink like any others.

Liveness probes connect to a rank's listener: a killed process's port refuses
at once. If another process took that port meanwhile, the rank counts as
"unknown" and is left out only at the deadline.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import time
from typing import Callable, Optional

from ..rendezvous import auth as _auth, env as _env, store as _store

# Seconds a liveness probe may take; past it the rank is "unknown", not dead.
PROBE_S = 0.25
# Between rounds of reading the store while an agreement waits.
POLL_S = 0.005
# Most ranks a members record may name (a record is read from the store).
MAX_MEMBERS = 1 << 16


class ElasticError(RuntimeError):
    """An elastic operation could not complete (it names the ranks and the reason)."""


class _Retry(Exception):
    """A member died before the new world formed: agree again without it."""


def probe(addr) -> Optional[bool]:
    """Whether a rank's listener at addr=(host, port) answers: True, False (refused: the
    process is gone), or None (no answer within PROBE_S: stopped, cut off, or far)."""
    if addr is None:
        return None
    try:
        socket.create_connection(addr, timeout=PROBE_S).close()
        return True
    except ConnectionRefusedError:
        return False
    except OSError as exc:
        return False if exc.errno in (errno.ECONNREFUSED, errno.ECONNRESET) else None


class Membership:
    """Who a world's ranks are, for the next agreement: its generation, the prefix of its
    store keys, and where each of its ranks listens (for liveness probes)."""

    def __init__(self, world: str, generation: int, prefix: str, addrs: list,
                 next_ticket: int = 1) -> None:
        self.world = world
        self.generation = generation
        self.prefix = prefix
        self.addrs = addrs
        self.next_ticket = next_ticket
        self.agreements = 0  # Agree calls on this world so far (each has its own keys)

    def base(self, attempt: int) -> str:
        """The store prefix of the agreement that makes the next generation."""
        return f"reform/{self.world}.{self.generation + 1}.{attempt}/"


def _decode_members(raw: bytes) -> dict:
    """A members record from the store (authenticated, still checked: shapes and bounds)."""
    try:
        rec = json.loads(raw.decode())
        members = rec["members"]
        ok = (isinstance(members, list) and 0 < len(members) <= MAX_MEMBERS
              and all(isinstance(m, list) and len(m) == 2 and m[0] in ("r", "j")
                      and isinstance(m[1], int) and m[1] >= 0 for m in members)
              and len(bytes.fromhex(rec["comm_id"])) == 16
              and isinstance(rec["generation"], int) and isinstance(rec["next_ticket"], int)
              and isinstance(rec["world"], str) and isinstance(rec["base"], str))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise ElasticError(f"malformed members record in the store: {raw[:200]!r}")
    rec["members"] = [tuple(m) for m in members]
    return rec


def _encode_members(ms: Membership, base: str, members: list, next_ticket: int) -> bytes:
    return json.dumps({"members": [list(m) for m in members], "comm_id": os.urandom(16).hex(),
                       "generation": ms.generation + 1, "next_ticket": next_ticket,
                       "world": ms.world, "base": base}).encode()


def _decide_once(client, base: str, name: str, value: Callable[[], bytes],
                 timeout: float) -> bytes:
    """The one value of `name` under base: the first caller (atomic ADD) writes value(),
    everyone reads what it wrote."""
    if client.add(f"{base}{name}.lock", 1) == 1:
        client.set(f"{base}{name}", value())
    return client.get(f"{base}{name}", timeout=max(0.05, timeout))


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


def gather_live(client, base: str, stem: str, value: bytes, ms: Membership, rank: int,
                deadline: float) -> set:
    """Post value under <base><stem>/<rank> and wait until every rank of ms has posted
    or is dead (its listener refuses), or the deadline, or <base>decided exists (someone
    decided already: what this rank would add is too late); the ranks seen posting."""
    n = len(ms.addrs)
    client.set(f"{base}{stem}/{rank}", value)
    posted, dead = {rank}, set()
    next_probe = 0.0
    while len(posted) + len(dead) < n and _left(deadline) > 0:
        if client.check([f"{base}decided"]):
            break
        for p in range(n):
            if p not in posted and p not in dead and client.check([f"{base}{stem}/{p}"]):
                posted.add(p)
        if time.monotonic() >= next_probe:
            for p in range(n):
                if p not in posted and p not in dead and probe(ms.addrs[p]) is False:
                    # Posted in the meantime? A rank posts before anything closes its listener.
                    if client.check([f"{base}{stem}/{p}"]):
                        posted.add(p)
                    else:
                        dead.add(p)
            next_probe = time.monotonic() + 0.1
        if len(posted) + len(dead) < n:
            time.sleep(POLL_S)
    return posted


def agree_flag(client, base: str, ms: Membership, rank: int, flag: int, deadline: float,
               hosts_store: bool = False) -> int:
    """The bitwise AND of the flags the live ranks of ms post (MPIX_Comm_agree): the first
    rank done decides which ranks count, so every rank returns the same value. The rank
    that hosts the store (hosts_store) returns once those ranks have read it (bounded by
    the deadline): its exit would take the answer with it."""

    def decide() -> bytes:
        value, counted = -1, []
        for p in range(len(ms.addrs)):
            if client.check([f"{base}flag/{p}"]):
                value &= int(client.get(f"{base}flag/{p}", timeout=1.0))
                counted.append(str(p))
        return f"{value}:{','.join(counted)}".encode()

    gather_live(client, base, "flag", str(int(flag)).encode(), ms, rank, deadline)
    value, counted = _decide_once(client, base, "decided", decide,
                                  _left(deadline) + 1.0).decode().split(":")
    client.set(f"{base}read/{rank}", b"")
    if hosts_store:
        keys = [f"{base}read/{p}" for p in counted.split(",")]
        while not client.check(keys) and _left(deadline) > 0:
            time.sleep(POLL_S)
    return int(value)


def agree_survivors(client, ms: Membership, rank: int, attempt: int, deadline: float) -> dict:
    """Steps 1-3 of shrink for this survivor (rank of generation ms.generation): the
    decided members record."""
    base = ms.base(attempt)
    gather_live(client, base, "alive", b"", ms, rank, deadline)
    # Decided from what the store holds now (a rank seen dead never posted; one that
    # posted since is alive and counts).
    members: list = []
    def decide() -> bytes:
        members.extend(("r", p) for p in range(len(ms.addrs))
                       if client.check([f"{base}alive/{p}"]))
        return _encode_members(ms, base, members, ms.next_ticket)

    return _decode_members(_decide_once(client, base, "decided", decide, _left(deadline) + 1.0))


def admit_joiners(client, ms: Membership, rank: int, min_new: int, deadline: float) -> dict:
    """grow's agreement: the members record (the ranks of this generation, then the joiners
    waiting, at least min_new of them by the deadline) and, for the first caller, the
    admissions the joiners wait for."""
    base = ms.base(0)
    n = len(ms.addrs)
    client.set(f"{base}alive/{rank}", b"")

    def decide() -> bytes:
        while True:
            taken = client.add("reform/joiners", 0)
            if taken - ms.next_ticket + 1 >= min_new or _left(deadline) <= 0:
                break
            time.sleep(POLL_S)
        # A joiner counts its ticket (ADD) before it writes its key: a ticket counted
        # whose key is not there yet is a joiner between its two writes, not a lost
        # one. Wait for the keys (bounded by the deadline): deciding without them
        # would skip those joiners for good (next_ticket moves past them).
        keys = {t: f"reform/joiner/{t}" for t in range(ms.next_ticket, taken + 1)}
        while not client.check(list(keys.values())) and _left(deadline) > 0:
            time.sleep(POLL_S)
        tickets = [t for t, key in keys.items() if client.check([key])]
        members = [("r", p) for p in range(n)] + [("j", t) for t in tickets]
        raw = _encode_members(ms, base, members, taken + 1)
        for t in tickets:
            client.set(f"reform/admit/{t}", raw)
        return raw

    rec = _decode_members(_decide_once(client, base, "decided", decide, _left(deadline) + 1.0))
    joined = len(rec["members"]) - n
    if joined < min_new:
        raise ElasticError(f"grow: {joined} process(es) joined within the deadline, "
                           f"{min_new} were expected (is the joiner's COLLECTIVES_STORE_ADDR "
                           f"and job secret this job's?)")
    return rec


def _member_name(m) -> str:
    return f"rank {m[1]}" if m[0] == "r" else f"joiner #{m[1]}"


def form(client, rec: dict, me, ms: Optional[Membership], make_core, put_addr_and_read,
         deadline: float):
    """Step 4: this process's communicator of the decided world, and its address records.

    make_core(new_rank, size, comm_id) -> core makes the native communicator (listening,
    link key and generation set); put_addr_and_read(core, rank, size, put, get) publishes
    its address and reads the others' (collectives.rendezvous.world.exchange_addresses). Raises
    _Retry when a member of the previous generation died before publishing.
    """
    members = rec["members"]
    base = rec["base"]
    rank = members.index(me)
    size = len(members)
    core = make_core(rank, size, bytes.fromhex(rec["comm_id"]))
    outcome: list = []

    def settle() -> bytes:
        if outcome:
            return outcome[0]
        keys = [f"{base}addr/{i}" for i in range(size)]
        next_probe = 0.0
        while True:
            if client.check([f"{base}outcome"]):
                break
            if client.check(keys):
                _decide_once(client, base, "outcome", lambda: b"ok", 1.0)
                break
            missing = [i for i in range(size) if not client.check([keys[i]])]
            if _left(deadline) <= 0:
                names = ", ".join(_member_name(members[i]) for i in missing)
                _decide_once(client, base, "outcome",
                             lambda: f"timeout:{names}".encode(), 1.0)
                break
            if ms is not None and time.monotonic() >= next_probe:
                for i in missing:
                    kind, who = members[i]
                    if kind == "r" and probe(ms.addrs[who]) is False and \
                            not client.check([keys[i]]):
                        _decide_once(client, base, "outcome",
                                     lambda: f"dead:rank {who}".encode(), 1.0)
                        break
                next_probe = time.monotonic() + 0.02
            time.sleep(POLL_S)
        outcome.append(client.get(f"{base}outcome", timeout=max(1.0, _left(deadline))))
        return outcome[0]

    def get(key: str) -> bytes:
        verdict = settle()
        if verdict.startswith(b"dead:"):
            raise _Retry(verdict[5:].decode(errors="replace"))
        if verdict.startswith(b"timeout:"):
            raise ElasticError(f"{verdict[8:].decode(errors='replace')} did not publish an "
                               f"address for generation {rec['generation']} in time")
        return client.get(f"{base}{key}", timeout=max(1.0, _left(deadline)))

    try:
        hosts, host_cpus = put_addr_and_read(core, rank, size,
                                             lambda k, v: client.set(f"{base}{k}", v), get)
        addrs = []
        for i in range(size):
            host, port = client.get(f"{base}addr/{i}", timeout=1.0).decode().split("\n")[:2]
            addrs.append((host, int(port)))
        client.set(f"{base}joined/{rank}", b"")
    except BaseException:
        core.close()
        raise
    return core, rank, size, hosts, host_cpus, addrs


def store_address() -> tuple:
    """The job's store address for a joiner: COLLECTIVES_STORE_ADDR, else torchrun's
    MASTER_ADDR/MASTER_PORT."""
    text = os.environ.get("COLLECTIVES_STORE_ADDR")
    if text:
        return _env.parse_addr(text)
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if host and port:
        return host, int(port)
    raise ValueError("join() needs the job's store address: COLLECTIVES_STORE_ADDR (or "
                     "MASTER_ADDR and MASTER_PORT), as the job's ranks have it")


def take_ticket(client) -> int:
    """A joiner's place in the queue of processes waiting to join (announced in the store)."""
    ticket = client.add("reform/joiners", 1)
    client.set(f"reform/joiner/{ticket}", b"")
    return ticket


def new_client(timeout: float):
    """A client of the job's store for a joiner (the job secret authenticates it)."""
    host, port = store_address()
    return _store.StoreClient(host, port, timeout=timeout, secret=_auth.job_secret())
