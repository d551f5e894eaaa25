"""Cluster faults for multi-host tests and the fault bench (issue 37, section 1).

A trial runs a world of H hosts x L ranks in network namespaces (tests/_netns.py)
whose ranks stream verified collectives (STREAM_BODY) while this process
injects one fault at a seeded random moment:

    kill       SIGKILL every rank of one host at once
    down       take the host's link down (the switch side) and keep it down
    blip       take it down, and up again after ``blip_s`` (less than the timeout)
    crawl      throttle the host's link to 1 Mbit/s (tc tbf) mid-collective
    partition  move some hosts to a second bridge: two groups that cannot meet
    stop       SIGSTOP every rank of one host for longer than the timeout

The ranks report through records: ``raised`` (wall time, message) when a
collective fails, ``wrong`` for a result that differs from its closed form,
``completed`` when the stream ends without an error. ``summarize`` turns a trial
into the figures of the README's table: raised, named right (the message
names every rank of the lost host and its hostname), hung, wrong, time to
error after the fault.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import List, Optional

from _netns import Cluster
from conftest import free_port, run_world

FAULTS = ("kill", "down", "blip", "crawl", "partition", "stop")

# Every rank streams allreduces of random sizes (8 B to 16 MiB) and algorithms
# (flat and two-level), checks each against its closed form, and
# every 8 steps asks rank 0 whether the test wants the stream to end (a flag allreduced with
# MAX, so every rank stops at the same step). A failure is reported and, with
# "shrink", the survivors re-form without the lost ranks and finish the
# training from the last commit in the smaller world.
STREAM_BODY = r"""
import random
import collectives
from collectives import MPI
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
hosts = [int(h) for h in sys.argv[1].split(",")]
seed, mode, lost_host = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
WORLD = os.environ["WORLD_DIR"]
rng = random.Random(seed)  # the same draws on every rank
SIZES = [2, 1000, 65_536, 1 << 20, 4 << 20]
ALGS = ["auto", "two_level", "ring", "butterfly", "tree"]
STEPS_AFTER = 6
state, committed = 0.0, (0, 0.0)
x = np.ones(1 << 16, np.float32)
comm.Allreduce(MPI.IN_PLACE, x)  # every link up before the fault
open(os.path.join(WORLD, f"pid{r}"), "w").write(str(os.getpid()))
arrive(f"ready{r}")
step, call_start = 0, time.monotonic()


def train_step(c, step):
    g = np.full(64, float(c.rank + step), np.float64)
    c.Allreduce(MPI.IN_PLACE, g)
    return g[0] / c.size


