"""The training state as checkpoints and memory snapshots save and load it: one state dict of
the model, the optimizer and a *progress* blob (step, sampler position and extra state), laid
out as torch.distributed.checkpoint (DCP) stores it.

Both worker/checkpoint.py (disk, broadcast) and worker/snapshots/ (memory) save what
:func:`capture` returns (or the same keys staged), load into what :func:`targets` returns and
hand the loaded state to :func:`install`; neither imports the other for it.

Step, sampler state and extra state travel as one opaque blob (``torch.save`` of a dict)
saved once (DCP deduplicates identical non-tensor items), so the extra state must be the same
on every rank (e.g. a learning-rate schedule), and, as with any checkpoint, trusted.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from .errors import WorkerError
from .sampler import ElasticSampler
from .torch_compat import local_tensor

# DCP state dict keys. The progress blob holds step, sampler state and extra state.
MODEL_KEY, OPTIMIZER_KEY, PROGRESS_KEY = "model", "optimizer", "progress"


class CheckpointError(WorkerError):
    """A checkpoint directory is missing, incomplete or not one of ours."""


def pack_progress(step: int, sampler: ElasticSampler | None, extra: Any) -> bytes:
    buffer = io.BytesIO()
    sampler_state = sampler.state_dict() if sampler is not None else None
    torch.save({"step": step, "sampler": sampler_state, "extra": extra}, buffer)
    return buffer.getvalue()


def capture(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    sampler: ElasticSampler | None,
    extra: Any,
) -> dict[str, Any]:
    """The state to save or send: this rank's view (its shards, for a sharded model)."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {
        MODEL_KEY: model_state,
        OPTIMIZER_KEY: optimizer_state,
        PROGRESS_KEY: pack_progress(step, sampler, extra),
    }


def presize_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, metadata: Metadata
) -> bool:
    """Give a fresh optimizer empty state tensors shaped as a stored state says (DCP's
    ``metadata``), so that ``get_state_dict`` need not create them by running a step of the
    optimizer on zero gradients (for AdamW at 64 MB of parameters a third of a restore here).
    Each parameter's state is laid out as the parameter itself (a DTensor sharded alike) when
    the stored tensor has its shape, a plain tensor when it is a scalar (a step count).
    Whether it did: nothing is touched unless the optimizer holds no state yet and every
    stored optimizer-state item of every parameter fits one of those two shapes (anything
    else is left to ``get_state_dict``'s own way)."""
    if optimizer.state:
        return False
    items = metadata.state_dict_metadata
    prefix = f"{OPTIMIZER_KEY}.state."
    stored: dict[str, dict[str, TensorStorageMetadata]] = {}
    names: dict[str, torch.Tensor] = dict(model.named_parameters())
    for key, item in items.items():
        if not key.startswith(prefix):
            continue
        name, _, field = key[len(prefix) :].rpartition(".")
        if name not in names or not isinstance(item, TensorStorageMetadata):
            return False
        stored.setdefault(name, {})[field] = item
    if not stored:
        return False
    wanted: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
    # Optimizers keep step counts on the CPU, but on the parameter's device when capturable
    # or fused (torch.optim's Adam family).
    on_device = any(g.get("capturable") or g.get("fused") for g in optimizer.param_groups)

    def scalar_device(parameter: torch.Tensor) -> torch.device:
        return parameter.device if on_device else torch.device("cpu")

    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for name, fields in stored.items():
        parameter = names[name]
        if id(parameter) not in in_optimizer:
            return False
        state: dict[str, torch.Tensor] = {}
        for field, item in fields.items():
            dtype = item.properties.dtype
            if tuple(item.size) == tuple(parameter.shape):
                state[field] = torch.empty_like(parameter, dtype=dtype, requires_grad=False)
            elif len(item.size) == 0:
                state[field] = torch.zeros((), dtype=dtype, device=scalar_device(parameter))
            else:
                return False
        wanted[parameter] = state
    for parameter, state in wanted.items():
        optimizer.state[parameter] = state
    return True


def targets(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, metadata: Metadata | None
) -> dict[str, Any]:
    """The state dict a restore loads into: this rank's view of the model and optimizer
    (the optimizer's state presized from ``metadata`` where it can be)."""
    if metadata is not None:
        presize_optimizer_state(model, optimizer, metadata)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {MODEL_KEY: model_state, OPTIMIZER_KEY: optimizer_state, PROGRESS_KEY: b""}


def _loaded_in_place(model: torch.nn.Module, loaded: dict[str, Any]) -> bool:
    """Every item of ``loaded`` (a model state dict) is one of the model's own tensors: the
    same memory, laid out alike (DCP loads into the state dict :func:`targets` made, and a
    model's state dict holds its parameters and buffers themselves, detached). Loading it
    then copies every tensor onto itself; for a DTensor that copy first works out its
    sharding, which a formation has just forgotten (torch_compat.forget_previous_world):
    most of a memory restore's own CPU time in a mesh job, measured."""
    live = model.state_dict()
    if live.keys() != loaded.keys():
        return False
    for key, tensor in live.items():
        value = loaded[key]
        if not isinstance(value, torch.Tensor) or type(value) is not type(tensor):
            return False
        if (
            isinstance(tensor, DTensor)
            and isinstance(value, DTensor)
            and (value.device_mesh != tensor.device_mesh or value.placements != tensor.placements)
        ):
            return False
        mine, theirs = local_tensor(tensor), local_tensor(value)
        if not (
            mine.untyped_storage().data_ptr() == theirs.untyped_storage().data_ptr()
            and mine.storage_offset() == theirs.storage_offset()
            and mine.shape == theirs.shape
            and mine.stride() == theirs.stride()
            and mine.dtype == theirs.dtype
        ):
            return False
    return True


def install(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    sampler: ElasticSampler | None,
) -> tuple[int, Any]:
    """Load a loaded or received state into the model, optimizer and sampler; returns the
    step and the extra state. A model state loaded in place (into the model's own tensors)
    is already installed: only the optimizer's (its hyperparameters are in the loaded
    state, not in its tensors) and the progress are."""
    model_state = state[MODEL_KEY]
    if _loaded_in_place(model, model_state):
        model_state = {}
    set_state_dict(
        model,
        optimizer,
        model_state_dict=model_state,
        optim_state_dict=state[OPTIMIZER_KEY],
    )
    progress: dict[str, Any] = torch.load(io.BytesIO(state[PROGRESS_KEY]), weights_only=False)
    if sampler is not None:
        if progress["sampler"] is None:
            raise CheckpointError("the checkpoint holds no sampler state")
        sampler.load_state_dict(progress["sampler"])
    return int(progress["step"]), progress["extra"]
