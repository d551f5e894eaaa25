"""Ray Train with the torch.distributed backend "collectives".

Ray Train's ``TorchConfig(backend=...)`` hands the name to
``torch.distributed.init_process_group`` on every worker, so a third-party
backend must be registered in the worker process before that call: Ray
Train has no other hook for it. ``CollectivesConfig`` is that TorchConfig:
on every worker, before the process group forms, it imports
``collectives.torch`` (which registers "collectives"), gives the workers one
job secret (the links authenticate with it) and clears rendezvous variables a
worker may have inherited from a ``collectives-run`` driver::

    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from collectives.ray.train import CollectivesConfig

    trainer = TorchTrainer(train_loop, torch_config=CollectivesConfig(),
                           scaling_config=ScalingConfig(num_workers=4))
    trainer.fit()

Plain ``TorchConfig(backend="collectives")`` works too when the workers
register the backend themselves: ``ray.init(runtime_env={
"worker_process_setup_hook": "collectives.ray.train.setup_worker",
"env_vars": {"COLLECTIVES_JOB_SECRET": ...}})``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from ray.train.torch import TorchConfig
from ray.train.torch.config import _TorchBackend

__all__ = ["CollectivesConfig", "setup_worker"]

# Rendezvous settings of a collectives-run job: a Ray worker started from such a driver
# inherits them, and the backend would then take that job's world for its own.
_INHERITED = ("COLLECTIVES_RANK", "COLLECTIVES_SIZE", "COLLECTIVES_LOCAL_RANK",
              "COLLECTIVES_LOCAL_SIZE", "COLLECTIVES_STORE_ADDR")


def setup_worker(secret: Optional[str] = None) -> None:
    """Make this process ready for backend="collectives": register the backend (import
    collectives.torch), drop inherited rendezvous variables, and set the job secret
    when one is given."""
    for name in _INHERITED:
        os.environ.pop(name, None)
    if secret:
        os.environ["COLLECTIVES_JOB_SECRET"] = secret
    import collectives.torch  # noqa: F401  (registers the "collectives" backend)


class _CollectivesBackend(_TorchBackend):
    """Ray Train's torch backend, with every worker set up for "collectives" first."""

    def on_start(self, worker_group: Any, backend_config: "CollectivesConfig") -> None:
        from collectives.rendezvous import auth as _auth

        secret = os.environ.get(_auth.SECRET_VAR) or _auth.generate_secret()
        worker_group.execute(setup_worker, secret=secret)
        super().on_start(worker_group, backend_config)


@dataclass
class CollectivesConfig(TorchConfig):
    """TorchConfig whose workers train over the torch.distributed backend "collectives".

    Args:
        backend: the process group backend (default "collectives").
        init_method: "env" (default) or "tcp", as TorchConfig.
        timeout_s: the process group's timeout in seconds, as TorchConfig.
    """

    backend: Optional[str] = "collectives"

    @property
    def backend_cls(self):
        """The Backend class Ray Train drives: sets the workers up, then TorchConfig's."""
        return _CollectivesBackend
