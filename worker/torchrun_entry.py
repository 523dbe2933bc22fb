"""The ``torchrun.handlers`` entry point, kept free of imports.

torch's rendezvous registry loads its out-of-tree backends while it is itself being
imported, and ``rallypoint.worker.torchrun`` imports that registry: when a process imports
our backend module before torch's registry, the registry would find the module half-imported
and skip the backend. This module defines only the factory; the backend module is imported
when torchrun first creates a handler, long after every import finished.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousHandler,
        RendezvousHandlerCreator,
        RendezvousParameters,
    )


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torchrun's handler for ``--rdzv-backend=rallypoint`` (see ``worker/torchrun.py``)."""
    from .torchrun import create_handler as create

    return create(params)


def create_handler_factory() -> RendezvousHandlerCreator:
    """The ``torchrun.handlers`` entry point: torch calls it and registers what it returns."""
    return create_handler
