"""Horovod's negotiation: operations matched across ranks by name, run in one agreed order.

Every ``collectives.torch`` operation (``*_async``, the blocking calls, grouped
ops, ``DistributedOptimizer``'s bucket launches, parameter and state
broadcasts, process-set registration) is queued here under a key (its
process set, its kind and its name; an unnamed op gets Horovod's
``<kind>.noname.<n>``, n counting this process's calls) and a description of
what must match across ranks. The thread holding the turn (see below: the
negotiating thread, or a thread waiting for its op), the only thread that issues
collectives on Horovod's links, runs *rounds*; each
round every rank says which keys it has queued, and every rank then runs the
keys that every rank (every member of the key's process set) has queued, in
the same order. So rank 0 may queue ``allgather_async(name="x")`` before a
barrier and rank 1 after it: the barrier runs first, then ``x``.

Links: none of this touches the world's links (``TorchContext`` makes a root
communicator of its own at init, ``rendezvous.links.own_links``; the rounds
and the operations' data run there). The user's thread may then call
MPI.COMM_WORLD, torch.distributed or JAX on the world at any time, in any
interleaving with the rounds. (The Negotiator takes the rounds' communicator
and the data's apart; a blocking round waits for the requests queued on its
communicator's progress thread, so separate ones would let rounds overlap the
data, at the cost of one more link set-up per init.)

A round (identical decisions on every rank; nothing is decided by one rank
alone except rank 0's stall expiries, which travel as records):

1. Step A, always: one allreduce (MIN over uint8) of a vector with one byte
   per response-cache entry (1: this rank has that key queued with that
   description, or is not a member of its set, or has joined and the entry is
   an allreduce it can serve with zeros) and three flags: "I announce nothing
   new" (so the MIN is a NOT-OR), "nothing queued here", "shutting down" (the
   MIN is an AND), then one byte per entry "not queued here" (the MIN: no rank
   holds it). A cached entry whose byte is 1 on every rank is ready; one some
   rank holds and that is not ready keeps the ranks cycling (pacing, below).
   A repeated step (the same names with the same shapes) therefore costs
   this one small allreduce per round: Horovod's bit-vector scheme.
2. Step B, only if some rank announces something: one allgather of a
   1 KiB slot per rank (length and JSON records; a second allgather for
   records that do not fit). Records: ``req`` (key, description, allreduce plan,
   set members) for a key not in the cache or cached with another
   description; ``evict`` (a cache entry every rank drops: a description
   changed, or a cached op has waited HIT_STALE_S, so that stall inspection
   sees it); ``expire`` (rank 0 only: an op waited past the stall deadline);
   ``tune`` (rank 0 only, HOROVOD_AUTOTUNE: the fusion threshold and cycle
   time from this round's ops on, on every rank; see _autotune).
   Every rank applies every rank's records in rank order to the same table
   of keys announced so far, so every rank holds the same table.
3. Judge the table: a key every (non-joined) member has announced is ready
   if all descriptions agree, else it fails on every rank with
   ``LayoutMismatch`` naming the key, two ranks and their descriptions (a
   rank whose call raised before queueing announced ``FAILED: <error>``, so
   the others fail naming it and its error). Ready keys enter the cache (the
   same slot on every rank: lowest free, else the least recently run).
4. Run the ready ops on this thread: cached ones in slot order, then the
   table's in announcement order. An op's job does its data movement (an
   allreduce only queues on the core's progress thread).

Rounds are paced so that no thread spins: a rank with something new starts
the next round ``HOROVOD_CYCLE_TIME`` after the previous one started (new
ops in between are agreed and run together, as Horovod's cycle; a rank idle
since longer than that starts one at once); with nothing new but ops still
queued on some rank after the last round (this one's, or one another rank
holds that the round did not run) and no progress for t seconds it waits
min(max(cycle, t/4), IDLE_S); with nothing left anywhere it waits IDLE_S (or
until a local op is queued), so a step whose ops all ran leaves no round
behind it that would wait for the step's data and delay the next step's. Between
rounds the thread sleeps on a condition variable; a rank waiting in a round
for a slower rank blocks in poll() inside the collective (after the core's
short spin), which every rank joins within IDLE_S. So idle ranks run ten
small rounds a second, and a stalled op costs a few rounds a second.

Who runs a round: one thread at a time holds the turn. A thread that waits for
one of its ops (``Job.wait``: every blocking call, ``synchronize``) runs rounds
itself, back to back, until its op is done, and the negotiating thread leaves
the rounds to it meanwhile: a waiting thread adds no ops to fuse, so the cycle
would only delay its op, and a round run in the caller saves two hand-offs
between threads. A blocking call's op is left to its caller for
CALLER_GRACE_S. The negotiating thread runs the rounds nobody waits for (the
async ops of a backward pass, idle rounds), paced as above.

``join()`` is the key ``join``: a rank that announced it serves every
allreduce the others agree on with zeros (from the plan in its record), and
other ops fail on the ranks that called them; ``join`` is ready once every
rank has announced it and returns the rank that joined last.

Stall inspection: rank 0 warns (the ``collectives.torch`` logger) about keys
some ranks announced and others not for ``HOROVOD_STALL_CHECK_TIME_SECONDS``,
naming the key and the missing ranks; after
``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` (default: the collective timeout) the
op fails with ``StalledOperation`` on the ranks that queued it: one op at a
time, the oldest first (of ops announced in one round, barriers and ``join``
last: there ranks that diverged meet again), at most one per EXPIRY_GAP_S, so that ranks whose op
failed can reach the op the others are waiting in before that one expires
(a test that failed on one rank only, then every rank's teardown barrier).
"""
from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Optional

