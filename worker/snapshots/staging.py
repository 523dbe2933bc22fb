"""The copy a memory snapshot makes of the training state, mostly while training goes on.

Theory of operation. A snapshot must be a consistent copy of the state at one step, and
training may not go on changing the state while it is copied; holding training for the whole
copy cost about 0.2-0.4 s per GB here (67 MB a rank, three ranks copying at once on two
cores). Most of the state only changes in ``optimizer.step()``: the parameters (FSDP2's
sharded parameters too: forward and backward all-gather them into other memory and write
gradients, never the shards) and the optimizer's state. So a snapshot (:func:`plan_copy`)
copies at once only what forward may change (the model's buffers, e.g. BatchNorm's running
statistics: every model tensor that is not a parameter) and leaves the rest to a background
thread (:meth:`DeferredCopy.run`, the protection thread's first work). A pre-hook on the
optimizer's ``step`` (:meth:`DeferredCopy.wait`) holds the next step until that copy is
done; with a step longer than the copy, training is never held for it. What it was held
(the copy made at once, plus any wait in the hook) is the snapshot's blocked time.

A caller that changes parameters or optimizer state outside ``optimizer.step()`` (an EMA
written into the parameters, a manual ``param.data`` edit) must call
``MemorySnapshots.copied()`` first, or take snapshots with ``overlap=False`` (everything
copied at once).

The copies land in staging buffers kept from one snapshot to the next (:class:`Stager`): a
copy into memory already touched runs several times faster than a clone into fresh pages
(measured here: 9.3 GB/s against 1.6 GB/s). A buffer is reused only once the snapshot that
last used it was protected (``MemorySnapshots.take`` never starts one before).

Finding what to copy costs too: ``get_state_dict`` and the walk over its answer took about
2 ms a snapshot for a 16-layer FSDP2 model, more than the copy left to the foreground. The
first snapshot of a (model, optimizer) makes a :class:`StatePlan` of it (each tensor's
staging buffer and where the tensor is registered); later ones check in about 0.2 ms that
the plan still holds (same modules, parameters, buffers and optimizer state, the same
tensor objects over the same memory) and stage from it, or capture in full again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ..torch_compat import local_tensor, module_registries

# (staging buffer, what to copy into it)
Copy = tuple[torch.Tensor, torch.Tensor]


class Stager:
    """Staging buffers for the state's tensors, kept from one snapshot to the next, and the
    DTensors wrapping them (made once per world)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        # path -> (the buffer wrapped, the DTensor wrapping it)
        self._wrappers: dict[tuple[Any, ...], tuple[torch.Tensor, DTensor]] = {}
        # How the last full capture's state is staged again, while it holds.
        self._plan: StatePlan | None = None
        # Snapshots staged by the plan, and in full (tests and debugging).
        self.planned = 0
        self.captured = 0

    def stage_state(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        capture: Callable[[], tuple[dict[str, Any], dict[str, Any]]],
        copies: list[Copy],
        deferred: list[Copy] | None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The model's and optimizer's state staged (``capture`` returns them as
        ``get_state_dict`` does; it is called only when the plan made from its last answer
        no longer holds), the copies into the staging buffers appended as :meth:`stage`
        appends them (the model's parameters and the optimizer's state to ``deferred``)."""
        plan = self._plan
        if plan is not None and plan.holds(model, optimizer):
            self.planned += 1
            return plan.stage(copies, deferred)
        self.captured += 1
        model_state, optimizer_state = capture()
        with torch.no_grad():  # a DTensor's local shard without autograd's bookkeeping
            in_step = self.only_in_step(model)
            staged_model = self.stage(model_state, copies, deferred, in_step, (0,))
            staged_optimizer = self.stage(optimizer_state, copies, deferred, lambda _: True, (1,))
            self._plan = StatePlan.make(
                model,
                optimizer,
                model_state,
                optimizer_state,
                staged_model,
                staged_optimizer,
                [*copies, *(deferred or ())],
                in_step,
            )
        return staged_model, staged_optimizer

    @staticmethod
    def only_in_step(model: torch.nn.Module) -> Callable[[torch.Tensor], bool]:
        """Whether a tensor of the model's state dict changes only in ``optimizer.step()``:
        it lives in a parameter's memory (a state dict's value shares it); every other model
        tensor (a buffer) may change in forward. (Under ``torch.no_grad()``: cheap then.)"""
        storages = {storage_of(p) for p in model.parameters()}
        return lambda tensor: storage_of(tensor) in storages

    @staticmethod
    def _fits(buffer: torch.Tensor, tensor: torch.Tensor) -> bool:
        return (
            buffer.shape == tensor.shape
            and buffer.dtype == tensor.dtype
            and buffer.device == tensor.device
            and buffer.stride() == tensor.stride()
        )

    def stage(
        self,
        obj: Any,
        copies: list[Copy],
        deferred: list[Copy] | None,
        defer: Callable[[torch.Tensor], bool],
        path: tuple[Any, ...] = (),
    ) -> Any:
        """``obj`` with every tensor replaced by its staging buffer (a DTensor by a DTensor
        wrapping one); the copies into them are appended to ``deferred`` for tensors
        ``defer`` names (when ``deferred`` is not None), else to ``copies``."""
        if isinstance(obj, DTensor):
            local = obj.to_local()
            buffer = self._buffer(path, local, copies, deferred, defer)
            wrapped = self._wrappers.get(path)
            if wrapped is not None and wrapped[0] is buffer:
                return wrapped[1]
            with torch.no_grad():
                staged = DTensor.from_local(
                    buffer,
                    obj.device_mesh,
                    obj.placements,
                    run_check=False,
                    shape=obj.shape,
                    stride=obj.stride(),
                )
            self._wrappers[path] = (buffer, staged)
            return staged
        if isinstance(obj, torch.Tensor):
            return self._buffer(path, obj, copies, deferred, defer)
        if isinstance(obj, dict):
            return {
                key: self.stage(value, copies, deferred, defer, (*path, key))
                for key, value in obj.items()
            }
        if isinstance(obj, list):
            return [
                self.stage(value, copies, deferred, defer, (*path, i))
                for i, value in enumerate(obj)
            ]
        if isinstance(obj, tuple):
            return tuple(
                self.stage(value, copies, deferred, defer, (*path, i))
                for i, value in enumerate(obj)
            )
        return obj

    def _buffer(
        self,
        path: tuple[Any, ...],
        tensor: torch.Tensor,
        copies: list[Copy],
        deferred: list[Copy] | None,
        defer: Callable[[torch.Tensor], bool],
    ) -> torch.Tensor:
        tensor = tensor.detach()
        buffer = self._buffers.get(path)
        if buffer is None or not self._fits(buffer, tensor):
            buffer = self._buffers[path] = torch.empty_strided(
                tensor.size(), tensor.stride(), dtype=tensor.dtype, device=tensor.device
            )
        (deferred if deferred is not None and defer(tensor) else copies).append((buffer, tensor))
        return buffer


def copy_all(copies: list[Copy]) -> None:
    with torch.no_grad():
        for buffer, tensor in copies:
            buffer.copy_(tensor)


def storage_of(tensor: torch.Tensor) -> int:
    """The address of the memory a tensor (a DTensor's local shard) lives in."""
    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    return int(tensor.untyped_storage().data_ptr())


class DeferredCopy:
    """The part of a snapshot's copy made in the background, and the training thread's wait
    for it (the optimizer's step pre-hook)."""

    def __init__(self, copies: list[Copy]) -> None:
        self._copies = copies
        self._cond = threading.Condition()
        self._done = False
        self._waiting = 0
        self._waited_s = 0.0

    def run(self) -> None:
        """Make the copies (on the background thread); the waiters go on even if it fails."""
        try:
            copy_all(self._copies)
        finally:
            with self._cond:
                self._done = True
                self._copies = []
                self._cond.notify_all()

    def wait(self) -> float:
        """Wait for the copy (the training thread); how long it waited."""
        with self._cond:
            if self._done:
                return 0.0
            self._waiting += 1
            started = time.monotonic()
            self._cond.wait_for(lambda: self._done)
            waited = time.monotonic() - started
            self._waited_s += waited
            self._waiting -= 1
            self._cond.notify_all()
            return waited

    def waited_s(self) -> float:
        """How long the training thread waited for this copy, once every wait that began
        before it was done has ended (call after :meth:`run`)."""
        with self._cond:
            self._cond.wait_for(lambda: self._waiting == 0)
            return self._waited_s


def state_bytes(obj: Any) -> int:
    """The bytes of the tensors in a state dict (a DTensor's local shard)."""
    if isinstance(obj, DTensor):
        local = obj.to_local()
        return local.numel() * local.element_size()
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(value) for value in obj.values())
    if isinstance(obj, list | tuple):
        return sum(state_bytes(value) for value in obj)
    return 0


