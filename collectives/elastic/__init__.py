"""Elastic worlds: membership, shrink and grow, generations.

``worker`` is a worker's side of ``collectives-run --elastic`` (wait for the
newest generation that lists it, join it); ``membership`` agrees who is in
the next world when no launcher decides it (``collectives.shrink`` /
``grow``); ``reform`` turns an agreed membership into a new communicator of a
new generation.

Layer: above the rendezvous, below the front ends. It may import the
rendezvous, ``collectives.config`` and the native core.
"""