import numpy as np

from ._autotune import TUNE, apply_record
from .exceptions import LayoutMismatch

__all__ = ["Negotiator", "StalledOperation", "FAILED", "JOIN"]

log = logging.getLogger("collectives.torch")

IDLE_S = 0.1  # the longest a rank sits out of rounds: bounds a peer's wait inside one
HIT_STALE_S = 1.0
# A blocking call's thread runs the round for its op itself (Negotiator.waiting); the
# negotiating thread runs it instead only once the caller has not come for this long.
CALLER_GRACE_S = 0.05
EXPIRY_GAP_S = 5.0  # at most one stalled op expires per this many seconds  # a cached op queued this long is evicted, so stall inspection sees it
MAX_RECORDS = 64 << 20  # bytes of records one rank may announce in a round (a bound)
# An allreduce this large runs alone, in place, even where it could be fused: fusing copies
# it into the fusion buffer and out again, which on a CPU costs more than the one call's
# latency that fusion saves from about this size up (bench/README.md, "Negotiation by name").
FUSE_ALONE_BYTES = 256 << 10
RECORD_SLOT = 1024  # bytes per rank in step B's first allgather (most rounds need no second)
FAILED = "FAILED: "  # a description announcing that the call raised before queueing
JOIN = "join"
_FLAGS = 3  # after the cache bytes: not announcing, nothing queued, shutting down


_UNKNOWN = object()
_SCALES = re.compile(r"^allreduce shape=\S.* op=(\w+) prescale=(\S+) postscale=(\S+) "
                     r"device=cpu$")


_FUSABLE: dict = {}  # (plan, desc) -> _fusable's answer: a step repeats the same ops


def _fusable(plan: int, desc: str, members: Optional[tuple]) -> Optional[tuple]:
    """(dtype and op bits, prescale, postscale, bytes) of a world CPU allreduce that may
    run fused, from what every rank holds alike; None otherwise."""
    if not plan or members is not None:
        return None
    known = _FUSABLE.get((plan, desc), _UNKNOWN)
    if known is not _UNKNOWN:
        return known
    m = _SCALES.match(desc)
    spec = None
    if m is not None and m.group(1) != "Adasum":
        count = (plan >> 12) & ((1 << 48) - 1)
        width = {0: 1, 1: 1, 2: 4, 3: 8, 4: 2, 5: 2, 6: 4, 7: 8}.get((plan >> 4) & 0xFF, 8)
        spec = (plan & 0xFFF, float(m.group(2)), float(m.group(3)), count * width)
    if len(_FUSABLE) >= 4096:
        _FUSABLE.clear()
    _FUSABLE[(plan, desc)] = spec
    return spec


class StalledOperation(RuntimeError):
    """An operation some ranks queued and others did not within the stall deadline
    (``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``, default the collective timeout)."""


class _Cached:
    """One response-cache entry (the same on every rank)."""

    __slots__ = ("key", "desc", "plan", "members", "used")

    def __init__(self, key: str, desc: str, plan: int, members: Optional[tuple], used: int
                 ) -> None:
        self.key, self.desc, self.plan, self.members, self.used = key, desc, plan, members, used


