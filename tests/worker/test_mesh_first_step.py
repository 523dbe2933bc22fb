"""The first step of a round of the mesh example, in one process on torch's fake process group
(a 2 x 2 mesh of which this process is rank 0; no collective moves data).

Every formation builds the model for the new mesh and clears DTensor's cached sharding
decisions (``torch_compat.forget_previous_world``), so the round's first step works out the
sharding of every distinct operation it runs again: with eight CPU-bound workers on a few
cores that was most of the time from a round's formation to its first step. What is checked
is how many operations the first optimizer step makes DTensor work out, not how long it
takes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.testing._internal.distributed.fake_pg import FakeStore

from rallypoint.worker import mesh_train
from rallypoint.worker.torch_compat import forget_previous_world


@pytest.fixture
def fake_world() -> Iterator[None]:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        # The fake backend keeps no timeouts; the build bounds its mesh groups' collectives.
        with mock.patch.object(dist.ProcessGroup, "set_timeout", lambda self, timeout: None):
            yield
    finally:
        dist.destroy_process_group()
        forget_previous_world()


def worked_out(step: Any) -> list[str]:
    """The operations whose sharding DTensor worked out (not cached) while ``step()`` ran."""
    worked: list[str] = []
    original = ShardingPropagator.propagate_op_sharding_non_cached

    def counting(self: ShardingPropagator, op_schema: Any) -> Any:
        worked.append(str(op_schema.op))
        return original(self, op_schema)

    with mock.patch.object(ShardingPropagator, "propagate_op_sharding_non_cached", counting):
        step()
    return worked


# torch warns that a tensor-parallel layer's output is a view an in-place op could detach
# from FSDP2's hooks; the model runs none.
@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module:UserWarning")
@pytest.mark.usefixtures("fake_world")
def test_the_first_optimizer_step_of_a_round_works_out_one_operation_for_all_parameters() -> None:
    forget_previous_world()  # as every formation does before the build
    model, optimizer = mesh_train.mesh_builder(2, 10.0)()
    inputs, targets = torch.randn(8, mesh_train.IN_FEATURES), torch.randn(8, 1)
    torch.nn.functional.mse_loss(model(inputs), targets).backward()  # type: ignore[no-untyped-call]
    worked = worked_out(optimizer.step)
    parameters = len(list(model.parameters()))
    assert parameters == 6
    # The optimizer's own update: one operation, whatever the number of parameters (the
    # per-parameter AdamW worked out eight per parameter, 42 in all). Creating the state
    # of each parameter (zeros_like) is once per parameter either way.
    updates = [op for op in worked if op != "aten.zeros_like.default"]
    assert updates == ["aten._fused_adamw_.default"], sorted(set(updates))
    assert len(worked) <= parameters + 1
    # The optimizer made by make_state (before the first formation) is the same kind.
    assert mesh_train.make_state().optimizer.defaults["fused"] is True


@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module:UserWarning")
@pytest.mark.usefixtures("fake_world")
def test_a_restore_loaded_in_place_works_out_no_copy_of_the_parameters() -> None:
    from rallypoint.worker.state_io import PROGRESS_KEY, install, pack_progress, targets

    forget_previous_world()
    model, optimizer = mesh_train.mesh_builder(2, 10.0)()
    state = targets(model, optimizer, None)  # DCP loads into these, in place
    state[PROGRESS_KEY] = pack_progress(3, None, None)
    worked = worked_out(lambda: install(model, optimizer, state, None))
    assert "aten.copy_.default" not in worked, worked
