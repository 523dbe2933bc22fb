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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor import DTensor

# (staging buffer, what to copy into it)
Copy = tuple[torch.Tensor, torch.Tensor]


class Stager:
    """Staging buffers for the state's tensors, kept from one snapshot to the next, and the
    DTensors wrapping them (made once per world)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        # path -> (the buffer wrapped, the DTensor wrapping it)
        self._wrappers: dict[tuple[Any, ...], tuple[torch.Tensor, DTensor]] = {}

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
