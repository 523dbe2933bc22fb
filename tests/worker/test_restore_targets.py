"""A restore into a fresh optimizer gives it its state tensors shaped from the stored state,
instead of having ``get_state_dict`` run one optimizer step on zero gradients to create them
(a third of a restore's time for AdamW): no step runs, and what is restored is bit for bit
what was stored, from a disk checkpoint and from memory. State the shapes cannot describe is
left to ``get_state_dict``.

Each scenario runs in its own process (a one-rank gloo world)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.worker.own_process import run_scenario


def _trained() -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def _fresh(steps: list[int]) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5)
    optimizer.register_step_pre_hook(lambda *_: steps.append(1))
    return model, optimizer


def _assert_same(got: tuple[Any, Any], expected: tuple[Any, Any]) -> None:
    import torch

    model, optimizer = got
    for (name, a), b in zip(
        model.state_dict().items(), expected[0].state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    mine, theirs = optimizer.state_dict(), expected[1].state_dict()
    assert mine["param_groups"] == theirs["param_groups"]
    for index, state in theirs["state"].items():
        assert state.keys() == mine["state"][index].keys()
        for field, value in state.items():
            assert torch.equal(mine["state"][index][field], value), (index, field)
            assert mine["state"][index][field].dtype == value.dtype


def scenario(tmp: Path) -> None:
    import torch
    import torch.distributed as dist

    from rallypoint.worker import Checkpointer, MemorySnapshots
    from rallypoint.worker.checkpoint import restore_checkpoint
    from rallypoint.worker.snapshots import holding, restore_from_memory
    from rallypoint.worker.state_io import presize_optimizer_state

    dist.init_process_group("gloo", init_method=f"file://{tmp / 'store'}", rank=0, world_size=1)
    trained = _trained()
    Checkpointer(tmp / "disk").save_async(3, *trained).wait()
    (path,) = (tmp / "disk").iterdir()
    memory = MemorySnapshots("host-a", copies=1)
    memory.attach(1)
    pending = memory.take(3, *trained, overlap=False)
    assert pending is not None
    taken = pending.wait(60)

    steps: list[int] = []
    fresh = _fresh(steps)
    assert restore_checkpoint(path, *fresh).step == 3
    assert steps == [], "the restore ran an optimizer step"
    _assert_same(fresh, trained)

    fresh = _fresh(steps)
    holdings = [holding(memory, taken.snapshot)]
    assert restore_from_memory(memory, taken.snapshot, holdings, *fresh)[0] == 3
    assert steps == [], "the restore ran an optimizer step"
    _assert_same(fresh, trained)

    # State shaped otherwise than the parameter or a scalar: left alone.
    metadata = memory.server.metadata(taken.snapshot)
    assert metadata is not None
    model, optimizer = _fresh(steps)
    assert presize_optimizer_state(model, optimizer, metadata)
    model, _ = _fresh(steps)
    model[0].weight = torch.nn.Parameter(torch.zeros(8, 4))
    optimizer = torch.optim.AdamW(model.parameters())
    assert not presize_optimizer_state(model, optimizer, metadata)
    assert not optimizer.state
    print("ok")


@pytest.mark.timeout(240)
def test_restore_targets(tmp_path: Path) -> None:
    run_scenario("tests.worker.test_restore_targets", "scenario", tmp_path)
