"""RayExecutor: a world of Ray actors joined through the project's own rendezvous.

In the manner of ``horovod.ray.RayExecutor``: ``start()`` places N actors (a
placement group, PACK by default, STRICT_SPREAD with ``num_hosts``), asks the
rank-0 actor for a port on its node, gives every actor its rank, the store's
address and the job secret, and has them all call ``collectives.init()`` at
once (rank 0's actor hosts the store; no ssh, no collectives-run).
``run(fn)`` calls fn on every worker and returns the results in rank order;
``execute(fn)`` calls fn(executable) on every worker.

A worker that fails makes run() raise WorkerError naming its rank, node and
actor. The failing rank closes its links at once, so the others stop too;
after a bounded grace (Settings.failure_grace_s) the ones still running are
killed. Static jobs then end (shutdown(); start() again to retry).

Elastic jobs (``min_workers=``, ``max_workers=``) instead replace the actors
that died and form a new world: the survivors (ranks 0.. in their old order)
and the new actors rendezvous through a new store, and fn runs again from its
start on every worker. A run carries state across such a re-form in
``collectives.ray.context().state``, which the surviving actors keep.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from ._errors import WorkerError, describe_failure, is_death, is_echo
from ._worker import Worker

__all__ = ["Settings", "RayExecutor"]

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def _ray():
    try:
        import ray
    except ImportError:
        raise ImportError("collectives.ray needs Ray: pip install 'collectives[ray]'") from None
    return ray


@dataclass
class Settings:
    """A RayExecutor's settings (RayExecutor.create_settings makes one).

    Attributes:
        timeout_s: seconds the workers have to form the world (the start-up deadline).
        placement_group_timeout_s: seconds to wait for Ray to place the workers.
        nics: network interfaces the ranks talk over (one name: COLLECTIVES_IFNAME).
        key: the job secret (None: COLLECTIVES_JOB_SECRET of the driver, else a fresh one).
        failure_grace_s: after a worker fails, seconds the others have to stop before
            they are killed.
    """

    timeout_s: float = 30.0
    placement_group_timeout_s: float = 100.0
    nics: Optional[set] = None
    key: Optional[str] = None
    failure_grace_s: float = 10.0


class RayExecutor:
    """A job of Ray actors that form one collectives world (horovod.ray.RayExecutor's API).

    Args:
        settings: a Settings (RayExecutor.create_settings).
        num_workers: number of workers (static job).
        num_hosts: alternative to num_workers: this many nodes (STRICT_SPREAD), each
            running num_workers_per_host workers.
        num_workers_per_host: workers per node with num_hosts.
        cpus_per_worker: CPUs Ray reserves for each worker.
        use_gpu: reserve GPUs for the workers.
        gpus_per_worker: GPUs per worker with use_gpu (default 1).
        placement_strategy: placement group strategy with num_workers: PACK (default),
            SPREAD, STRICT_PACK or STRICT_SPREAD.
        min_workers: elastic job: the fewest workers training goes on with.
        max_workers: elastic job: the workers started (default min_workers).
        reset_limit: elastic job: how many re-forms before a failure ends the job
            (None: no limit).
        elastic_timeout: elastic job: seconds to wait for replacements to be placed.
    """

    @classmethod
    def create_settings(cls, timeout_s: float = 30, placement_group_timeout_s: float = 100,
                        nics: Optional[set] = None, key: Optional[str] = None,
                        failure_grace_s: float = 10.0) -> Settings:
        """Settings for a RayExecutor (the names of Horovod's; no ssh: nothing uses it)."""
        return Settings(timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s,
                        nics=nics, key=key, failure_grace_s=failure_grace_s)

    def __init__(self, settings: Optional[Settings] = None, num_workers: Optional[int] = None,
                 num_hosts: Optional[int] = None, num_workers_per_host: int = 1,
                 cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[float] = None, placement_strategy: str = "PACK",
                 min_workers: Optional[int] = None, max_workers: Optional[int] = None,
                 reset_limit: Optional[int] = None, elastic_timeout: float = 600) -> None:
        self.settings = settings if settings is not None else Settings()
        if gpus_per_worker and not use_gpu:
            raise ValueError("gpus_per_worker is set but use_gpu is False")
        if cpus_per_worker < 0 or (gpus_per_worker is not None and gpus_per_worker <= 0):
            raise ValueError("cpus_per_worker must be >= 0 and gpus_per_worker > 0")
        if placement_strategy not in STRATEGIES:
            raise ValueError(f"placement_strategy={placement_strategy!r} is not one of "
                             f"{', '.join(STRATEGIES)}")
        self.elastic = min_workers is not None
        if self.elastic:
            if num_workers or num_hosts:
                raise ValueError("give min_workers/max_workers (elastic) or num_workers/"
                                 "num_hosts (static), not both")
            max_workers = max_workers if max_workers is not None else min_workers
            if not 1 <= min_workers <= max_workers:
                raise ValueError(f"need 1 <= min_workers <= max_workers, got {min_workers} "
                                 f"and {max_workers}")
            self.num_workers = max_workers
        else:
            if max_workers is not None:
                raise ValueError("max_workers needs min_workers (an elastic job)")
            if bool(num_workers) == bool(num_hosts):
                raise ValueError("give exactly one of num_workers and num_hosts")
            if num_hosts and num_workers_per_host < 1:
                raise ValueError("num_workers_per_host must be >= 1")
            self.num_workers = num_workers or num_hosts * num_workers_per_host
        if self.num_workers < 1:
            raise ValueError(f"a job needs at least one worker, got {self.num_workers}")
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = use_gpu
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.placement_strategy = placement_strategy
        self.min_workers = min_workers
        self.reset_limit = reset_limit
        self.elastic_timeout = elastic_timeout
        self.resets = 0
        self.workers: List[Any] = []
        self._where: List[Dict[str, Any]] = []
        self._pg = None
        self._world = 0
        self._env: Dict[str, str] = {}
        self._executable: Optional[tuple] = None

    # -------------------------------------------------------------- placing actors
    def _actor_options(self, bundle: Optional[int]) -> dict:
        opts: Dict[str, Any] = {"num_cpus": self.cpus_per_worker, "num_gpus": self.gpus_per_worker,
                                "max_restarts": 0}
        if bundle is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self._pg, placement_group_bundle_index=bundle)
        return opts

    def _place(self) -> List[Any]:
        """The static job's placement group (waited for) and one actor per rank in it."""
        ray = _ray()
        from ray.util.placement_group import placement_group, remove_placement_group

        per = self.num_workers_per_host if self.num_hosts else 1
        bundle = {"CPU": self.cpus_per_worker * per}
        if self.gpus_per_worker:
            bundle["GPU"] = self.gpus_per_worker * per
        count = self.num_hosts or self.num_workers
        strategy = "STRICT_SPREAD" if self.num_hosts else self.placement_strategy
        self._pg = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
        if not self._pg.wait(self.settings.placement_group_timeout_s):
            remove_placement_group(self._pg)
            self._pg = None
            raise TimeoutError(f"Ray could not place {count} bundles of {bundle} "
                               f"({strategy}) within {self.settings.placement_group_timeout_s:g} "
                               f"s: the cluster lacks the resources (ray.cluster_resources(): "
                               f"{ray.cluster_resources()})")
        remote = ray.remote(Worker)
        return [remote.options(**self._actor_options(i // per)).remote()
                for i in range(self.num_workers)]

    def _new_actors(self, count: int) -> List[Any]:
        remote = _ray().remote(Worker)
        return [remote.options(**self._actor_options(None)).remote() for _ in range(count)]

    def _describe(self, actors: Sequence[Any], wait_s: float) -> List[Optional[dict]]:
        """Each actor's describe() (None for one not started within wait_s)."""
        ray = _ray()
        refs = [a.describe.remote() for a in actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        ready_set = set(ready)
        out: List[Optional[dict]] = []
        for ref in refs:
            if ref not in ready_set:
                out.append(None)
                continue
            try:
                out.append(ray.get(ref))
            except Exception:  # died while starting
                out.append(None)
        return out

    # -------------------------------------------------------------- the world
    def _base_env(self, extra: Optional[Dict[str, str]]) -> Dict[str, str]:
        from collectives.rendezvous import auth as _auth

        env = {"COLLECTIVES_START_TIMEOUT": f"{float(self.settings.timeout_s):g}"}
        env[_auth.SECRET_VAR] = (self.settings.key or os.environ.get(_auth.SECRET_VAR)
                                 or _auth.generate_secret())
        if self.settings.nics:
            nics = sorted(self.settings.nics)
            if len(nics) != 1:
                raise ValueError(f"nics={nics}: the ranks talk over one interface")
            env["COLLECTIVES_IFNAME"] = nics[0]
        env.update({k: str(v) for k, v in (extra or {}).items()})
        return env

    def _form(self, actors: List[Any], where: List[dict]) -> None:
        """Join actors (in rank order) into world number self._world + 1."""
        ray = _ray()
        self._world += 1
        port = ray.get(actors[0].store_port.remote())
        store = f"{where[0]['node_ip']}:{port}"
        if ":" in where[0]["node_ip"]:
            store = f"[{where[0]['node_ip']}]:{port}"
        nodes = [w["node_id"] for w in where]
        refs = []
        for rank, actor in enumerate(actors):
            env = dict(self._env, COLLECTIVES_RANK=str(rank), COLLECTIVES_SIZE=str(len(actors)),
                       COLLECTIVES_LOCAL_RANK=str(nodes[:rank].count(nodes[rank])),
                       COLLECTIVES_LOCAL_SIZE=str(nodes.count(nodes[rank])),
                       COLLECTIVES_STORE_ADDR=store)
            refs.append(actor.join.remote(env, rank, len(actors), self._world,
                                          float(self.settings.timeout_s), self._executable))
        self.workers, self._where = actors, where
        self._gather(refs)

    def start(self, executable_cls: Optional[type] = None,
              executable_args: Optional[Sequence] = None,
              executable_kwargs: Optional[Dict] = None,
              extra_env_vars: Optional[Dict[str, str]] = None) -> None:
        """Place the workers and form the world among them.

        Args:
            executable_cls: a class each worker makes an object of after joining (the
                argument of the functions execute() runs).
            executable_args: its positional arguments.
            executable_kwargs: its keyword arguments.
            extra_env_vars: environment variables set in every worker before it joins
                (e.g. COLLECTIVES_TIMEOUT).

        Raises:
            TimeoutError: Ray could not place the workers in time.
            WorkerError: a worker failed to join (naming it).
        """
        ray = _ray()
        if self.workers:
            raise RuntimeError("this RayExecutor is already started")
        self._env = self._base_env(extra_env_vars)
        self._executable = (executable_cls, tuple(executable_args or ()),
                            dict(executable_kwargs or {})) if executable_cls else None
        if self.elastic:
            actors = self._new_actors(self.num_workers)
        else:
            actors = self._place()
        try:
            where = self._describe(actors, self.settings.placement_group_timeout_s)
            if self.elastic:
                actors, where = self._ready(actors, where, self.min_workers)
            elif any(w is None for w in where):
                raise TimeoutError(f"{sum(w is None for w in where)} of {len(actors)} workers "
                                   f"did not start within {self.settings.placement_group_timeout_s:g} s")
            # Workers of a node take consecutive ranks (local ranks 0.. on each node).
            order = sorted(range(len(actors)), key=lambda i: [w["node_id"] for w in where]
                           .index(where[i]["node_id"]))
            self._form([actors[i] for i in order], [where[i] for i in order])
        except BaseException:
            self.workers = list(actors)
            self.shutdown()
            raise

    def _ready(self, actors: List[Any], where: List[Optional[dict]], need: int) -> tuple:
        """The actors that started (killing the rest), at least `need` of them."""
        ray = _ray()
        keep = [(a, w) for a, w in zip(actors, where) if w is not None]
        for a, w in zip(actors, where):
            if w is None:
                ray.kill(a)
        if len(keep) < need:
            for a, _ in keep:
                ray.kill(a)
            raise TimeoutError(f"only {len(keep)} of the {need} workers needed could be "
                               f"placed within the wait")
        return [a for a, _ in keep], [w for _, w in keep]

    # -------------------------------------------------------------- running
    def _gather(self, refs: List[Any]) -> List[Any]:
        """ray.get of one call per rank; on a failure, the others get failure_grace_s to
        stop, and WorkerError names the rank that failed first by its own doing."""
        ray = _ray()
        rank_of = {ref: r for r, ref in enumerate(refs)}
        results: Dict[int, Any] = {}
        failed: Dict[int, BaseException] = {}
        order: List[int] = []
        pending = list(refs)
        deadline = None
        while pending:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=wait)
            if not done:
                break  # the grace is over: the others are stuck
            for ref in done:
                rank = rank_of[ref]
                try:
                    results[rank] = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 (Ray's errors, the function's)
                    failed[rank] = exc
                    order.append(rank)
                    if deadline is None:
                        deadline = time.monotonic() + self.settings.failure_grace_s
        if not failed:
            return [results[r] for r in range(len(refs))]
        stuck = [rank_of[ref] for ref in pending]
        texts = {r: describe_failure(e) for r, e in failed.items()}
        for r in stuck:
            texts[r] = (f"still running {self.settings.failure_grace_s:g} s after rank "
                        f"{order[0]} failed (killed)")
        deaths = [r for r in order if is_death(failed[r])]
        own = [r for r in order if not is_death(failed[r]) and not is_echo(texts[r])]
        culprit = (deaths or own or order)[0]
        err = WorkerError(culprit, self._where[culprit] if culprit < len(self._where) else {},
                          culprit in deaths, texts[culprit], texts)
        err.dead = sorted(set(deaths) | set(stuck))
        raise err from failed[culprit]

    def _call(self, method: str, *args: Any) -> List[Any]:
        if not callable(args[0]):
            raise TypeError(f"{method}() needs a callable, got {type(args[0]).__name__}")
        if not self.workers:
            raise RuntimeError("this RayExecutor is not started (start() it; a static job "
                               "that failed is shut down)")
        refs = [getattr(w, method).remote(*args) for w in self.workers]
        if not self.elastic:
            try:
                return self._gather(refs)
            except WorkerError:
                self.shutdown()
                raise
        while True:
            try:
                return self._gather(refs)
            except WorkerError as err:
                if not err.dead or (self.reset_limit is not None
                                    and self.resets >= self.reset_limit):
                    self.shutdown()
                    raise
                self.resets += 1
                self._reform(err.dead)
                refs = [getattr(w, method).remote(*args) for w in self.workers]

    def _reform(self, dead: Sequence[int]) -> None:
        """Kill the lost ranks' actors, start replacements up to max_workers, and form
        a new world: survivors first, in their old order."""
        ray = _ray()
        for r in dead:
            ray.kill(self.workers[r])
        keep = [r for r in range(len(self.workers)) if r not in set(dead)]
        actors = [self.workers[r] for r in keep]
        where = [self._where[r] for r in keep]
        fresh: List[Any] = []
        try:
            fresh = self._new_actors(self.num_workers - len(actors))
            wait = min(self.elastic_timeout, self.settings.placement_group_timeout_s)
            new_where = self._describe(fresh, wait)
            fresh, new_where = self._ready(fresh, new_where,
                                           max(0, self.min_workers - len(actors)))
            self._form(actors + fresh, where + new_where)
        except BaseException:
            # Too few workers, or the world could not form again: the job ends, as a
            # static one would, and no actor is left behind.
            self.workers = actors + fresh
            self.shutdown()
            raise

    def run(self, fn: Callable[..., Any], args: Optional[Sequence] = None,
            kwargs: Optional[Dict] = None) -> List[Any]:
        """fn(*args, **kwargs) on every worker; the results in rank order.

        Raises:
            WorkerError: a worker failed (its rank, node and actor named); in an elastic
                job, only a worker's own exception or a loss beyond reset_limit.
        """
        return self._call("run", fn, tuple(args or ()), dict(kwargs or {}))

    def execute(self, fn: Callable[[Any], Any]) -> List[Any]:
        """fn(executable) on every worker (the object made from start()'s
        executable_cls, or None); the results in rank order."""
        return self._call("execute", fn)

    def run_remote(self, fn: Callable[..., Any], args: Optional[Sequence] = None,
                   kwargs: Optional[Dict] = None) -> List[Any]:
        """fn(*args, **kwargs) on every worker, without waiting: Ray object refs in rank
        order (ray.get them; a failure is Ray's error, not a WorkerError)."""
        if not self.workers:
            raise RuntimeError("this RayExecutor is not started")
        return [w.run.remote(fn, tuple(args or ()), dict(kwargs or {})) for w in self.workers]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """fn(executable) on the rank-0 worker only."""
        if not self.workers:
            raise RuntimeError("this RayExecutor is not started")
        return _ray().get(self.workers[0].execute.remote(fn))

    def worker_info(self) -> List[Dict[str, Any]]:
        """Per rank: node_id, node_ip, hostname, pid and actor_id of its worker."""
        return [dict(w) for w in self._where]

    def shutdown(self) -> None:
        """Close the world (bounded) and end every worker and the placement group."""
        ray = _ray()
        workers, self.workers = self.workers, []
        if workers:
            refs = [w.leave.remote() for w in workers]
            try:
                ray.wait(refs, num_returns=len(refs), timeout=5.0)
            except Exception:  # noqa: BLE001 (dead actors: nothing to close)
                pass
            for w in workers:
                try:
                    ray.kill(w)
                except Exception:  # noqa: BLE001
                    pass
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
            self._pg = None
