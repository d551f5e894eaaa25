"""collectives-bench: bandwidth tests of the collectives in the nccl-tests format.

Run as ``collectives-bench`` or ``python -m collectives.bench``. The package
keeps the benchmark apart from the library:

- :mod:`collectives.bench.driver`: the command line, the sweep of sizes and
  algorithms, the workers and the driver that starts them (and the peers);
- :mod:`collectives.bench.peers`: the same sweep through torch.distributed +
  Gloo and mpi4py, for ``--compare``;
- :mod:`collectives.bench.turns`: the turns in which the driver's jobs
  measure, size by size, so every library meets the same noisy minute;
- :mod:`collectives.bench.rows`: the results: rows, medians over runs,
  tables, comparisons, CSV/JSON/plot files and the ``--tune`` table.
"""
from .driver import main

__all__ = ["main"]
