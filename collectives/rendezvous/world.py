"""Rendezvous: environment + store -> the native world communicator.

The only module that knows both the environment readers and the core. Rank 0
hosts the store; every rank creates its native communicator (which starts
listening), publishes its address, port, host id, CPU mask and whether it
encrypts its links (``COLLECTIVES_ENCRYPT``, which must be equal on every rank)
under ``addr/<rank>``, reads every peer's entry, and says so under ``joined/<rank>``
(rank 0 keeps the store until every rank has). From the host ids it derives
local rank and size when the launcher did not say, and from the masks of the
ranks on its host whether the host is oversubscribed (the host policy: how a
rank waits, its socket buffers, its CPU). No link is opened here: the core
connects to the peers an algorithm needs on first use.

After a collective fails, a rank reports its error under ``failed/<rank>``;
a rank whose own error is only the echo ("closed the connection", timeout)
puts what the rank that saw the cause reported (or which ranks reported
nothing: the dead) in front of its own text, so every survivor names the
culprit first.
"""
from __future__ import annotations

import atexit
import errno
import os
import random
import re
import socket
import sys
import threading
import time
from typing import Callable, Optional, Sequence

from . import auth as _auth, blame as _blame, env as _env, store as _store, store_wire as _wire
from .. import config

_lock = threading.RLock()
_state: Optional["_World"] = None
# How many worlds this process has created. Every rank of a job creates and
# closes its worlds in step (init, finalize, init, ...), so the count names
# the same world on every rank: the store of world g says so under
# "generation/<g>", and a rank re-initializing retries until the store it
# reaches says its own generation (not the previous one, which rank 0 may
# still be closing).
_generation = 0


# Seconds rank 0 keeps the store at exit for ranks still reading addresses.
JOIN_WAIT = 10.0


class _World:
    """What init() built: the communicator and, at rank 0, the store server."""

    def __init__(self, comm, core, server, client, prefix: str = "", membership=None) -> None:
        self.comm = comm
        self.core = core
        self.server = server
        self.client = client
        self.failed = False
        self.cause = ""
        # A world made by shrink or grow (collectives/elastic/membership.py) keeps its store keys
        # under its own prefix, so no rank reads what an earlier generation left there.
        self.prefix = prefix
        self.membership = membership

    def close(self) -> None:
        self.core.close()
        if self.server is not None:
            # The store lives in rank 0. A rank may still be reading the
            # others' addresses from it, or, after a failure, their reports:
            # give them a moment (bounded) before it goes.
            stage, seconds = ("explained", 2.0) if self.failed else ("joined", JOIN_WAIT)
            keys = [f"{self.prefix}{stage}/{r}" for r in range(self.comm.size)]
            deadline = time.monotonic() + seconds
            try:
                while time.monotonic() < deadline and not self.client.check(keys):
                    # After a failure, a rank that has not explained yet reads through the
                    # connection it opened at init (a client never reconnects): once no
                    # connection but this rank's own is left (the others exited, or died
                    # without explaining), nobody can read the store any more. (Not so
                    # while joining: a rank may not have connected yet.)
                    if self.failed and self.server.connection_count()[0] <= 1:
                        break
                    time.sleep(0.05)
            except (OSError, TimeoutError, ConnectionError):
                pass
        if self.client is not None:
            self.client.close()
        if self.server is not None:
            self.server.close()


