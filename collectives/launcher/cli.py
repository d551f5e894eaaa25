"""collectives-run: start N ranks of a command, like horovodrun or mpirun.

    collectives-run -np 4 python train.py
    collectives-run -H node1:4,node2:4 --network-interface eth0 python train.py

Ranks fill the slots of the hosts in order. Ranks on this machine are child
processes; ranks on other hosts are started with ``ssh -o BatchMode=yes``.
Each rank gets ``COLLECTIVES_RANK``, ``_SIZE``, ``_LOCAL_RANK``,
``_LOCAL_SIZE`` and ``_STORE_ADDR`` (the first host and a port; rank 0 hosts
the store there). Where a host runs several ranks and ``OMP_NUM_THREADS`` is
not set, each gets its share of the cores (1 on remote hosts), as torchrun
does, so that OpenMP/BLAS thread pools do not starve the ranks. torchrun's
variables are set too (``RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
MASTER_ADDR MASTER_PORT``, a second port for torch's own store), so a
``torch.distributed`` script runs unchanged. Every output line comes back
prefixed ``[rank]<stdout>:`` or ``[rank]<stderr>:``; a progress bar redrawn
with ``\\r`` (tqdm) is forwarded as it is drawn, not when its line ends.
When a rank fails, the others are stopped and the launcher returns the failed
rank's code (128 + signal for a signal), except with ``--elastic``, where the
survivors re-form the world and go on (collectives/launcher/elastic_driver.py).

A remote rank is stopped through its ssh connection. sshd forwards no signal
without a tty, so the remote side runs the command under a small sh watcher
(:func:`remote_script`) that reads the connection's stdin: when the launcher
stops the rank, exits or is killed, that stdin closes, and the watcher sends
the command SIGTERM, then SIGKILL after the grace period.
"""

from __future__ import annotations

import argparse
import os
import random
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from .. import config
from ..rendezvous import blame as _blame
from ..rendezvous.env import format_addr
from . import engines
from .output import OutputPump as _OutputPump

__all__ = [
    "RankCommand",
    "parse_hosts",
    "parse_hostfile",
    "is_local_host",
    "choose_store_addr",
    "free_port",
    "build_rank_commands",
    "remote_script",
    "launch",
    "main",
]

DEFAULT_GRACE_S = 5.0
# Seconds the launcher waits for the rank that the first failed rank named as where
# its failure began (a survivor often exits first) before it stops the job.
BLAME_WAIT_S = 3.0
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "127.0.0.1", "::1"}


@dataclass
class RankCommand:
    """How to start one rank: the argv to exec and the environment it needs.

    For a local rank ``argv`` is the user's command and ``env`` holds the
    variables to add to the launcher's environment. For a remote rank
    ``argv`` is the whole ssh command line (the variables are inside it) and
    ``env`` lists the same variables for reference.
    """

    rank: int
    host: str
    local_rank: int
    local_size: int
    local: bool
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # Written to a remote rank's ssh stdin at start (the job secret, which
    # must not appear on a command line); b"" for local ranks.
    stdin_data: bytes = b""


# ------------------------------------------------------------------- hosts


def _split_host_slots(item: str, sep: str, what: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):  # [v6addr] or [v6addr]:slots
        close = item.find("]")
        if close < 0:
            raise ValueError(f"bad host {item!r} in {what}")
        host, rest = item[1:close], item[close + 1 :]
        slots_text = rest[1:] if rest.startswith(sep) else (None if not rest else "x")
    elif item.count(":") > 1:  # bare IPv6 address, one slot
        host, slots_text = item, None
    else:
        host, found, slots_text = item.partition(sep)
        slots_text = slots_text if found else None
    if not host:
        raise ValueError(f"empty host name in {what}")
    if slots_text is None:
        return host, 1
    if not slots_text.strip().isdigit() or int(slots_text) < 1:
        raise ValueError(f"bad slot count in {item!r} ({what}): expected a positive integer")
    return host, int(slots_text)


