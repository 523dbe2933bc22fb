"""torch's private APIs the worker uses, in one place.

Each name below reaches into a part of torch that is not its public API and may move between
releases: when a torch release moves one, this is the file to change, and each says what it
reaches and why the public API does not do (checked with torch 2.13). The rest of the worker
imports them from here, never from torch's private modules.

Keep the imports at the top light: the torchrun backend's agent imports this module, and it
must not pay for FSDP (about 600 modules) or import ``torch.distributed.checkpoint`` while
torch itself may still be importing it (worker/__init__.py says why). Heavier names load on
first use: inside the functions, or through the module's ``__getattr__``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
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


# ----------------------------------------------------------------------------------------------
# snapshots and checkpoints
# ----------------------------------------------------------------------------------------------


def forget_previous_world() -> None:
    """Clear torch's DTensor caches of the calling thread after the world was formed again.

    torch caches the sharding of DTensor operations by their specs, and a spec's mesh
    compares equal to the previous world's (same shape, ranks 0..n-1) although this
    process's coordinate in it may have changed; a cached answer then hands new DTensors
    the previous world's mesh, whose coordinate is stale: DCP reads the wrong shard (seen
    as a size mismatch, or worse). Call it after each re-formation, before the model of the
    new world is made (the elastic loop does). torch offers no public way to clear them."""
    from torch.distributed.tensor import DTensor as _DTensor
    from torch.distributed.tensor import _redistribute

    clear_native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_native is not None:  # torch's C++ fast path keeps a cache of its own
        clear_native()
    propagator: Any = _DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    propagator._propagate_tensor_meta_cached.cache_clear()
    _redistribute._gen_transform_infos.cache_clear()


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard as it is held (``_local_tensor``), a plain tensor itself:
    ``to_local()`` goes through an autograd function, too slow for a check run on every
    tensor at every snapshot (worker/snapshots/staging.py)."""
    from torch.distributed.tensor import DTensor

    local = getattr(tensor, "_local_tensor", None) if isinstance(tensor, DTensor) else tensor
    if not isinstance(local, torch.Tensor):
        raise TypeError("a DTensor without a local tensor")
    return local


def module_registries(
    module: torch.nn.Module,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], set[str]]:
    """The dicts a module registers its parameters, buffers and children in, and the names of
    its non-persistent buffers (``_parameters``, ``_buffers``, ``_modules``,
    ``_non_persistent_buffers_set``): the objects themselves, so that a later check sees
    whether they were replaced or changed, which the public iterators cannot tell (a
    snapshot's plan relies on it: worker/snapshots/staging.py)."""
    return (
        module._parameters,
        module._buffers,
        module._modules,
        module._non_persistent_buffers_set,
    )


__all__ = [
    "AllGather",
    "ReduceScatter",
    "Store",
    "forget_previous_world",
    "local_tensor",
    "module_registries",
    "reset_group_count",
    "role_local_world_size",
]


def local_offset_and_shape(tensor: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Where a DTensor's local piece sits in the global tensor: its global offset and local
    shape (worker/replica_restore.py keys pieces by them). torch's own rule, the one DCP's
    planners use (``torch.distributed.tensor._utils.compute_local_shape_and_global_offset``);
    the public API gives the local shape only."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(
        tensor.shape, tensor.device_mesh, tensor.placements
    )
    return tuple(int(o) for o in offset), tuple(int(s) for s in shape)


def replicate_over(model: torch.nn.Module, mesh: Any) -> None:
    """Replicate ``model`` over the 1-D device mesh ``mesh`` (data parallel, gradients
    all-reduced), composable with tensor-parallel DTensors: FSDP2's ``replicate``
    (``torch.distributed._composable.replicate_with_fsdp``), which torch 2.13 does not export
    publicly; DDP does not take DTensor parameters (worker/mesh_train.py --replicate-dp)."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    replicate(model, mesh=mesh)
