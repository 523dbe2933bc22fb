"""One rank of a multi-process checkpoint scenario, run as a script by test_checkpoint.py.

    python dist_ranks.py SCENARIO[,SCENARIO...] RANK WORLD_SIZE WORKDIR

The ranks meet through a FileStore in WORKDIR (no coordinator, no port). Every check is an
assert, so a mismatch fails the rank's exit code with the details on stderr; figures go to
WORKDIR/<scenarios>-<world size>-rank<r>.json for the test to read, by scenario. Several
scenarios run one after the other in one process group (starting processes is the slow part).

Scenarios:
  save     train an FSDP2 model and a replicated (DDP) model for 3 steps, save both
           asynchronously, train one more step while the save runs, and keep the step-3 full
           state (gathered) as the reference.
  restore  restore both checkpoints into this (smaller) world and compare with the reference.
  heal     survivors hold the reference in memory; the last rank is new: restore_state must
           broadcast it, and every rank must end with the reference state.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from rallypoint.worker import (
    Checkpointer,
    ElasticSampler,
    RestoreSource,
    read_metadata,
    restore_checkpoint,
    restore_state,
)

NUM_SAMPLES, BATCH_SIZE, SAVED_STEP = 96, 4, 3
FEATURES = torch.randn(NUM_SAMPLES, 6, generator=torch.Generator().manual_seed(1))
TARGETS = torch.randn(NUM_SAMPLES, 3, generator=torch.Generator().manual_seed(2))
EXTRA = {"schedule": [0.1, 0.01], "note": "extra state"}


def mlp(seed: int) -> torch.nn.Sequential:
    # Widths 10 and 7 do not divide by 2, 3 or 4: FSDP's shards are uneven.
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 7), torch.nn.Linear(7, 3)
    )


def sharded_mlp(seed: int, world_size: int) -> torch.nn.Module:
    mesh = init_device_mesh("cpu", (world_size,))
    model = mlp(seed)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def adam(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=0.01)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: list[int]) -> None:
    loss = torch.nn.functional.mse_loss(model(FEATURES[batch]), TARGETS[batch])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    """Model and optimizer state gathered to whole tensors (collective), copied: the state
    dict shares unsharded tensors (Adam's step counts) with the live optimizer."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=False)
    return copy.deepcopy(get_state_dict(model, optimizer, options=options))


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).view(torch.uint8)


def assert_bit_equal(actual: Any, expected: Any, where: str = "") -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, where
        # Compare the bits, so that -0.0 vs 0.0 or a NaN payload would count as different.
        assert torch.equal(as_bytes(actual), as_bytes(expected)), (where, actual, expected)
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), (
            where,
            actual.keys(),
            expected.keys(),
        )
        for key in expected:
            assert_bit_equal(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, list | tuple):
        assert type(actual) is type(expected) and len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_bit_equal(a, e, f"{where}[{index}]")
    else:
        assert actual == expected, (where, actual, expected)


def save(rank: int, world_size: int, workdir: Path) -> dict[str, Any]:
    sampler = ElasticSampler(NUM_SAMPLES, batch_size=BATCH_SIZE, rank=rank, world_size=world_size)
    sharded = sharded_mlp(0, world_size)
    replicated = DistributedDataParallel(mlp(0))
    models = {"fsdp": sharded, "replicated": replicated}
    optimizers = {name: adam(model) for name, model in models.items()}
    batches = iter(sampler)
    for _ in range(SAVED_STEP):
        batch = next(batches)
        for name, model in models.items():
            train_step(model, optimizers[name], batch)
        sampler.advance()
    reference = {name: full_state(model, optimizers[name]) for name, model in models.items()}
    pending = {
        name: Checkpointer(workdir / name).save_async(
            SAVED_STEP, model, optimizers[name], sampler=sampler, extra=EXTRA
        )
        for name, model in models.items()
    }
    durable: list[str] = []
    for name, save_in_progress in pending.items():
        save_in_progress.add_done_callback(lambda done, name=name: durable.append(name))
    # Training goes on while the checkpoint is written; the checkpoint must still hold step 3.
    batch = next(batches)
    for name, model in models.items():
        train_step(model, optimizers[name], batch)
    saved = {name: pending[name].wait() for name in models}
    # The hook where the elastic loop reports its shard ran once per save.
    assert sorted(durable) == sorted(models), durable
    if rank == 0:
        reference["sampler"] = sampler.state_dict()
        torch.save(reference, workdir / "reference.pt")
    return {
        name: {"path": str(s.path), "bytes_total": s.bytes_total, "duration_s": s.duration_s}
        for name, s in saved.items()
    }


