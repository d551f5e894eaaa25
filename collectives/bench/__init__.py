"""collectives-bench: bandwidth tests of the collectives in the nccl-tests format.

Run as ``collectives-bench`` or ``python -m collectives.bench``. The package
keeps the benchmark apart from the library:

- :mod:`collectives.bench.sweep`: what a worker measures (sizes, inputs, the
  backends, the sweep);
- :mod:`collectives.bench.driver`: the command line, a worker's run and
  report, and the driver that starts the workers (and the peers');
- :mod:`collectives.bench.peers`: which peers (torch.distributed + Gloo,
  mpi4py) can run here and how each is launched, for ``--compare``;
- :mod:`collectives.bench.peer_worker`: the same sweep through the peers;
- :mod:`collectives.bench.turns`: the turns in which the driver's jobs
  measure, size by size, so every library meets the same noisy minute;
- :mod:`collectives.bench.rows`: the results: rows, medians over runs,
  tables, comparisons, CSV/JSON/plot files and the ``--tune`` table.
"""
from .driver import main

__all__ = ["main"]