def _default_timeout() -> float:
    """Start-up deadline: COLLECTIVES_START_TIMEOUT (set by collectives-run), else COLLECTIVES_TIMEOUT."""
    for name in ("COLLECTIVES_START_TIMEOUT", "COLLECTIVES_TIMEOUT"):
        text = os.environ.get(name)
        if not text:
            continue
        try:
            t = float(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not a number of seconds") from None
        if t != t:
            raise ValueError(f"{name}={text!r} is not a number of seconds")
        if t > 0:
            return min(t, _store.MAX_WAIT_S)  # inf: as long as the store can wait
    return 300.0


def _addr_named(info: _env.WorldInfo) -> str:
    """The store address and the variables it came from, for error messages."""
    addr = _env.format_addr(info.store_host, info.store_port)
    return f"{addr} (from {info.store_var})" if info.store_var else addr


def _backoff(delay: float, cap: float) -> float:
    """The next wait of a retry loop: doubled, capped, with jitter so that the ranks of a
    big job do not ask the cluster's DNS server in lockstep."""
    return min(cap, delay * 2) * random.uniform(0.75, 1.0)


def _start_store(info: _env.WorldInfo, secret: bytes = b"", timeout: float = 0.0):
    """Rank 0's store, on the given address and nowhere else.

    Never on every address instead: a store meant for one interface must not
    be reachable from the others. A name that does not resolve yet (a pod's
    own DNS record appears some time after it starts) is retried with backoff
    until ``timeout``.
    """
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        try:
            return _store.StoreServer(info.store_host, info.store_port, secret=secret)
        except socket.gaierror as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError(errno.EADDRNOTAVAIL,
                              f"rank 0 cannot host the store at {_addr_named(info)}: the name "
                              f"{info.store_host!r} did not resolve within {timeout:g} s "
                              f"({exc.strerror}); it must name rank 0's own host") from None
            time.sleep(min(delay, left))  # the last try at the deadline
            delay = _backoff(delay, 1.0)
        except OSError as exc:
            hint = ""
            if info.source in ("env", "pytorchjob", "volcano"):
                hint = (" (without torchrun the store takes MASTER_PORT itself: if "
                        "torch.distributed's env:// store holds it, give ours another with "
                        "COLLECTIVES_STORE_ADDR=host:port)")
            raise OSError(exc.errno, f"{exc.strerror}; rank 0 hosts the store at "
                          f"{_addr_named(info)}, so the store address must be one of rank "
                          f"0's own (is it taken by another job, or not this host's?){hint}"
                          ) from None


def spin_us() -> float:
    """Microseconds a waiting rank keeps checking: COLLECTIVES_SPIN_US ("auto": 100)."""
    text = os.environ.get("COLLECTIVES_SPIN_US", "auto").strip().lower()
    if text in ("", "auto"):
        return 100.0
    try:
        return max(0.0, float(text))
    except ValueError:
        raise ValueError(f"COLLECTIVES_SPIN_US={text!r} is not a number of microseconds or 'auto'") from None


BIND_MODES = ("auto", "core", "none")


def bind_mode() -> str:
    """COLLECTIVES_BIND: auto (pin when the host runs more ranks than CPUs), core, none."""
    text = os.environ.get("COLLECTIVES_BIND", "auto").strip().lower() or "auto"
    if text not in BIND_MODES:
        raise ValueError(f"COLLECTIVES_BIND={text!r} is not one of {', '.join(BIND_MODES)}")
    return text


_cpus: Optional[list] = None


def process_cpus() -> list:
    """The CPUs this process may run on (its affinity mask, as taskset, cgroup cpusets and
    launchers that bind leave it), read once: before this module pins the process."""
    global _cpus
    if _cpus is None:
        try:
            _cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            _cpus = list(range(os.cpu_count() or 1))
    return _cpus


def apply_host_policy(core, local_rank: int, local_size: int, host_cpus: set,
                      bind: bool = True) -> None:
    """How a rank waits, sizes its TCP buffers and where it runs, given that its host runs
    local_size ranks on host_cpus (the union of their affinity masks); see
    coll_comm_set_spin, coll_comm_set_oversubscribed and coll_comm_bind_cpu in native/coll.h.
    bind=False leaves the process where it runs (a second communicator of the same
    process, e.g. a torch sub-group's, must not move it)."""
    oversubscribed = local_size > len(host_cpus)
    core.set_spin(spin_us())
    core.set_oversubscribed(oversubscribed)
    mine = process_cpus()
    mode = bind_mode()
    if bind and len(mine) > 1 and (mode == "core" or (mode == "auto" and oversubscribed)):
        core.bind_cpu(mine[local_rank % len(mine)])


def host_id() -> str:
    """Equal for processes that share a host and its /dev/shm: hostname + boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


# Settings every rank must share, checked at start-up: ranks that cut a message
# into other segments cannot exchange it, and the wire check alone could only
# report a message "out of step".
SHARED_SETTINGS = ("COLLECTIVES_SEGMENT_BYTES",)


class SettingsMismatch(ValueError):
    """Ranks of one job were started with different values of a setting they must share."""


def _setting(name: str) -> str:
    """The value of a shared setting as the core reads it: bytes with K/M/G, else text."""
    text = os.environ.get(name, "").strip()
    m = re.fullmatch(r"(\d+)\s*([kmg]?)i?b?", text, re.IGNORECASE)
    if m:
        return str(int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()])
    return text.lower() or "auto"


def _check_shared(values: list) -> None:
    """Raise SettingsMismatch naming each setting whose value differs between ranks."""
    for i, name in enumerate(SHARED_SETTINGS):
        seen = [v[i] if i < len(v) else "?" for v in values]
        if len(set(seen)) > 1:
            groups: dict = {}
            for r, v in enumerate(seen):
                groups.setdefault(v, []).append(str(r))
            said = "; ".join(f"{name}={v} on rank{'s' if len(rs) > 1 else ''} {', '.join(rs)}"
                             for v, rs in groups.items())
            raise SettingsMismatch(f"{name} differs between the ranks ({said}): every rank "
                                   f"must have the same value (or none), since ranks that "
                                   f"cut messages differently cannot exchange them")


def exchange_addresses(core, rank: int, size: int, advertise: str, put, get) -> tuple:
    """Publish where this rank listens, its host id, its CPUs, the settings every rank
    must share and its COLLECTIVES_ENCRYPT through a store (put(key, bytes), get(key) ->
    bytes), point core at every peer, tell it whether some host of the job runs more
    ranks than CPUs, and return the ranks' host ids and the union of the CPU masks of
    the ranks on this rank's host.

    Raises:
        SettingsMismatch: a setting of SHARED_SETTINGS differs between ranks (every
            rank raises it, naming the setting and each rank's value).
        ValueError: the ranks' COLLECTIVES_ENCRYPT differ (every rank refuses).
    """
    cpus = ",".join(map(str, process_cpus()))
    shared = ";".join(_setting(name) for name in SHARED_SETTINGS)
    encrypt = "1" if _auth.encrypt_wanted() else "0"
    _check_crypto_lib()
    put(f"addr/{rank}",
        f"{advertise}\n{core.port}\n{host_id()}\n{cpus}\n{shared}\n{encrypt}".encode())
    records, settings, encrypts = [], [], []
    for peer in range(size):
        fields = get(f"addr/{peer}").decode().split("\n")
        addr, port, peer_host, peer_cpus = fields[:4]
        core.set_peer(peer, addr, int(port))
        core.set_peer_host(peer, peer_host)  # same-host peers may then use shared memory
        records.append((peer_host, peer_cpus))
        settings.append(fields[4].split(";") if len(fields) > 4 else [])
        encrypts.append(fields[5] if len(fields) > 5 else "0")
    _check_shared(settings)
    if len(set(encrypts)) > 1:
        _encrypt_disagree(rank, size, encrypts, put, get)
    hosts = [host for host, _ in records]
    cpus_of: dict = {}
    for host, text in records:
        cpus_of.setdefault(host, set()).update(int(c) for c in text.split(","))
    # From every rank's record, so every rank decides alike (the segment size follows it).
    core.set_job_oversubscribed(any(hosts.count(h) > len(c) for h, c in cpus_of.items()))
    return hosts, cpus_of[hosts[rank]]


def _check_crypto_lib() -> None:
    """With COLLECTIVES_ENCRYPT=1, raise RuntimeError unless libcrypto can be used."""
    if not _auth.encrypt_wanted():
        return
    from .._core import crypt_lib_error
    why = crypt_lib_error()
    if why:
        raise RuntimeError(f"{_auth.ENCRYPT_VAR}=1 needs OpenSSL's libcrypto, but {why}; "
                           f"install OpenSSL 3, point COLLECTIVES_CRYPTO_LIB at it, or "
                           f"unset {_auth.ENCRYPT_VAR} on every rank")


def _encrypt_disagree(rank: int, size: int, encrypts: list, put, get) -> None:
    """Every rank read the same records, so every rank raises this same error. Rank 0
    (whose store it may be) first waits until each rank has read them all."""
    put(f"encrypt_seen/{rank}", b"")
    if rank == 0:
        for peer in range(size):
            try:
                get(f"encrypt_seen/{peer}")
            except (OSError, TimeoutError, ConnectionError):
                break
    groups = {v: [r for r in range(size) if encrypts[r] == v] for v in sorted(set(encrypts))}
    said = "; ".join(f"{_auth.ENCRYPT_VAR}={v} on rank{'s' if len(rs) > 1 else ''} "
                     f"{', '.join(map(str, rs))}" for v, rs in groups.items())
    raise ValueError(f"the ranks disagree on encrypting their links: {said} (this is rank "
                     f"{rank}); set the same value on every rank")


def local_place(hosts: list, rank: int) -> tuple:
    """(local rank, local size) of rank from every rank's host id: its position among
    the ranks on its host, and how many there are."""
    return hosts[:rank].count(hosts[rank]), hosts.count(hosts[rank])


_START_CHECKS = ("check that every rank runs the same command with the same store address, "
                 "that {addr} is reachable from every host (COLLECTIVES_STORE_ADDR, or "
                 "MASTER_ADDR/MASTER_PORT; a firewall), and that the start-up deadline "
                 "(COLLECTIVES_START_TIMEOUT, else COLLECTIVES_TIMEOUT, now {t:g} s) leaves "
                 "the slowest rank time to start")


# Seconds rank 0 keeps the store after a start-up timeout, for the ranks that came.
START_LINGER = 2.0


def _missing_ranks(client, size: int, prefix: str = "") -> list:
    """The ranks that have not published their address ([] if the store is gone)."""
    try:
        return [r for r in range(size) if not client.check([f"{prefix}addr/{r}"])]
    except (OSError, TimeoutError, ConnectionError):
        return []


def start_timeout_error(info: _env.WorldInfo, timeout: float, missing: Optional[list],
                        detail: str) -> TimeoutError:
    """The one exception a rank raises when the job did not assemble in time: which ranks
    did not arrive (None: the store itself was not reached) and what to check."""
    addr = _addr_named(info)
    if missing is None:
        what = (f"rank {info.rank} of {info.size} could not reach the store at {addr} "
                f"(rank 0 hosts it) within {timeout:g} s ({detail}): is rank 0 running? "
                f"rank 0 and the ranks that reached no store were not seen")
    elif missing:
        names = ", ".join(map(str, missing))
        plural = "s" if len(missing) > 1 else ""
        what = (f"start-up timed out after {timeout:g} s: rank{plural} {names} of {info.size} "
                f"did not arrive at the store at {addr}")
    else:  # the store went away first: rank 0 gave up (or died) before this rank
        what = (f"start-up failed: the store at {addr} stopped answering before every rank "
                f"arrived (rank 0 gave up or exited first; its error says which ranks were "
                f"missing) ({detail})")
    return TimeoutError(f"{what}; {_START_CHECKS.format(addr=addr, t=timeout)}")


class _OtherWorld(TimeoutError):
    """The store answered, but for another world than this rank's init (the ranks called
    init and finalize different numbers of times)."""


def _connect_store(info: _env.WorldInfo, generation: int, timeout: float,
                   secret: bytes) -> "_store.StoreClient":
    """A client of the store of world `generation`: rank 0 marks its new store so; the
    others retry while they reach no store, or the previous world's store (its rank 0
    closes it once every rank has joined it), until `timeout`. Pods start in any order: a
    name that does not resolve yet and a refused connection are retried with backoff
    (from 5 ms, to 1 s between DNS queries and 0.2 s between connections)."""
    key = f"generation/{generation}"
    deadline = time.monotonic() + timeout
    delay, last = 0.0025, ""
    while True:
        try:
            # A bare connect first: the client's own retries sleep 50 ms when refused,
            # the length of a whole world's life in a tight init/finalize loop.
            socket.create_connection((info.store_host, info.store_port),
                                     timeout=min(_wire.CONNECT_ATTEMPT_S,
                                                 max(0.05, deadline - time.monotonic()))
                                     ).close()
        except OSError as exc:
            unresolved = isinstance(exc, socket.gaierror)
            last = (f"the name {info.store_host!r} does not resolve: {exc.strerror}"
                    if unresolved else f"{exc.strerror or exc}")
            delay = _backoff(max(delay, 0.0025), 1.0 if unresolved else 0.2)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"could not connect to the store at {_addr_named(info)} "
                                   f"within {timeout:g} s; last: {last}") from None
            time.sleep(min(delay, left))  # the last try at the deadline
            continue
        delay = 0.0025
        client = _store.StoreClient(info.store_host, info.store_port,
                                    timeout=max(0.05, deadline - time.monotonic()), secret=secret)
        client.timeout = timeout
        try:
            if info.rank == 0:
                client.set(key, b"")
                return client
            if client.check([key]):
                return client
        except (ConnectionError, TimeoutError, OSError):
            pass  # the previous world's store closed under us
        except BaseException:
            client.close()
            raise
        client.close()
        if time.monotonic() >= deadline:
            raise _OtherWorld(f"the store at {client.address} did not start world "
                               f"#{generation} within {timeout:g} s (every rank must call "
                               f"init and finalize the same number of times)")
        time.sleep(0.005)


def store_external() -> bool:
    """COLLECTIVES_STORE_EXTERNAL=1: a launcher hosts the job's store at the store address
    and keeps it for the whole job, so rank 0 starts none, and the store outlives any
    rank (an elastic world can then shrink after rank 0 died, collectives/elastic/membership.py).
    Such a store outlives each world too: a world's keys then carry its number."""
    return os.environ.get("COLLECTIVES_STORE_EXTERNAL", "").strip() == "1"


