"""One worker of test_mesh_elastic.py: the mesh example (rallypoint.worker.mesh_train) plus
a probe: after every formation, ``formed_state`` with the restored step, its source and a
digest of the whole (gathered) model and optimizer state, so the test can check that every
rank of a re-formed world holds the same state.

    python mesh_worker.py MESH_TRAIN_ARGS...
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import time

import torch

from rallypoint.worker.demo_train import emit, open_run, state_digest, train
from rallypoint.worker.elastic import ElasticRun
from rallypoint.worker.mesh_train import (
    announce_mesh,
    make_state,
    parse_mesh_args,
    shape_settings,
)


def main() -> None:
    tp, args = parse_mesh_args(sys.argv[1:])
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    state = make_state(tp)

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
