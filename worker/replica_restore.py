"""A sharded model's state restored from the survivors that hold it: no rollback (REPLICAS).

Theory of operation. A job whose state is replicated across units and sharded only inside one
(tensor parallel inside a unit and replicated over data parallel, or HSDP whose shard group is
the unit) keeps a whole replica in every unit. When a unit is lost, the survivors at the most
advanced step hold, for every unit-local position, the same shard. Each piece of state is
named by its layout, a ``ShardKey`` (name, global offset, local shape, dtype), which says
where the piece sits in the global tensor whatever the world: the same key in two worlds is
the same data.

- Before a formation builds the new world's model (``TrainState.build`` replaces it), a
  survivor takes :func:`held_state` of its model and optimizer: every local tensor keyed by
  its layout, and the optimizer's hyperparameters. Nothing is copied; the old tensors stay
  alive until the restore is done.
- Every rank then says what it holds and what it needs (:func:`model_pieces` of the new
  model) in the ``PeerState`` the restore gathers anyway; ``choose_restore_source`` makes
  the same ``ReplicaPlan`` on every rank (restore_choice.py).
- :func:`restore_from_replicas` carries the plan out: the lowest-ranked survivor at that
  step broadcasts the step, sampler position, extra state and hyperparameters (one small
  object broadcast); every rank keeps what it holds itself and receives the rest from the
  holders the plan names, one point-to-point message per piece, straight into the new
  model's and optimizer's tensors, bit for bit. The new optimizer's state
  is made in the layout of its parameters before it is filled.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from .restore_choice import MODEL_PREFIX, OPTIMIZER_PREFIX, ReplicaPlan, ShardKey
from .sampler import ElasticSampler
from .state_io import CheckpointError, pack_progress
from .torch_compat import local_offset_and_shape, local_tensor


@dataclass(frozen=True, slots=True)
class HeldState:
    """A survivor's state as the previous world laid it out. Invariant: every key's tensor is
    the local piece that key names (shape and dtype as the key says)."""

    pieces: Mapping[ShardKey, torch.Tensor]
    # The optimizer's param_groups without their parameters (learning rate, betas, ...).
    hyperparameters: tuple[dict[str, Any], ...]

    @property
    def layout(self) -> tuple[ShardKey, ...]:
        return tuple(sorted(self.pieces))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r} in a replica plan")
    return dtype


def _place(tensor: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The global offset and local shape of this rank's piece of ``tensor``."""
    if isinstance(tensor, DTensor):
        return local_offset_and_shape(tensor)
    return (0,) * tensor.dim(), tuple(tensor.shape)


def _key(name: str, tensor: torch.Tensor) -> ShardKey:
    offset, shape = _place(tensor)
    return (name, offset, shape, _dtype_name(tensor.dtype))


def model_pieces(model: torch.nn.Module) -> dict[ShardKey, torch.Tensor]:
    """Every local piece of ``model``'s parameters and buffers, keyed by its layout."""
    pieces: dict[ShardKey, torch.Tensor] = {}
    named = [*model.named_parameters(), *model.named_buffers()]
    for name, tensor in named:
        pieces[_key(MODEL_PREFIX + name, tensor)] = local_tensor(tensor.detach())
    return pieces


def held_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> HeldState | None:
    """What a survivor holds, before the new world's model replaces it; None when some of the
    optimizer's state is not a tensor (nothing this restore knows how to place) or the
    optimizer steps a parameter the module does not hold (below)."""
    pieces = model_pieces(model)
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    # Every parameter the optimizer steps must be the module's own: FSDP2 swaps unsharded
    # tensors into a module during its forward pass, and a step given up there leaves them
    # (their data may be an abandoned all-gather's). Such a state is not offered.
    optimized = [p for group in optimizer.param_groups for p in group["params"]]
    if any(id(parameter) not in names for parameter in optimized):
        return None
    for parameter, state in optimizer.state.items():
        name = names.get(id(parameter))
        if name is None:
            return None
        for field, value in state.items():
            if not isinstance(value, torch.Tensor):
                return None
            key = _key(f"{OPTIMIZER_PREFIX}{name}.{field}", value)
            pieces[key] = local_tensor(value.detach())
    hyperparameters = tuple(
        {key: value for key, value in group.items() if key != "params"}
        for group in optimizer.param_groups
    )
    return HeldState(pieces, hyperparameters)