def _rendezvous(info: _env.WorldInfo, timeout: float, generation: int = 0):
    from .._core import Communicator

    secret = _auth.job_secret(info.rank)
    server = None
    p = f"w{generation}/" if store_external() else ""
    if info.rank == 0 and not p:
        server = _start_store(info, secret, timeout)
    try:
        client = _connect_store(info, generation, timeout, secret)
    except _OtherWorld:
        if server is not None:
            server.close()
        raise
    except TimeoutError as exc:
        if server is not None:
            server.close()
        raise start_timeout_error(info, timeout, None, str(exc)) from None
    except BaseException:
        if server is not None:
            server.close()
        raise
    try:
        advertise = _env.advertise_address(info.store_host, info.store_port)
        if info.rank == 0:
            client.set(f"{p}comm_id", os.urandom(16))
        comm_id = client.get(f"{p}comm_id", timeout=timeout)
        core = Communicator(info.rank, info.size, advertise, comm_id)
        core.set_link_key(_auth.link_key(secret))
        hosts, host_cpus = exchange_addresses(core, info.rank, info.size, advertise,
                                              lambda key, value: client.set(p + key, value),
                                              lambda key: client.get(p + key, timeout=timeout))
        client.set(f"{p}joined/{info.rank}", b"")
    except SettingsMismatch:
        # Every rank raises the same error; rank 0 keeps the store (bounded) until the
        # others have read what they need to, so that they do not see it vanish instead.
        try:
            client.set(f"{p}mismatch/{info.rank}", b"")
            if server is not None:
                deadline = time.monotonic() + START_LINGER
                keys = [f"{p}mismatch/{r}" for r in range(info.size)]
                while time.monotonic() < deadline and not client.check(keys):
                    time.sleep(0.05)
        except (OSError, TimeoutError, ConnectionError):
            pass
        core.close()
        client.close()
        if server is not None:
            server.close()
        raise
    except (TimeoutError, ConnectionError) as exc:
        missing = _missing_ranks(client, info.size, p)
        try:
            client.set(f"{p}gave_up/{info.rank}", b"")
            if server is not None:
                # Keep the store a moment (bounded) for the ranks that came: each
                # reads who is missing before it gives up too.
                came = [f"{p}gave_up/{r}" for r in range(info.size) if r not in missing]
                deadline = time.monotonic() + START_LINGER
                while time.monotonic() < deadline and not client.check(came):
                    time.sleep(0.05)
        except (OSError, TimeoutError, ConnectionError):
            pass
        client.close()
        if server is not None:
            server.close()
        raise start_timeout_error(info, timeout, missing, str(exc)) from None
    except BaseException:
        client.close()
        if server is not None:
            server.close()
        raise
    local_rank = info.local_rank
    local_size = info.local_size
    if local_rank is None or local_size is None:
        local_rank, local_size = local_place(hosts, info.rank)
    return core, server, client, local_rank, local_size, host_cpus, p