class Cache:
    """Horovod's response cache: agreed descriptions by key, each with a fixed slot (its
    byte in step A). Changed only while applying agreed outcomes, so identical on every
    rank."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.slots: list = []  # slot -> _Cached or None
        self.index: dict = {}  # key -> slot
        self.version = 0  # changes with every insert and evict

    def lookup(self, key: str) -> Optional[int]:
        """The slot of `key`, or None."""
        return self.index.get(key)

    def evict(self, slot: int) -> bool:
        """Drop the entry in `slot` (False if there is none)."""
        if not 0 <= slot < len(self.slots) or self.slots[slot] is None:
            return False
        del self.index[self.slots[slot].key]
        self.slots[slot] = None
        self.version += 1
        return True

    def insert(self, entry: _Cached) -> list:
        """Cache `entry`; return the slots evicted to make room."""
        if self.capacity <= 0:
            return []
        evicted = []
        free = [i for i, e in enumerate(self.slots) if e is None]
        if free:
            slot = free[0]
        elif len(self.slots) < self.capacity:
            slot = len(self.slots)
            self.slots.append(None)
        else:
            slot = min(range(len(self.slots)), key=lambda i: self.slots[i].used)
            self.evict(slot)
            evicted.append(slot)
        self.slots[slot] = entry
        self.index[entry.key] = slot
        self.version += 1
        return evicted


class _Asked:
    """A key in the table: what each rank that announced it described."""

    def __init__(self, members: Optional[tuple], plan: int, since: float) -> None:
        self.members = members
        self.plan = plan
        self.since = since
        self.descs: dict = {}
        self.warned = since


class Negotiator:
    """The queue of operations of one world and the thread that agrees and runs them.

    Args:
        core: the communicator the rounds travel on: links of their own, used by nothing
            else, so a round never waits behind data queued on ``data`` (see _context).
        rank, size: this rank and the world's size.
        cycle_s: HOROVOD_CYCLE_TIME in seconds.
        capacity: response-cache entries.
        stall_warn_s, stall_expire_s: stall inspection (0: no warning).
        serve: serve(plan) runs an allreduce plan with zeros (a joined rank).
    """

    def __init__(self, core: Any, rank: int, size: int, cycle_s: float, capacity: int,
                 stall_warn_s: float, stall_expire_s: float,
                 serve: Callable[[int], None], data: Any = None) -> None:
        self.core, self.rank, self.size = core, rank, size
        self.data = data if data is not None else core  # where fused allreduces run
        self.cycle_s = cycle_s
        self.cache = Cache(capacity)
        self.stall_warn_s, self.stall_expire_s = stall_warn_s, stall_expire_s
        self._serve = serve
        self._cv = threading.Condition()
        self._new: deque = deque()  # queued, not yet seen by the thread
        self._inflight: dict = {}  # key -> Job: for the duplicate-name check
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        self._abandon = False  # stop() gave up waiting for every rank: leave now
        self._error: Optional[BaseException] = None
        self._closed = False
        self._handles: dict = {}  # process set id -> calls made on it
        self.timeline: Any = None
        # the thread's own state
        self._queue: list = []  # this rank's queued jobs, in queueing order
        self._last_start = 0.0
        self._last_progress = time.monotonic()
        self._busy_any = False
        self._waiters = 0  # threads waiting for an op queued here (Job.wait)
        self._turn: Optional[int] = None  # the ident of the thread running a round now
        # threads in an untimed wait on _cv (for the turn, or the negotiating thread while
        # others wait): only they need a notify when the turn or _waiters changes; a notify
        # nobody needs wakes the negotiating thread for nothing, twice per blocking call,
        # and that hand-off of the GIL costs more than a small call on a busy host
        self._sleepers = 0
        self._over = False  # no more rounds: every rank stopped, or the negotiation failed
        # a context manager a waiting thread runs its rounds in (the negotiating thread's
        # thread-local state: see _context._lane_state); None: none needed
        self.turn_state: Optional[Callable[[], Any]] = None
        # replicated state: the same on every rank after every round
        self.table: "OrderedDict[str, _Asked]" = OrderedDict()
        self.joined: dict = {}  # rank -> (round, rank) of its join
        self._round = 0
        self._stamp = 0
        self._join_counts: list = []
        self._last_expiry = 0.0
        # rounds, those with records, ops run; seconds in step A (the bit-vector allreduce,
        # queueing behind data included) and in step B (bench/bench_negotiate.py prints them)
        self.stats = {"rounds": 0, "full_rounds": 0, "ran": 0, "a_s": 0.0, "b_s": 0.0}
        self.fuse: Optional[Callable] = None  # fuse(core, parts): see _fusion (set at init)
        self.fusion_bytes = 0
        self.fuse_alone_bytes = FUSE_ALONE_BYTES
        self.tuner: Any = None  # rank 0's _autotune.Autotuner under HOROVOD_AUTOTUNE=1
        self.tuned: list = []  # (round, fusion bytes, cycle ms, tuning) as rank 0's records set
        self._not_mine_for: Any = None  # see _not_mine
        self._not_mine_slots: list = []

    # -- the caller's side --------------------------------------------------------
    def next_handle(self, process_set: int = 0) -> int:
        """The next call number (Horovod's handle counter), one counter per process set:
        the members of a set make the same calls on it, whatever else each rank does."""
        with self._cv:
            self._handles[process_set] = self._handles.get(process_set, 0) + 1
            return self._handles[process_set]

    def release_handle(self, n: int, process_set: int = 0) -> None:
        """Give back number n if no number was taken since (a call refused as a duplicate)."""
        with self._cv:
            if self._handles.get(process_set) == n:
                self._handles[process_set] = n - 1

    def on_lane(self) -> bool:
        """True on the thread running a round (ops called from a running op run at once)."""
        return threading.get_ident() == self._turn

    def submit(self, job: Any) -> Any:
        """Queue `job` under job.key; ValueError if an op with that key is still in flight
        on this rank (Horovod's duplicate-name error). A job queued from the negotiating
        thread (an op inside an op) runs at once; so does every job in a 1-rank world."""
        if self.size == 1 or self.on_lane():
            job.run()
            return job
        with self._cv:
            if self._error is not None:
                raise RuntimeError(f"collectives.torch: the negotiation failed earlier: "
                                   f"{self._error}") from self._error
            if self._closed or self._stopping or self._over:
                raise ValueError("collectives.torch has been shut down; call hvd.init()")
            held = self._inflight.get(job.key)
            if held is not None and not held.poll():
                err = ValueError(f"{job.key}: an operation with this name is already in "
                                 "flight on this rank; Horovod rejects a second one (synchronize "
                                 "the first, or use another name)")
                err.duplicate_name = True  # type: ignore[attr-defined]
                raise err
            if job.fn is not None:
                self._inflight[job.key] = job
                if len(self._inflight) > 4096:
                    for k in [k for k, h in self._inflight.items() if h.poll()]:
                        del self._inflight[k]
            job.since = time.monotonic()
            job.timeline, job.queued = self.timeline, time.perf_counter_ns()
            job.lane = self
            self._new.append(job)
            self._start()
            if not job.blocking:
                # (a blocking job's caller runs its round: the negotiating thread needs no
                # wake-up for it, and takes it at its next pacing if the caller never comes)
                self._cv.notify_all()
        return job

    def waiting(self, done: Any) -> None:
        """Wait until `done` (an event: a job queued here completes), running rounds in this thread
        meanwhile, back to back: the cycle only gathers more ops to fuse, and a thread that
        waits adds none, so waiting it out would only delay the op (1 ms a blocking call);
        and a round run here saves two hand-offs between threads (to the negotiating thread
        and back), which cost more than the round on a busy host. The negotiating thread
        leaves the rounds to waiting threads, one round at a time."""
        with self._cv:
            self._waiters += 1  # (the negotiating thread sees it when it next wakes)
        try:
            while not done.is_set():
                with self._cv:
                    while self._turn is not None and not done.is_set():
                        self._sleep()
                    if done.is_set() or self._over or self._thread is None:
                        break
                    self._turn = threading.get_ident()
                if self.turn_state is None:
                    self._take_turn()
                else:
                    with self.turn_state():
                        self._take_turn()
        finally:
            with self._cv:
                self._waiters -= 1
                if self._sleepers:
                    self._cv.notify_all()  # the negotiating thread paces the rounds again
        done.wait()  # set by now, unless the negotiation ended (then _fail_all sets it)

    def drain(self) -> None:
        """Kept for callers of the old lane: nothing to wait for (ops run when agreed)."""

    def stop(self, timeout: float) -> bool:
        """Shut down with every rank: rounds go on until every rank is stopping (ops agreed
        meanwhile still run), then the thread ends and ops still queued fail. After
        `timeout` seconds without every rank stopping, this rank leaves at the end of its
        current round (the others' next round then fails: a rank left). True once the
        thread has ended (only then may the communicator be closed under it)."""
        with self._cv:
            if self._closed:
                return True
            self._stopping = True
            if self.size > 1 and self._error is None:
                self._start()
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("collectives.torch: rank %d: not every rank called shutdown() "
                            "within %.0f s; leaving", self.rank, timeout)
                return self.abandon(timeout)  # a round is bounded by the collective timeout
        with self._cv:
            self._closed = True
        return thread is None or not thread.is_alive()

    def abandon(self, timeout: float) -> bool:
        """Leave without the other ranks (this process is finalizing): the thread ends after
        its current round; ops still queued fail. True once it has ended (within timeout)."""
        with self._cv:
            self._abandon = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._cv:
            self._closed = True
        return thread is None or not thread.is_alive()

    def start(self) -> None:
        """Start the negotiating thread (at init, on every rank: rounds need every rank)."""
        with self._cv:
            self._start()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="collectives-torch-lane",
                                            daemon=True)
            self._thread.start()

    # -- the thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                if not self._pace():
                    break
                self._turn = threading.get_ident()
            self._take_turn()

    def _take_turn(self) -> None:
        """Run one round in this thread, which holds the turn (self._turn); give it back.
        The negotiation ends once every rank stops, this rank abandons it, or a round fails:
        every queued op then fails (with the round's error)."""
        over = False
        try:
            over = self._abandon or self._round_once()
        except BaseException as e:  # noqa: BLE001 -- every queued op gets it
            with self._cv:
                self._error = e
            log.warning("collectives.torch: negotiation stopped on rank %d: %s", self.rank, e)
            over = True
        finally:
            if over:
                with self._cv:
                    self._over = True
                self._fail_all()
            with self._cv:
                self._turn = None
                if self._sleepers:
                    self._cv.notify_all()

    def _sleep(self) -> None:
        """(Holding self._cv) wait untimed for a notify (see _sleepers)."""
        self._sleepers += 1
        try:
            self._cv.wait()
        finally:
            self._sleepers -= 1

    def _fail_all(self) -> None:
        with self._cv:
            jobs = self._queue + list(self._new)
            self._queue, self._new = [], deque()
            err = self._error
        for job in jobs:
            if err is not None:
                job.fail(err)
            else:
                job.fail(RuntimeError(f"collectives.torch was shut down before {job.key!r} ran "
                                      "(not every rank queued it)"))

    def _pace(self) -> bool:
        """(Holding self._cv) wait for the negotiating thread's turn to start a round (see
        the module docstring); False once the negotiation is over."""
        while not self._over:
            if self._turn is not None:
                self._sleep()  # a waiting thread runs a round
                continue
            if self._abandon:
                return True  # the turn ends it
            if self._waiters:
                self._sleep()  # waiting threads run the rounds
                continue
            now = time.monotonic()
            if self._new or (self._stopping and not self._queue) or \
                    any(not j.announced for j in self._queue):
                wait = self.cycle_s
            elif self._queue or self._stopping or self._busy_any:
                wait = min(max(self.cycle_s, (now - self._last_progress) / 4), IDLE_S)
            else:
                wait = IDLE_S
            target = self._last_start + wait
            if self._new and not self._stopping and all(j.blocking for j in self._new):
                # their callers are about to wait, and run the round themselves (waiting());
                # this thread takes it only if one of them does not come
                target = max(target, self._new[-1].since + CALLER_GRACE_S)
            if now >= target:
                return True
            self._cv.wait(target - now)
        return False

    def _round_once(self) -> bool:
        """One round; True once every rank is shutting down."""
        self._last_start = now = time.monotonic()
        with self._cv:
            self._queue.extend(self._new)
            self._new.clear()
            stopping = self._stopping
        records = self._announcements(now)
        if self.tuner is not None:  # (rank 0: the next point travels as a record)
            records += self.tuner.records()
        width = len(self.cache.slots)
        # [the cache bytes, the flags, "not queued here" per cache entry]: the MIN gives
        # the entries every rank holds, and (in the last part) the ones no rank holds
        vec = np.zeros(2 * width + _FLAGS, dtype=np.uint8)
        vec[width + _FLAGS:] = 1
        for job in self._queue:
            if job.slot is not None:
                vec[job.slot] = 1
                vec[width + _FLAGS + job.slot] = 0
        vec[self._not_mine()] = 1
        vec[width] = 0 if records else 1
        vec[width + 1] = 0 if self._queue else 1
        vec[width + 2] = 1 if stopping else 0
        t0 = time.perf_counter()
        self.core.allreduce(None, vec, op="min")
        self.stats["a_s"] += time.perf_counter() - t0
        self._round += 1
        self.stats["rounds"] += 1
        ready = [s for s in np.flatnonzero(vec[:width]).tolist()
                 if self.cache.slots[s] is not None and
                 self._has_live_member(self.cache.slots[s].members)]
        # the cached ones first (slot order), then the table's (announcement order)
        plan = [(self.cache.slots[s].key, self.cache.slots[s].plan, None,
                 self.cache.slots[s].desc, self.cache.slots[s].members) for s in ready]
        agreed = time.perf_counter_ns()
        outcomes: list = []
        if not vec[width]:
            self.stats["full_rounds"] += 1
            t0 = time.perf_counter()
            self._apply(self._exchange(records), now)
            self.stats["b_s"] += time.perf_counter() - t0
            outcomes = self._judge()
        for key, asked, error in outcomes:
            if error is None and key != JOIN:
                entry = _Cached(key, asked.descs[min(asked.descs)], asked.plan, asked.members, 0)
                for slot in self.cache.insert(entry):
                    self._unslot(slot)
            plan.append((key, asked.plan, error, asked.descs[min(asked.descs)] if asked.descs
                         else "", asked.members))
        for job in self._queue:
            if job.agreed == 0:
                job.agreed = agreed  # (the timeline's NEGOTIATE ends; not-ready ones reset)
        self._execute(plan)
        if self.tuner is not None:
            self.tuner.observe(plan, time.monotonic())
        for job in self._queue:
            job.agreed = 0
        # another round soon (cycle pace) only while an op is still queued somewhere: a
        # cached one some rank holds and this round did not run, or an announced one not yet
        # decided; a step whose ops all ran leaves every rank idle-paced, so that its next
        # step's first ops start a round at once instead of meeting a round that waits
        # behind this step's data (bench/README.md, "Negotiation by name")
        ran = set(ready)  # (a set: a step may cache thousands of ops)
        self._busy_any = not vec[width + 1] and (bool(self.table) or any(
            s not in ran for s in np.flatnonzero(vec[width + _FLAGS:] == 0).tolist()))
        if plan or not vec[width]:
            self._last_progress = now
        return bool(vec[width + 2])

    def _not_mine(self) -> list:
        """The cache slots this rank sets in step A whatever it queued: entries of process
        sets it is not in, and (once joined) the allreduces it serves with zeros. Kept
        while the cache and the joined state stay as they were (a round's hot loop)."""
        state = (self.cache.version, self.rank in self.joined)
        if self._not_mine_for != state:
            joined = state[1]
            self._not_mine_slots = [
                slot for slot, e in enumerate(self.cache.slots)
                if e is not None and ((e.members is not None and self.rank not in e.members) or
                                      (joined and e.plan))]
            self._not_mine_for = state
        return self._not_mine_slots

    def _execute(self, plan: list) -> None:
        """Run the decided ops in order; runs of fusable allreduces as one (see _fusion)."""
        group: list = []
        for key, aplan, error, desc, members in plan:
            spec = None if (error is not None or self.fuse is None) else \
                _fusable(aplan, desc, members)
            if spec is not None and spec[3] > self.fuse_alone_bytes:
                # alone and in place; the group goes on past it (allreduces of other
                # tensors: every rank runs the same order, the results do not depend on it)
                self._finish(key, aplan, error)
                continue
            if group and (spec is None or spec[:3] != group[0][5][:3] or
                          sum(g[5][3] for g in group) + spec[3] > self.fusion_bytes):
                self._flush(group)
                group = []
            if spec is None:
                self._finish(key, aplan, error)
            else:
                group.append((key, aplan, error, desc, members, spec))
        self._flush(group)

    def _flush(self, group: list) -> None:
        """Run one group of fusable allreduces: alone if one, else fused."""
        if len(group) == 1:
            self._finish(*group[0][:3])
            return
        if not group:
            return
        parts = []
        for key, aplan, _, _, _, spec in group:
            job = self._take(key)
            if job is not None and job.fuse is None:  # every rank groups alike: cannot be
                raise RuntimeError(f"negotiation: {key!r} was agreed as a fusable allreduce "
                                   "but this rank queued another kind of op under it")
            if job is None and self.rank not in self.joined:
                continue  # (an op this rank never queued cannot be ready: defensive)
            self._stamp += 1
            slot = self.cache.lookup(key)
            if slot is not None:
                self.cache.slots[slot].used = self._stamp
            parts.append((job, aplan, spec[1], spec[2]))
            if job is not None:
                self.stats["ran"] += 1
        if parts:
            self.stats["fused"] = self.stats.get("fused", 0) + 1
            self.fuse(self.data, parts)

    def _take(self, key: str) -> Any:
        for i, j in enumerate(self._queue):
            if j.key == key:
                return self._queue.pop(i)
        return None

    def _has_live_member(self, members: Optional[tuple]) -> bool:
        ranks = members if members is not None else range(self.size)
        return any(r not in self.joined for r in ranks)

    def _announcements(self, now: float) -> list:
        """This rank's records for this round (and the cache slots of its cached ops)."""
        records: list = []
        for job in self._queue:
            if job.announced:
                if job.slot is not None and not job.evicting:
                    entry = self.cache.slots[job.slot]
                    if now - job.since > HIT_STALE_S or (self.joined and not entry.plan):
                        records.append(["evict", job.slot])
                        job.evicting = True
                continue
            slot = None if self.joined else self.cache.lookup(job.key)
            if slot is not None:
                if self.cache.slots[slot].desc == job.desc:
                    job.slot, job.announced = slot, True
                    continue
                records.append(["evict", slot])
            records.append(["req", job.key, job.desc, job.plan,
                            list(job.members) if job.members is not None else None])
            job.announced = True
        if self.rank == 0:
            stalled = [key for key, asked in self.table.items()
                       if self._inspect(key, asked, now)]
            # one expiry at a time, the oldest first, then a pause: the ranks whose op failed
            # can reach the op the others wait in (e.g. a test's teardown barrier) before
            # that one expires too
            if stalled and now - self._last_expiry >= min(EXPIRY_GAP_S, self.stall_expire_s):
                # among ops announced in the same round, a barrier (or join) goes last:
                # there ranks that diverged meet again
                oldest = min(stalled, key=lambda k: (self.table[k].since, k == JOIN or
                                                     k.endswith("barrier.barrier")))
                records.append(["expire", oldest])
                self._last_expiry = now
        return records

    def _inspect(self, key: str, asked: _Asked, now: float) -> bool:
        """Rank 0's stall inspection of one announced key: warn; True once it is due to
        expire."""
        age = now - asked.since
        members = asked.members if asked.members is not None else range(self.size)
        missing = [r for r in members if r not in asked.descs and
                   not (r in self.joined and asked.plan)]
        if not missing:
            return False
        if self.stall_warn_s and now - asked.warned >= self.stall_warn_s:
            asked.warned = now
            log.warning("collectives.torch: %r has been queued by rank(s) %s and not by rank(s) "
                        "%s for %.0f s (stalled: a rank that never calls it, or calls it under "
                        "another name)", key, sorted(asked.descs), missing, age)
        return age >= self.stall_expire_s

    def _exchange(self, records: list) -> list:
        """Every rank's records (step B): one allgather of RECORD_SLOT bytes per rank (the
        length, then the JSON text), and a second one for what did not fit."""
        blob = json.dumps(records).encode()
        slot = np.zeros(RECORD_SLOT, dtype=np.uint8)
        slot[:8] = np.frombuffer(np.int64(len(blob)).tobytes(), dtype=np.uint8)
        head = min(len(blob), RECORD_SLOT - 8)
        slot[8:8 + head] = np.frombuffer(blob[:head], dtype=np.uint8)
        slots = np.empty(self.size * RECORD_SLOT, dtype=np.uint8)
        self.core.allgatherv(slot, slots, [RECORD_SLOT] * self.size)
        slots = slots.reshape(self.size, RECORD_SLOT)
        lens = [int(np.frombuffer(slots[r, :8].tobytes(), dtype=np.int64)[0])
                for r in range(self.size)]
        if min(lens) < 2 or max(lens) > MAX_RECORDS:  # from peers: bounded before use
            raise LayoutMismatch(f"negotiation: a rank announced {lens} bytes of records")
        rest = [max(0, n - (RECORD_SLOT - 8)) for n in lens]
        more = np.empty(sum(rest), dtype=np.uint8)
        if sum(rest):
            tail = np.frombuffer(blob[head:], dtype=np.uint8)
            self.core.allgatherv(tail if tail.size else np.empty(0, dtype=np.uint8), more, rest)
        texts, pos = [], 0
        for r, n in enumerate(lens):
            text = bytes(slots[r, 8:8 + min(n, RECORD_SLOT - 8)]) + bytes(more[pos:pos + rest[r]])
            pos += rest[r]
            texts.append(json.loads(text.decode()))
        return texts

    def _apply(self, per_rank: list, now: float) -> None:
        """Apply every rank's records, in rank order, to the table and the cache."""
        for r, records in enumerate(per_rank):
            for rec in records:
                if not isinstance(rec, list) or not rec:
                    raise LayoutMismatch(f"negotiation: rank {r} sent a malformed record")
                if rec[0] == "evict" and self.cache.evict(int(rec[1])):
                    self._unslot(int(rec[1]))
                elif rec[0] == "req":
                    key, desc, plan, members = rec[1], rec[2], int(rec[3]), rec[4]
                    asked = self.table.get(key)
                    if asked is None:
                        asked = self.table[key] = _Asked(
                            tuple(members) if members is not None else None, plan, now)
                    asked.descs[r] = str(desc)
                    if key == JOIN:
                        self.joined.setdefault(r, (self._round, r))
                elif rec[0] == "expire" and r == 0:
                    asked = self.table.pop(rec[1], None)
                    if asked is not None:
                        self._expire(rec[1], asked)
                elif rec[0] == TUNE and r == 0:  # before this round's ops run (_autotune)
                    apply_record(self, rec, self._round, now)

    def _expire(self, key: str, asked: _Asked) -> None:
        members = asked.members if asked.members is not None else range(self.size)
        missing = [m for m in members if m not in asked.descs]
        self._finish(key, 0, StalledOperation(
            f"{key!r} was queued by rank(s) {sorted(asked.descs)} but not by rank(s) {missing} "
            f"within {self.stall_expire_s:g} s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, default "
            "the collective timeout), so it fails on the ranks that queued it"))

    def _unslot(self, slot: int) -> None:
        """A cache slot was dropped: this rank's ops queued under it are announced again."""
        for job in self._queue:
            if job.slot == slot:
                job.slot, job.announced, job.evicting = None, False, False

    def _judge(self) -> list:
        """(key, asked, error or None) for every table key now decided, in table order."""
        out = []
        for key, asked in list(self.table.items()):
            if key == JOIN:
                if len(asked.descs) == self.size:
                    del self.table[key]
                    self._join_counts = [int(d.split()[-1]) if d.split()[-1].isdigit() else 0
                                         for d in asked.descs.values()]
                    out.append((key, asked, None))
                continue
            members = asked.members if asked.members is not None else range(self.size)
            if any(m not in asked.descs and m not in self.joined for m in members):
                continue
            del self.table[key]
            out.append((key, asked, self._verdict(key, asked, members)))
        return out

    def _verdict(self, key: str, asked: _Asked, members: Any) -> Optional[BaseException]:
        descs = asked.descs
        ranks = sorted(descs)
        failed = [r for r in ranks if descs[r].startswith(FAILED)]
        if failed and len(failed) < len(ranks):
            k = failed[0]
            return LayoutMismatch(f"rank {k} raised before the collective, so no rank ran "
                                  f"{key!r} ({descs[k][len(FAILED):]})")
        ref = ranks[0]
        differ = [r for r in ranks if descs[r] != descs[ref]]
        if differ:
            k = differ[0]
            more = f" (ranks {', '.join(map(str, differ))} differ from rank {ref})" \
                if len(differ) > 1 else ""
            return LayoutMismatch(f"ranks passed different arguments to {key!r}, so no rank ran "
                                  f"it: rank {ref} has {descs[ref]}; rank {k} has {descs[k]}"
                                  + more)
        joined = [m for m in members if m not in descs]
        if joined and not asked.plan:
            return LayoutMismatch(
                f"rank{'s' if len(joined) > 1 else ''} {', '.join(map(str, joined))} called "
                f"join(), and joined ranks serve only allreduce (with zeros), so no rank ran "
                f"{key!r}")
        if failed:  # every rank raised the same way: nothing to run, nothing to say
            return LayoutMismatch(f"every rank raised before the collective {key!r}")
        return None

    def _finish(self, key: str, plan: int, error: Optional[BaseException]) -> None:
        """Run (or fail) this rank's op `key`; serve it with zeros if this rank has joined."""
        job = None
        for i, j in enumerate(self._queue):
            if j.key == key:
                job = self._queue.pop(i)
                break
        if error is not None:
            if job is not None:
                job.fail(error)
            return
        self._stamp += 1
        slot = self.cache.lookup(key)
        if slot is not None:
            self.cache.slots[slot].used = self._stamp
        if key == JOIN:
            last = max(self.joined.items(), key=lambda kv: kv[1])[0] if self.joined else 0
            self.joined = {}
            with self._cv:  # every rank's call count becomes the largest (see _join)
                self._handles[0] = max([self._handles.get(0, 0)] + self._join_counts)
            if job is not None:
                job.result(last)
            return
        if job is not None:
            self.stats["ran"] += 1
            job.run()
        elif self.rank in self.joined and plan:
            self._serve(plan)
