"""A 2-D DeviceMesh job in the elastic loop: data parallel (FSDP2) x tensor parallel (DTensor).

    python -m rallypoint.worker.mesh_train --endpoints A,B,C --job mesh --name a0 \\
        --host host-a --checkpoint-dir DIR [--tp 2] [--replicate-dp]
        [--min-nodes 2 --max-nodes 4] [--snapshot-every 1] [--max-steps N]
        [demo_train's other options]

Every worker runs this; the workers of one simulated host give the same ``--host``.

Theory of operation. The world is ``dp x tp`` ranks: ``tp`` (2 here) ranks hold the halves of
each tensor-parallel layer, ``dp`` such groups are the data-parallel replicas, each sharded
over dp with FSDP2. Nothing of the shape is chosen by the workers: each round the coordinator
hands every worker its rank and the world size, and the program derives the mesh from them
(:func:`mesh_shape`): ``dp = world // tp``, and the tensor-parallel group of rank r is the
unit ``[tp * (r // tp), tp * (r // tp) + tp)`` (ranks 2k and 2k+1). That is the layout
``init_device_mesh("cpu", (dp, tp))`` makes, so the mesh's rows are the job's units.

The job declares that shape to the coordinator (:func:`shape_settings`): units of ``tp``
ranks (every round's world a multiple of tp, a unit's ranks contiguous and kept together)
and one failure domain per host (a unit placed inside one host; a host lost at once ends
one round). When one rank dies its unit's survivor leaves the world with it and the others
re-form at ``dp - 1``; a spare host waiting is taken instead, keeping dp. Without units a
round could form at an odd world size, which no 2-D mesh fits: :func:`mesh_shape` refuses
it with one line saying so.

Each formation builds the model again for the new mesh (``TrainState.build``): the two
tensor-parallel layers split by ``parallelize_module`` (column-wise, then row-wise) over the
"tp" dimension, every linear layer and the whole model ``fully_shard``-ed over "dp". The
state comes back resharded from the peers' memory (in-memory snapshots, each rank's copy
kept on another host) or from the latest disk checkpoint: DCP reads the stored 2-D chunks
into the new layout, whatever dp was. The sampler (:class:`MeshSampler`) partitions the data
over dp only: both ranks of a unit train on the same batch.

With ``--replicate-dp`` the model is replicated over "dp" instead of sharded over it
(``replicate``, FSDP2's data-parallel form: gradients all-reduced over dp), so every unit
holds a whole replica, split over its ``tp`` ranks. A lost unit then costs no rollback: the
survivors at the most advanced step hold every unit-local shard, and the new world is
restored from them (source ``replicas``, worker/replica_restore.py), even without snapshots.

What torch 2.13 on CPU/gloo supports here (measured): FSDP2 over the "dp" dimension of a
2-D mesh with TP on "tp", forward, backward and AdamW; DTensor redistribution of the
resulting ``(_StridedShard(0), Shard(0))`` parameters (full state dicts: torch warns that it
takes two all-gathers); DCP save and load of the 2-D state across dp changes (4 ranks saved
as 2 x 2, loaded as 1 x 2 and 3 x 2: the full weights as saved). Not supported: giving up a
TP collective (gloo cannot interrupt it, and DTensor's are not FSDP2's pluggable ones): the
loop closes a leaving rank's mesh groups at once, which fails its partner's pending TP
collective, and bounds the mesh's groups within a step (docs/elastic.md, "Mesh jobs").
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rallypoint.proto.v1.defaults import ELASTIC

from .demo_train import (
    BATCH_SIZE,
    IN_FEATURES,
    LEARNING_RATE,
    NUM_SAMPLES,
    SAMPLER_SEED,
    emit,
    open_run,
    parse_args,
    train,
)
from .elastic import ElasticRun, TrainState
from .errors import WorkerError
from .sampler import ElasticSampler
from .torch_compat import replicate_over

# The tensor-parallel degree: the ranks of one unit, on one host.
TP = 2
HIDDEN = 64
MODEL_SEED = 11
# The layers split over "tp": the first column-wise, the second row-wise (their product
# needs one all-reduce in the forward pass and one in the backward pass).
TP_PLAN = {"0": "colwise", "2": "rowwise"}


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW, fused: one operation per step over every parameter. DTensor works out the
    sharding of each operation on a new mesh once, and the loop clears what it worked out at
    every formation (``torch_compat.forget_previous_world``), so the first step of every
    round pays for it again: the per-parameter AdamW runs eight operations per parameter (48
    here, two thirds of the step's CPU time after a re-formation, measured), the fused one a
    single operation for all of them."""
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=True)


class MeshShapeError(WorkerError, ValueError):
    """A world size no ``dp x tp`` mesh fits."""


@dataclass(frozen=True, slots=True)
class MeshShape:
    """One round's mesh: ``dp`` data-parallel replicas of ``tp`` tensor-parallel ranks.

    Invariant: ``world_size == dp * tp``; rank r is at ``(r // tp, r % tp)``."""

    dp: int
    tp: int

    @property
    def world_size(self) -> int:
        return self.dp * self.tp

    def unit(self, rank: int) -> int:
        """The unit (data-parallel index) of ``rank``."""
        return rank // self.tp

    def unit_ranks(self, unit: int) -> tuple[int, ...]:
        """The ranks of unit ``unit``: its tensor-parallel group."""
        return tuple(range(unit * self.tp, (unit + 1) * self.tp))


