"""One elastic worker of test_formation.py: the demo's training program, with one fault in
the formation of its first round.

    python formation_worker.py DEMO_TRAIN_ARGS... --collective-timeout-s S [FAULT]

    --hold-after-init         once the process group is up, stay (heartbeat alive, the group
                              and its connections held) until the round has ended; then go
                              on, as a worker that learns of the end right after its init does
    --hold-after-publish      inside the init, once this rank's gloo address is in the round
                              store, stay until the round has ended, as when a round ends
                              mid-init; then the init's next store read goes on (answered
                              from the ended round's read-only store, or refused)
    --hold-in-snapshot-group  the same inside the making of the in-memory snapshots' first
                              gloo group (give --snapshot-every), as when a round ends while
                              those groups connect
    --hold-in-checkpoint-group  the same inside the making of the disk checkpoints' gloo
                              group at the round's first checkpoint (give --checkpoint-every)

Either way the worker prints ``holding`` (JSON, with the round) when it starts holding,
``released`` with ``read`` (``answered`` or ``refused: ...``) when the group's next store
read after a hold inside a group's connect returns, and the demo's lines (``step``,
``round_formed``, ``round_ended`` ...) otherwise. The hold is bounded (``HOLD_S``) so a
broken test never leaves it behind for long.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from rallypoint.worker.demo_train import emit, make_state, open_run, parse_args, train
from rallypoint.worker.elastic import ElasticRun
from rallypoint.worker.store import CoordinatorStore, StaleStoreRoundError

HOLD_S = 120.0


def main() -> None:
    faults = argparse.ArgumentParser(add_help=False)
    faults.add_argument("--collective-timeout-s", type=float, default=30.0)
    faults.add_argument("--hold-after-init", action="store_true")
    faults.add_argument("--hold-after-publish", action="store_true")
    faults.add_argument("--hold-in-snapshot-group", action="store_true")
    faults.add_argument("--hold-in-checkpoint-group", action="store_true")
    fault, rest = faults.parse_known_args()
    args = parse_args(rest)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    state = make_state(fsdp=args.fsdp)
    run: ElasticRun | None = None
    held: list[Any] = []  # what the hold keeps alive (the first round's group)

    def hold_until_the_round_ends(where: str) -> None:
        assert run is not None and run.current is not None
        round_ = run.current
        emit("holding", {"t": time.time(), "name": args.name, "round": round_.number,
                         "where": where})  # fmt: skip
        deadline = time.monotonic() + HOLD_S
        while not round_.ended and time.monotonic() < deadline:
            time.sleep(0.01)

    # After a hold inside a group's connect: report how the next store read went.
    real_wait = CoordinatorStore.wait
    report_next_read = False

    def wait_reporting(store: CoordinatorStore, keys: Any, timeout: Any = None) -> None:
        nonlocal report_next_read
        if not report_next_read:
            return real_wait(store, keys, timeout)
        report_next_read = False
        fields = {"t": time.time(), "name": args.name, "round": store.round_number}
        try:
            real_wait(store, keys, timeout)
        except StaleStoreRoundError as error:
            emit("released", {**fields, "read": f"refused: {error}"})
            raise
        emit("released", {**fields, "read": "answered"})

    CoordinatorStore.wait = wait_reporting  # type: ignore[method-assign,assignment]

    if fault.hold_after_init:
        real_init = dist.init_process_group

        def init_then_hold(*init_args: Any, **init_kwargs: Any) -> None:
            real_init(*init_args, **init_kwargs)
            if not held:
                held.append(dist.group.WORLD)
                hold_until_the_round_ends("after init")

        dist.init_process_group = init_then_hold

    if fault.hold_after_publish:
        real_set = CoordinatorStore.set

        def set_then_hold(store: CoordinatorStore, key: str, value: bytes | str) -> None:
            real_set(store, key, value)
            # The first key of the init that is not ours: this rank's gloo address.
            if not held and not key.startswith("rallypoint/"):
                held.append(key)
                hold_until_the_round_ends("after publishing its address")
                nonlocal report_next_read
                report_next_read = True

        CoordinatorStore.set = set_then_hold  # type: ignore[method-assign,assignment]

    def hold_in_group_of(modules: tuple[str, ...], where: str) -> None:
        """Hold after publishing this rank's address in the first gloo group one of
        ``modules`` makes (a peer whose connect to this rank goes through is then done with
        the round store and goes on), until the round ends."""
        real_new_group = dist.new_group
        made = 0  # groups this process made from that module
        in_group = False

        def new_group_noting(*group_args: Any, **group_kwargs: Any) -> Any:
            nonlocal made, in_group
            if sys._getframe(1).f_globals.get("__name__") in modules:
                made += 1
                in_group = made == 1
            try:
                return real_new_group(*group_args, **group_kwargs)
            finally:
                in_group = False

        dist.new_group = new_group_noting
        real_store_set = CoordinatorStore.set

        def set_then_hold_in_group(store: CoordinatorStore, key: str, value: bytes | str) -> None:
            real_store_set(store, key, value)
            # This rank's gloo address for that group (the loop's own keys are not gloo's).
            if in_group and not held and not key.startswith("rallypoint/"):
                held.append(key)
                hold_until_the_round_ends(where)
                nonlocal report_next_read
                report_next_read = True

        CoordinatorStore.set = set_then_hold_in_group  # type: ignore[method-assign,assignment]

    if fault.hold_in_snapshot_group:
        # The snapshots' first group (on gloo the only one: the protection thread's).
        hold_in_group_of(
            ("rallypoint.worker.snapshots.lifecycle",), "after publishing a snapshot group address"
        )
    if fault.hold_in_checkpoint_group:
        # The group the disk checkpoints' writes use, made at the round's first checkpoint
        # (by the elastic loop, or by the Checkpointer itself when not given one).
        modules = ("rallypoint.worker.elastic.round", "rallypoint.worker.checkpoint")
        hold_in_group_of(modules, "after publishing a checkpoint group address")

    with open_run(args, state, collective_timeout_s=fault.collective_timeout_s) as opened:
        run = opened
        train(opened, checkpoint_every=args.checkpoint_every, step_sleep_s=args.step_sleep_s)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
