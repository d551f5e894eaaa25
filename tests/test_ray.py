"""collectives.ray on a local Ray cluster: worlds of Ray actors, failures named, elastic
re-forms, and Ray Train over the "collectives" torch.distributed backend.

One Ray cluster for the module: two Ray nodes (raylets) of 2 CPUs on this machine, so
placement across nodes is real though the nodes share the host. The workers are real
processes talking over real sockets; every executor is shut down in the test that made
it, and the cluster's shutdown ends its processes.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from conftest import REPO, TESTS, package_path  # noqa: E402

import collectives.ray as cray  # noqa: E402
from collectives.ray import RayExecutor, WorkerError  # noqa: E402

pytestmark = pytest.mark.timeout(180)

# A collective left waiting on a rank that is gone must fail by the link closing, long
# before this: the tests check that the failure comes well within it.
OP_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes of 2 CPUs each on this machine (ray.cluster_utils.Cluster: a raylet
    per node), so that placement across nodes and local ranks are exercised."""
    from ray import cloudpickle
    from ray.cluster_utils import Cluster

    # Functions of this module travel by value: the actors need not import it.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    path = os.pathsep.join(package_path() + [str(TESTS)] +
                           [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        nodes.add_node(num_cpus=2)
        ray.init(address=nodes.address, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": path,
                                           "COLLECTIVES_TIMEOUT": f"{OP_TIMEOUT:g}"}})
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def settings(**kw):
    kw.setdefault("timeout_s", 60)
    kw.setdefault("failure_grace_s", 15)
    return RayExecutor.create_settings(**kw)


def _allreduce_rank_sum(steps=1):
    from collectives import MPI

    comm = MPI.COMM_WORLD
    out = None
    for _ in range(steps):
        x = np.arange(1000, dtype=np.float64) + comm.rank
        out = np.empty_like(x)
        comm.Allreduce(x, out)
    ctx = cray.context()
    return comm.rank, comm.size, comm.local_rank, ctx.world, out.tolist()


class Counter:
    """An executable: state that lives in the worker between execute() calls."""

    def __init__(self, start):
        self.value = start

    def bump(self):
        from collectives import MPI

        self.value += 1
        return MPI.COMM_WORLD.rank, MPI.COMM_WORLD.allreduce(float(self.value))


def _hvd_average():
    import torch

    import collectives.torch as hvd

    hvd.init()  # finds the world the executor formed
    return hvd.rank(), hvd.size(), hvd.allreduce(torch.tensor([float(hvd.rank())])).item()


@pytest.mark.parametrize("n", [2, 4])
def test_workers_allreduce_exact_sums(cluster, n):
    ex = RayExecutor(settings(), num_workers=n, cpus_per_worker=1)
    try:
        ex.start(executable_cls=Counter, executable_args=[10])
        results = ex.run(_allreduce_rank_sum)
        expected = (n * np.arange(1000) + n * (n - 1) / 2).tolist()
        info = ex.worker_info()
        nodes = [w["node_id"] for w in info]
        # A node's workers take consecutive ranks, numbered 0.. on it.
        assert nodes == sorted(nodes, key=nodes.index)
        local = [nodes[:r].count(nodes[r]) for r in range(n)]
        assert [r[:4] for r in results] == [(r, n, local[r], 1) for r in range(n)]
        assert all(r[4] == expected for r in results)
        assert len({w["actor_id"] for w in info}) == n and len({w["pid"] for w in info}) == n
        # The executable keeps its state between calls; torch's Horovod API finds the world.
        assert ex.execute(lambda c: c.bump()) == [(r, 11.0 * n) for r in range(n)]
        assert ex.execute(lambda c: c.bump()) == [(r, 12.0 * n) for r in range(n)]
        assert ex.execute_single(lambda c: c.value) == 12
        assert ray.get(ex.run_remote(lambda a, b: a * b, args=[6], kwargs={"b": 7})) == [42] * n
        if n == 2:
            pytest.importorskip("torch")
            assert ex.run(_hvd_average) == [(0, 2, 0.5), (1, 2, 0.5)]
    finally:
        ex.shutdown()


