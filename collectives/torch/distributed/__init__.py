"""The ``torch.distributed`` backend named "collectives".

``backend`` is the ``ProcessGroup`` torch talks to and its registration;
``_ops`` maps torch's collectives onto the core, ``_more`` the rarer ones
(sparse allreduce, monitored barrier), ``_work`` the ``Work`` and ``Future``
objects, ``_errors`` the wording torch's tests expect (gloo's).

Layer: a front end, beside the Horovod API of ``collectives.torch``; it may
import that package's basics, the rendezvous and the native core.
"""