try:
    while True:
        count = SIZES[rng.randrange(len(SIZES))]
        alg = ALGS[rng.randrange(len(ALGS))]
        mult = step % 7 + 1
        buf = np.full(count, float((r + 1) * mult), np.float32)
        call_start = time.monotonic()
        comm.Allreduce(MPI.IN_PLACE, buf, algorithm=alg)
        want = float(mult * n * (n + 1) // 2)
        if not (buf == want).all():
            bad = int(np.flatnonzero(buf != want)[0])
            emit("wrong", step=step, count=count, alg=alg, index=bad, got=float(buf[bad]),
                 want=want)
        call_start = time.monotonic()
        state += train_step(comm, step)
        step += 1
        if step % 3 == 0:
            committed = (step, state)
        if step % 8 == 0:  # the same steps on every rank
            call_start = time.monotonic()
            flag = np.array([os.path.exists(os.path.join(WORLD, "stop")) and r == 0], np.int32)
            comm.Allreduce(MPI.IN_PLACE, flag, op=MPI.MAX)
            if flag[0]:
                break
    emit("completed", at=time.time(), steps=step)
except Exception as exc:
    emit("raised", at=time.time(), call_s=time.monotonic() - call_start, message=str(exc),
         type=type(exc).__name__, step=step)
    if mode == "shrink" and hosts[r] != lost_host:
        new = collectives.shrink(timeout=20)
        s0, state = committed
        for s in range(s0, s0 + STEPS_AFTER):
            state += train_step(new, s)
        emit("resumed", size=new.size, rank=new.rank, s0=s0, state=state,
             committed=committed[1])
"""


@dataclass
class Trial:
    """One fault in one world, and what every rank reported."""
    fault: str
    sizes: List[int]
    placement: List[int]
    lost_host: int
    seed: int
    timeout: float
    injected_at: float = 0.0
    healed_at: float = 0.0
    hostname: str = ""
    records: dict = field(default_factory=dict)   # rank -> {tag: record}
    codes: dict = field(default_factory=dict)     # rank -> exit code
    result: object = None

    @property
    def lost(self) -> List[int]:
        """The ranks of the lost (or cut-off) host(s)."""
        return [q for q, h in enumerate(self.placement) if h in self.lost_hosts]

    @property
    def lost_hosts(self) -> List[int]:
        if self.fault == "partition":
            return [h for h in range(len(self.sizes)) if h >= self.lost_host]
        return [self.lost_host]

    @property
    def survivors(self) -> List[int]:
        return [q for q in range(len(self.placement)) if q not in self.lost]


def _pids(world: str, n: int, deadline: float) -> List[int]:
    while time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(world, f"arrived-ready{q}")) for q in range(n)):
            return [int(open(os.path.join(world, f"pid{q}")).read()) for q in range(n)]
        time.sleep(0.05)
    raise TimeoutError("the ranks did not get ready")


def _sw(c: Cluster, *cmd: str) -> None:
    subprocess.run(["ip", "netns", "exec", c.switch, *cmd], check=True, capture_output=True,
                   timeout=30)


def _inject(c: Cluster, t: Trial, world: str, n: int) -> None:
    """Waits for every rank to be ready, then a seeded moment, then the fault."""
    pids = _pids(world, n, time.monotonic() + 60)
    rng = random.Random(t.seed)
    time.sleep(rng.uniform(0.2, 1.5))
    lost = [pids[q] for q in t.lost]
    h = t.lost_host
    t.injected_at = time.time()
    if t.fault == "kill":
        for p in lost:
            os.kill(p, signal.SIGKILL)
    elif t.fault in ("down", "blip"):
        _sw(c, "ip", "link", "set", f"p{h}", "down")
        if t.fault == "blip":
            time.sleep(min(1.0, t.timeout / 3))
            _sw(c, "ip", "link", "set", f"p{h}", "up")
            t.healed_at = time.time()
    elif t.fault == "crawl":
        for dev_ns, dev in ((c.switch, f"p{h}"), (c.names[h], "eth0")):
            subprocess.run(["ip", "netns", "exec", dev_ns, "tc", "qdisc", "replace", "dev", dev,
                            "root", "tbf", "rate", "1mbit", "burst", "32kb", "latency", "400ms"],
                           check=True, capture_output=True, timeout=30)
    elif t.fault == "partition":
        _sw(c, "ip", "link", "add", "br1", "type", "bridge")
        _sw(c, "ip", "link", "set", "br1", "up")
        for g in t.lost_hosts:
            _sw(c, "ip", "link", "set", f"p{g}", "master", "br1")
    elif t.fault == "stop":
        for p in lost:
            os.kill(p, signal.SIGSTOP)
        time.sleep(t.timeout + 3)
        for p in lost:
            os.kill(p, signal.SIGCONT)
        t.healed_at = time.time()
    # streams that survive the fault (blip, crawl) end a few seconds later
    if t.fault in ("blip", "crawl"):
        time.sleep(t.timeout + 3)
    open(os.path.join(world, "stop"), "w").close()


def run_trial(fault: str, sizes: List[int], placement: str, seed: int, timeout: float = 4.0,
              mode: str = "raise", lost_host: Optional[int] = None,
              deadline: float = 90.0) -> Trial:
    """One trial: build the cluster, start the ranks, inject, collect (see module doc)."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
    nh = len(sizes)
    if lost_host is None:  # never rank 0's host: it keeps the store that shrink needs
        lost_host = nh - 1 if fault != "partition" else nh // 2
    n = sum(sizes)
    if placement == "block":
        hosts = [h for h, k in enumerate(sizes) for _ in range(k)]
    else:
        left, hosts = list(sizes), []
        while any(left):
            for h in range(nh):
                if left[h]:
                    hosts.append(h)
                    left[h] -= 1
    t = Trial(fault, list(sizes), hosts, lost_host, seed, timeout)
    with Cluster(nh, rate="4gbit") as c:
        c.hosts_of(n, hosts)
        t.hostname = c.hostname(lost_host)
        import tempfile
        with tempfile.TemporaryDirectory(prefix="collfault") as world:
            err: list = []

            def injector():
                try:
                    _inject(c, t, world, n)
                except BaseException as exc:  # reported by the test, never swallowed
                    err.append(exc)

            th = threading.Thread(target=injector, daemon=True)
            th.start()
            res = run_world(n, STREAM_BODY, args=[",".join(map(str, hosts)), str(seed), mode,
                                                  str(lost_host)],
                            timeout=deadline, collective_timeout=timeout,
                            rank_env=c.rank_env(free_port()), prefix=c.prefix,
                            env={"WORLD_DIR": world})
            th.join(timeout=timeout + 10)
            if err:
                raise err[0]
            if not t.injected_at:
                raise AssertionError("the fault was never injected:\n" + res.report(2000))
    t.result = res
    for q in range(n):
        t.codes[q] = res[q].returncode
        t.records[q] = {rec["tag"]: rec for rec in res[q].records}
    return t


def names_lost(t: Trial, message: str) -> bool:
    """Whether an error message names every lost rank and (but for a partition, where
    several hosts are out of reach) the lost host's hostname."""
    import re
    named = {int(m) for m in re.findall(r"\b(\d+)\b", message)}
    if not set(t.lost) <= named:
        return False
    return t.fault == "partition" or t.hostname in message


def summarize(t: Trial) -> dict:
    """The table's figures for one trial (see the module doc)."""
    raised = [q for q in t.survivors if "raised" in t.records[q]]
    wrong = sum(len(t.result[q].get("wrong")) for q in t.records)
    hung = [q for q in t.records if t.codes[q] is None
            and not (t.fault == "kill" and q in t.lost)]
    named = [q for q in raised if names_lost(t, t.records[q]["raised"]["message"])]
    seconds = [t.records[q]["raised"]["at"] - t.injected_at for q in raised]
    return {"fault": t.fault, "survivors": len(t.survivors), "raised": len(raised),
            "named": len(named), "hung": len(hung), "wrong": wrong,
            "max_s": round(max(seconds), 2) if seconds else None}