def test_bad_arguments_raise_before_any_actor_starts():
    with pytest.raises(ValueError, match="exactly one of num_workers and num_hosts"):
        RayExecutor(settings(), num_workers=2, num_hosts=2)
    with pytest.raises(ValueError, match="use_gpu"):
        RayExecutor(settings(), num_workers=2, gpus_per_worker=1)
    with pytest.raises(ValueError, match="placement_strategy"):
        RayExecutor(settings(), num_workers=2, placement_strategy="ANYWHERE")
    with pytest.raises(ValueError, match="min_workers <= max_workers"):
        RayExecutor(settings(), min_workers=3, max_workers=2)
    with pytest.raises(ValueError, match="not both"):
        RayExecutor(settings(), num_workers=2, min_workers=2)
    with pytest.raises(TypeError, match="callable"):
        RayExecutor(settings(), num_workers=2).run("train")


def test_num_hosts_spreads_the_workers_over_nodes(cluster):
    ex = RayExecutor(settings(), num_hosts=2, num_workers_per_host=2)
    try:
        ex.start()
        info = ex.worker_info()
        assert info[0]["node_id"] == info[1]["node_id"] != info[2]["node_id"] == info[3]["node_id"]
        results = ex.run(_allreduce_rank_sum)
        assert [r[:3] for r in results] == [(0, 4, 0), (1, 4, 1), (2, 4, 0), (3, 4, 1)]
        assert all(r[4] == (4 * np.arange(1000) + 6).tolist() for r in results)
    finally:
        ex.shutdown()


def test_unplaceable_job_times_out_naming_the_resources(cluster):
    # Three nodes strictly apart, on a two-node cluster: Ray can never place it.
    ex = RayExecutor(settings(placement_group_timeout_s=2), num_hosts=3, num_workers_per_host=1)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="STRICT_SPREAD"):
        ex.start()
    assert time.monotonic() - t0 < 20
    assert ex.workers == []


def _raise_at_rank_1():
    from collectives import MPI

    comm = MPI.COMM_WORLD
    if comm.rank == 1:
        time.sleep(0.5)  # the others are inside the allreduce by now
        raise ValueError("bad batch at rank 1")
    x = np.ones(10)
    comm.Allreduce(x.copy(), x)
    return comm.rank


def test_worker_that_raises_is_named_and_the_others_stop(cluster):
    ex = RayExecutor(settings(), num_workers=3)
    try:
        ex.start()
        info = ex.worker_info()
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as caught:
            ex.run(_raise_at_rank_1)
        took = time.monotonic() - t0
        err = caught.value
        assert err.rank == 1 and not err.died
        assert "ValueError: bad batch at rank 1" in str(err)
        assert info[1]["actor_id"] in str(err) and info[1]["node_ip"] in str(err)
        assert str(info[1]["pid"]) in str(err)
        # The others failed by themselves because rank 1 left (it closed its links), well
        # before their timeout and the grace after which they would have been killed.
        assert sorted(err.errors) == [0, 1, 2] and err.dead == []
        assert "rank 1 closed the connection" in err.errors[0] + err.errors[2], err.errors
        assert took < 10, took
        assert ex.workers == []  # a static job ends at a failure
        with pytest.raises(RuntimeError, match="not started"):
            ex.run(_allreduce_rank_sum)
    finally:
        ex.shutdown()


def _exit_at_rank_2():
    from collectives import MPI

    comm = MPI.COMM_WORLD
    x = np.ones(1000)
    for step in range(1000):
        if comm.rank == 2 and step == 3:
            os._exit(1)  # as SIGKILL: no word to anyone
        comm.Allreduce(x.copy(), x)
        x[:] = 1
    return comm.rank


def test_worker_that_dies_is_named_without_hanging(cluster):
    ex = RayExecutor(settings(), num_workers=3)
    try:
        ex.start()
        info = ex.worker_info()
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as caught:
            ex.run(_exit_at_rank_2)
        err = caught.value
        assert err.rank == 2 and err.died, str(err)
        assert info[2]["actor_id"] in str(err) and err.dead == [2]
        assert time.monotonic() - t0 < OP_TIMEOUT / 3
    finally:
        ex.shutdown()


def _allreduce_forever():
    from collectives import MPI

    comm = MPI.COMM_WORLD
    x = np.ones(100)
    while True:
        comm.Allreduce(x.copy(), x)
        x[:] = 1
        time.sleep(0.01)


