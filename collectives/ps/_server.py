"""A parameter server: one shard, one handler thread per worker, the modes' rules in one place.

Each handler thread blocks (GIL released) on its worker's pair communicator,
checks the header, and hands the message to the shard under one condition
variable. What happens to a PUSH of the gradient computed on version ``k``
when the shard is at version ``v``:

=========  ==========================================================  =====================
mode       applied                                                     reply (newest params)
=========  ==========================================================  =====================
sync       k == v: summed; when every live worker (or the first        when version > k
           live - backup_workers of them) has pushed, the mean is
           applied once and v += 1. k < v: late, dropped, recorded
           in step k's report, never applied to another step.
async      at once, alone; staleness v - k recorded                    at once
ssp        at once, like async; the worker's clock c_w += 1            when c_w - min over
                                                                       live workers <= s
=========  ==========================================================  =====================

A sparse push (SPUSH, collectives/ps/_sparse.py) is checked and densified
before the handler takes the lock, then counts as a PUSH in every mode.

A worker that fails (its link breaks, it dies) is dropped from the live set
with a warning: a sync step then completes with the workers left. DONE is
a worker leaving normally. serve() returns when every worker has left.

Host groups (``groups``, from ``init(host_sum=True)``): a PUSH from a group's
first worker carries the sum of its group's gradients and counts as a
gradient of each of them (the step's mean divides by every contributor);
the group's other workers only pull and leave. Sync mode without backup
workers only (collectives/ps/__init__.py says why). A group's first worker
failing drops the whole group: its sums carried theirs.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import sys
import threading
import time
import warnings
from typing import Callable, Optional

import numpy as np

from . import _wire as W
from ._sparse import densify

MODES = ("sync", "async", "ssp")


@dataclasses.dataclass
class StepReport:
    """What one update of one shard applied.

    step: the shard's version before the update (the update makes version step + 1).
    shard: the server index.
    contributors: worker indices whose gradients were applied.
    staleness: for each contributor, step minus the version its gradient was computed on.
    dropped: workers whose gradient for this step arrived after it completed (sync with
        backup workers): discarded, never applied.
    ahead: ssp: for each contributor, how many steps it was ahead of the slowest live worker
        when its gradient arrived (never more than the staleness bound).
    time: seconds since serve() started.
    """

    step: int
    shard: int
    contributors: list
    staleness: list
    dropped: list = dataclasses.field(default_factory=list)
    ahead: list = dataclasses.field(default_factory=list)
    time: float = 0.0


class _Stop(Exception):
    pass


class Server:
    """One shard's parameters, optimizer and the rules of a mode (see the module doc).

    Args:
        links: {worker index: pair communicator}.
        layout: the parameter layout (collectives.ps.Layout).
        shard: this server's index.
        optimizer: collectives.ps.SGD or Adam (or anything with apply(p, g)).
        mode: "sync", "async" or "ssp".
        backup_workers: sync: each step applies the first num_workers - backup_workers gradients.
        staleness: ssp: how many steps a worker may run ahead of the slowest.
        on_step: called with each StepReport (under the shard's lock: keep it short).
        timeout: seconds a handler waits for its worker's next message (None: COLLECTIVES_TIMEOUT).
        keep_reports: how many of the latest StepReports to keep (a long job's memory stays
            bounded; on_step sees every one).
        groups: {first worker: every worker of its host}: that worker pushes the group's sum
            (sync mode without backup workers only).
    """

    def __init__(self, links: dict, layout: W.Layout, shard: int, optimizer, mode: str = "sync",
                 backup_workers: int = 0, staleness: int = 0,
                 on_step: Optional[Callable[[StepReport], None]] = None,
                 timeout: Optional[float] = None, keep_reports: int = 100_000,
                 groups: Optional[dict] = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        n = len(links)
        if not 0 <= backup_workers < n:
            raise ValueError(f"backup_workers={backup_workers} must be in [0, {n}) "
                             f"with {n} workers")
        if backup_workers and mode != "sync":
            raise ValueError("backup_workers applies to mode='sync' only")
        if staleness < 0:
            raise ValueError(f"staleness={staleness} must be >= 0")
        self.groups = {int(w): [int(x) for x in g] for w, g in (groups or {}).items()}
        if self.groups and (mode != "sync" or backup_workers):
            raise ValueError(f"host_sum sums a host's gradients before one push: mode='sync' "
                             f"without backup workers only, not mode={mode!r} with "
                             f"backup_workers={backup_workers} (a backup drops workers, a host "
                             f"sum ties them together; async and SSP apply each worker's own "
                             f"gradient)")
        self.pushes = collections.Counter()  # PUSH/SPUSH messages received per worker
        self.links, self.layout, self.shard = links, layout, shard
        self.optimizer, self.mode = optimizer, mode
        self.backup, self.staleness = int(backup_workers), int(staleness)
        self.on_step, self.timeout = on_step, timeout
        self.size = layout.shard_size(shard)
        self.params = np.zeros(self.size, dtype=np.float32)
        self.version = 0
        self.initialized = False
        self.cv = threading.Condition()
        self.live = set(links)
        self.dead: dict = {}  # worker -> error text
        self.clock = {w: 0 for w in links}
        self.acc = np.zeros(self.size, dtype=np.float32)
        self.contributors: list = []
        self.pending_ahead: list = []
        self.reports: collections.deque = collections.deque(maxlen=max(1, keep_reports))
        self.by_step: dict = {}
        self.stopping = False
        self.snapshot = self._snapshot()
        self.t0 = time.monotonic()

    # ---- parameters and checkpoints ------------------------------------------------
    def _snapshot(self) -> np.ndarray:
        """The PARAMS message of the current version (immutable once made: handlers send it
        outside the lock while the next update builds a new one)."""
        return W.message(W.PARAMS, self.version, self.shard, -1, self.layout.hash, self.params)

    def set_params(self, values: np.ndarray) -> None:
        """Start from these shard values (version 0) instead of waiting for worker 0's INIT."""
        with self.cv:
            self.params[:] = np.asarray(values, dtype=np.float32).reshape(-1)
            self.initialized = True
            self.snapshot = self._snapshot()
            self.cv.notify_all()

    def save(self, path: str) -> None:
        """Write this shard (values, version, optimizer state, layout) to path (.npz), making
        its directory if needed (checkpoint="ckpt/ps" in a fresh directory)."""
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with self.cv:
            state = {f"opt_{k}": v for k, v in self.optimizer.state().items()}
            np.savez(path, params=self.params, version=np.int64(self.version),
                     layout=np.int64(self.layout.hash), shard=np.int64(self.shard),
                     optimizer=np.array(getattr(self.optimizer, "name", "")), **state)

    def load(self, path: str) -> None:
        """Restore what save() wrote; ValueError if it belongs to another layout or shard."""
        with np.load(path) as z:
            if int(z["layout"]) != self.layout.hash or int(z["shard"]) != self.shard:
                raise ValueError(f"{path}: a checkpoint of shard {int(z['shard'])} of another "
                                 f"layout, not of shard {self.shard} of {self.layout}")
            if str(z["optimizer"]) != getattr(self.optimizer, "name", ""):
                raise ValueError(f"{path}: optimizer {str(z['optimizer'])!r}, this server runs "
                                 f"{getattr(self.optimizer, 'name', '')!r}")
            with self.cv:
                self.params[:] = z["params"]
                self.version = int(z["version"])
                self.optimizer.load_state({k[4:]: z[k] for k in z.files if k.startswith("opt_")})
                self.initialized = True
                self.snapshot = self._snapshot()

    # ---- the rules -------------------------------------------------------------------
    def _report(self, contributors, staleness, ahead=()) -> None:
        r = StepReport(self.version, self.shard, list(contributors), list(staleness),
                       ahead=list(ahead), time=time.monotonic() - self.t0)
        self.reports.append(r)
        self.by_step[r.step] = r
        if len(self.by_step) > self.reports.maxlen:
            del self.by_step[next(iter(self.by_step))]  # the oldest
        if self.on_step is not None:
            self.on_step(r)

    def _apply(self, g: np.ndarray) -> None:
        self.optimizer.apply(self.params, g)
        self.version += 1
        self.snapshot = self._snapshot()
        self.cv.notify_all()

    def _need(self) -> int:
        return max(1, len(self.live) - self.backup)

    def _maybe_complete(self) -> None:
        """sync: apply the step once enough live workers have pushed."""
        if self.mode == "sync" and self.contributors and len(self.contributors) >= self._need():
            k = len(self.contributors)
            g = self.acc / np.float32(k)
            self._report(sorted(self.contributors), [0] * k)
            self.contributors = []
            self._apply(g)

    def _slowest(self) -> int:
        return min((self.clock[w] for w in self.live), default=0)

    def _push(self, w: int, step: int, g: np.ndarray) -> None:
        """One gradient of worker w computed on version step; returns when its reply may go."""
        if self.mode == "sync":
            if step < self.version:  # late: its step is over
                if step in self.by_step:
                    self.by_step[step].dropped.append(w)
                return
            if self.contributors:
                self.acc += g
            else:
                self.acc[:] = g
            self.contributors.extend(self.groups.get(w, [w]))  # a group's sum counts for each
            self._maybe_complete()
            while self.version <= step:
                self._wait()
            return
        ahead = self.clock[w] - self._slowest()
        self._report([w], [self.version - step], [ahead] if self.mode == "ssp" else [])
        self._apply(g)
        self.clock[w] += 1
        if self.mode == "ssp":
            self.cv.notify_all()  # the slowest may have moved
            while self.clock[w] - self._slowest() > self.staleness:
                self._wait()

    def _wait(self) -> None:
        if self.stopping:
            raise _Stop()
        self.cv.wait(0.2)

    def _leave(self, w: int, error: Optional[str]) -> None:
        with self.cv:
            if w not in self.live:
                return
            self.live.discard(w)
            if error is not None:
                self.dead[w] = error
                for m in self.groups.get(w, [])[1:]:  # its sums carried theirs
                    if m in self.live:
                        self.live.discard(m)
                        self.dead[m] = f"its host's first worker {w} failed: {error}"
                warnings.warn(f"parameter server {self.shard}: worker {w} failed and is dropped "
                              f"from training ({error})", RuntimeWarning, stacklevel=2)
                print(f"collectives.ps: server {self.shard}: dropping worker {w}: {error}",
                      file=sys.stderr, flush=True)
            self._maybe_complete()
            self.cv.notify_all()

    # ---- one handler thread per worker ---------------------------------------------
    def _check(self, w: int, fields: tuple, nbytes_ok: Callable[[int, int], bool]) -> str:
        kind, step, shard, worker, nbytes, dtype, layout = fields
        if layout != self.layout.hash:
            return (f"layout {layout:#x} differs from the server's {self.layout.hash:#x} "
                    f"({self.layout}): every rank must declare the same parameter shapes")
        if shard != self.shard or worker != w:
            return f"a message for shard {shard} from worker {worker} reached shard " \
                   f"{self.shard} on worker {w}'s link"
        if dtype not in W.DTYPES:
            return f"unknown dtype code {dtype}"
        if not nbytes_ok(nbytes, dtype):
            return (f"{W.KIND_NAMES.get(kind, kind)} of {nbytes} bytes of {W.DTYPES[dtype]}: "
                    f"shard {self.shard} holds {self.size} elements")
        return ""

    def _handle(self, w: int) -> None:
        core = self.links[w]
        from .._core import p2p_recv, p2p_send

        # Room for a whole shard of 8-byte elements: a shard pushed as float64 (or other
        # wrong sizes up to that) gets an ERROR reply that says so. A larger message is
        # refused by the core, which ends this worker's link: only a hostile peer sends one.
        cap = W.HEADER_BYTES + 8 * self.size + W.ERROR_TEXT_BYTES
        buf = np.empty(cap, dtype=np.uint8)
        try:
            while True:
                _, tag, count = p2p_recv(core, buf, 1, -1, self.timeout)
                try:
                    fields = W.header(buf, count)
                    kind, step, _, _, nbytes, dtype, _ = fields
                    if kind != tag or kind not in (W.PUSH, W.SPUSH, W.INIT, W.PULL, W.DONE):
                        raise ValueError(f"message kind {kind} with tag {tag}")
                    payload_ok = (lambda n, d: n == self.size * DTYPES_SIZE[d]) \
                        if kind in (W.PUSH, W.INIT) else (lambda n, d: True) \
                        if kind == W.SPUSH else (lambda n, d: n == 0)
                    if kind == W.INIT and dtype != W.DTYPE_F32:
                        raise ValueError("INIT must carry float32 values")
                    problem = self._check(w, fields, payload_ok)
                    sparse = None
                    if not problem and kind == W.SPUSH:  # every index checked, nothing written
                        sparse = densify(buf[W.HEADER_BYTES:count], self.size, dtype)
                except ValueError as exc:
                    problem = str(exc)
                if problem:
                    p2p_send(core, W.error_message(f"parameter server {self.shard}: rejected "
                                                   f"from worker {w}: {problem}", self.shard,
                                                   self.layout.hash), 1, W.ERROR, self.timeout)
                    continue
                if kind == W.DONE:
                    self._leave(w, None)
                    return
                with self.cv:
                    if kind == W.INIT:
                        if w == 0 and not self.initialized:
                            self.params[:] = buf[W.HEADER_BYTES:count].view("<f4")
                            self.initialized = True
                            self.snapshot = self._snapshot()
                            self.cv.notify_all()
                        continue  # worker 0 pulls next; a loaded checkpoint wins over INIT
                    while not self.initialized and 0 in self.live:
                        self._wait()
                    if not self.initialized:
                        reply = W.error_message(
                            f"parameter server {self.shard}: worker 0 left before sending the "
                            f"initial parameters (Worker.start)", self.shard, self.layout.hash)
                    elif kind in (W.PUSH, W.SPUSH):
                        if step > self.version or step < 0 or (
                                self.mode == "sync" and w in self.contributors):
                            reply = W.error_message(
                                f"parameter server {self.shard}: worker {w} pushed a gradient "
                                f"of version {step} (again?), the shard is at {self.version}",
                                self.shard, self.layout.hash)
                        else:
                            g = sparse if sparse is not None else \
                                buf[W.HEADER_BYTES:count].view(W.DTYPES[dtype]).astype(np.float32)
                            self.pushes[w] += 1
                            self._push(w, step, g)
                            reply = self.snapshot
                    else:
                        reply = self.snapshot
                p2p_send(core, reply, 1, int(reply[:16].view("<i8")[1]), self.timeout)
        except _Stop:
            return
        except Exception as exc:  # the link broke: the worker died or hung past the timeout
            self._leave(w, str(exc))

    def serve(self) -> list:
        """Answer every worker until all have finished or failed; returns the StepReports
        (the latest keep_reports of them)."""
        self.stopping = False
        threads = [threading.Thread(target=self._handle, args=(w,), daemon=True,
                                    name=f"ps-server{self.shard}-worker{w}") for w in self.links]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        finally:
            self.stopping = True
        return list(self.reports)


DTYPES_SIZE = {code: dt.itemsize for code, dt in W.DTYPES.items()}