# -- the plan: staging again without walking the state ----------------------------------------

# A tensor as the plan remembers it: its memory, layout and type. Same memory, same layout:
# a copy from it reads what the state holds now.
_Layout = tuple[int, torch.Size, tuple[int, ...], int, torch.dtype]


def _layout(tensor: torch.Tensor) -> _Layout:
    return (
        tensor.data_ptr(),
        tensor.shape,
        tensor.stride(),
        int(tensor.storage_offset()),
        tensor.dtype,
    )


# Where a tensor is registered: ``owner[name]`` (a module's parameters or buffers dict,
# or a parameter's optimizer state) holds ``tensor``.
_Registration = tuple[Mapping[Any, Any], Any, torch.Tensor]


@dataclass(slots=True)
class _Source:
    """One tensor of the state: everywhere it is registered (tied weights: in several
    modules), its local memory's layout, and the copy from it into its staging buffer."""

    registrations: tuple[_Registration, ...]
    layout: _Layout
    copy: Copy
    later: bool

    def holds(self) -> bool:
        for owner, name, registered in self.registrations:
            if owner.get(name) is not registered:
                return False
        return _layout(local_tensor(self.registrations[0][2])) == self.layout


@dataclass(slots=True)
class _ModuleShape:
    module: torch.nn.Module
    children: tuple[torch.nn.Module, ...]
    parameters_dict: dict[str, Any]
    buffers_dict: dict[str, Any]
    parameters: int
    buffers: int
    non_persistent: int

    @classmethod
    def of(cls, module: torch.nn.Module) -> _ModuleShape:
        parameters, buffers, children, non_persistent = module_registries(module)
        return cls(
            module,
            tuple(children.values()),
            parameters,
            buffers,
            len(parameters),
            len(buffers),
            len(non_persistent),
        )

    def holds(self) -> bool:
        parameters, buffers, children, non_persistent = module_registries(self.module)
        return (
            parameters is self.parameters_dict
            and buffers is self.buffers_dict
            and len(parameters) == self.parameters
            and len(buffers) == self.buffers
            and len(non_persistent) == self.non_persistent
            and len(children) == len(self.children)
            and all(a is b for a, b in zip(children.values(), self.children, strict=True))
        )


