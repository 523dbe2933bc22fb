"""FSDP2's collectives waited for abandonably, as the loop's own are (collectives.py).

Imported only for a model that FSDP2 sharded (a ``TrainState`` with ``build``; formation.py),
never on the way into a job: importing FSDP costs about half a second and 600 modules
(torch.distributed.tensor, sympy), which a replacement of a replicated model's job need not pay
before it joins (tests/worker/test_lazy_imports.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from ..torch_compat import AllGather, ReduceScatter
from .collectives import CollectiveAbandoned, Waiter


class _RoundComm:
    """What FSDP2's custom collectives below share: how they wait (the round's ``wait``),
    why the round ended, and plain allocation."""

    def __init__(self, wait: Waiter, end_reason: Callable[[], str]) -> None:
        self.wait = wait
        self.end_reason = end_reason

    def allocate(
        self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def waited(self, work: dist.Work | None, what: str, async_op: bool) -> dist.Work | None:
        if work is None:
            raise AssertionError(f"{what}: an async collective returned no work")
        if not self.wait(work, what):
            raise CollectiveAbandoned(f"{what} was given up: {self.end_reason()}")
        return work if async_op else None


class _AbandonableAllGather(_RoundComm, AllGather):
    """FSDP2's all-gather, waited for as the loop's own collectives are (``round.wait``): in
    slices, given up as soon as the round ends (the coordinator's push), counted as progress
    for hang detection. gloo cannot interrupt a collective that waits on a peer that is gone;
    this lets the training thread leave it (the work is kept alive until it times out)."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> dist.Work | None:
        work = dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=True)
        return self.waited(work, "FSDP's all-gather", async_op)


class _AbandonableReduceScatter(_RoundComm, ReduceScatter):
    """FSDP2's reduce-scatter, waited for abandonably (see _AbandonableAllGather)."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        # gloo's asynchronous reduce-scatter only runs once waited for (it never completes
        # on its own, measured with torch 2.13), so it cannot be waited for abandonably: an
        # all-reduce of the whole input (twice the traffic) and this rank's part of it.
        work = dist.all_reduce(input_tensor, op=op, group=group, async_op=True)
        self.waited(work, "FSDP's reduce-scatter (an all-reduce)", True)
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        output_tensor.copy_(input_tensor.view(world, -1)[rank].view_as(output_tensor))
        return None


def abandonable_fsdp(model: torch.nn.Module, wait: Waiter, end_reason: Callable[[], str]) -> None:
    """Give every FSDP2 module of ``model`` the loop's abandonable all-gather and
    reduce-scatter, waited for by ``wait`` (the round's; gloo only: NCCL keeps FSDP's own)."""
    if dist.get_backend() != "gloo":
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            with contextlib.suppress(ValueError):  # several parameter groups: FSDP's own
                module.set_custom_all_gather(_AbandonableAllGather(wait, end_reason))
                module.set_custom_reduce_scatter(_AbandonableReduceScatter(wait, end_reason))
