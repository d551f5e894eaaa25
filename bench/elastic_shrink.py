"""Time from SIGKILL of one of N ranks to the first correct allreduce on the survivors.

    python bench/elastic_shrink.py --np 4 --runs 5

Each run starts N ranks on loopback (a store at rank 0, as collectives-run does),
runs allreduces in a loop, SIGKILLs rank N//2 at step 20, lets the survivors call
collectives.shrink() and checks their first allreduce at N-1 ranks. Prints each run's
time (kill -> last survivor's first correct result; wall clock on one host) and the
median. Absolute numbers depend on the host's load: compare within one run.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap

WORKER = textwrap.dedent("""
    import json, os, signal, time
    import numpy as np
    import collectives
    from collectives import MPI
    comm = collectives.init()
    victim = int(os.environ["VICTIM"])
    x = np.zeros(256)
    try:
        for step in range(100000):
            if comm.rank == victim and step == 20:
                print(json.dumps({"kill": time.time()}), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            comm.Allreduce(np.full(256, 1.0), x)
    except MPI.Exception:
        print(json.dumps({"error": time.time()}), flush=True)
    new = collectives.shrink(timeout=30)
    new.Allreduce(np.full(256, 1.0), x)
    assert x[0] == new.size, x[0]
    print(json.dumps({"first": time.time(), "size": new.size}), flush=True)
    collectives.finalize()
""")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(n: int, repo: str) -> tuple:
    """Seconds from the kill to the last survivor's error, and to its first correct
    allreduce after shrink."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "w.py")
        with open(path, "w") as f:
            f.write(WORKER)
        port = _port()
        procs = []
        try:
            for r in range(n):
                env = dict(os.environ, COLLECTIVES_RANK=str(r), COLLECTIVES_SIZE=str(n),
                           COLLECTIVES_STORE_ADDR=f"127.0.0.1:{port}", VICTIM=str(n // 2),
                           COLLECTIVES_JOB_SECRET="elastic-bench-secret-0123456789",
                           COLLECTIVES_TIMEOUT="30",
                           PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
                procs.append(subprocess.Popen([sys.executable, path], env=env,
                                              stdout=subprocess.PIPE, start_new_session=True))
            outs = [p.communicate(timeout=120)[0].decode() for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    recs = [json.loads(line) for out in outs for line in out.splitlines() if line.startswith("{")]
    kill = [r["kill"] for r in recs if "kill" in r]
    first = [r["first"] for r in recs if "first" in r]
    if len(kill) != 1 or len(first) != n - 1:
        raise RuntimeError(f"run failed: {recs}")
    errors = [r["error"] for r in recs if "error" in r]
    return max(errors) - kill[0], max(first) - kill[0]


def main() -> None:
    """Run the measurement and print each run and the median."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    errs, times = [], []
    for i in range(args.runs):
        e, t = one_run(args.np, repo)
        errs.append(e)
        times.append(t)
        print(f"run {i}: error raised after {e * 1000:.1f} ms, first correct allreduce "
              f"after {t * 1000:.1f} ms", flush=True)
    print(f"median of {args.runs}: kill -> error {statistics.median(errs) * 1000:.1f} ms, "
          f"kill -> first correct allreduce at {args.np - 1} ranks "
          f"{statistics.median(times) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
