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
    from rallypoint.worker.snapshots import holding, restore_from_memory

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

    from rallypoint.worker.snapshots import staging as snapshot_copy

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


def _fsdp_model_and_optimizer(frozen_last: bool) -> tuple[Any, Any, Any]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (1,))
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 8)
    )
    model[2].requires_grad_(not frozen_last)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return model, optimizer, scheduler


def scenario_plan(tmp: Path) -> None:
    """After the first full capture, snapshots are staged by the plan while the state keeps
    its layout, and in full again when it changes (a buffer replaced, an optimizer state
    tensor replaced, a frozen layer starting to train, a new parameter group, a buffer's
    memory swapped under it); whichever
    path, the snapshot restores bit for bit, the scheduler's learning rate included."""
    import torch

    from rallypoint.worker.snapshots import holding, restore_from_memory
    from tests.worker.dist_ranks import assert_bit_equal, full_state

    memory = _world(tmp)
    model, optimizer, scheduler = _fsdp_model_and_optimizer(frozen_last=True)
    stager = memory._stager
    extra = torch.nn.Parameter(torch.zeros(8))
    changes = {
        3: lambda: setattr(model[1], "running_mean", torch.full((8,), 3.0)),
        4: lambda: optimizer.state[model[0].bias].__setitem__(
            "exp_avg", torch.full_like(optimizer.state[model[0].bias]["exp_avg"], 2.0)
        ),
        5: lambda: model[2].requires_grad_(True),
        7: lambda: (
            model.register_parameter("extra", extra),
            optimizer.add_param_group({"params": [extra], "lr": 0.25}),
        ),
        # The same tensor object over other memory.
        8: lambda: setattr(model[1].running_var, "data", torch.full((8,), 5.0)),
    }
    # Step: (staged by the plan, captured in full) so far, once its snapshot is taken.
    paths = {1: (0, 1), 2: (1, 1), 3: (1, 2), 4: (1, 3), 5: (1, 4), 6: (2, 4), 7: (2, 5)}
    paths.update({8: (2, 6), 9: (3, 6)})
    for step in range(1, 10):
        if step in changes:
            changes[step]()
        model.train()
        (model(torch.randn(4, 8)).sum() + extra.sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        expected = full_state(model, optimizer)
        pending = memory.take(step, model, optimizer)
        assert pending is not None
        taken = pending.wait(60)
        assert (stager.planned, stager.captured) == paths[step], (step, stager.planned)
        fresh, fresh_optimizer, _ = _fsdp_model_and_optimizer(frozen_last=step < 5)
        if step >= 7:
            fresh.register_parameter("extra", torch.nn.Parameter(torch.ones(8)))
            fresh_optimizer.add_param_group({"params": [fresh.extra], "lr": 1.0})
        restored_step, _, _ = restore_from_memory(
            memory, taken.snapshot, [holding(memory, taken.snapshot)], fresh, fresh_optimizer
        )
        assert restored_step == step
        assert_bit_equal(full_state(fresh, fresh_optimizer), expected, f"step {step}")
    print("ok")


def scenario_plan_plain_state(tmp: Path) -> None:
    """Optimizer state that is not a tensor (a count kept by the optimizer) is read afresh
    by every snapshot the plan stages."""
    import torch

    from rallypoint.worker.snapshots import holding, restore_from_memory

    class Counting(torch.optim.SGD):
        def step(self, closure: Any = None) -> Any:
            loss = super().step(closure)
            for group in self.param_groups:
                for param in group["params"]:
                    self.state[param]["count"] = self.state[param].get("count", 0) + 1
            return loss

    def made() -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4)
        return model, Counting(model.parameters(), lr=0.1, momentum=0.9)

    memory = _world(tmp)
    model, optimizer = made()
    for step in range(1, 4):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        taken = memory.take(step, model, optimizer)
        assert taken is not None
        snapshot = taken.wait(60).snapshot
        fresh, fresh_optimizer = made()
        restore_from_memory(memory, snapshot, [holding(memory, snapshot)], fresh, fresh_optimizer)
        counts = [state["count"] for state in fresh_optimizer.state.values()]
        assert counts == [step, step], (step, counts)
        assert torch.equal(fresh.weight, model.weight)
    assert (memory._stager.planned, memory._stager.captured) == (2, 1)
    print("ok")


def scenario_plan_ties_and_state_dicts(tmp: Path) -> None:
    """Weights tied then untied, and a parameter's optimizer state replaced by a new dict
    (the old one left as it was): the plan notices both."""
    import torch

    from rallypoint.worker.snapshots import holding, restore_from_memory
    from tests.worker.dist_ranks import assert_bit_equal, full_state

    def made(tied: bool) -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        if tied:
            model[1].weight = model[0].weight
        # Untied later, the new weight is not the optimizer's (as after the change below).
        params = [model[0].weight, model[0].bias, model[1].bias]
        return model, torch.optim.SGD(params, lr=0.1, momentum=0.9)

    memory = _world(tmp)
    model, optimizer = made(tied=True)
    untie = 3

    def change(step: int) -> None:
        if step == untie:
            model[1].weight = torch.nn.Parameter(torch.full((4, 4), 0.5))
        if step == 5:
            bias = model[0].bias
            old = optimizer.state[bias]["momentum_buffer"]
            optimizer.state[bias] = {"momentum_buffer": torch.full_like(old, 7.0)}

    # Step: (planned, captured) once its snapshot is taken.
    paths = {1: (0, 1), 2: (1, 1), 3: (1, 2), 4: (2, 2), 5: (2, 3), 6: (3, 3)}
    for step in range(1, 7):
        change(step)
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        expected = full_state(model, optimizer)
        pending = memory.take(step, model, optimizer)
        assert pending is not None
        snapshot = pending.wait(60).snapshot
        assert (memory._stager.planned, memory._stager.captured) == paths[step], step
        fresh, fresh_optimizer = made(tied=step < untie)
        restore_from_memory(memory, snapshot, [holding(memory, snapshot)], fresh, fresh_optimizer)
        assert_bit_equal(full_state(fresh, fresh_optimizer)[0], expected[0], f"step {step}")
        fresh_bias = fresh_optimizer.state[fresh[0].bias]["momentum_buffer"]
        assert torch.equal(fresh_bias, optimizer.state[model[0].bias]["momentum_buffer"])
    print("ok")


@pytest.mark.parametrize(
    "scenario", ["overlap", "no_overlap", "plan", "plan_plain_state", "plan_ties_and_state_dicts"]
)
def test_snapshot_copy(scenario: str, tmp_path: Path) -> None:
    run_scenario("tests.worker.test_snapshot_copy", f"scenario_{scenario}", tmp_path)
