"""The driver of ``collectives-run --elastic``: a job whose workers come and go.

    collectives-run --elastic -np 4 --min-np 2 --max-np 4 [--max-restarts K]
                    [--host-discovery-script S] python train.py

The driver hosts the job's store itself (not rank 0, which may die) and
numbers the worlds the workers form: *generations* (see collectives/elastic/worker.py
for the keys). It starts ``-np`` workers and publishes generation 1 with all of
them. Then:

- A worker that exits non-zero (killed, crashed) is dropped: the driver writes
  why under the generation's ``failed/<rank>`` (so every survivor's
  HorovodInternalError names it at once) and publishes the next generation of
  the survivors, which they join after rolling back (``hvd.elastic.run``).
  Fewer than ``--min-np`` left: the job is stopped, with a message saying so.
  While ``--max-restarts`` allows and fewer than ``--max-np`` run, a
  replacement is started on a free slot.
- A new worker (a replacement, or one on a host the discovery script added)
  is admitted once it reaches the store: the driver publishes a generation
  with it appended and announces a host update, which the running workers
  raise as HostsUpdatedInterrupt at their next ``state.commit()``; they then
  re-form with it and ``sync()`` gives it the state by broadcast.
- The discovery script is run every ``--discovery-interval`` seconds; it
  prints ``host[:slots]`` lines. Workers on a host it stops listing leave at
  the next commit: the others raise HostsUpdatedInterrupt (skip_sync) and
  re-form without them, and the driver then stops them (after
  REMOVE_GRACE_S at the latest: the others then roll back as after any loss).
- Once a worker exits 0, training is over: no one else is started, and the
  job ends when every worker has exited (0 if none failed after that).

Output lines are prefixed ``[<id>]`` by worker id (ids are stable; ranks
change with each generation).

The processes are started, watched, stopped and their output forwarded by the
plumbing of ``collectives.run`` (``_OutputPump``, ``_signal_group``,
``remote_script``, ...), which this module gets as ``tools``: ``collectives.run``
(the CLI) sits above this module and passes itself in, so the modules do not
import each other.
"""
from __future__ import annotations

import argparse
import os
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Optional

from ..rendezvous import auth as _auth, store as _store
from ..elastic import worker as _elastic
from ..rendezvous.env import format_addr
from .engines import parse_discovery

__all__ = ["add_arguments", "ElasticDriver", "run_elastic"]