def init(timeout: Optional[float], wrap: Callable, elastic: Optional[Callable] = None):
    """Create the world communicator once (see collectives.init) and return it.

    wrap(core, local_rank, local_size) makes the front end's communicator of
    the native one (collectives.MPI passes Comm._from_core): this module sits
    below the front ends and imports none of them. elastic, when given, is the
    elastic layer's rendezvous (collectives.elastic.worker.rendezvous), taken
    instead of the environment's under ``collectives-run --elastic``; it is
    passed down by the front end because the elastic layer sits above this one.
    """
    global _state, _generation
    with _lock:
        if _state is not None:
            return _state.comm
        from .._core import Communicator

        if elastic is not None:  # collectives-run --elastic: its driver names the members
            core, client, local_rank, local_size, host_cpus = elastic(
                float(timeout) if timeout else _default_timeout(), exchange_addresses, local_place)
            apply_host_policy(core, local_rank, local_size, host_cpus)
            _state = _World(wrap(core, local_rank, local_size), core, None, client)
            return _state.comm
        info = _env.detect()
        config.check_env()  # every COLLECTIVES_* tunable, before any connection
        if info.size > 1:
            secret = _auth.job_secret()  # refuses (COLLECTIVES_REQUIRE_AUTH) before any socket
            _auth.link_key(secret)  # and COLLECTIVES_ENCRYPT=1 without a secret
            _check_crypto_lib()
        t = float(timeout) if timeout else _default_timeout()
        if info.size == 1:
            core, server, client, prefix = Communicator(0, 1), None, None, ""
            local_rank, local_size, host_cpus = 0, 1, set(process_cpus())
        else:
            _generation += 1
            core, server, client, local_rank, local_size, host_cpus, prefix = \
                _rendezvous(info, t, _generation)
        apply_host_policy(core, local_rank, local_size, host_cpus)
        comm = wrap(core, local_rank, local_size)
        _state = _World(comm, core, server, client, prefix)
        return comm


