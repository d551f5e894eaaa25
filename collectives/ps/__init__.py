"""A parameter server on the library's own transport: sync (with backup workers), async, SSP.

Some ranks serve, the others work. With S servers among N ranks, ranks
``0 .. N-S-1`` are the workers (worker index = rank) and the last S ranks the
servers; S comes from ``init(num_servers=S)`` or ``COLLECTIVES_PS_SERVERS``
(``collectives-run --servers S`` sets it; set it yourself under torchrun,
mpirun or srun). Every rank runs the same script::

    import collectives.ps as ps
    role = ps.init()
    shapes = [p.shape for p in params]
    if role.is_server:
        reports = ps.serve(shapes, ps.SGD(lr=0.1, momentum=0.9), mode="ssp", staleness=2)
    else:
        w = ps.worker(shapes)
        flat = w.start(initial_flat)          # worker 0's values; every worker pulls them
        for batch in data:
            flat = w.push_pull(gradient(flat, batch))
        w.finish()

``collectives.ps.torch.Optimizer`` wraps a torch optimizer in this. The
parameters are one flat float32 vector cut into S balanced contiguous pieces
(see ``Layout``); each server updates its piece with a numpy SGD or Adam
and answers per its mode (see ``collectives/ps/_server.py``). Each server
returns one ``StepReport`` per update: contributors, dropped late
gradients, staleness of each applied gradient.

``init(host_sum=True)`` sums per host (BytePS / Herring style): the workers
of one host reduce their gradients over shared memory to the host's first
worker, which pushes the sum once to each server (counted as a gradient of
each of them) and broadcasts the reply inside the host, so one message per
host crosses to a server and back instead of one per worker. Sync mode
without backup workers only: a backup drops the slowest *workers* of a
step, but a host's workers wait for each other before their sum leaves, so
a straggler would hold back its whole host and a backup could only drop
whole hosts; async and SSP apply each worker's gradient on the version it
read, which a sum of several workers no longer is. The workers of a host
must push the same number of times (as in an allreduce), and a worker's
failure ends its host's group (the server drops all of its workers).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterable, Optional

from ._client import PSError, Worker
from ._optim import SGD, Adam, DGCSGD
from ._server import MODES, Server, StepReport
from ._wire import Layout

__all__ = ["init", "serve", "worker", "Role", "Layout", "Server", "Worker", "StepReport",
           "SGD", "Adam", "DGCSGD", "PSError", "MODES", "ENV_SERVERS"]

ENV_SERVERS = "COLLECTIVES_PS_SERVERS"


@dataclasses.dataclass(frozen=True)
class Role:
    """This rank's part in the parameter server job.

    rank/size: world rank and size; num_servers/num_workers: how the world is split;
    index: the worker index (workers) or server index (servers);
    server_ranks: the world rank of each server.
    """

    rank: int
    size: int
    num_servers: int
    is_server: bool
    index: int
    groups: tuple = ()  # host_sum: the worker indices of each host, in host order

    @property
    def is_worker(self) -> bool:
        """True on the ranks that compute gradients."""
        return not self.is_server

    @property
    def num_workers(self) -> int:
        """How many ranks compute gradients."""
        return self.size - self.num_servers

    @property
    def server_ranks(self) -> list:
        """The world rank of each server (the last num_servers ranks)."""
        return list(range(self.num_workers, self.size))


_role: Optional[Role] = None
_links: dict = {}
_host: Any = None  # host_sum: this worker's host communicator (rank 0: the host's first worker)


def _servers_from_env() -> Optional[int]:
    text = os.environ.get(ENV_SERVERS, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{ENV_SERVERS}={text!r} is not an integer number of servers") from None


def init(num_servers: Optional[int] = None, timeout: Optional[float] = None,
         host_sum: bool = False) -> Role:
    """Join the world and make the server/worker links; returns this rank's Role.

    Args:
        num_servers: how many of the ranks serve (default: COLLECTIVES_PS_SERVERS).
        timeout: seconds to wait for every rank (default: COLLECTIVES_TIMEOUT).
        host_sum: the workers of a host sum their gradients before one push per host
            (see the module doc; sync mode without backup workers). Every rank passes
            the same value.

    Every rank of the job calls it once. ValueError (before any connection to a
    peer) unless 1 <= num_servers < world size.
    """
    global _role, _links, _host
    if _role is not None:
        return _role
    if num_servers is None:
        num_servers = _servers_from_env()
    if num_servers is None:
        raise ValueError(f"say how many ranks serve: ps.init(num_servers=S), {ENV_SERVERS}=S or "
                         f"collectives-run --servers S")
    import collectives
    from ._links import open_pairs
    from ..rendezvous import world as _world

    comm = collectives.init(timeout)
    size, rank = comm.size, comm.rank
    if not 1 <= num_servers < size:
        raise ValueError(f"{num_servers} servers in a world of {size} ranks: need 1 <= servers "
                         f"< {size} (at least one worker)")
    workers = size - num_servers
    is_server = rank >= workers
    groups: tuple = ()
    if host_sum:
        ids = comm._core.host_ids()[:workers]
        groups = tuple(tuple(w for w in range(workers) if ids[w] == h) for h in dict.fromkeys(ids))
    role = Role(rank, size, int(num_servers), is_server, rank - workers if is_server else rank,
                groups)
    peers = list(range(workers)) if is_server else role.server_ranks
    t = float(timeout) if timeout else _world._default_timeout()
    _links = open_pairs(rank, size, peers, is_server, t)
    if host_sum:  # a collective on the world: every rank, servers included, splits
        from .. import _core

        mine = next((i for i, g in enumerate(groups) if rank in g), _core.UNDEFINED)
        _host = _core.comm_split(comm._core, mine if not is_server else _core.UNDEFINED, rank, t)
    _world.add_finalize_hook(_close)
    _role = role
    return role


def _close() -> None:
    global _role, _links, _host
    for core in _links.values():
        core.close()
    _links, _role, _host = {}, None, None


def _layout(params: Iterable[Any], role: Role) -> Layout:
    return Layout([getattr(p, "shape", p) for p in params], role.num_servers)


def serve(params: Iterable[Any], optimizer: Any, mode: str = "sync", *, backup_workers: int = 0,
          staleness: int = 0, initial: Any = None, checkpoint: Optional[str] = None,
          on_step: Optional[Callable[[StepReport], None]] = None,
          server: Optional[Callable[[Server], None]] = None) -> list:
    """Run this rank's server until every worker has finished or failed; returns its StepReports.

    Args:
        params: the parameter tensors or their shapes, in the workers' order.
        optimizer: SGD(...) or Adam(...): the update the server applies.
        mode: "sync" (with backup_workers), "async" or "ssp" (with staleness).
        backup_workers: sync: apply the first num_workers - backup_workers gradients of a step.
        staleness: ssp: how many steps a worker may run ahead of the slowest.
        initial: this shard's starting values: a flat float32 vector of the whole model
            (default: worker 0's, sent by Worker.start).
        checkpoint: a path: load this shard from it if it exists (it wins over initial and
            worker 0's values) and save the shard there when serving ends.
        on_step: called with each StepReport as it happens.
        server: called with the Server before serving (e.g. to save it from another thread).
    """
    role = _require(server_side=True)
    layout = _layout(params, role)
    links = {w: _links[w] for w in range(role.num_workers)}
    groups = {g[0]: list(g) for g in role.groups if len(g) > 1}
    srv = Server(links, layout, role.index, optimizer, mode, backup_workers, staleness, on_step,
                 groups=groups)
    if initial is not None:
        import numpy as np
        srv.set_params(np.asarray(initial, dtype=np.float32).reshape(-1)[layout.shard(role.index)])
    path = None
    if checkpoint is not None:
        path = f"{checkpoint}.shard{role.index}.npz"
        if os.path.exists(path):
            srv.load(path)
    if server is not None:
        server(srv)
    reports = srv.serve()
    if path is not None:
        srv.save(path)
    return reports


def worker(params: Iterable[Any], compression: Any = "none",
           timeout: Optional[float] = None) -> Worker:
    """This worker's client of every server (see Worker: start, push_pull, pull, finish).

    Args:
        params: the parameter tensors or their shapes, in the same order on every rank.
        compression: "none", "fp16" (gradients travel as float16), "dgc" or a
            collectives.torch.dgc.DGC / TopKCompressor instance (sparse pushes: top-k with
            residuals; DGC's momentum is then the worker's, so the server's optimizer must
            not add its own: use ps.DGCSGD).
        timeout: seconds to wait for a server (default: COLLECTIVES_TIMEOUT).
    """
    role = _require(server_side=False)
    layout = _layout(params, role)
    links = {s: _links[r] for s, r in enumerate(role.server_ranks)}
    host = _host if _host is not None and _host.size > 1 else None
    return Worker(links, layout, role.index, role.server_ranks, compression, timeout,
                  num_workers=role.num_workers, host=host)


def _require(server_side: bool) -> Role:
    if _role is None:
        raise RuntimeError("call collectives.ps.init() first")
    if _role.is_server != server_side:
        raise RuntimeError(f"rank {_role.rank} is a {'server' if _role.is_server else 'worker'}: "
                           f"{'serve' if server_side else 'worker'}() is for "
                           f"{'servers' if server_side else 'workers'}")
    return _role
