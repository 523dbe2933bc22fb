"""One process of test_replica_restore.py's multi-process scenario.

    python replica_ranks.py OLD_RANK WORKDIR MODE

Every process is one rank of a dp=2 x 2 world of rallypoint.worker.mesh_train's model, by
MODE: ``replicate`` (mesh_train's ``replicate_dp``: tensor parallel inside a unit of two,
replicated over dp), ``hsdp`` (FSDP2 on a 2-D "dp" x "shard" mesh: sharded inside a unit of
two, replicated over dp) or ``fsdp`` (sharded over dp as mesh_train's default), meeting
through TCPStores on the ports in
the environment (PORTS: three, one per world). No coordinator: the worlds are formed by hand
as the elastic loop forms them (a new default group, ``forget_previous_world``, ``build``,
``restore_state`` with what each survivor held).

1. World 1 (4 ranks): train 3 steps, each unit on its own batch. Every rank writes the
   digest of each piece it holds (WORKDIR/held-rank<r>.json), then takes ``held_state``.
2. World 2 (4 ranks, unit order swapped: new rank = (old + 2) % 4): old ranks 2 and 3 come
   back as newcomers (their state dropped), 0 and 1 as survivors at step 3. ``restore_state``
   must restore from the survivors' replicas at step 3; every rank's pieces then equal the
   pieces world 1 held under the same keys; one more step is trained and the replicas
   compared again.
3. World 3 (2 ranks, old 2 and 3 as new 0 and 1; old 0 and 1 have left): the broken unit
   gone, dp one smaller, the survivors restore at step 3 keeping their own pieces.

Figures per world go to WORKDIR/world<n>-rank<old rank>.json; every check is an assert.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from rallypoint.worker.checkpoint import restore_state
from rallypoint.worker.mesh_train import make_model, make_optimizer, mesh_builder
from rallypoint.worker.replica_restore import HeldState, held_state, model_pieces
from rallypoint.worker.restore_choice import OPTIMIZER_PREFIX
from rallypoint.worker.torch_compat import forget_previous_world, reset_group_count

STEPS = 3
TIMEOUT = timedelta(seconds=60)


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().contiguous().numpy().tobytes()).hexdigest()[:16]


def state_pieces(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, str]:
    """Every piece of model and optimizer, by its key as text, to its digest."""
    held = held_state(model, optimizer)
    assert held is not None
    return {json.dumps(key): digest(tensor) for key, tensor in held.pieces.items()}


Builder = Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer]]


def hsdp_build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """HSDP whose shard group is the unit: every unit a whole replica."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "shard"))
    model = make_model()
    for layer in model.children():
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, make_optimizer(model)


def builder(mode: str) -> Builder:
    if mode == "hsdp":
        return hsdp_build
    return mesh_builder(2, 60.0, replicate_dp=mode == "replicate")


def form(rank: int, world_size: int, port: int) -> None:
    reset_group_count()
    store = TCPStore("127.0.0.1", port, world_size, is_master=rank == 0, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=TIMEOUT)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, unit: int) -> None:
    generator = torch.Generator().manual_seed(1000 + unit)
    inputs = torch.randn(8, 16, generator=generator)
    targets = torch.randn(8, 1, generator=generator)
    torch.nn.functional.mse_loss(model(inputs), targets).backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    optimizer.zero_grad()


def replicas_agree(pieces: dict[str, str]) -> None:
    """Every key held by several ranks has one digest (the replicas hold the same bits)."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, pieces)
    seen: dict[str, set[str]] = {}
    for theirs in everyone:
        for key, value in theirs.items():
            seen.setdefault(key, set()).add(value)
    disagreeing = {key: values for key, values in seen.items() if len(values) > 1}
    assert not disagreeing, disagreeing


def new_world(
    rank: int,
    world_size: int,
    port: int,
    held: HeldState | None,
    survivor_step: int | None,
    build: Builder,
) -> tuple[torch.nn.Module, torch.optim.Optimizer, dict[str, Any]]:
    form(rank, world_size, port)
    forget_previous_world()
    model, optimizer = build()
    result = restore_state(
        model,
        optimizer,
        checkpoint=None,
        survivor_step=survivor_step,
        extra={"schedule": "survivors'"} if held is not None else {"schedule": "newcomer's"},
        previous=held,
    )
    figures = {
        "source": result.source.value,
        "reason": result.reason,
        "step": result.step,
        "extra": result.extra,
        "bytes_moved": result.bytes_moved,
    }
    return model, optimizer, figures


def main() -> None:
    old_rank, workdir, mode = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    ports = [int(port) for port in os.environ["PORTS"].split(",")]
    build = builder(mode)
    torch.set_num_threads(1)

    # 1. dp=2 x tp=2: train, note what is held.
    form(old_rank, 4, ports[0])
    model, optimizer = build()
    for _ in range(STEPS):
        train_step(model, optimizer, old_rank // 2)
    held_digests = state_pieces(model, optimizer)
    if mode != "fsdp":
        replicas_agree(held_digests)
    (workdir / f"held-rank{old_rank}.json").write_text(json.dumps(held_digests))
    held = held_state(model, optimizer)
    assert held is not None
    dist.barrier()
    dist.destroy_process_group()

    # 2. The same size, units swapped, old 2 and 3 newcomers.
    survivor = old_rank < 2
    rank = (old_rank + 2) % 4
    new_model, new_optimizer, figures = new_world(
        rank, 4, ports[1], held if survivor else None, STEPS if survivor else None, build
    )
    survivors_held: dict[str, str] = {}
    for old in (0, 1):
        survivors_held.update(json.loads((workdir / f"held-rank{old}.json").read_text()))
    restored = state_pieces(new_model, new_optimizer)
    figures["restored_equal_held"] = all(
        survivors_held.get(key) == value for key, value in restored.items()
    )
    figures["optimizer_pieces"] = sum(
        json.loads(key)[0].startswith(OPTIMIZER_PREFIX) for key in restored
    )
    figures["model_pieces"] = len(model_pieces(new_model))
    if figures["source"] == "replicas":
        train_step(new_model, new_optimizer, rank // 2)
        replicas_agree(state_pieces(new_model, new_optimizer))
        figures["trained_on"] = True
    (workdir / f"world2-rank{old_rank}.json").write_text(json.dumps(figures))
    dist.barrier()
    dist.destroy_process_group()
    if old_rank < 2:
        return

    # 3. Old unit 0 gone: old 2 and 3 re-form as a world of one unit.
    shrunk_model, shrunk_optimizer, figures = new_world(
        old_rank - 2, 2, ports[2], held, STEPS, build
    )
    figures["restored_equal_held"] = all(
        held_digests.get(key) == value
        for key, value in state_pieces(shrunk_model, shrunk_optimizer).items()
    )
    (workdir / f"world3-rank{old_rank}.json").write_text(json.dumps(figures))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