def test_worker_killed_by_ray_is_named(cluster):
    ex = RayExecutor(settings(), num_workers=2)
    try:
        ex.start()
        victim = ex.workers[1]
        killer = threading.Timer(1.0, ray.kill, args=(victim,))
        killer.start()
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as caught:
            ex.run(_allreduce_forever)
        killer.join()
        assert caught.value.rank == 1 and caught.value.died, str(caught.value)
        assert time.monotonic() - t0 < OP_TIMEOUT / 3
    finally:
        ex.shutdown()


def _elastic_train(steps, victim=2):
    """Sum-of-ranks 'training' that commits its step to the actor's state; rank `victim`
    of the first world dies after committing step 3."""
    from collectives import MPI

    ctx = cray.context()
    comm = MPI.COMM_WORLD
    # The survivors hold the last commit and rank 0 is one of them: everyone takes it.
    start = comm.bcast(ctx.state.get("step", 0), root=0)
    total = comm.bcast(ctx.state.get("total", 0.0), root=0)
    for step in range(start, steps):
        if ctx.world == 1 and ctx.rank == victim and step == 3:
            os._exit(1)
        x = np.array([1.0])
        comm.Allreduce(x.copy(), x)
        total += x[0]
        ctx.state.update(step=step + 1, total=total)  # the commit
    return ctx.world, ctx.rank, comm.size, ctx.new, start, total


def test_elastic_job_replaces_a_lost_worker_and_goes_on(cluster):
    ex = RayExecutor(settings(), min_workers=2, max_workers=3, reset_limit=2)
    try:
        ex.start()
        before = ex.worker_info()
        results = ex.run(_elastic_train, args=[8])
        after = ex.worker_info()
        assert ex.resets == 1
        # The survivors kept ranks 0 and 1; a new actor took rank 2.
        assert [w["actor_id"] for w in after[:2]] == [w["actor_id"] for w in before[:2]]
        assert after[2]["actor_id"] != before[2]["actor_id"]
        assert [r[:4] for r in results] == [(2, 0, 3, False), (2, 1, 3, False), (2, 2, 3, True)]
        # Everyone resumed from the survivors' commit: steps 0-2 done (rank 2 never sent
        # its part of step 3, so no survivor finished it).
        assert {r[4] for r in results} == {3}, results
        # 3 steps at size 3 before the loss, 5 at size 3 after: a sum of 3 a step.
        assert all(r[5] == 3.0 * 8 for r in results), results
    finally:
        ex.shutdown()


def test_elastic_job_goes_on_with_fewer_when_no_replacement_can_be_placed(cluster):
    @ray.remote(num_cpus=2)
    class Blocker:
        def ping(self):
            return True

    # Replacements get elastic_timeout to start; the one that never gets CPUs is dropped
    # (the blocker, already waiting, takes them whatever the timeout: 3 s is plenty).
    ex = RayExecutor(settings(), min_workers=2, max_workers=3, elastic_timeout=3)
    blocker = None
    try:
        ex.start()
        nodes = [w["node_id"] for w in ex.worker_info()]
        # The worker alone on its node: when it dies, its node has both CPUs free, and a
        # 2-CPU actor already waiting takes them before the replacement can.
        victim = next(r for r in range(3) if nodes.count(nodes[r]) == 1)
        blocker = Blocker.remote()
        ready, _ = ray.wait([blocker.ping.remote()], timeout=1)
        assert not ready  # it cannot be placed while the three workers run
        results = ex.run(_elastic_train, args=[8, victim])
        assert ex.resets == 1 and len(ex.workers) == 2
        assert [r[:4] for r in results] == [(2, 0, 2, False), (2, 1, 2, False)]
        assert {r[4] for r in results} == {3}
        # 3 steps at size 3, then 5 at size 2.
        assert all(r[5] == 3.0 * 3 + 2.0 * 5 for r in results), results
    finally:
        ex.shutdown()
        if blocker is not None:
            ray.kill(blocker)


def test_elastic_job_past_its_reset_limit_fails_naming_the_lost_rank(cluster):
    ex = RayExecutor(settings(), min_workers=2, max_workers=3, reset_limit=0)
    try:
        ex.start()
        with pytest.raises(WorkerError) as caught:
            ex.run(_elastic_train, args=[8])
        assert caught.value.rank == 2 and caught.value.died
        assert ex.workers == []
    finally:
        ex.shutdown()