def restore(rank: int, world_size: int, workdir: Path) -> dict[str, Any]:
    reference = torch.load(workdir / "reference.pt", weights_only=False)
    figures = {}
    models = {"fsdp": sharded_mlp(5, world_size), "replicated": DistributedDataParallel(mlp(5))}
    for name, model in models.items():
        optimizer = adam(model)
        sampler = ElasticSampler(NUM_SAMPLES, batch_size=3, rank=rank, world_size=world_size)
        path = read_checkpoint_dir(workdir / name)
        result = restore_checkpoint(path, model, optimizer, sampler=sampler)
        assert (result.source, result.step, result.extra) == (RestoreSource.DISK, 3, EXTRA)
        assert sampler.state_dict() == reference["sampler"]
        assert_bit_equal(full_state(model, optimizer), reference[name], name)
        # Training continues in the new world.
        train_step(model, optimizer, next(iter(sampler)))
        figures[name] = {"bytes_read": result.bytes_moved, "duration_s": result.duration_s}
    return figures


def heal(rank: int, world_size: int, workdir: Path) -> dict[str, Any]:
    reference = torch.load(workdir / "reference.pt", weights_only=False)
    newcomer = rank == world_size - 1
    model = DistributedDataParallel(mlp(9))
    optimizer = adam(model)
    sampler = ElasticSampler(NUM_SAMPLES, batch_size=BATCH_SIZE, rank=rank, world_size=world_size)
    if not newcomer:
        # set_state_dict renames the keys of the dicts it is given: hand it a copy.
        model_state, optimizer_state = copy.deepcopy(reference["replicated"])
        set_state_dict(
            model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state
        )
        sampler.load_state_dict(reference["sampler"])
    result = restore_state(
        model,
        optimizer,
        checkpoint=read_checkpoint_dir(workdir / "replicated"),
        survivor_step=None if newcomer else SAVED_STEP,
        extra=None if newcomer else EXTRA,
        sampler=sampler,
    )
    assert result.source is RestoreSource.BROADCAST, result
    assert (result.step, result.extra) == (SAVED_STEP, EXTRA)
    assert sampler.state_dict() == reference["sampler"]
    assert_bit_equal(full_state(model, optimizer), reference["replicated"], "healed")
    # Now every rank holds the same replica: nothing needs to move.
    again = restore_state(
        model,
        optimizer,
        checkpoint=read_checkpoint_dir(workdir / "replicated"),
        survivor_step=result.step,
        extra=result.extra,
    )
    assert (again.source, again.step, again.bytes_moved) == (RestoreSource.KEEP, SAVED_STEP, 0)
    return {"bytes": result.bytes_moved, "duration_s": result.duration_s, "reason": result.reason}


def read_checkpoint_dir(root: Path) -> Path:
    (path,) = root.iterdir()
    assert read_metadata(path).step == SAVED_STEP
    return path


def main() -> None:
    scenario, rank, world_size, workdir = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        Path(sys.argv[4]),
    )
    # MASTER_ADDR / MASTER_PORT from the test: rank 0 hosts the TCPStore.
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size)
    try:
        figures = {
            name: {"save": save, "restore": restore, "heal": heal}[name](rank, world_size, workdir)
            for name in scenario.split(",")
        }
        (workdir / f"{scenario}-{world_size}-rank{rank}.json").write_text(json.dumps(figures))
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    # Every rank has written its figures and passed the barrier: leave without torch's C++
    # teardown, which now and then aborted a rank ("terminate called without an active
    # exception") when rank 0, the TCPStore's host, was gone first.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
