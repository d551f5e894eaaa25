"""Training on Ray: a collectives world of Ray actors, and a Ray Train backend.

``RayExecutor`` follows ``horovod.ray.RayExecutor``: it starts N workers as
Ray actors (CPUs/GPUs per worker, a placement group to pack or spread them),
forms the world among them through the project's own store and job secret,
runs a function on every worker and returns the results in rank order, and
raises ``WorkerError`` naming the rank, node and actor of a worker that
fails. With ``min_workers``/``max_workers`` it is elastic: lost actors are
replaced and the world formed again (README, "Ray").

``collectives.ray.train`` (imports Ray Train) has ``CollectivesConfig``, a
``TorchConfig`` whose workers use the torch.distributed backend
"collectives".

Importing this package does not import Ray; using the executor does.
"""
from __future__ import annotations

from ._errors import WorkerError
from ._executor import RayExecutor, Settings
from ._worker import RayContext, RemoteError, context

__all__ = ["RayExecutor", "Settings", "WorkerError", "RemoteError", "RayContext", "context"]
