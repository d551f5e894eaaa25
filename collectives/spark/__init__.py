"""Training on Spark: ``collectives.spark.run``, Horovod's ``horovod.spark.run`` on this library.

    import collectives.spark
    results = collectives.spark.run(train, args=(lr,), num_proc=4)  # one per rank

``run`` starts ``num_proc`` Spark tasks in one barrier stage (Spark's barrier
execution mode: all tasks start together, or none), forms a collectives world
among them and calls ``fn(*args, **kwargs)`` in each, where
``collectives.init()``, ``hvd.init()`` (``collectives.torch``) or
``MPI.COMM_WORLD`` find that world as under collectives-run. It returns the
return values in rank order.

Rendezvous: every task learns the others' executor addresses from
``BarrierTaskContext``; rank 0 picks a free port on its executor's address
for the store and tells the others through ``BarrierTaskContext.allGather``
(Spark's own channel, not the network the store uses). The job secret is
made on the driver and travels to the tasks inside the task closure, as the
function and its arguments do; it never goes through the store.

A cluster that cannot run ``num_proc`` tasks at once would make Spark's
barrier scheduler retry for minutes (``spark.scheduler.barrier.
maxConcurrentTasksCheck.*``): ``run`` asks Spark's own slot count first and
raises at once, unless dynamic allocation may still add executors.

PySpark's ``TorchDistributor`` needs nothing from here: it starts torchrun in
its tasks, whose variables collectives reads (collectives/rendezvous/env.py),
so a function using ``dist.init_process_group("collectives")`` or
``collectives.torch`` runs under it unchanged (tests/test_spark.py).

Importing this package does not import PySpark; ``run`` does.
"""
from __future__ import annotations

import functools
import json
import os
import socket
import time
from typing import Any, Callable, Mapping, Optional, Sequence

__all__ = ["run", "slots"]

# Seconds the slot count must stay the same, below num_proc, before run() gives up on it:
# executors of a starting application register one by one.
SLOTS_SETTLE_S = 5.0
DEFAULT_START_TIMEOUT_S = 600.0  # Horovod's HOROVOD_SPARK_START_TIMEOUT default


def slots(sc: Any) -> int:
    """The tasks Spark's barrier scheduler would run at once now: its own slot count
    (SparkContext.maxNumConcurrentTasks for the default resource profile)."""
    jsc = sc._jsc.sc()
    return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))


def _wait_for_slots(sc: Any, num_proc: int, timeout: float) -> None:
    if sc.getConf().get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        return  # executors may still come: Spark's own barrier check waits for them
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while True:
        have = slots(sc)
        if have >= num_proc:
            return
        now = time.monotonic()
        if have != last:
            last, since = have, now
        if (have > 0 and now - since >= SLOTS_SETTLE_S) or now >= deadline:
            raise ValueError(
                f"num_proc={num_proc} but this Spark application can run {have} task(s) at "
                f"once (Spark's barrier slot check: executors x cores / spark.task.cpus): a "
                f"barrier stage needs all of them together; give num_proc <= {have}, or "
                f"more executors or cores")
        time.sleep(0.2)


