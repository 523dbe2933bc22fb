"""One elastic worker of test_elastic.py: the demo's training program plus test probes.

    python elastic_worker.py DEMO_TRAIN_ARGS... [--pause-file PATH]

On top of the demo program's JSON lines it prints:

- ``formed_state`` after every formation: the step and a digest of the model's and
  optimizer's state, so the test can compare it with the checkpoint it was restored from;
- with ``--pause-file``: when rank 0 is about to commit and PATH exists, the worker stops
  itself (SIGSTOP, once), as a worker paused past its failure detection would be. Once
  resumed and told it was declared failed, it tries to write to the store of the round it
  was in and reports the outcome (``zombie_store``); then its commit proceeds and is refused
  (``checkpoint_refused``);
- with ``--pause-snapshot-file``: the same when rank 0 is about to register an in-memory
  snapshot every rank protected (``pausing`` with ``at: snapshot``); once resumed and told it
  was declared failed, its registration proceeds and is refused (``snapshot_refused``);
- with ``--digest-snapshots``: ``snapshot_digest`` (step, digest) as each memory snapshot is
  taken, the digest of the state it copies;
- with ``--health-check=pass`` or ``fail``: a pre-admission health check that passes, or
  that fails in every round (so the worker drains its own host). Every rank of a job runs
  the same check, as one program does: the ranks vote on its outcome in a collective
  (worker/elastic/formation.py), which a rank without a check does not join;
- with ``--client-timeout-s``: its client's deadline for one call (``timeout_s`` of its
  ``client_options``; the client's default otherwise);
- ``groups_alive`` once the run is left: how many of the process groups made in this
  process (``init_process_group``, ``new_group``) are still alive, and how many of them the
  run says it holds on purpose (``held``: a collective still pending on them).
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rallypoint.client import StaleRoundError
from rallypoint.worker.demo_train import (
    emit,
    make_state,
    open_run,
    parse_args,
    state_digest,
    train,
)
from rallypoint.worker.elastic import ElasticRun
from rallypoint.worker.elastic.commit import RoundCommits
from rallypoint.worker.snapshots import MemorySnapshots, SnapshotId, SnapshotPlacement


def main() -> None:
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--pause-file", type=Path, default=None)
    probe.add_argument("--pause-snapshot-file", type=Path, default=None)
    probe.add_argument("--health-check", choices=("pass", "fail"), default=None)
    probe.add_argument("--digest-snapshots", action="store_true")
    probe.add_argument("--client-timeout-s", type=float, default=None)
    probe_args, rest = probe.parse_known_args()
    args = parse_args(rest)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    state = make_state(fsdp=args.fsdp)
    paused = False
    run: ElasticRun | None = None

    def on_event(kind: str, fields: Mapping[str, Any]) -> None:
        nonlocal paused
        emit(kind, fields)
        pause_file = probe_args.pause_file
        if kind != "committing" or paused or pause_file is None or not pause_file.exists():
            return
        paused = True
        assert run is not None and run.current is not None
        round_ = run.current
        emit("pausing", {"t": time.time(), "round": round_.number, "step": fields["step"]})
        os.kill(os.getpid(), signal.SIGSTOP)
        # Resumed: the world has moved on without this worker, which learns so from the
        # coordinator; its writes to the old round are refused from then on.
        run.participant.lost.wait(timeout=30)
        try:
            round_.store.set("zombie-was-here", b"1")
            outcome = "accepted"
        except StaleRoundError as error:
            outcome = f"refused: {error}"
        emit("zombie_store", {"t": time.time(), "round": round_.number, "outcome": outcome})

    register = RoundCommits.register_snapshot
    snapshot_paused = False

    def pausing_register(
        commits: RoundCommits, snapshot: SnapshotId, world_size: int, placement: SnapshotPlacement
    ) -> bool:
        nonlocal snapshot_paused
        pause_file = probe_args.pause_snapshot_file
        if not snapshot_paused and pause_file is not None and pause_file.exists():
            snapshot_paused = True
            fields = {"round": commits.info.round, "step": snapshot.step, "at": "snapshot"}
            emit("pausing", {"t": time.time(), **fields})
            os.kill(os.getpid(), signal.SIGSTOP)
            assert run is not None
            run.participant.lost.wait(timeout=30)
        return register(commits, snapshot, world_size, placement)

    RoundCommits.register_snapshot = pausing_register  # type: ignore[method-assign,assignment]

    if probe_args.digest_snapshots:
        take = MemorySnapshots.take

        def digesting_take(
            memory: MemorySnapshots,
            step: int,
            model: torch.nn.Module,
            optimizer: torch.optim.Optimizer,
            **options: Any,
        ) -> Any:
            # The state this snapshot copies, before training changes it.
            digest = state_digest(model, optimizer)
            emit("snapshot_digest", {"t": time.time(), "step": step, "digest": digest})
            return take(memory, step, model, optimizer, **options)

        MemorySnapshots.take = digesting_take  # type: ignore[method-assign]

    def after_formed(formed: ElasticRun) -> None:
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
                "checkpoint": formation.checkpoint,
                "digest": state_digest(formed.state.model, formed.state.optimizer),
            },
        )

    # Every process group this process makes, weakly: alive at the end means not destroyed.
    groups: list[weakref.ref[Any]] = []
    real_init, real_new_group = dist.init_process_group, dist.new_group

    def init_noting(*init_args: Any, **init_kwargs: Any) -> None:
        real_init(*init_args, **init_kwargs)
        groups.append(weakref.ref(dist.group.WORLD))

    def new_group_noting(*group_args: Any, **group_kwargs: Any) -> Any:
        group = real_new_group(*group_args, **group_kwargs)
        groups.append(weakref.ref(group))
        return group

    dist.init_process_group = init_noting
    dist.new_group = new_group_noting

    options: dict[str, Any] = {}
    if probe_args.client_timeout_s is not None:
        options["client_options"] = {"timeout_s": probe_args.client_timeout_s}
    if probe_args.health_check == "fail":
        options["health_check"] = lambda round_: "failing its health check on purpose"
    elif probe_args.health_check == "pass":
        options["health_check"] = lambda round_: None
    with open_run(args, state, on_event, **options) as opened:
        run = opened
        train(
            opened,
            checkpoint_every=args.checkpoint_every,
            step_sleep_s=args.step_sleep_s,
            after_formed=after_formed,
        )
    assert run is not None
    alive = sum(ref() is not None for ref in groups)
    emit("groups_alive", {"t": time.time(), "made": len(groups), "alive": alive,
                          "held": run.held_groups()})  # fmt: skip
    emit(
        "final_state",
        {
            "t": time.time(),
            "step": state.step,
            "digest": state_digest(state.model, state.optimizer),
        },
    )
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
