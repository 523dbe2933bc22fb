"""One error base class for the worker: ``except WorkerError`` catches each error the
worker side raises of its own, and each keeps the base it had, so ``except`` clauses
written for those still work."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousTimeoutError,
)

from rallypoint.client import DeadlineExceededError
from rallypoint.worker import (
    CoordinatorStoreError,
    JoinTimeoutError,
    StaleStoreRoundError,
    StoreTimeoutError,
    WorkerError,
)
from rallypoint.worker.elastic import CollectiveAbandoned
from rallypoint.worker.torchrun import (
    CoordinatorUnreachableRendezvousError,
    RendezvousSettingsError,
    RoundTimeoutError,
    TokenRefusedRendezvousError,
    WorkersStorePortError,
)


@pytest.mark.parametrize(
    ("error", "kept"),
    [
        (CoordinatorStoreError, dist.DistStoreError),
        (StoreTimeoutError, CoordinatorStoreError),
        (StaleStoreRoundError, CoordinatorStoreError),
        (JoinTimeoutError, DeadlineExceededError),
        (CollectiveAbandoned, RuntimeError),
        (RendezvousSettingsError, RendezvousError),
        (RendezvousSettingsError, ValueError),
        (CoordinatorUnreachableRendezvousError, RendezvousConnectionError),
        (TokenRefusedRendezvousError, RendezvousConnectionError),
        (RoundTimeoutError, RendezvousTimeoutError),
        (WorkersStorePortError, RendezvousError),
    ],
)
def test_each_worker_error_is_a_worker_error_and_keeps_its_base(
    error: type[Exception], kept: type[Exception]
) -> None:
    assert issubclass(error, WorkerError)
    assert issubclass(error, kept)


def test_a_store_error_is_caught_both_ways() -> None:
    for catch in (WorkerError, dist.DistStoreError, RuntimeError):
        with pytest.raises(catch):
            raise StaleStoreRoundError("round 3 is over", job="j", round_number=3)


def test_every_error_the_worker_defines_is_a_worker_error() -> None:
    import importlib
    import inspect
    import pkgutil

    import rallypoint.worker

    outside: list[str] = []
    for module_info in pkgutil.walk_packages(
        rallypoint.worker.__path__, rallypoint.worker.__name__ + "."
    ):
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            # Private ones (``_Short``, ``_Interrupted``) are control flow that never escapes.
            if (
                not name.startswith("_")
                and inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and not issubclass(value, WorkerError)
            ):
                outside.append(f"{module.__name__}.{name}")
    assert outside == []
