"""Rendezvous: from the environment to a world communicator; ``blame`` tells ``collectives-run`` which rank a failure began at.

``env`` reads the launcher's variables (ours, torchrun's, Open MPI's, Slurm's,
...) into rank, size and a store address; ``store`` is the small
authenticated key-value store the ranks meet at (its server; ``store_client``
the client, ``store_wire`` what both send); ``auth`` holds the job
secret and the message authentication; ``world`` runs the rendezvous itself:
publish this rank's address, read the peers', and build the native
communicator.

Layer: just above the native core (``collectives._core``). It may import the
core and ``collectives.config``; never a front end, the elastic machinery or
the launcher.
"""

from . import blame  # noqa: E402,F401 (at exit, a failed rank's report for collectives-run)