def _train_both(config):
    """The same tiny model trained twice per worker, by DDP over the default group
    (the backend under test) and over a gloo group; rank 0 writes both results."""
    import ray.train
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = ray.train.get_context().get_world_rank()
    gloo = dist.new_group(backend="gloo")
    weights = {}
    for name, group in (("default", None), ("gloo", gloo)):
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 1), process_group=group)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(100 + rank)
        for _ in range(config["steps"]):
            x = torch.randn(8, 4, generator=g)
            y = x.sum(1, keepdim=True)
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
        weights[name] = [p.detach().flatten().tolist() for p in model.module.parameters()]
    if rank == 0:
        with open(config["out"], "w") as fh:
            json.dump({"backend": dist.get_backend(), "size": dist.get_world_size(),
                       **weights}, fh)


@pytest.mark.slow
@pytest.mark.timeout(400)  # Ray Train starts a trainer and a worker group: ~3 min on a busy 2-core machine
def test_ray_train_torch_trainer_with_collectives_backend_equals_gloo(cluster, tmp_path):
    pytest.importorskip("torch")
    try:
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
    except ImportError as exc:
        pytest.skip(f"Ray Train is not installed (pip install 'ray[train]'): {exc}")
    from collectives.ray.train import CollectivesConfig

    out = tmp_path / "weights.json"
    trainer = TorchTrainer(_train_both, train_loop_config={"steps": 5, "out": str(out)},
                           torch_config=CollectivesConfig(),
                           scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(storage_path=str(tmp_path), name="collectives"))
    trainer.fit()
    got = json.loads(out.read_text())
    assert got["backend"] == "collectives" and got["size"] == 2
    np.testing.assert_allclose(np.concatenate([np.ravel(w) for w in got["default"]]),
                               np.concatenate([np.ravel(w) for w in got["gloo"]]),
                               rtol=0, atol=1e-6)
    # And it trained: the weights moved from where the seed put them.
    import torch

    torch.manual_seed(0)
    start = np.concatenate([p.detach().numpy().ravel() for p in torch.nn.Linear(4, 1).parameters()])
    moved = np.concatenate([np.ravel(w) for w in got["default"]]) - start
    assert np.abs(moved).max() > 1e-2, moved


def test_readme_ray_example_runs_with_the_collectives_it_imports(cluster):
    """examples/ray_train.py as the README gives it. Before: it put the checkout on the
    workers' PYTHONPATH, which after `pip install .` has no built core (ImportError:
    cannot import name '_core'); CI runs this against the installed wheel."""
    import subprocess

    from conftest import RUN_CWD, base_env

    proc = subprocess.run([sys.executable, str(REPO / "examples" / "ray_train.py"), "--workers",
                           "2", "--steps", "3", "--batch", "8", "--address", cluster.address],
                          capture_output=True, text=True, timeout=170, cwd=str(RUN_CWD),
                          env=base_env({"COLLECTIVES_TIMEOUT": "60"}))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "_core" not in proc.stderr, proc.stderr[-3000:]


def test_ray_modules_have_docstrings():
    from test_docs import _missing

    names = ["collectives.ray", "collectives.ray._executor", "collectives.ray._worker",
             "collectives.ray._errors"]
    try:
        import ray.train  # noqa: F401

        names.append("collectives.ray.train")
    except ImportError:
        pass
    missing = [m for n in names for m in _missing(n)]
    assert not missing, missing


def test_ray_example_runs_as_the_readme_gives_it(tmp_path_factory):
    """`python examples/ray_train.py --workers N` from the clone's root after the README's
    install (issue 38, item 2): the workers import the installed collectives, not the
    clone's collectives/ (no built core), which the example no longer puts on their path."""
    import subprocess

    import _clone

    root, env = _clone.user_clone(tmp_path_factory)
    env["RAY_ADDRESS"] = "local"  # a cluster of its own, not one another job left running
    res = subprocess.run([sys.executable, *_clone.PYTHON_FLAGS, "examples/ray_train.py",
                          "--workers", "2", "--steps", "5"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "loss=" in res.stdout, res.stdout[-3000:]