_finalize_hooks: list = []


def add_finalize_hook(fn) -> None:
    """Run fn() before the world communicator closes (adapters that queue work
    on other threads, as JAX's asynchronous dispatch does, drain it there)."""
    if fn not in _finalize_hooks:
        _finalize_hooks.append(fn)


def finalize() -> None:
    """Close the world communicator and the store (idempotent)."""
    global _state
    with _lock:
        if _state is None:
            return
        for fn in list(_finalize_hooks):
            try:
                fn()
            except Exception:  # a failed collective already raised where it ran
                pass
        state, _state = _state, None
        state.close()


def is_initialized() -> bool:
    """True while the world communicator exists."""
    return _state is not None


_ECHOES = ("closed the connection", "connection to rank", "timed out", "is broken",
           "failed and broke the communicator", "cannot connect to rank")


# The failure report's hard bound (seconds): it talks to the store, which
# lives in rank 0 and may be stopped, cut off or gone with it. The README
# promises an error within 2 s after the timeout; 0.2 s of that is left for
# everything around the report (the call's own unwinding, building the error).
REPORT_S = 1.8


def _whole_hosts(core, ranks: Sequence[int]) -> str:
    """' (all of host NAME: ranks ...)' for each host every one of whose ranks is in ranks."""
    try:
        ids = core.host_ids()
    except Exception:  # closed meanwhile: the ranks alone still say it
        return ""
    whole = []
    for hid in dict.fromkeys(ids[p] for p in ranks if ids[p]):
        on_host = [q for q, h in enumerate(ids) if h == hid]
        if set(on_host) <= set(ranks):
            whole.append(f"all of host {hid.split('/')[0]}: rank {', '.join(map(str, on_host))}")
    return f" ({'; '.join(whole)})" if whole else ""