DISCOVERY_TIMEOUT_S = 10.0
MAX_DISCOVERY_OUTPUT = 1 << 20
REMOVE_GRACE_S = 30.0  # for a worker on a removed host to reach the next commit


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The --elastic options of collectives-run."""
    g = p.add_argument_group("elastic (Horovod elastic: hvd.elastic.run)")
    g.add_argument("--elastic", action="store_true",
                   help="workers may die and join: survivors re-form the world (see README)")
    g.add_argument("--min-np", type=int, default=None,
                   help="stop the job when fewer workers remain (default: -np)")
    g.add_argument("--max-np", type=int, default=None,
                   help="never run more workers than this (default: -np)")
    g.add_argument("--max-restarts", type=int, default=0,
                   help="replacement workers the job may start in all (default 0)")
    g.add_argument("--host-discovery-script", default=None, metavar="S",
                   help="prints the available 'host[:slots]' lines (or the MPI Operator's "
                        "/etc/mpi/discover_hosts.sh: host names); run periodically")
    g.add_argument("--discovery-interval", type=float, default=1.0, metavar="SEC",
                   help="seconds between runs of the discovery script (default 1)")


def _reachable_name(remote: str, exports: dict) -> str:
    """The address remote workers reach this launcher's store at: the interface's given
    (--network-interface), else this host's name when it resolves, else the address this
    host routes from towards the first remote host (a pod or a namespace whose hostname
    no DNS knows)."""
    from ..rendezvous.env import advertise_address, interface_address

    ifname = exports.get("COLLECTIVES_IFNAME") or os.environ.get("COLLECTIVES_IFNAME")
    if ifname:
        return interface_address(ifname)
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, None)
        return name
    except socket.gaierror:
        return advertise_address(remote.strip("[]"), 22, environ={})


class _Worker:
    def __init__(self, ident: int, host: str, proc: subprocess.Popen, pidfd) -> None:
        self.ident = ident
        self.host = host
        self.proc = proc
        self.pidfd = pidfd
        self.started = time.monotonic()
        self.member = False  # listed in a published generation


class ElasticDriver:
    """Runs one elastic job (see the module docstring); :meth:`run` returns its exit code."""

    def __init__(self, tools: Any, command: list, hosts: list, np: int, min_np: int,
                 max_np: int, max_restarts: int, exports: dict, secret: Optional[str],
                 discovery: Optional[str] = None, discovery_interval: float = 1.0,
                 grace: float = 5.0, verbose: bool = False,
                 ssh_options: tuple = ()) -> None:
        self.tools = tools
        self.command = command
        self.hosts = list(hosts)
        self.np, self.min_np, self.max_np = np, min_np, max_np
        self.restarts_left = max_restarts
        self.exports = dict(exports)
        self.secret = secret
        self.store_addr = ""  # the store's, chosen by run() once the hosts are known
        self.discovery = discovery
        self.discovery_interval = discovery_interval
        self.grace = grace
        self.verbose = verbose
        self.ssh_options = list(ssh_options)
        self.workers: dict = {}  # id -> _Worker, alive
        self.members: list = []  # ids of the newest generation, in rank order
        self.gen = 0
        self.updates = 0
        self.next_id = 0
        self.finished = False
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.discovered: Optional[list] = None  # the discovery thread's latest answer
        self.dismissed: set = set()
        self.removing: dict = {}  # id -> when to stop it at the latest (its host is gone)  # ids stopped by the driver once training was over
        self.failure: Optional[int] = None  # the job's exit code once it failed
        self.sel = selectors.DefaultSelector()
        self.pump = self.tools._OutputPump(self.sel)
        self.procs: list = []
        self.signal = 0
        self.kill_at: Optional[float] = None

    # -------------------------------------------------------------- helpers
    def _say(self, text: str) -> None:
        print(f"collectives-run: {text}", file=sys.stderr, flush=True)

    def _slots_free(self) -> list:
        """[(host)] one entry per free slot, in host order."""
        used: dict = {}
        for w in self.workers.values():
            used[w.host] = used.get(w.host, 0) + 1
        free = []
        for host, slots in self.hosts:
            free += [host] * max(0, slots - used.get(host, 0))
            used[host] = max(0, used.get(host, 0) - slots)
        return free

    def _spawn(self, host: str) -> _Worker:
        ident = self.next_id
        self.next_id += 1
        env = dict(self.exports)
        env.update({_elastic.ID_VAR: str(ident), "COLLECTIVES_STORE_ADDR": self.store_addr})
        per_host = sum(s for h, s in self.hosts if h == host) or 1
        if per_host > 1 and "OMP_NUM_THREADS" not in env and \
                not (self.tools.is_local_host(host) and "OMP_NUM_THREADS" in os.environ):
            env["OMP_NUM_THREADS"] = str(self.tools._threads_per_rank(host, per_host))
        stdin_data = b""
        if self.tools.is_local_host(host):
            argv = list(self.command)
            if self.secret is not None:
                env[_auth.SECRET_VAR] = self.secret
            full_env = dict(os.environ)
            full_env.update(env)
            stdin = subprocess.DEVNULL
        else:
            script = self.tools.remote_script(os.getcwd(), env, self.command, self.grace,
                                   secret_on_stdin=self.secret is not None)
            argv = ["ssh", "-o", "BatchMode=yes", *self.ssh_options, host.strip("[]"),
                    "sh -c " + shlex.quote(script)]
            full_env = dict(os.environ)
            stdin = subprocess.PIPE
            if self.secret is not None:
                stdin_data = self.secret.encode() + b"\n"
        if self.verbose:
            self._say(f"worker {ident} on {host}: {shlex.join(argv)}")
        proc = subprocess.Popen(argv, env=full_env, stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        if stdin_data and proc.stdin is not None:
            try:
                proc.stdin.write(stdin_data)
                proc.stdin.flush()
            except OSError:
                pass
        self.procs.append(proc)
        self.pump.add(ident, "stdout", proc.stdout)
        self.pump.add(ident, "stderr", proc.stderr)
        worker = _Worker(ident, host, proc, self.tools._watch_exit(self.sel, proc, ident))
        self.workers[ident] = worker
        return worker

    def _publish(self, ids: list, update: Optional[str] = None) -> None:
        """Publish the next generation (ids in rank order); with update, announce it."""
        if update is not None:
            self.client.set(f"elastic/update/{self.updates + 1}", update.encode())
            self.updates = self.client.add("elastic/updates", 1)
        g = self.gen + 1
        self.client.set(f"elastic/members/{g}",
                        _elastic.format_members(self.updates, ids, os.urandom(16)))
        self.gen = self.client.add("elastic/gen", 1)
        self.members = list(ids)
        for i in ids:
            self.workers[int(i)].member = True
        self._say(f"generation {self.gen}: {len(ids)} workers (ids {', '.join(map(str, ids))})")

    def _stop_all(self, sig: int) -> None:
        for w in self.workers.values():
            self.tools._close_stdin(w.proc)
            self.tools._signal_group(w.proc, sig)
        if sig != signal.SIGKILL and self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace

    # ------------------------------------------------------------ decisions
    def _on_exit(self, w: _Worker, code: int) -> None:
        del self.workers[w.ident]
        self.tools._unwatch(self.sel, w.pidfd)
        if self.failure is not None or self.signal:
            return
        if w.ident in self.dismissed:
            return
        if code == 0:
            if not self.finished:
                self._say(f"worker {w.ident} finished; waiting for the others")
                self.finished = True
                self._dismiss_newcomers()
            return
        if self.finished:
            self._say(f"worker {w.ident} {self.tools._describe(code)} after training finished")
            self.failure = 128 - code if code < 0 else code
            self._stop_all(signal.SIGTERM)
            return
        was_member = str(w.ident) in self.members
        self._say(f"worker {w.ident} {self.tools._describe(code)}")
        if was_member:
            rank = self.members.index(str(w.ident))
            try:  # the survivors' failure reports then name it at once
                self.client.set(f"g{self.gen}/failed/{rank}",
                                f"worker {w.ident} (rank {rank}) {self.tools._describe(code)} "
                                f"(collectives-run --elastic)".encode(), timeout=2.0)
            except (OSError, TimeoutError, ConnectionError):
                pass
        if self._can_restart():
            self.restarts_left -= 1
            host = self._slots_free()[0]
            nw = self._spawn(host)
            self._say(f"started worker {nw.ident} on {host} in place of worker {w.ident} "
                      f"({self.restarts_left} restarts left)")
        if len(self.workers) < self.min_np:
            n = len(self.workers)
            self._say(f"{n} worker{'' if n == 1 else 's'} left, fewer than --min-np "
                      f"{self.min_np}: stopping the job")
            self.failure = 128 - code if code < 0 else (code or 1)
            self._stop_all(signal.SIGTERM)
            return
        if was_member:  # the survivors (and any new worker already waiting) re-form
            ready = [str(i) for i, x in self.workers.items() if not x.member and self._ready(x)]
            self._publish([m for m in self.members if int(m) in self.workers] + ready)

    def _formed(self) -> list:
        """The ids of the newest generation every member joined (the world that trained)."""
        for g in range(self.gen, 0, -1):
            try:
                _, ids, _ = _elastic.parse_members(self.client.get(f"elastic/members/{g}",
                                                                   timeout=1.0))
                if self.client.check([f"g{g}/joined/{r}" for r in range(len(ids))]):
                    return ids
            except (OSError, TimeoutError, ConnectionError, ValueError):
                return []
        return []

    def _dismiss_newcomers(self) -> None:
        """Training is over: stop the workers that never trained (still waiting to join)."""
        formed = set(self._formed())
        for w in self.workers.values():
            if str(w.ident) not in formed:
                self._say(f"training is over: stopping worker {w.ident}, which never joined")
                self.dismissed.add(w.ident)
                self.tools._close_stdin(w.proc)
                self.tools._signal_group(w.proc, signal.SIGTERM)

    def _can_restart(self) -> bool:
        return (self.restarts_left > 0 and not self.finished and len(self.workers) < self.max_np
                and bool(self._slots_free()))

    def _ready(self, w: _Worker) -> bool:
        return self.client.check([f"elastic/ready/{w.ident}"])

    def _admit_ready(self) -> None:
        if self.finished:
            return
        ready = [str(i) for i, w in self.workers.items() if not w.member and self._ready(w)]
        if ready:
            self._say(f"worker(s) {', '.join(ready)} ready: admitting at the next commit")
            self._publish([m for m in self.members if int(m) in self.workers] + ready,
                          update="added")

    def _run_discovery(self) -> Optional[list]:
        """The hosts the discovery script lists now; None (said why) if it failed."""
        try:
            out = subprocess.run([self.discovery], capture_output=True, timeout=DISCOVERY_TIMEOUT_S,
                                 check=True).stdout[:MAX_DISCOVERY_OUTPUT].decode()
            return parse_discovery(out)  # host, host:slots, host slots=N (MPI Operator)
        except (OSError, subprocess.SubprocessError, ValueError, UnicodeDecodeError) as exc:
            self._say(f"host discovery script {self.discovery!r} failed ({exc}); "
                      f"keeping the hosts known")
            return None

    def _discovery_loop(self) -> None:
        """Thread: run the script every interval (it may be slow: the main loop must keep
        draining the workers' output meanwhile) and leave its answer for the main loop."""
        while not self.stopping.wait(self.discovery_interval):
            hosts = self._run_discovery()
            if hosts is not None:
                with self.lock:
                    self.discovered = hosts

    def _discover(self, hosts: Optional[list] = None) -> None:
        if hosts is None:
            hosts = self._run_discovery()
            if hosts is None:
                return
        if hosts == self.hosts:
            return
        gone = {h for h, _ in self.hosts} - {h for h, _ in hosts}
        self._say(f"host discovery: {', '.join(f'{h}:{s}' for h, s in hosts) or 'no hosts'}")
        self.hosts = hosts
        leaving = [w for w in self.workers.values() if w.host in gone]
        members = [w for w in leaving if str(w.ident) in self.members and not self.finished]
        for w in leaving:
            self.dismissed.add(w.ident)  # its exit is no failure
            if w not in members:  # not training (yet): stop it now
                self._say(f"host {w.host} is gone: stopping worker {w.ident}")
                self._terminate(w)
        if members:
            # Horovod's way: the others go on without them from their next commit
            # (HostsUpdatedInterrupt, skip_sync); they are stopped once that world formed.
            out = {str(w.ident) for w in members}
            keep = [m for m in self.members if m not in out]
            self._say(f"host(s) {', '.join(sorted(gone))} gone: worker(s) "
                      f"{', '.join(sorted(out))} leave at the next commit")
            for w in members:
                self.removing[w.ident] = time.monotonic() + REMOVE_GRACE_S
            if len(keep) < self.min_np:
                self._say(f"{len(keep)} worker{'' if len(keep) == 1 else 's'} left, fewer than "
                          f"--min-np {self.min_np}: stopping the job")
                self.failure = 1
                self._stop_all(signal.SIGTERM)
                return
            self._publish(keep, update="removed")
        if not self.finished:
            for host in self._slots_free()[: max(0, self.max_np - len(self.workers))]:
                nw = self._spawn(host)
                self._say(f"started worker {nw.ident} on {host} (new host slot)")

    def _terminate(self, w: _Worker) -> None:
        self.tools._close_stdin(w.proc)
        self.tools._signal_group(w.proc, signal.SIGTERM)

    def _stop_removed(self) -> None:
        """Stop the workers of removed hosts once the world without them formed (or their
        grace ran out: they never reached a commit, and the others roll back instead)."""
        formed = self._formed() == self.members
        for ident, deadline in list(self.removing.items()):
            if ident not in self.workers:
                del self.removing[ident]
            elif formed or time.monotonic() >= deadline:
                self._say(f"stopping worker {ident} (its host is gone)")
                self._terminate(self.workers[ident])
                del self.removing[ident]

    # ----------------------------------------------------------------- run
    def run(self) -> int:
        """Start the store and the workers, run the job to its end, return its exit code."""
        if self.discovery:
            self._discover_initial()
        remote = [h for h, _ in self.hosts if not self.tools.is_local_host(h)]
        host = "127.0.0.1" if not remote else _reachable_name(remote[0], self.exports)
        port = self.tools.free_port()
        self.store_addr = format_addr(host, port)
        secret = self.secret.encode() if self.secret is not None else _auth.job_secret()
        self.server = _store.StoreServer(host, port, secret=secret)
        self.client = _store.StoreClient(host, port, timeout=10.0, secret=secret)

        def on_signal(signum: int, _frame: object) -> None:
            first = not self.signal
            self.signal = self.signal or signum
            self._stop_all(signal.SIGKILL if not first and signum == signal.SIGINT else signum)

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        if self.discovery:
            threading.Thread(target=self._discovery_loop, name="host-discovery",
                             daemon=True).start()
        try:
            first = [self._spawn(h) for h in self._slots_free()[: self.np]]
            self._publish([str(w.ident) for w in first])
            drain_from: Optional[float] = None
            while True:
                timeout = 0.05
                if self.kill_at is not None:
                    timeout = max(0.0, min(timeout, self.kill_at - time.monotonic()))
                for key, _ in self.sel.select(timeout=timeout):
                    if isinstance(key.data, tuple):
                        self.pump.read(key)
                for w in list(self.workers.values()):
                    code = w.proc.poll()
                    if code is not None:
                        self._on_exit(w, code)
                if self.failure is None and not self.signal:
                    self._admit_ready()
                    with self.lock:
                        hosts, self.discovered = self.discovered, None
                    if hosts is not None:
                        self._discover(hosts)
                    if self.removing:
                        self._stop_removed()
                if self.kill_at is not None and time.monotonic() >= self.kill_at:
                    self._stop_all(signal.SIGKILL)
                    self.kill_at = float("inf")
                if not self.workers:
                    if self.pump.open == 0:
                        break
                    drain_from = drain_from or time.monotonic()
                    if time.monotonic() - drain_from > 1.0:
                        self.pump.close_all()
                        break
        finally:
            self.stopping.set()
            for proc in self.procs:
                self.tools._close_stdin(proc)
                if proc.poll() is None:
                    self.tools._signal_group(proc, signal.SIGKILL)
            for proc in self.procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
                self.tools._signal_group(proc, signal.SIGKILL)
            if self.pump.open:
                self.pump.close_all()
            for w in self.workers.values():
                self.tools._unwatch(self.sel, w.pidfd)
            self.sel.close()
            self.client.close()
            self.server.close()
            for sig, handler in old.items():
                signal.signal(sig, handler)
        if self.signal:
            self._say(f"received {signal.Signals(self.signal).name}; stopped the workers")
            return 128 + self.signal
        if self.failure is not None:
            return self.failure
        return 0

    def _discover_initial(self) -> None:
        saved = self.finished
        self.finished = True  # list the hosts only; the first workers start below
        self._discover()
        self.finished = saved
        if not self.hosts:
            raise ValueError(f"the host discovery script {self.discovery!r} lists no hosts")


def run_elastic(tools: Any, args: argparse.Namespace, parser: argparse.ArgumentParser,
                command: list, hosts: list, exports: dict, ssh_options: list,
                secret: Optional[str]) -> int:
    """collectives-run --elastic: check the options and run an :class:`ElasticDriver`
    (tools: the collectives.run module, see the module docstring)."""
    if args.servers is not None:
        parser.error("--elastic and --servers cannot be combined")
    max_np = args.max_np if args.max_np is not None else (args.np or sum(s for _, s in hosts))
    np = args.np if args.np is not None else max_np
    min_np = args.min_np if args.min_np is not None else np
    if not 1 <= min_np <= np <= max_np:
        parser.error(f"--elastic needs 1 <= --min-np ({min_np}) <= -np ({np}) <= --max-np "
                     f"({max_np})")
    if args.max_restarts < 0:
        parser.error("--max-restarts must be >= 0")
    if args.discovery_interval <= 0:
        parser.error("--discovery-interval must be > 0")
    if args.host_discovery_script is not None:
        hosts = []  # the script's, read when the job starts
    elif not args.hosts and not args.hostfile:
        hosts = [("localhost", max_np)]
    if args.host_discovery_script is None and np > sum(s for _, s in hosts):
        parser.error(f"-np {np} is more than the {sum(s for _, s in hosts)} slots on the hosts")
    driver = ElasticDriver(tools, command, hosts, np, min_np, max_np, args.max_restarts, exports, secret,
                           discovery=args.host_discovery_script,
                           discovery_interval=args.discovery_interval, grace=args.kill_grace,
                           verbose=args.verbose, ssh_options=tuple(ssh_options))
    try:
        return driver.run()
    except ValueError as exc:
        print(f"collectives-run: {exc}", file=sys.stderr)
        return 2
