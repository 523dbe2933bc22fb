"""The private torch APIs the worker reaches, in one place: when a torch release moves one,
this is the file to change. Each function says what it reaches and why the public API does
not do.
"""

from __future__ import annotations

from typing import Any

import torch

# snapshots and checkpoints


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
