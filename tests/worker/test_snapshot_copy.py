"""A memory snapshot's copy overlaps training: ``take`` copies the model's buffers before it
returns and leaves parameters and optimizer state to the background, ``optimizer.step()``
waits for that copy (its wait counted as blocked time), and what the snapshot holds is the
state at ``take``, bit for bit, whatever training did after it (buffers changed by forward,
parameters by the held step). ``overlap=False`` copies everything before returning.

Each scenario runs in its own process (a one-rank gloo world)."""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.worker.own_process import run_scenario


def _model_and_optimizer() -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()  # momentum buffers exist: optimizer state to copy
    optimizer.zero_grad()
    return model, optimizer


def _snapshot_state(model: Any, optimizer: Any) -> dict[str, Any]:
    return {
        "model": copy.deepcopy(model.state_dict()),
        "optimizer": copy.deepcopy(optimizer.state_dict()["state"]),
    }


def _restored(memory: Any, taken: Any) -> dict[str, Any]:
    """The snapshot loaded into a fresh model and optimizer."""
    from rallypoint.worker.memory import holding, restore_from_memory

    model, optimizer = _model_and_optimizer()
    step, _, _ = restore_from_memory(
        memory, taken.snapshot, [holding(memory, taken.snapshot)], model, optimizer
    )
    assert step == 7
    return _snapshot_state(model, optimizer)


def _assert_same(got: dict[str, Any], expected: dict[str, Any]) -> None:
    import torch

    assert got["model"].keys() == expected["model"].keys()
    for key, value in expected["model"].items():
        assert torch.equal(got["model"][key], value), key
    for index, state in expected["optimizer"].items():
        for name, value in state.items():
            assert torch.equal(got["optimizer"][index][name], value), (index, name)


def _world(tmp: Path) -> Any:
    import torch.distributed as dist

    from rallypoint.worker import MemorySnapshots

    dist.init_process_group("gloo", init_method=f"file://{tmp / 'store'}", rank=0, world_size=1)
    memory = MemorySnapshots("host-a", copies=1)
    memory.attach(1)
    return memory


def scenario_overlap(tmp: Path) -> None:
    import torch

    from rallypoint.worker import snapshot_copy

    memory = _world(tmp)
    model, optimizer = _model_and_optimizer()
    gate = threading.Event()
    run = snapshot_copy.DeferredCopy.run

    def gated(self: Any) -> None:
        gate.wait(30)
        run(self)

    snapshot_copy.DeferredCopy.run = gated  # type: ignore[method-assign]
    expected = _snapshot_state(model, optimizer)
    pending = memory.take(7, model, optimizer)
    assert pending is not None
    # take returned with the parameters' copy still to make: forward may change the
    # buffers (they were copied already) and backward the gradients.
    model.train()
    model(torch.randn(4, 8) * 5).sum().backward()
    assert not torch.equal(model[1].running_mean, expected["model"]["1.running_mean"])
    stepping = threading.Event()
    stepped = threading.Event()

    def step() -> None:
        stepping.set()
        optimizer.step()  # held by the snapshot's pre-hook until the copy is made
        stepped.set()

    stepper = threading.Thread(target=step)
    stepper.start()
    assert stepping.wait(10)
    time.sleep(0.5)
    assert not stepped.is_set(), "optimizer.step() ran before the snapshot's copy was made"
    gate.set()
    stepper.join(30)
    assert stepped.is_set()
    taken = pending.wait(60)
    assert taken.blocked_s >= 0.25  # the step's wait counts as blocked
    assert not torch.equal(model[0].weight, expected["model"]["0.weight"])
    _assert_same(_restored(memory, taken), expected)
    print("ok")


def scenario_no_overlap(tmp: Path) -> None:
    import torch

    memory = _world(tmp)
    model, optimizer = _model_and_optimizer()
    expected = _snapshot_state(model, optimizer)
    pending = memory.take(7, model, optimizer, overlap=False)
    assert pending is not None
    with torch.no_grad():  # changed outside optimizer.step(): allowed without overlap
        for parameter in model.parameters():
            parameter.add_(1.0)
        for state in optimizer.state.values():
            state["momentum_buffer"].add_(1.0)
    _assert_same(_restored(memory, pending.wait(60)), expected)
    print("ok")


@pytest.mark.parametrize("scenario", ["overlap", "no_overlap"])
def test_snapshot_copy(scenario: str, tmp_path: Path) -> None:
    run_scenario("tests.worker.test_snapshot_copy", f"scenario_{scenario}", tmp_path)