def _optimizer_pieces(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, keys: list[ShardKey]
) -> dict[ShardKey, torch.Tensor]:
    """Make the optimizer state ``keys`` name (its parameters' layout) and return its pieces."""
    parameters = dict(model.named_parameters())
    # Optimizers keep step counts on the CPU, but on the parameter's device when capturable
    # or fused (torch.optim's Adam family): as state_io.presize_optimizer_state.
    on_device = any(g.get("capturable") or g.get("fused") for g in optimizer.param_groups)
    pieces: dict[ShardKey, torch.Tensor] = {}
    for key in keys:
        name, _offset, shape, dtype_name = key
        parameter_name, _, field = name[len(OPTIMIZER_PREFIX) :].rpartition(".")
        parameter = parameters[parameter_name]
        dtype = _dtype(dtype_name)
        if shape == () and parameter.dim() != 0:
            device = parameter.device if on_device else torch.device("cpu")
            value = torch.zeros((), dtype=dtype, device=device)
        else:
            value = torch.empty_like(parameter.detach(), dtype=dtype)
        optimizer.state[parameter][field] = value
        pieces[key] = local_tensor(value)
    return pieces


def restore_from_replicas(
    plan: ReplicaPlan,
    held: HeldState | None,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    extra: Any,
    sampler: ElasticSampler | None,
    process_group: dist.ProcessGroup | None = None,
) -> tuple[int, Any, int]:
    """Carry ``plan`` out on this rank (module docstring); returns the step, the extra state
    and the bytes this rank received. Collective. ``held``: this rank's previous state (None
    for a newcomer); ``step`` and ``extra``: its own, sent if it is the plan's
    ``progress_rank``; ``optimizer`` must be fresh (no state)."""
    me = dist.get_rank()
    payload: list[Any] = [None]
    if me == plan.progress_rank:
        if held is None:
            raise AssertionError("the progress rank of a replica plan holds nothing")
        payload = [(pack_progress(step, sampler, extra), held.hyperparameters)]
    dist.broadcast_object_list(payload, src=plan.progress_rank, group=process_group)
    progress_blob, hyperparameters = payload[0]

    mine = [(sender, key) for receiver, sender, key in plan.transfers if receiver == me]
    targets = model_pieces(model)
    optimizer_keys = [key for _, key in mine if key[0].startswith(OPTIMIZER_PREFIX)]
    if optimizer.state:
        raise AssertionError("restore_from_replicas needs a fresh optimizer")
    targets.update(_optimizer_pieces(model, optimizer, optimizer_keys))

    # Messages: one per piece, between each sender and receiver in the plan's (sorted) order,
    # tagged by its place in that order; sent from the held tensor and received into the new
    # one where it is contiguous (no staging copy: half of a restore's time, measured).
    outgoing: dict[int, list[ShardKey]] = {}
    incoming: dict[int, list[ShardKey]] = {}
    for receiver, sender, key in plan.transfers:
        if sender == receiver:
            continue
        if sender == me:
            outgoing.setdefault(receiver, []).append(key)
        if receiver == me:
            incoming.setdefault(sender, []).append(key)

    works: list[dist.Work] = []
    staged: list[tuple[torch.Tensor, ShardKey]] = []
    bytes_received = 0
    for peer in sorted(set(outgoing) | set(incoming)):
        for tag, key in enumerate(outgoing.get(peer, [])):
            if held is None:
                raise AssertionError("a replica plan sends from a rank that holds nothing")
            work = dist.isend(held.pieces[key].contiguous(), dst=peer, group=process_group, tag=tag)
            assert work is not None
            works.append(work)
        for tag, key in enumerate(incoming.get(peer, [])):
            target = targets[key]
            if not target.is_contiguous():
                target = torch.empty(key[2], dtype=_dtype(key[3]))
                staged.append((target, key))
            work = dist.irecv(target, src=peer, group=process_group, tag=tag)
            assert work is not None
            works.append(work)
            bytes_received += target.numel() * target.element_size()
    with torch.no_grad():
        for sender, key in mine:
            if sender == me:
                if held is None:
                    raise AssertionError("a replica plan keeps a piece a newcomer does not hold")
                targets[key].copy_(held.pieces[key])
        for work in works:
            work.wait()
        for buffer, key in staged:
            targets[key].copy_(buffer)

    if len(hyperparameters) != len(optimizer.param_groups):
        raise CheckpointError(
            f"the survivors' optimizer has {len(hyperparameters)} parameter groups, this "
            f"rank's {len(optimizer.param_groups)}"
        )
    for group, settings in zip(optimizer.param_groups, hyperparameters, strict=True):
        group.update(settings)
    progress: dict[str, Any] = torch.load(io.BytesIO(progress_blob), weights_only=False)
    if sampler is not None:
        if progress["sampler"] is None:
            raise CheckpointError("the survivors sent no sampler state")
        sampler.load_state_dict(progress["sampler"])
    return int(progress["step"]), progress["extra"], bytes_received