def parse_hosts(spec: str) -> list[tuple[str, int]]:
    """Parse ``-H host1:2,host2,[::1]:4`` into [(host, slots), ...]; no slots = 1."""
    hosts = [_split_host_slots(item, ":", "-H") for item in spec.split(",") if item.strip()]
    if not hosts:
        raise ValueError("-H lists no hosts")
    return hosts


def parse_hostfile(path: str) -> list[tuple[str, int]]:
    """Read a hostfile: one host a line as ``host``, ``host slots=N`` or ``host:N``.

    ``#`` starts a comment; blank lines are ignored. Other ``key=value``
    words on a line (e.g. ``max_slots=8``) are ignored, as mpirun does.
    """
    hosts: list[tuple[str, int]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            words = line.split()
            where = f"{path}:{lineno}"
            host, slots = _split_host_slots(words[0], ":", where)
            for word in words[1:]:
                key, _, value = word.partition("=")
                if key == "slots":
                    if not value.isdigit() or int(value) < 1:
                        raise ValueError(f"bad slots={value!r} at {where}")
                    slots = int(value)
            hosts.append((host, slots))
    if not hosts:
        raise ValueError(f"hostfile {path} lists no hosts")
    return hosts


def is_local_host(host: str) -> bool:
    """True for localhost, loopback addresses and this machine's own name."""
    host = host.strip("[]").lower()
    if host in _LOCAL_NAMES or host.startswith("127."):
        return True
    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    names |= {n.split(".", 1)[0] for n in names}
    return host in names


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out for port 0 (Linux's ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
            lo, hi = (int(x) for x in fh.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
        return True


def free_port(pair: bool = False) -> int:
    """A TCP port free now (with pair=True, port+1 too), for a store some process binds later.

    Picked at random outside the kernel's ephemeral range where there is room:
    ranks bind their listeners to port 0 while rank 0 starts its store, and
    one of them could otherwise be handed the store's port first. Falls back
    to the kernel's choice (bind to port 0) where the range leaves no room.
    """
    lo, hi = _ephemeral_range()
    spans = [(a, b) for a, b in ((10000, lo - 2), (hi + 1, 65534)) if b >= a]
    total = sum(b - a + 1 for a, b in spans)
    for _ in range(100 if total else 0):
        k = random.randrange(total)
        for a, b in spans:
            if k <= b - a:
                port = a + k
                break
            k -= b - a + 1
        if _bindable(port) and (not pair or _bindable(port + 1)):
            return port
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        if port < 65535 and (not pair or _bindable(port + 1)):
            return port
    raise OSError("no free TCP port found")


def choose_store_addr(hosts: Sequence[tuple[str, int]]) -> str:
    """The store address for a job: the first host and a port.

    When every rank is local the store is on 127.0.0.1. A local first host in
    a multi-host job is named by this machine's hostname so remote ranks can
    reach it. The port is a free local one when the first host is local, and
    a random one in 20000..39999 otherwise (it cannot be probed from here).
    """
    first = hosts[0][0]
    if is_local_host(first):
        if all(is_local_host(h) for h, _ in hosts):
            return format_addr("127.0.0.1", free_port())
        name = socket.gethostname() if first.strip("[]") in _LOCAL_NAMES else first
        return format_addr(name.strip("[]"), free_port())
    return format_addr(first.strip("[]"), random.randint(20000, 39999))


def remote_script(cwd: str, env: Mapping[str, str], command: Sequence[str],
                  grace: float = DEFAULT_GRACE_S, secret_on_stdin: bool = False) -> str:
    """The sh script a remote rank runs: the command, stopped when stdin closes.

    Without a tty sshd forwards no signal, so killing the ssh client would
    leave the remote command running. Instead the script keeps the
    connection's stdin (fd 3) for a watcher, runs the command with stdin from
    /dev/null, and when that stdin reaches EOF (the launcher closed it, or
    the connection dropped) sends the command SIGTERM, then SIGKILL after
    ``grace`` seconds. The command's exit status is the script's. With
    ``secret_on_stdin`` the script first reads one line from stdin into
    COLLECTIVES_JOB_SECRET, so the secret is never on a command line (where
    ps would show it).
    """
    assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    first = (["IFS= read -r COLLECTIVES_JOB_SECRET || exit 126", "export COLLECTIVES_JOB_SECRET"]
             if secret_on_stdin else [])
    return "\n".join(first + [
        f"cd {shlex.quote(cwd)} || exit 127",
        "exec 3<&0 </dev/null",
        f"env {assignments} {shlex.join(command)} &",
        "pid=$!",
        "(read -r _ <&3; kill -TERM $pid 2>/dev/null; "
        f"sleep {max(grace, 0.0):g}; kill -KILL $pid 2>/dev/null) &",
        "watcher=$!",
        "exec 3<&-",
        "wait $pid",
        "rc=$?",
        "kill $watcher 2>/dev/null",
        "exit $rc",
    ])


def build_rank_commands(
    command: Sequence[str],
    hosts: Sequence[tuple[str, int]],
    np: int,
    store_addr: str,
    exports: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    ssh_options: Sequence[str] = (),
    torch_addr: Optional[str] = None,
    grace: float = DEFAULT_GRACE_S,
    secret: Optional[str] = None,
) -> list[RankCommand]:
    """Place ``np`` ranks on ``hosts`` (filling slots in order) and build their argv.

    Args:
        command: the user's command and arguments.
        hosts: [(host, slots)]; ranks fill each host's slots before the next.
        np: number of ranks; at most the total number of slots.
        store_addr: "host:port" given to every rank as COLLECTIVES_STORE_ADDR.
        exports: extra variables for every rank (``-x``, ``--timeout``, ...).
        cwd: directory remote ranks ``cd`` into (default: the current one).
        ssh_options: extra ``ssh`` arguments placed before the host.
        torch_addr: "host:port" for torch.distributed's own store: when given,
            every rank also gets torchrun's variables (``RANK WORLD_SIZE
            LOCAL_RANK LOCAL_WORLD_SIZE``, and ``MASTER_ADDR MASTER_PORT``
            unless ``exports`` sets them), so ``init_process_group`` works
            without an init_method.
        grace: seconds a remote rank gets between SIGTERM and SIGKILL once
            its ssh connection closes (:func:`remote_script`).
        secret: the job secret: COLLECTIVES_JOB_SECRET of local ranks, the
            first line on a remote rank's ssh stdin (never in its argv).

    Returns:
        One :class:`RankCommand` per rank, in rank order.
    """
    if not command:
        raise ValueError("no command to run")
    total = sum(slots for _, slots in hosts)
    if np < 1:
        raise ValueError(f"-np {np}: must be at least 1")
    if np > total:
        raise ValueError(f"-np {np} is more than the {total} slots on the hosts given")
    placement: list[tuple[str, int]] = []  # (host, local_rank)
    for host, slots in hosts:
        for local_rank in range(slots):
            if len(placement) < np:
                placement.append((host, local_rank))
    local_sizes: dict[str, int] = {}
    for host, _ in placement:
        local_sizes[host] = local_sizes.get(host, 0) + 1
    cwd = cwd or os.getcwd()
    out = []
    for rank, (host, local_rank) in enumerate(placement):
        env = dict(exports or {})
        env.update({
            "COLLECTIVES_RANK": str(rank),
            "COLLECTIVES_SIZE": str(np),
            "COLLECTIVES_LOCAL_RANK": str(local_rank),
            "COLLECTIVES_LOCAL_SIZE": str(local_sizes[host]),
            "COLLECTIVES_STORE_ADDR": store_addr,
        })
        if torch_addr is not None:
            master, _, port = torch_addr.rpartition(":")
            env.update({"RANK": str(rank), "WORLD_SIZE": str(np), "LOCAL_RANK": str(local_rank),
                        "LOCAL_WORLD_SIZE": str(local_sizes[host])})
            env.setdefault("MASTER_ADDR", master.strip("[]"))
            env.setdefault("MASTER_PORT", port)
        if local_sizes[host] > 1 and "OMP_NUM_THREADS" not in env and \
                not (is_local_host(host) and "OMP_NUM_THREADS" in os.environ):
            env["OMP_NUM_THREADS"] = str(_threads_per_rank(host, local_sizes[host]))
        stdin_data = b""
        if is_local_host(host):
            argv = list(command)
            local = True
            if secret is not None:
                env["COLLECTIVES_JOB_SECRET"] = secret
        else:
            remote = "sh -c " + shlex.quote(remote_script(cwd, env, command, grace,
                                                          secret_on_stdin=secret is not None))
            argv = ["ssh", "-o", "BatchMode=yes", *ssh_options, host.strip("[]"), remote]
            local = False
            if secret is not None:
                stdin_data = secret.encode() + b"\n"
        out.append(RankCommand(rank, host, local_rank, local_sizes[host], local, argv, env,
                               stdin_data))
    return out


def _threads_per_rank(host: str, local_size: int) -> int:
    """OMP_NUM_THREADS for a rank that shares its host, when the user set none.

    OpenMP and BLAS pools (numpy's OpenBLAS, torch) otherwise start a thread
    per core in every rank, and their spinning workers take the cores the
    ranks need to make progress. Here: this machine's cores shared among its
    ranks; on another host, whose cores are unknown here, 1 (as torchrun).
    """
    if not is_local_host(host):
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores // local_size)


# ------------------------------------------------------------------ running


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send sig to the rank's process group (its pid: it leads a new session)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _close_stdin(proc: subprocess.Popen) -> None:
    """Close the pipe a remote rank's ssh reads (ending the remote command)."""
    if proc.stdin is not None and not proc.stdin.closed:
        try:
            proc.stdin.close()
        except OSError:
            pass


def _watch_exit(sel: selectors.BaseSelector, proc: subprocess.Popen, rank: int) -> Optional[int]:
    """A pidfd for the rank's process, registered in sel (readable once it exits), or None
    where the system has none (Linux < 5.3): the launcher then checks every 50 ms."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return None
    sel.register(fd, selectors.EVENT_READ, rank)
    return fd


def _unwatch(sel: selectors.BaseSelector, fd: Optional[int]) -> None:
    if fd is not None:
        sel.unregister(fd)
        os.close(fd)


def _describe(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def launch(ranks: Sequence[RankCommand], grace: float = DEFAULT_GRACE_S,
           verbose: bool = False, tolerate: Sequence[int] = ()) -> int:
    """Run the ranks to completion and return the job's exit code.

    0 when every rank exits 0; otherwise the code of the rank where the failure
    began (128 + signal number for a signal), after stopping the others. That is
    the first rank to fail, unless its error echoes another rank's failure (it
    names that rank in COLLECTIVES_FAILURE_DIR, collectives/rendezvous/blame.py):
    the launcher then waits up to BLAME_WAIT_S for that rank's own exit. Stopping: SIGTERM to
    each rank's process group, SIGKILL after ``grace`` seconds. SIGINT and
    SIGTERM received by the launcher are forwarded the same way (a second
    SIGINT kills at once). No process is left running on any path.

    A rank in ``tolerate`` (the workers of a parameter-server job, which the
    servers drop and go on without) that fails stops no one: it is reported
    at once and its code is the job's if nothing else fails.
    """
    procs: list[subprocess.Popen] = []
    sel = selectors.DefaultSelector()
    pump = _OutputPump(sel)
    state = {"signal": 0, "kill_at": None, "signals_seen": 0}
    alive: dict[int, subprocess.Popen] = {}
    exits: dict[int, Optional[int]] = {}  # rank -> pidfd (_watch_exit)

    def stop_all(sig: int) -> None:
        for proc in alive.values():
            _close_stdin(proc)  # a remote rank's watcher stops it (remote_script)
            _signal_group(proc, sig)
        if sig != signal.SIGKILL and state["kill_at"] is None:
            state["kill_at"] = time.monotonic() + grace

    def on_signal(signum: int, _frame: object) -> None:
        state["signals_seen"] += 1
        if not state["signal"]:
            state["signal"] = signum
        if state["signals_seen"] > 1 and signum == signal.SIGINT:
            stop_all(signal.SIGKILL)
        else:
            stop_all(signum)

    old_handlers = {}
    if threading.current_thread() is threading.main_thread():  # else: cannot catch
        old_handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    first_failure: Optional[tuple[int, int, int]] = None  # rank, code, others stopped
    tolerated: Optional[tuple[int, int]] = None  # rank, code
    # Where local ranks say which rank their failure began at (rendezvous/blame.py).
    reports = tempfile.mkdtemp(prefix="collectives-run-")
    # The first rank to fail named another: (its rank, its code, the rank it named,
    # the time until which we wait for that rank's own exit).
    named: Optional[tuple[int, int, int, float]] = None
    try:
        for rc in ranks:
            env = dict(os.environ)
            env.update(rc.env)
            if rc.local:
                env[_blame.DIR_VAR] = reports
            if verbose:
                where = "local" if rc.local else rc.host
                print(f"collectives-run: rank {rc.rank} on {where}: {shlex.join(rc.argv)}",
                      file=sys.stderr, flush=True)
            # A remote rank's ssh gets a pipe that stays open while it should
            # run; local ranks read nothing.
            stdin = subprocess.DEVNULL if rc.local else subprocess.PIPE
            proc = subprocess.Popen(rc.argv, env=env, stdin=stdin,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
            if rc.stdin_data and proc.stdin is not None:
                try:
                    proc.stdin.write(rc.stdin_data)
                    proc.stdin.flush()
                except OSError:  # ssh already gone: its exit is reported like any other
                    pass
            procs.append(proc)
            alive[rc.rank] = proc
            pump.add(rc.rank, "stdout", proc.stdout)
            pump.add(rc.rank, "stderr", proc.stderr)
            exits[rc.rank] = _watch_exit(sel, proc, rc.rank)
            if state["signal"]:  # a signal arrived while we were starting ranks
                break
        all_exited_at: Optional[float] = None
        while True:
            # Asleep in epoll until a rank writes or exits: the launcher shares
            # the cores with the ranks. It looks every second anyway (a signal
            # may have set kill_at), and every 50 ms without pidfds or while
            # draining the pipes of exited ranks.
            watched = all_exited_at is None and all(exits.get(r) is not None for r in alive)
            timeout = 1.0 if watched else 0.05
            if state["kill_at"] is not None:
                timeout = max(0.0, min(timeout, state["kill_at"] - time.monotonic()))
            if named is not None:
                timeout = max(0.0, min(timeout, named[3] - time.monotonic()))
            for key, _ in sel.select(timeout=timeout):
                if isinstance(key.data, tuple):  # an output pipe, not a pidfd
                    pump.read(key)
            for rank in list(alive):
                code = alive[rank].poll()
                if code is None:
                    continue
                del alive[rank]
                _unwatch(sel, exits.pop(rank, None))
                if code != 0 and rank in tolerate and first_failure is None:
                    print(f"collectives-run: rank {rank} {_describe(code)}; the job goes on "
                          f"without it (a parameter-server worker)", file=sys.stderr, flush=True)
                    tolerated = tolerated or (rank, code)
                elif named is not None and rank == named[2] and first_failure is None:
                    # The rank the first failure named, exiting by itself: the failure
                    # began there (or, had it exited 0, at the rank that named it).
                    first_failure = (rank, code, len(alive)) if code != 0 else \
                        (named[0], named[1], len(alive))
                    named = None
                    stop_all(signal.SIGTERM)
                elif code != 0 and first_failure is None and named is None \
                        and not state["signal"]:
                    origin = _blame.read_report(reports, rank)
                    if origin is not None and origin in alive:
                        # Its error echoes rank `origin` (a closed connection...): that
                        # rank is still exiting; wait a moment for it to say so itself.
                        named = (rank, code, origin, time.monotonic() + BLAME_WAIT_S)
                    else:
                        first_failure = (rank, code, len(alive))
                        stop_all(signal.SIGTERM)
            if named is not None and time.monotonic() >= named[3]:
                first_failure = (named[0], named[1], len(alive))
                print(f"collectives-run: rank {named[0]} failed naming rank {named[2]} as "
                      f"where the failure began, which did not exit within "
                      f"{BLAME_WAIT_S:g} s", file=sys.stderr, flush=True)
                named = None
                stop_all(signal.SIGTERM)
            if state["kill_at"] is not None and time.monotonic() >= state["kill_at"]:
                stop_all(signal.SIGKILL)
                state["kill_at"] = float("inf")
            if not alive:
                if pump.open == 0:
                    break
                # Pipes held open by a rank's leftover children: drain briefly.
                all_exited_at = all_exited_at or time.monotonic()
                if time.monotonic() - all_exited_at > 1.0:
                    pump.close_all()
                    break
    finally:
        for proc in procs:  # anything left in a rank's group: descendants included
            _close_stdin(proc)
            if proc.poll() is None:
                _signal_group(proc, signal.SIGKILL)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)
        if pump.open:
            pump.close_all()
        for fd in exits.values():
            _unwatch(sel, fd)
        sel.close()
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        shutil.rmtree(reports, ignore_errors=True)

    if first_failure is not None:
        rank, code, stopped = first_failure
        tail = f"; stopped the other {stopped} ranks" if stopped else ""
        print(f"collectives-run: rank {rank} {_describe(code)} first{tail}",
              file=sys.stderr, flush=True)
        return 128 - code if code < 0 else code
    if state["signal"]:
        name = signal.Signals(state["signal"]).name
        print(f"collectives-run: received {name}; stopped {len(procs)} ranks",
              file=sys.stderr, flush=True)
        return 128 + state["signal"]
    if tolerated is not None:
        return 128 - tolerated[1] if tolerated[1] < 0 else tolerated[1]
    return 0


# --------------------------------------------------------------------- CLI


def _seconds(text: str) -> float:
    """argparse type of --timeout/--start-timeout: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number of seconds > 0")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="collectives-run",
        description="Run N copies of a command as the ranks of a collectives job.",
    )
    p.add_argument("-np", "-n", dest="np", type=int, default=None,
                   help="number of ranks (default: the total slots of -H/--hostfile, or 1)")
    p.add_argument("-H", "--hosts", dest="hosts", default=None,
                   help="hosts and slots: host1:2,host2:4 (a host without slots has 1)")
    p.add_argument("--hostfile", default=None,
                   help="file of 'host slots=N' or 'host:N' lines ('#' comments)")
    p.add_argument("--network-interface", dest="ifname", default=None,
                   help="interface the ranks talk over (sets COLLECTIVES_IFNAME)")
    p.add_argument("--timeout", type=_seconds, default=None,
                   help="deadline of every blocking wait in the ranks, in seconds "
                        "(sets COLLECTIVES_TIMEOUT)")
    p.add_argument("--start-timeout", type=_seconds, default=None,
                   help="seconds for ranks to start and meet at the store (sets "
                        "COLLECTIVES_START_TIMEOUT and ssh's ConnectTimeout)")
    p.add_argument("--servers", type=int, default=None, metavar="S",
                   help="collectives.ps: the last S ranks are parameter servers, the others "
                        "workers (sets COLLECTIVES_PS_SERVERS)")
    p.add_argument("-x", dest="exports", action="append", default=[], metavar="VAR[=VALUE]",
                   help="export VAR (from here, or with VALUE) to every rank; repeatable")
    p.add_argument("--kill-grace", type=float, default=DEFAULT_GRACE_S,
                   help="seconds between SIGTERM and SIGKILL when stopping ranks")
    p.add_argument("--verbose", action="store_true", help="print each rank's command")
    from .elastic_driver import add_arguments

    add_arguments(p)  # --elastic --min-np --max-np --max-restarts --host-discovery-script
    from . import horovod_flags

    horovod_flags.add_arguments(p)  # horovodrun's -p --fusion-threshold-mb ... --gloo --mpi
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments")
    return p


def _launcher_secret(exports: dict, fresh: bool = True) -> Optional[str]:
    """The job secret to hand the ranks (collectives/rendezvous/auth.py): the user's
    COLLECTIVES_JOB_SECRET if set; None when the user gave a secret file
    (exported to every rank here: they read it); else a fresh one (with ``fresh``:
    not when each pod of a job runs its own launcher, which could not agree on one)."""
    from ..rendezvous.auth import SECRET_FILE_VAR, SECRET_VAR, generate_secret
    given = exports.get(SECRET_VAR) or os.environ.get(SECRET_VAR)
    if given:
        return given
    path = exports.get(SECRET_FILE_VAR) or os.environ.get(SECRET_FILE_VAR)
    if path:
        exports[SECRET_FILE_VAR] = path
        return None
    return generate_secret() if fresh else None


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``collectives-run``; returns the exit code of the job."""
    parser = _parser()
    args = parser.parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no command given (usage: collectives-run -np N command ...)")
    command = engines.script_command(command)  # `collectives-run train.py`, as torchrun
    if args.hosts and args.hostfile:
        parser.error("use either -H or --hostfile, not both")
    try:
        if args.hostfile:
            hosts = parse_hostfile(args.hostfile)
        elif args.hosts:
            hosts = parse_hosts(args.hosts)
        else:
            hosts = [("localhost", args.np or 1)]
        # Inside an engine (collectives/launcher/engines.py): a Kubeflow pod's share of
        # the job (PET_*), or a Slurm job's nodes, reached through srun.
        node = srun = None
        if not (args.hosts or args.hostfile or args.elastic):
            node = engines.kubeflow_node(os.environ, args.np)
            srun = None if node else engines.slurm_hosts(os.environ)
            hosts = [("localhost", node.nproc)] if node else (srun or hosts)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    np = args.np if args.np is not None else sum(s for _, s in hosts)

    exports: dict[str, str] = {}
    for item in args.exports:
        name, has_value, value = item.partition("=")
        if not name:
            parser.error(f"-x {item!r}: empty variable name")
        if has_value:
            exports[name] = value
        elif name in os.environ:
            exports[name] = os.environ[name]
        elif args.verbose:
            print(f"collectives-run: -x {name}: not set here, not exported",
                  file=sys.stderr)
    if args.ifname:
        exports["COLLECTIVES_IFNAME"] = args.ifname
    if args.timeout is not None:
        exports["COLLECTIVES_TIMEOUT"] = f"{args.timeout:g}"
    if args.servers is not None:
        if not 1 <= args.servers < np:
            parser.error(f"--servers {args.servers}: need 1 <= servers < -np ({np}), "
                         f"leaving at least one worker")
        exports["COLLECTIVES_PS_SERVERS"] = str(args.servers)
    from . import horovod_flags

    hvd_env, ssh_options = horovod_flags.exports_from(args)
    for name, value in hvd_env.items():
        exports.setdefault(name, value)  # an explicit -x wins
    if args.start_timeout is not None:
        exports["COLLECTIVES_START_TIMEOUT"] = f"{args.start_timeout:g}"
        ssh_options += ["-o", f"ConnectTimeout={max(1, int(args.start_timeout))}"]

    try:
        # Every rank would refuse a bad COLLECTIVES_* setting: say it once, before starting any.
        config.check_env({**os.environ, **exports}, warn_unknown=False)
    except ValueError as exc:
        parser.error(str(exc))
    if args.elastic:
        from .elastic_driver import run_elastic

        try:
            return run_elastic(sys.modules[__name__], args, parser, command, hosts, exports,
                               ssh_options, _launcher_secret(exports))
        except OSError as exc:  # e.g. the command does not exist
            print(f"collectives-run: cannot start {command[0]!r}: {exc}", file=sys.stderr)
            return 127
    try:
        if node:
            store_addr, torch_addr = node.store_addr, node.torch_addr
        else:
            store_addr = choose_store_addr(hosts)
            torch_addr = choose_store_addr(hosts)
            while torch_addr == store_addr:
                torch_addr = choose_store_addr(hosts)
        ranks = build_rank_commands(command, hosts, np, store_addr, exports=exports,
                                    ssh_options=ssh_options, torch_addr=torch_addr,
                                    grace=args.kill_grace,
                                    secret=_launcher_secret(exports, fresh=node is None))
        ranks = engines.place_on_node(ranks, node) if node else ranks
        ranks = engines.through_srun(ranks) if srun else ranks
    except ValueError as exc:
        parser.error(str(exc))
    try:
        workers = range(np - args.servers) if args.servers is not None else ()
        return launch(ranks, grace=args.kill_grace, verbose=args.verbose, tolerate=workers)
    except OSError as exc:  # e.g. the command does not exist
        print(f"collectives-run: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