_PLAIN = (int, float, bool, str, type(None))


class StatePlan:
    """How to stage one (model, optimizer)'s state again without ``get_state_dict`` and
    the walk over what it returns (about 2 ms a snapshot for a 16-layer FSDP2 model here,
    most of what a snapshot held training for): made from one full capture, it knows each
    tensor's staging buffer and where the tensor is registered. Before each use,
    :meth:`holds` checks (about 1 us a tensor) that every module still has the same
    children, parameters and buffers, every tensor is still the object registered wherever
    it was (tied weights stay tied), over the same memory with the same layout, and the
    optimizer has the same groups of the same parameters, each with the same state dict
    holding the same keys; anything else changed and the snapshot
    takes the full path (and makes a new plan). Hyperparameters (a scheduler's learning
    rate), non-tensor optimizer state and everything outside the model and optimizer are
    read afresh each time."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        modules: list[_ModuleShape],
        sources: list[_Source],
        staged_model: dict[str, Any],
        staged_state: dict[str, dict[str, Any]],
        state_params: dict[str, tuple[torch.nn.Parameter, dict[str, Any]]],
        plain_state: dict[str, list[str]],
        groups: list[tuple[list[Any], list[str]]],
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self._modules = modules
        self._sources = sources
        self._staged_model = staged_model
        self._staged_state = staged_state
        self._state_params = state_params
        self._plain_state = plain_state
        self._groups = groups
        self._state_sizes = {name: len(staged) for name, staged in staged_state.items()}

    @classmethod
    def make(
        cls,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        model_state: Mapping[str, Any],
        optimizer_state: Mapping[str, Any],
        staged_model: dict[str, Any],
        staged_optimizer: Mapping[str, Any],
        copies: list[Copy],
        in_step: Callable[[torch.Tensor], bool],
    ) -> StatePlan | None:
        """The plan of a full capture (``get_state_dict``'s model and optimizer state, what
        :meth:`Stager.stage` made of them and the copies it listed; ``in_step``: whether a
        model tensor changes only in ``optimizer.step()``), or None when the state has
        anything the plan does not follow (it is then captured in full every time)."""
        # By the buffer's memory: a DTensor made from a buffer may wrap an alias of it.
        copy_of = {_layout(buffer): (buffer, tensor) for buffer, tensor in copies}

        def source(
            registrations: tuple[_Registration, ...], staged: Any, later: bool
        ) -> _Source | None:
            if not isinstance(staged, torch.Tensor):
                return None
            found = copy_of.get(_layout(local_tensor(staged)))
            if found is None:
                return None
            layout = _layout(local_tensor(registrations[0][2]))
            if _layout(found[1]) != layout:
                return None
            return _Source(registrations, layout, found, later)

        modules = [_ModuleShape.of(module) for module in model.modules()]
        registered: dict[_Layout, list[_Registration]] = {}
        for shape in modules:
            for owner in (shape.parameters_dict, shape.buffers_dict):
                for name, tensor in owner.items():
                    if tensor is not None:
                        layout = _layout(local_tensor(tensor))
                        registered.setdefault(layout, []).append((owner, name, tensor))
        sources: list[_Source] = []
        for key, value in model_state.items():
            if not isinstance(value, torch.Tensor) or key not in staged_model:
                return None
            found = registered.get(_layout(local_tensor(value)))
            if found is None:
                return None
            made = source(tuple(found), staged_model[key], in_step(found[0][2]))
            if made is None:
                return None
            sources.append(made)

        groups_state = optimizer_state.get("param_groups")
        state = optimizer_state.get("state")
        if set(optimizer_state) != {"state", "param_groups"} or not isinstance(state, Mapping):
            return None
        if not isinstance(groups_state, list) or len(groups_state) != len(optimizer.param_groups):
            return None
        groups: list[tuple[list[Any], list[str]]] = []
        by_name: dict[str, torch.nn.Parameter] = {}
        for stored, group in zip(groups_state, optimizer.param_groups, strict=True):
            names = stored.get("params")
            params = list(group["params"])
            if not isinstance(names, list) or len(names) != len(params):
                return None
            if any(isinstance(value, torch.Tensor) for value in group.values()):
                return None  # a tensor setting (a capturable lr) is copied by the full path
            groups.append((params, list(names)))
            by_name.update(zip(names, params, strict=True))
        staged_state = staged_optimizer["state"]
        plain_state: dict[str, list[str]] = {}
        state_params: dict[str, tuple[torch.nn.Parameter, dict[str, Any]]] = {}
        for name, values in state.items():
            param = by_name.get(name)
            own = optimizer.state.get(param) if param is not None else None
            if param is None or own is None or set(own) != set(values):
                return None
            state_params[name] = (param, own)
            for key, value in values.items():
                if isinstance(value, torch.Tensor):
                    if own[key] is not value:
                        return None
                    made = source(((own, key, value),), staged_state[name][key], True)
                    if made is None:
                        return None
                    sources.append(made)
                elif isinstance(value, _PLAIN):
                    plain_state.setdefault(name, []).append(key)
                else:
                    return None
        if len(state) != len(optimizer.state):
            return None
        return cls(
            model,
            optimizer,
            modules,
            sources,
            dict(staged_model),
            {name: dict(values) for name, values in staged_state.items()},
            state_params,
            plain_state,
            groups,
        )

    def holds(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bool:
        """Whether the state is still laid out as planned (see the class docstring)."""
        if model is not self.model or optimizer is not self.optimizer:
            return False
        if len(optimizer.param_groups) != len(self._groups):
            return False
        for group, (params, _) in zip(optimizer.param_groups, self._groups, strict=True):
            if any(isinstance(value, torch.Tensor) for value in group.values()):
                return False
            current = group["params"]
            if len(current) != len(params) or any(
                a is not b for a, b in zip(current, params, strict=True)
            ):
                return False
        state = optimizer.state
        if len(state) != len(self._state_params):
            return False
        for name, (param, planned) in self._state_params.items():
            own = state.get(param)
            if own is not planned or len(own) != self._state_sizes[name]:
                return False
        for name, keys in self._plain_state.items():
            own = self._state_params[name][1]
            if not all(key in own and isinstance(own[key], _PLAIN) for key in keys):
                return False
        return all(shape.holds() for shape in self._modules) and all(
            source.holds() for source in self._sources
        )

    def stage(
        self, copies: list[Copy], deferred: list[Copy] | None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The staged model and optimizer state (staging buffers, and the optimizer's
        settings and non-tensor state as they are now), the copies into them appended as
        :meth:`Stager.stage` would."""
        for source in self._sources:
            (deferred if deferred is not None and source.later else copies).append(source.copy)
        state = self._staged_state
        if self._plain_state:
            state = dict(state)
            for name, keys in self._plain_state.items():
                own = self._state_params[name][1]
                state[name] = {**state[name], **{key: own[key] for key in keys}}
        groups = [
            {**{key: value for key, value in group.items() if key != "params"}, "params": names}
            for group, (_, names) in zip(self.optimizer.param_groups, self._groups, strict=True)
        ]
        return self._staged_model, {"state": state, "param_groups": groups}
