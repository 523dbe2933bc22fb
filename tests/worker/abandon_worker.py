"""One elastic worker of test_restore_survivors.py: the demo's training program, where rank
``R`` of a world of ``W`` abandons the all-reduce of step ``N`` although it completed.

    python abandon_worker.py DEMO_TRAIN_ARGS... --collective-timeout-s S --hang-floor-s H \\
        --abandon-at-step N --abandon-rank R --abandon-world W

The interleaving of issue 37 (a round ending during an all-reduce), made deterministic:
that rank's wait for the all-reduce of step N first lets the collective complete for real
(its gradients reach its peers, which count step N and go on to step N + 1's all-reduce,
where they wait for it), prints ``holding``, stays until the round has ended (the test
SIGKILLs a peer, whose loss ends it), prints ``abandoned`` and returns False, as the
round's wait does when it sees the round's end before the work's completion. The rank then
clears its gradients and does not count step N, as the loop does with any abandoned step.

It prints the demo's lines (``step``, ``round_formed`` ...) and, after every formation,
``formed_state`` (the step, the sampler's epoch and position, the restore's source and
reason, a digest of the parameters and optimizer state), and ``final_state`` at the end.
The hold is bounded (``HOLD_S``) so a broken test never leaves it behind for long.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from rallypoint.worker.demo_train import (
    emit,
    make_state,
    open_run,
    parse_args,
    state_digest,
    train,
)
from rallypoint.worker.elastic import ElasticRound, ElasticRun

HOLD_S = 120.0


def main() -> None:
    fault = argparse.ArgumentParser(add_help=False)
    fault.add_argument("--collective-timeout-s", type=float, default=120.0)
    fault.add_argument("--hang-floor-s", type=float, default=1.5)
    fault.add_argument("--abandon-at-step", type=int, default=0)
    fault.add_argument("--abandon-rank", type=int, default=0)
    fault.add_argument("--abandon-world", type=int, default=3)
    faults, rest = fault.parse_known_args()
    args = parse_args(rest)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    state = make_state()
    assert state.sampler is not None
    sampler = state.sampler
    abandoned = False
    real_wait = ElasticRound.wait

    def wait_then_abandon(round_: ElasticRound, work: dist.Work, what: str) -> bool:
        nonlocal abandoned
        if (
            abandoned
            or what != "all_reduce"
            or round_.rank != faults.abandon_rank
            or round_.world_size != faults.abandon_world
            or state.step + 1 != faults.abandon_at_step
        ):
            return real_wait(round_, work, what)
        abandoned = True
        started = time.monotonic()
        # Reported as waiting in this collective, as the real wait does, so the leader's
        # progress sees a rank in a collective, not one that never entered it.
        round_.progress.entered_collective(started)
        try:
            work.wait()  # completes: every rank's gradients are summed, this one's included
            fields = {"name": args.name, "round": round_.number, "rank": round_.rank}
            emit("holding", {"t": time.time(), **fields, "step": state.step + 1})
            round_.ending.event.wait(HOLD_S)
            emit("abandoned", {"t": time.time(), **fields, "step": state.step + 1,
                               "completed": work.is_completed(), "ended": round_.ended,
                               "reason": round_.end_reason})  # fmt: skip
        finally:
            round_.progress.left_collective(started)
        return False

    ElasticRound.wait = wait_then_abandon  # type: ignore[method-assign]

    def after_formed(formed: ElasticRun) -> None:
        assert formed.current is not None and formed.current.formation is not None
        formation = formed.current.formation
        emit(
            "formed_state",
            {
                "t": time.time(),
                "name": formed.name,
                "round": formation.round_number,
                "rank": formation.rank,
                "world_size": formation.world_size,
                "step": formed.state.step,
                "epoch": sampler.epoch,
                "position": sampler.position,
                "source": formation.restore.source.value,
                "reason": formation.restore.reason,
                "digest": state_digest(formed.state.model, formed.state.optimizer),
            },
        )

    options = {"collective_timeout_s": faults.collective_timeout_s,
               "hang_floor_s": faults.hang_floor_s}  # fmt: skip
    with open_run(args, state, **options) as run:
        train(
            run,
            checkpoint_every=args.checkpoint_every,
            step_sleep_s=args.step_sleep_s,
            after_formed=after_formed,
        )
    emit(
        "final_state",
        {
            "t": time.time(),
            "name": args.name,
            "step": state.step,
            "epoch": sampler.epoch,
            "position": sampler.position,
            "digest": state_digest(state.model, state.optimizer),
        },
    )
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
