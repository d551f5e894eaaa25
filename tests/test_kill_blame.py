"""In kills, the survivors' error names the killed rank first (issue 37, section 4).

A killed rank's neighbours see its sockets close; the other survivors see
those neighbours' communicators break (their links close, or their abort
notices come), so their own error names a live neighbour. The failure
reports through the store tell them who died; the message must lead with
that rank, not bury it after the neighbour (52 of 90 kills did). Each case
SIGKILLs one rank at a seeded moment of a stream of allreduces.
"""
from __future__ import annotations

import json
import re

import pytest

from conftest import run_world

pytestmark = pytest.mark.timeout(120)

BODY = r"""
import json, os, random, signal, threading
from collectives import MPI
S = json.loads(sys.argv[1])
comm = MPI.COMM_WORLD
r = comm.rank
x = np.ones(S["count"], np.float32)
comm.Barrier()
if r == S["victim"]:
    delay = random.Random(S["seed"]).uniform(0.0, 0.3)
    threading.Thread(target=lambda: (time.sleep(delay), os.kill(os.getpid(), signal.SIGKILL)),
                     daemon=True).start()
try:
    for i in range(100000):
        comm.Allreduce(MPI.IN_PLACE, x, algorithm=S["alg"])
except MPI.Exception as exc:
    emit("error", message=str(exc))
"""


def first_named(message: str, me: int):
    """The first rank a message names, past its leading "rank <me>:"."""
    text = re.sub(rf"^rank {me}: ", "", message)
    m = re.search(r"\branks? (\d+)", text.split(";")[0])
    return int(m.group(1)) if m else None


def kill(victim: int, alg: str, seed: int, transport: str = "tcp", n: int = 4) -> list:
    spec = {"victim": victim, "alg": alg, "seed": seed, "count": 1 << 16}
    res = run_world(n, BODY, args=[json.dumps(spec)], timeout=60, collective_timeout=10.0,
                    env={"COLLECTIVES_TRANSPORT": transport})
    assert not res.timed_out, res.report()
    out = []
    for rr in res.ranks:
        if rr.rank == victim:
            continue
        got = rr.get("error")
        assert got, res.report()
        out.append((rr.rank, got[0]["message"]))
    return out


@pytest.mark.parametrize("victim,alg,seed", [(1, "ring", 1), (2, "tree", 2), (3, "butterfly", 3),
                                             (2, "ring", 4), (0, "tree", 5)])
def test_survivors_name_the_killed_rank_first(victim, alg, seed):
    wrong = [(rank, msg) for rank, msg in kill(victim, alg, seed)
             if first_named(msg, rank) != victim]
    assert not wrong, "\n".join(f"rank {r}: {m}" for r, m in wrong)