def mesh_shape(world_size: int, tp: int) -> MeshShape:
    """The mesh of a round of ``world_size`` ranks, or a one-line refusal."""
    if tp < 1:
        raise MeshShapeError(f"tp must be >= 1, got {tp}")
    if world_size < tp or world_size % tp:
        raise MeshShapeError(
            f"a world of {world_size} ranks is not a multiple of tp={tp}: no {tp}-wide mesh "
            f"fits it; the job must declare unit_size={tp} so that every round is"
        )
    return MeshShape(world_size // tp, tp)


def shape_settings(tp: int, host: str) -> dict[str, Any]:
    """``elastic_training``'s settings that declare the job's shape: units of ``tp`` ranks,
    never straddling two hosts, and this worker's failure domain (its host, where its unit
    lives). Every worker of the job gives the same ``tp``."""
    return {"host": host, "unit_size": tp, "units_within_domains": True}


class MeshSampler(ElasticSampler):
    """The elastic sampler over the data-parallel dimension only: the ``tp`` ranks of a unit
    get the same batch (the unit's), and the global step is ``dp`` batches."""

    def __init__(self, tp: int, **kwargs: Any) -> None:
        self.tp = tp
        super().__init__(**kwargs)

    def set_world(self, rank: int, world_size: int) -> None:
        shape = mesh_shape(world_size, self.tp)
        super().set_world(shape.unit(rank), shape.dp)


def make_model() -> torch.nn.Module:
    torch.manual_seed(MODEL_SEED)
    return torch.nn.Sequential(
        torch.nn.Linear(IN_FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, 1),
    )


def mesh_builder(
    tp: int, collective_timeout_s: float, replicate_dp: bool = False
) -> Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer]]:
    """``TrainState.build`` for a ``dp x tp`` job: called at every formation, once the
    process group is up, for the world of that round. ``replicate_dp``: replicated over
    "dp" (every unit a whole replica), else sharded over it (FSDP2)."""

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        shape = mesh_shape(dist.get_world_size(), tp)
        mesh = init_device_mesh("cpu", (shape.dp, shape.tp), mesh_dim_names=("dp", "tp"))
        # The sub-meshes' groups are new groups of their own (gloo's default timeout is
        # 30 minutes): bound their collectives as the world's are; within a step the loop
        # bounds them tighter (ElasticRound.step).
        for dim in ("dp", "tp"):
            mesh.get_group(dim).set_timeout(timedelta(seconds=collective_timeout_s))
        model = make_model()
        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        # src_data_rank=None: each rank keeps its own shard of the weights it made, with no
        # scatter from the tp group's rank 0 (four collectives on every formation, whose
        # values a restore then overwrites). A fresh job's ranks still agree: make_model
        # seeds every rank alike, which FSDP2's dp sharding (no collective either) already
        # relies on.
        parallelize_module(
            model,
            mesh["tp"],
            {name: styles[style]() for name, style in TP_PLAN.items()},
            src_data_rank=None,
        )
        if replicate_dp:
            replicate_over(model, mesh["dp"])
            return model, make_optimizer(model)
        for layer in model.children():
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        return model, make_optimizer(model)

    return build


def make_state(
    tp: int = TP,
    collective_timeout_s: float = ELASTIC.collective_timeout_s,
    replicate_dp: bool = False,
) -> TrainState:
    """A ``dp x tp`` job's state: the model is built for each round's mesh (the one made
    here is a placeholder the first formation replaces); ``replicate_dp`` as
    :func:`mesh_builder`."""
    model = make_model()
    sampler = MeshSampler(
        tp,
        num_samples=NUM_SAMPLES,
        batch_size=BATCH_SIZE,
        rank=0,
        world_size=tp,
        seed=SAMPLER_SEED,
        drop_last=True,
    )
    return TrainState(
        model,
        make_optimizer(model),
        sampler,
        build=mesh_builder(tp, collective_timeout_s, replicate_dp),
    )


def announce_mesh(run: ElasticRun, tp: int) -> None:
    """Print the round's mesh (``mesh_formed``): this rank's unit and the unit's ranks."""
    round_ = run.current
    assert round_ is not None
    shape = mesh_shape(round_.world_size, tp)
    unit = shape.unit(round_.rank)
    emit(
        "mesh_formed",
        {
            "t": time.time(),
            "name": run.name,
            "host": run.host,
            "round": round_.number,
            "rank": round_.rank,
            "world_size": round_.world_size,
            "dp": shape.dp,
            "tp": shape.tp,
            "unit": unit,
            "unit_ranks": list(shape.unit_ranks(unit)),
            "step": run.state.step,
            "source": round_.formation.restore.source.value if round_.formation else None,
        },
    )


def parse_mesh_args(argv: list[str] | None = None) -> tuple[int, argparse.Namespace]:
    """``--tp``, ``--replicate-dp`` (as ``args.replicate_dp``) and demo_train's options."""
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--tp", type=int, default=TP)
    probe.add_argument("--replicate-dp", action="store_true")
    probe_args, rest = probe.parse_known_args(argv)
    args = parse_args(rest)
    if args.host is None:
        raise SystemExit("mesh_train: give --host, the simulated host this worker runs on")
    args.replicate_dp = probe_args.replicate_dp
    return probe_args.tp, args


def main(argv: list[str] | None = None) -> None:
    tp, args = parse_mesh_args(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    # A full state dict of (_StridedShard, Shard) parameters takes two all-gathers; torch
    # says so at every formation.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    state = make_state(tp, replicate_dp=args.replicate_dp)
    settings = shape_settings(tp, args.host)
    settings.pop("host")
    with open_run(args, state, **settings) as run:
        train(
            run,
            checkpoint_every=args.checkpoint_every,
            step_sleep_s=args.step_sleep_s,
            after_formed=lambda formed: announce_mesh(formed, tp),
        )
    sys.stdout.flush()
    os._exit(0)  # as demo_train: do not join DCP writer threads of abandoned rounds


if __name__ == "__main__":
    main()
