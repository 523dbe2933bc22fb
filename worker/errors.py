"""The worker's error base class: ``except WorkerError`` catches every error the training-side
integration raises of its own (a store call refused, no round in time, a rendezvous setting
that cannot be used, a collective given up).

Each of those errors also keeps the base it had before, so an ``except`` clause written for
it still works: a store's errors are ``torch.distributed.DistStoreError`` (what torch's
callers expect of a store), the elastic loop's join timeout is the client's
``DeadlineExceededError``, the torchrun backend's are torch's ``RendezvousError`` kinds.
``WorkerError`` is a mixin on purpose: it adds no state and no ``__init__``, so it combines
with any of those bases.
"""

from __future__ import annotations


class WorkerError(Exception):
    """Base of the errors rallypoint's worker side raises (see the module docstring)."""


__all__ = ["WorkerError"]
