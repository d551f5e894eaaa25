"""collectives.spark.run and PySpark's TorchDistributor, on a real Spark cluster (issue 35).

One Spark application for the module, in local-cluster mode: a master, two worker JVMs
with one executor of one core each, so the two ranks are tasks of different executor
processes, as on a cluster (local[N] would run every task in one JVM). Everything binds
to loopback (SPARK_LOCAL_IP).
"""
from __future__ import annotations

import os
import shutil
import sys
import time

import pytest

pyspark = pytest.importorskip("pyspark")
if shutil.which("java") is None:
    pytest.skip("no java: Spark needs a JRE (.ci/run installs openjdk-17-jre-headless)",
                allow_module_level=True)

import collectives.spark  # noqa: E402
from conftest import TESTS, package_path  # noqa: E402

pytestmark = pytest.mark.timeout(600)  # the first test also starts the JVMs


@pytest.fixture(scope="module")
def sc():
    from pyspark.sql import SparkSession

    pythonpath = os.pathsep.join(package_path() + [str(TESTS)])
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local-cluster[2,1,1024]")
             .appName("collectives-test-spark")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.task.maxFailures", "1")
             .config("spark.executorEnv.PYTHONPATH", pythonpath)
             .config("spark.executorEnv.COLLECTIVES_TIMEOUT", "60")
             .config("spark.executorEnv.OMP_NUM_THREADS", "1")
             .getOrCreate())
    try:
        deadline = time.monotonic() + 300
        while collectives.spark.slots(spark.sparkContext) < 2:  # executors registering
            assert time.monotonic() < deadline, "the local cluster's executors never came"
            time.sleep(0.5)
        yield spark.sparkContext
    finally:
        spark.stop()


def _allreduce_fn(scale, offset=0.0):
    import os

    import numpy as np
    from collectives import MPI

    c = MPI.COMM_WORLD
    x = np.array([scale * (c.Get_rank() + 1)])
    c.Allreduce(MPI.IN_PLACE, x)
    return {"rank": c.Get_rank(), "size": c.Get_size(), "total": float(x[0]) + offset,
            "pid": os.getpid(), "secret": len(os.environ.get("COLLECTIVES_JOB_SECRET", "")),
            "extra": os.environ.get("EXTRA_VAR")}


def test_run_returns_each_ranks_result_in_rank_order(sc):
    out = collectives.spark.run(_allreduce_fn, args=(2.0,), kwargs={"offset": 0.5}, num_proc=2,
                                env={"EXTRA_VAR": "yes"}, start_timeout=120)
    assert [r["rank"] for r in out] == [0, 1] and {r["size"] for r in out} == {2}
    assert {r["total"] for r in out} == {6.5}
    assert out[0]["pid"] != out[1]["pid"]  # two executors' Python workers
    assert {r["secret"] for r in out} == {64} and {r["extra"] for r in out} == {"yes"}
    # The Python workers are reused: a second job in the same processes forms a new world.
    again = collectives.spark.run(_allreduce_fn, args=(1.0,), start_timeout=120)
    assert [r["total"] for r in again] == [3.0, 3.0]


def test_more_ranks_than_slots_fails_fast_before_any_task(sc):
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="num_proc=3 but this Spark application can run 2"):
        collectives.spark.run(_allreduce_fn, args=(1.0,), num_proc=3, start_timeout=120)
    assert time.monotonic() - t0 < 30


def _fail_on_rank_1():
    from pyspark import BarrierTaskContext

    if BarrierTaskContext.get().partitionId() == 1:
        raise RuntimeError("rank 1 broke on purpose")
    import collectives
    collectives.init()  # waits for rank 1, which never comes: Spark must stop it


def test_a_failing_rank_fails_the_job_without_waiting_out_the_start_timeout(sc):
    t0 = time.monotonic()
    with pytest.raises(Exception, match="rank 1 broke on purpose"):
        collectives.spark.run(_fail_on_rank_1, num_proc=2, start_timeout=300)
    assert time.monotonic() - t0 < 120
    # The application survives: the next job runs.
    assert [r["total"] for r in collectives.spark.run(_allreduce_fn, args=(1.0,),
                                                      start_timeout=120)] == [3.0, 3.0]


def _torch_fn():
    # A script written for torchrun: Horovod's API and the torch.distributed backend.
    import torch
    import torch.distributed as dist

    import collectives.torch as hvd

    hvd.init()
    a = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    dist.init_process_group("collectives")
    b = torch.tensor([10.0 * (dist.get_rank() + 1)])
    dist.all_reduce(b)
    out = (hvd.rank(), hvd.size(), float(a[0]), dist.get_world_size(), float(b[0]))
    dist.destroy_process_group()
    hvd.shutdown()
    return out


def test_torch_distributor_runs_a_collectives_function_unchanged(sc):
    pytest.importorskip("torch")
    from pyspark.ml.torch.distributor import TorchDistributor

    out = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(_torch_fn)
    assert out == (0, 2, 3.0, 2, 30.0)  # rank 0's return value


def test_bad_arguments_are_refused_before_spark_is_asked():
    for kwargs, match in (({"num_proc": 0}, "num_proc=0"), ({"use_mpi": True}, "use_mpi"),
                          ({"extra_mpi_args": "-x A"}, "extra_mpi_args"),
                          ({"nics": ["eth0", "eth1"]}, "one interface"),
                          ({"start_timeout": 0}, "start_timeout")):
        with pytest.raises(ValueError, match=match):
            collectives.spark.run(_allreduce_fn, **kwargs)
    with pytest.raises(TypeError, match="env must map str to str"):
        collectives.spark.run(_allreduce_fn, env={"A": 1})
    with pytest.raises(TypeError, match="callable"):
        collectives.spark.run(42)
