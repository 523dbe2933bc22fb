"""One worker of test_replica_elastic.py: the mesh example (rallypoint.worker.mesh_train) with
``--replicate-dp``, printing after every formation ``formed_state``: the restored step, its
source and a digest of this rank's own pieces of the model and optimizer state (no
collective: a probe that gathered would hang in a round that ended under it), with the
rank's tensor-parallel position, so the test can compare the replicas position by position.

    python replica_worker.py MESH_TRAIN_ARGS...
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time

import torch

from rallypoint.worker.demo_train import emit, open_run, train
from rallypoint.worker.elastic import ElasticRun
from rallypoint.worker.mesh_train import announce_mesh, make_state, parse_mesh_args, shape_settings
from rallypoint.worker.replica_restore import held_state


def local_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    held = held_state(model, optimizer)
    assert held is not None
    digest = hashlib.sha256()
    for key in held.layout:
        digest.update(repr(key).encode())
        digest.update(held.pieces[key].contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    tp, args = parse_mesh_args(sys.argv[1:])
    torch.set_num_threads(1)
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    state = make_state(tp, replicate_dp=args.replicate_dp)

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
                "position": formation.rank % tp,
                "step": formed.state.step,
                "source": formation.restore.source.value,
                "reason": formation.restore.reason,
                "digest": local_digest(formed.state.model, formed.state.optimizer),
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