def _free_port(host: str) -> int:
    """A port free on host now, for the store rank 0 starts right after (the other tasks
    learn it through allGather)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _finalize_world() -> None:
    import sys

    torch_front = sys.modules.get("collectives.torch")
    if torch_front is not None and torch_front.is_initialized():
        torch_front.shutdown()
    import collectives

    collectives.finalize()


def _partition(fn: Callable, args: tuple, kwargs: dict, env: Mapping[str, str], secret: str,
               start_timeout: float, ifname: Optional[str], _rows: Any):
    """The body of each barrier task (runs on an executor): rendezvous, fn, its result."""
    from pyspark import BarrierTaskContext

    from ..rendezvous.env import format_addr

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    infos = ctx.getTaskInfos()
    host = infos[0].address.rpartition(":")[0].strip("[]")  # rank 0's executor
    offer = _free_port(host) if rank == 0 else 0
    port = json.loads(ctx.allGather(json.dumps({"port": offer}))[0])["port"]
    ours = {"COLLECTIVES_RANK": str(rank), "COLLECTIVES_SIZE": str(len(infos)),
            "COLLECTIVES_STORE_ADDR": format_addr(host, port),
            "COLLECTIVES_JOB_SECRET": secret,
            "COLLECTIVES_START_TIMEOUT": f"{start_timeout:g}"}
    if ifname:
        ours["COLLECTIVES_IFNAME"] = ifname
    ours.update(env)
    # Spark reuses its Python workers: what this task sets is taken back after it.
    saved = {k: os.environ.get(k) for k in ours}
    os.environ.update(ours)
    try:
        result = fn(*args, **kwargs)
    finally:
        try:
            _finalize_world()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    yield rank, result


def run(fn: Callable, args: Sequence = (), kwargs: Optional[Mapping[str, Any]] = None,
        num_proc: Optional[int] = None, start_timeout: Optional[float] = None,
        use_mpi: Optional[bool] = None, use_gloo: Optional[bool] = None,
        extra_mpi_args: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
        verbose: int = 1, nics: Optional[Sequence[str]] = None) -> list:
    """Run ``fn(*args, **kwargs)`` as a collectives job of ``num_proc`` Spark tasks.

    Args (Horovod's names):
        fn: the training function; it joins the world as under collectives-run.
        args, kwargs: its arguments (pickled to the tasks).
        num_proc: number of ranks; default: the SparkContext's defaultParallelism.
        start_timeout: seconds for the cluster to offer the slots and the ranks to
            meet (COLLECTIVES_START_TIMEOUT, else 600 s).
        use_mpi, use_gloo: which controller Horovod uses; here there is one (TCP, as
            gloo): use_mpi=True is refused.
        extra_mpi_args: mpirun arguments in Horovod; refused when given.
        env: variables set in each task while fn runs (e.g. COLLECTIVES_TIMEOUT).
        verbose: 0 silences the driver's line about the job.
        nics: network interfaces the ranks may use; one (its name becomes
            COLLECTIVES_IFNAME), as collectives-run's --network-interface.

    Returns:
        fn's return values, in rank order.

    Raises:
        ValueError, TypeError: bad arguments, or a cluster that cannot run num_proc
            tasks at once; before any task starts.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    if use_mpi:
        raise ValueError("use_mpi=True: collectives runs over its own TCP links, not MPI; "
                         "leave use_mpi unset")
    if extra_mpi_args:
        raise ValueError("extra_mpi_args: there is no mpirun here; set collectives' "
                         "COLLECTIVES_* variables through env instead")
    if num_proc is not None and (not isinstance(num_proc, int) or num_proc < 1):
        raise ValueError(f"num_proc={num_proc!r} must be a positive integer")
    env = dict(env or {})
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"env must map str to str; got {key!r}: {value!r}")
    nics = list(nics or [])
    if len(nics) > 1:
        raise ValueError(f"nics={nics}: collectives uses one interface (COLLECTIVES_IFNAME)")
    if start_timeout is None:
        text = os.environ.get("COLLECTIVES_START_TIMEOUT", "")
        start_timeout = float(text) if text else DEFAULT_START_TIMEOUT_S
    if not start_timeout > 0:
        raise ValueError(f"start_timeout={start_timeout!r} must be > 0")
    from .. import config

    config.check_env({**os.environ, **env})  # refuse a bad COLLECTIVES_* before any task
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("collectives.spark.run needs an active SparkContext "
                           "(SparkSession.builder...getOrCreate() first)")
    num_proc = num_proc or sc.defaultParallelism
    _wait_for_slots(sc, num_proc, start_timeout)
    from ..rendezvous.auth import generate_secret

    if verbose:
        print(f"collectives.spark.run: {num_proc} ranks in one barrier stage", flush=True)
    body = functools.partial(_partition, fn, tuple(args), dict(kwargs or {}), env,
                             generate_secret(), start_timeout, nics[0] if nics else None)
    rows = sc.parallelize(range(num_proc), num_proc).barrier().mapPartitions(body).collect()
    return [result for _, result in sorted(rows, key=lambda row: row[0])]
