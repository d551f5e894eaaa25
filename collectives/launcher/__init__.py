"""The launcher: ``collectives-run`` and its elastic driver.

``cli`` starts the ranks of a job (local processes, or ``ssh`` to other
hosts), prefixes their output, fans out signals and returns the failed rank's
code; ``elastic_driver`` runs ``collectives-run --elastic``: it hosts the
job's store, watches the workers and publishes each generation of the world.

Layer: an engine, at the top. It may import the elastic machinery, the
rendezvous and ``collectives.config``; nothing in the library imports it.
"""