def explain_failure(rank: int, message: str, peers: Optional[Sequence[int]] = None) -> str:
    """Report this rank's failure to the store and add the cause others saw.

    rank is a world rank; peers (world ranks, default all) are the ranks whose reports
    count: a subcommunicator's members.

    Only the first failure of the world is reported and explained; later
    calls on the broken communicator repeat the cause found then. Best
    effort, bounded by REPORT_S in all: a store that does not answer within
    it (rank 0 stopped, cut off or gone) is itself the cause reported.
    """
    _blame.note(message)
    state = _state
    if state is None or state.client is None:
        return message
    if state.failed:
        return message + (f"; {state.cause}" if state.cause else "")
    state.failed = True
    client = state.client
    prefix = state.prefix
    end = time.monotonic() + REPORT_S

    class OutOfTime(Exception):
        pass

    def left() -> float:
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise OutOfTime
        return remaining

    causes: list = []
    try:
        client.set(f"{prefix}failed/{rank}", message.encode(), timeout=left())
        if any(echo in message for echo in _ECHOES):
            deadline = min(end, time.monotonic() + 1.0)
            silent: list = []
            found = False
            while not found and time.monotonic() < deadline:
                silent = []
                for peer in (range(state.comm.size) if peers is None else peers):
                    if peer == rank:
                        continue
                    if not client.check([f"{prefix}failed/{peer}"], timeout=left()):
                        silent.append(peer)
                        continue
                    text = client.get(f"{prefix}failed/{peer}", timeout=0.5,
                                      io_timeout=left()).decode()
                    if not any(echo in text for echo in _ECHOES):
                        found = True
                        if text not in message:  # an abort notice may have carried it
                            causes.append(f"rank {peer} reported: {text}")
                if not found:
                    time.sleep(0.05)
            if not found and silent:
                # Everyone who is alive has reported an echo by now; the
                # ranks that said nothing are the ones that died or hung.
                names = ", ".join(str(p) for p in silent)
                causes.append(f"rank {names} reported nothing: it exited, was killed or is stuck"
                              + _whole_hosts(state.core, silent))
        client.set(f"{prefix}explained/{rank}", b"", timeout=left())
    except OutOfTime:  # the store answered, slowly: report what was found
        pass
    except (OSError, TimeoutError, ConnectionError) as exc:
        if rank == 0:
            return message
        state.cause = (f"the store at rank 0 ({client.address}) did not answer within "
                       f"{REPORT_S:g} s: rank 0 is stopped, cut off or gone ({exc})")
        if any(echo in message for echo in _ECHOES):
            return _cause_first(rank, state.cause, message)
        return message + f"; {state.cause}"
    except ValueError:
        return message
    state.cause = "; ".join(causes)
    return _cause_first(rank, state.cause, message)


