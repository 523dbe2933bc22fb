"""torch's private APIs the worker uses, in one place.

Each name below reaches into a part of torch that is not its public API and may move between
releases: when a torch upgrade breaks one, this module is the one to change, and the comment
on each says what it is for and what it was measured or checked with (torch 2.13). The rest
of the worker imports them from here, never from torch's private modules.

Keep the imports at the top light: the torchrun backend's agent imports this module, and it
must not pay for FSDP (about 600 modules) or import ``torch.distributed.checkpoint`` while
torch itself may still be importing it (worker/__init__.py says why). Heavy names load on
first use, through the module's ``__getattr__``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch._C._distributed_c10d import Store
from torch.distributed import distributed_c10d

# ----------------------------------------------------------------------------------------------
# elastic and torchrun
# ----------------------------------------------------------------------------------------------

# ``Store`` (above): the c10d store base class, to subclass (worker/store.py).
# ``torch.distributed.Store`` is the same class at run time, but torch's type stubs do not
# declare it there, so mypy would see ``Any`` and refuse the subclass.

if TYPE_CHECKING:
    # FSDP2's custom collective interfaces (``FSDPModule.set_custom_all_gather`` and
    # ``set_custom_reduce_scatter`` take their instances): worker/elastic/collectives.py.
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter


def __getattr__(name: str) -> Any:
    # FSDP2's interfaces load on first use (see the module docstring).
    if name not in ("AllGather", "ReduceScatter"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from torch.distributed.fsdp._fully_shard import _fsdp_api

    return getattr(_fsdp_api, name)


def reset_group_count() -> None:
    """Start torch's naming of unnamed process groups from zero again.

    torch names unnamed groups by a per-process counter that only destroying the default
    group resets; an init that failed half-way (its round ended) leaves it advanced, and
    ranks whose counters differ never find each other's gloo keys. The elastic loop calls
    this before every round's ``init_process_group`` (worker/elastic/formation.py)."""
    distributed_c10d._world.group_count = 0


def role_local_world_size(role_info: bytes) -> int:
    """The local world size in a torchrun agent's serialised role info (the value torch's
    ``SimpleElasticAgent._assign_worker_ranks`` sets under ``torchelastic/role_info/<rank>``;
    worker/torchrun_store.py answers the rank assignment with it once a round is over)."""
    from torch.distributed.elastic.agent.server.api import _RoleInstanceInfo

    return int(_RoleInstanceInfo.deserialize(role_info).local_world_size)


__all__ = ["AllGather", "ReduceScatter", "Store", "reset_group_count", "role_local_world_size"]
