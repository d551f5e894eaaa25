"""Turns for collectives-bench's jobs: every library measures a size in the same minute.

The driver (collectives.bench.drive) starts all its jobs at once, ours and each
``--compare`` peer's, and lets one measure at a time, size by size: job A
measures size i, then job B measures size i, ..., then A measures size i+1. On
a shared machine a noisy spell lasts seconds to minutes; run one after another,
whole sweeps of several minutes each, one library got the quiet minute and the
next the noisy one, and their ratio at 2 MiB moved between 0.8x and 1.4x from
one invocation to the next. In turns, both see the same minute. A step is a
size, or from SPLIT_BYTES on a share of its iterations (collectives-bench
--turn-iters): a whole size at 128 MiB is a turn of several seconds, long
enough for one library to draw a slow spell that the next does not.

Protocol, one TCP connection on loopback per worker rank to the driver, lines
of text:

    worker -> driver   hello JOB RANK NRANKS     on connecting
    worker -> driver   ready STEP                before turn STEP (STEP = number
                                                 of turns: the sweep is done)
    driver -> worker   go STEP                   measure it

A worker waiting for its go blocks in recv(), so the job whose turn it is has
the cores to itself. The driver gives the first go only when every job is
ready for step 0 (all have started: a job starting up, torch importing, does
not load the machine under another's measurement), and the final go, which
lets the jobs write their results and exit, only when every job has measured
its last turn.
"""
from __future__ import annotations

import selectors
import socket
import subprocess
import threading
import time
from typing import Callable, Optional, Sequence

__all__ = ["SPLIT_BYTES", "TurnGate", "run_in_turns", "turn_orders", "turn_rounds"]


def turn_orders(n: int) -> list[list[int]]:
    """The orders in which n implementations take their turns, one per iteration in
    rotation: a Williams design, where within the turns each implementation follows each
    other one equally often and takes each place equally often (n orders for even n; for
    odd n, those n and their reverses). A call can run slower after some other algorithm's
    call than after its own kind: with a plain rotation (ring, tree, butterfly, auto, then
    tree, butterfly, auto, ring, ...) auto nearly always followed butterfly, and an 8-byte
    auto call, which is a butterfly there, timed 10.7 us against butterfly's 6.6 us."""
    if n == 0:
        return [[]]
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    orders = [[(x + k) % n for x in first] for k in range(n)]
    return orders + [o[::-1] for o in orders] if n % 2 else orders


# Sizes below this take a single turn however many iterations they time. Their
# turn lasts well under a second (4 algorithms x 2 placements x 25 calls of at
# most a few ms), short beside the host's slow spells, and cut into turns of 2
# iterations it would mostly time calls just after the job woke from waiting:
# at 4 ranks over TCP, a sweep cut that way timed the 8-byte call of OpenMPI
# and of our auto alone at 143 and 89 us; sweeps in whole-size turns, one
# before and one after, at 65-91 and 46-48 us.
SPLIT_BYTES = 4 << 20