def _cause_first(rank: int, cause: str, message: str) -> str:
    """This rank's error with the cause found in the reports in front: its own error is an
    echo that names a neighbour (whose communicator broke because of the cause), so the
    first rank the text names is the one where the failure began."""
    if not cause:
        return message
    own = f"rank {rank}: "
    return own + cause + "; " + (message[len(own):] if message.startswith(own) else message)


def _at_exit() -> None:
    """At interpreter exit: a script that ended with an uncaught exception of its own
    (not an echo of a peer's failure) first tells the others why, through the store,
    then finalizes. Its links close as it exits, the others' collectives fail, and their
    errors then name its exception at once (explain_failure finds the report) instead of
    looking a second for a report that never comes, then saying "reported nothing"."""
    state = _state
    exc = getattr(sys, "last_value", None)
    if state is not None and exc is not None and not state.failed and state.client is not None:
        text = f"{type(exc).__name__}: {exc}"
        if not any(echo in text for echo in _ECHOES):
            state.failed = True  # one report: a collective failing in finalize adds none
            try:
                state.client.set(f"{state.prefix}failed/{state.comm.rank}",
                                 f"its script raised {text[:500]} (the process is exiting)"
                                 .encode(), timeout=EXIT_REPORT_S)
            except (OSError, TimeoutError, ConnectionError, ValueError):
                pass
    finalize()


# How long a rank exiting with an exception may spend telling the store why (rank 0, and
# its store, may be gone already: then the others say the rank reported nothing).
EXIT_REPORT_S = 0.5

atexit.register(_at_exit)
