"""One worker of test_mesh_elastic.py: the mesh example (rallypoint.worker.mesh_train) plus
probes:

- after every formation, ``formed_state`` with the restored step, its source and a digest of
  the whole (gathered) model and optimizer state, so the test can check that every rank of a
  re-formed world holds the same state;
- once per round, after a step past the round's first, ``step_bounds``: the timeouts (s) of
  the default group and of the mesh's "dp" and "tp" groups as the step left them;
- ``left_round`` after each round this worker left while the run goes on: whether its "tp"
  group still exists once the round is torn down (``tp_alive``).

    python mesh_worker.py MESH_TRAIN_ARGS...
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import logging
import os
import signal
import sys
import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from rallypoint.worker.demo_train import emit, open_run, state_digest, train
from rallypoint.worker.elastic import ElasticRound, ElasticRun
from rallypoint.worker.elastic import run as elastic_run
from rallypoint.worker.mesh_train import (
    announce_mesh,
    make_state,
    parse_mesh_args,
    shape_settings,
)


def timeout_s(group: dist.ProcessGroup) -> float:
    backend = group._get_backend(torch.device("cpu"))
    return float(backend.options._timeout.total_seconds())  # type: ignore[attr-defined]


def note_step_bounds() -> None:
    """Make every round print ``step_bounds`` once, after its second step."""
    real_step = ElasticRound.step
    reported: set[int] = set()

    @contextlib.contextmanager
    def step(self: ElasticRound) -> Iterator[None]:
        with real_step(self):
            yield
        if self.number in reported or self.steps_trained < 1 or self.ended:
            return
        reported.add(self.number)
        mesh = next(p for p in self.run.state.model.parameters() if isinstance(p, DTensor))
        world = dist.group.WORLD
        assert world is not None
        emit(
            "step_bounds",
            {
                "t": time.time(),
                "name": getattr(self.run, "name", ""),
                "round": self.number,
                "world_s": timeout_s(world),
                "dp_s": timeout_s(mesh.device_mesh.get_group("dp")),
                "tp_s": timeout_s(mesh.device_mesh.get_group("tp")),
            },
        )

    ElasticRound.step = step  # type: ignore[method-assign,assignment]


def note_left_rounds() -> None:
    """Make every round left (not finished) print ``left_round`` with ``tp_alive``."""
    real_leave = elastic_run.leave_round

    def leave_round(round_: ElasticRound, *args: Any, finished: bool, **kwargs: Any) -> None:
        model = round_.run.state.model
        mesh = next((p.device_mesh for p in model.parameters() if isinstance(p, DTensor)), None)
        tp = None
        if mesh is not None and not finished:
            try:
                tp = weakref.ref(mesh.get_group("tp"))
            except RuntimeError:
                # A round that failed to form: its mesh's groups were never made or are gone
                # already ("Could not resolve the process group"); nothing to watch close.
                tp = None
        real_leave(round_, *args, finished=finished, **kwargs)
        if tp is None:
            return
        gc.collect()
        emit(
            "left_round",
            {
                "t": time.time(),
                "name": getattr(round_.run, "name", ""),
                "round": round_.number,
                "tp_alive": tp() is not None,
            },
        )

    elastic_run.leave_round = leave_round  # type: ignore[assignment]


def main() -> None:
    tp, args = parse_mesh_args(sys.argv[1:])
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    state = make_state(tp)
    note_step_bounds()
    note_left_rounds()

    def after_formed(formed: ElasticRun) -> None:
        announce_mesh(formed, tp)
        assert formed.current is not None and formed.current.formation is not None
        formation = formed.current.formation
        emit(
            "formed_state",
            {
                "t": time.time(),
                "name": formed.name,
                "round": formation.round_number,
                "world_size": formation.world_size,
                "step": formed.state.step,
                "source": formation.restore.source.value,
                "digest": state_digest(formed.state.model, formed.state.optimizer),
            },
        )

    settings = shape_settings(tp, args.host)
    settings.pop("host")
    with open_run(args, state, **settings) as run:
        train(
            run,
            checkpoint_every=args.checkpoint_every,
            step_sleep_s=args.step_sleep_s,
            after_formed=after_formed,
        )
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