def turn_rounds(iters: int, turn_iters: int, nbytes: int = SPLIT_BYTES) -> list[int]:
    """How many of a size's ``iters`` timed iterations each of its turns measures: all in
    one turn when turn_iters is 0 or the size is below SPLIT_BYTES, else turns of at most
    turn_iters, as even as can be."""
    if turn_iters <= 0 or turn_iters >= iters or nbytes < SPLIT_BYTES:
        return [iters]
    k = -(-iters // turn_iters)
    return [iters // k + (1 if r < iters % k else 0) for r in range(k)]


class TurnGate:
    """A worker rank's side: ``gate(step)`` reports ready and waits for the driver's go.

    spec is ``HOST:PORT,JOB`` (the driver's --turns argument)."""

    def __init__(self, spec: str, rank: int, nranks: int) -> None:
        addr, _, self.job = spec.rpartition(",")
        host, _, port = addr.rpartition(":")
        if not self.job or not port.isdigit():
            raise SystemExit(f"collectives-bench: --turns {spec!r} is not HOST:PORT,JOB")
        self._sock = socket.create_connection((host, int(port)), timeout=60)
        self._sock.settimeout(None)  # a turn lasts as long as the other jobs' turns take
        self._buf = b""
        self._sock.sendall(f"hello {self.job} {rank} {nranks}\n".encode())

    def __call__(self, step: int) -> None:
        self._sock.sendall(f"ready {step}\n".encode())
        while b"\n" not in self._buf:
            chunk = self._sock.recv(64)
            if not chunk:
                raise SystemExit(f"collectives-bench: the driver stopped the turns (job {self.job}, "
                                 f"turn {step}): another job failed or the driver was interrupted")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        if line.decode(errors="replace").split() != ["go", str(step)]:
            raise SystemExit(f"collectives-bench: expected 'go {step}' from the driver, got {line!r}")

    def close(self) -> None:
        """Close the connection to the driver."""
        self._sock.close()


class _Job:
    def __init__(self, name: str, proc: subprocess.Popen) -> None:
        self.name, self.proc = name, proc
        self.nranks = 0  # from the hellos
        self.ranks: dict[socket.socket, int] = {}  # connection -> last step it is ready for
        self.failed = False

    def ready(self, step: int) -> bool:
        return (self.nranks > 0 and len(self.ranks) == self.nranks
                and all(s >= step for s in self.ranks.values()))


class _Driver:
    def __init__(self, jobs: dict[str, _Job], listener: socket.socket, nsteps: int) -> None:
        self.jobs, self.listener, self.nsteps = jobs, listener, nsteps
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ, None)
        self.pending: dict[socket.socket, bytes] = {}  # connected, hello not yet read
        self.owner: dict[socket.socket, _Job] = {}
        self.bufs: dict[socket.socket, bytes] = {}

    def wait(self, job: _Job, step: int) -> bool:
        """Until every rank of job is ready for step (True) or the job failed (False)."""
        while not job.failed and not job.ready(step):
            self._pump(0.5)
            for j in self.jobs.values():  # a job that exited before its sweep ended failed
                if not j.failed and j.proc.poll() is not None and not j.ready(self.nsteps):
                    self.stop(j)
        return not job.failed

    def go(self, job: _Job, step: int) -> None:
        for conn in list(job.ranks):
            try:
                conn.sendall(f"go {step}\n".encode())
            except OSError:
                self.stop(job)
                return

    def stop(self, job: _Job) -> None:
        """Drop a job that failed: close its connections and end its launcher (a rank
        still inside a collective with a dead peer would otherwise wait out the
        library's timeout); the other jobs go on."""
        job.failed = True
        for conn in list(job.ranks):
            self._forget(conn)
        job.ranks.clear()
        if job.proc.poll() is None:
            job.proc.terminate()

    def _forget(self, conn: socket.socket) -> None:
        self.sel.unregister(conn)
        self.pending.pop(conn, None)
        self.owner.pop(conn, None)
        self.bufs.pop(conn, None)
        conn.close()

    def _pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            if key.fileobj is self.listener:
                conn, _ = self.listener.accept()
                self.pending[conn] = b""
                self.sel.register(conn, selectors.EVENT_READ, None)
                continue
            conn = key.fileobj
            assert isinstance(conn, socket.socket)
            if conn.fileno() < 0:  # forgotten earlier in this round (its job stopped)
                continue
            try:
                data = conn.recv(4096)
            except OSError:
                data = b""
            if not data:
                self._closed(conn)
                continue
            if conn in self.pending:
                self.pending[conn] += data
                if b"\n" not in self.pending[conn]:
                    continue
                line, _, rest = self.pending.pop(conn).partition(b"\n")
                words = line.decode(errors="replace").split()
                job = self.jobs.get(words[1]) if len(words) == 4 and words[0] == "hello" else None
                if job is None or job.failed:
                    self._forget(conn)
                    continue
                job.nranks = int(words[3])
                job.ranks[conn] = -1
                self.owner[conn] = job
                data = rest
            self.bufs[conn] = self.bufs.get(conn, b"") + data
            while b"\n" in self.bufs[conn]:
                line, _, self.bufs[conn] = self.bufs[conn].partition(b"\n")
                words = line.decode(errors="replace").split()
                job = self.owner[conn]
                if len(words) == 2 and words[0] == "ready" and words[1].isdigit() and conn in job.ranks:
                    job.ranks[conn] = int(words[1])

    def _closed(self, conn: socket.socket) -> None:
        job = self.owner.get(conn)
        if job is not None and job.ranks.get(conn, self.nsteps) < self.nsteps:
            self.stop(job)  # a rank gone before its sweep ended
        else:
            if job is not None:
                job.ranks.pop(conn, None)
            self._forget(conn)

    def close(self) -> None:
        for conn in list(self.owner) + list(self.pending):
            conn.close()
        self.sel.close()


def run_in_turns(jobs: Sequence[tuple[str, Sequence[str]]], env: dict, nsteps: int,
                 orders: Callable[[int], list[list[int]]],
                 on_stderr: Callable[[str, str], None]) -> dict[str, int]:
    """Run the jobs (name, command) at once, measuring in turns; returns their exit codes.

    Each command gets ``--turns HOST:PORT,NAME`` appended before its last two
    arguments (``--worker-json PATH``). Size i is measured by the jobs in the
    order orders(len(jobs))[i % len(...)] (a Williams design: each job follows
    each other one equally often). on_stderr(name, line) receives each line a
    job writes to stderr."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    port = listener.getsockname()[1]
    procs: dict[str, _Job] = {}
    readers: list[threading.Thread] = []
    driver: Optional[_Driver] = None
    try:
        for name, cmd in jobs:
            full = [*cmd[:-2], "--turns", f"127.0.0.1:{port},{name}", *cmd[-2:]]
            proc = subprocess.Popen(full, env=env, stderr=subprocess.PIPE, text=True,
                                    errors="replace")
            procs[name] = _Job(name, proc)
            t = threading.Thread(target=_forward, args=(name, proc, on_stderr), daemon=True)
            t.start()
            readers.append(t)
        driver = _Driver(procs, listener, nsteps)
        names = [name for name, _ in jobs]
        for job in procs.values():  # everyone started before anyone measures
            driver.wait(job, 0)
        turn = orders(len(names))
        for step in range(nsteps):
            for k in turn[step % len(turn)]:
                job = procs[names[k]]
                if driver.wait(job, step):
                    driver.go(job, step)
                    driver.wait(job, step + 1)
        for job in procs.values():
            if not job.failed:
                driver.go(job, nsteps)
        codes = {name: job.proc.wait() for name, job in procs.items()}
    finally:
        if driver is not None:
            driver.close()
        listener.close()
        for job in procs.values():
            if job.proc.poll() is None:
                job.proc.terminate()
                try:
                    job.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    job.proc.kill()
                    job.proc.wait()
        deadline = time.monotonic() + 10
        for t in readers:
            t.join(max(0.0, deadline - time.monotonic()))
    return codes


def _forward(name: str, proc: subprocess.Popen, on_stderr: Callable[[str, str], None]) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        on_stderr(name, line)
