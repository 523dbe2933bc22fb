"""One elastic worker with the faults of test_hangs.py: the demo's model and loop, plus

    --block-at-step N       block forever at the start of step N (a stuck data loader)
    --skip-collective-at-step N  compute step N, then never enter its all-reduce
    --jitter F              each step's sleep is --step-sleep-s x uniform(1 - F, 1 + F)
    --slow-factor X         this rank sleeps X times as long per step (a straggler)
    --long-step-every K --long-step-s S   every K steps, every rank sleeps S (a checkpoint)
    --straggler-factor F --straggler-window-s S --straggler-hold-windows N   the policy

It prints the demo's JSON lines (``step``, ``round_formed``, ``round_ended``, ...) and
``blocked`` when it blocks. Its heartbeat keeps going while it is blocked: only the progress
it reports tells the coordinator that it does not train.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time

import torch

from rallypoint.worker.demo_train import emit, make_data, make_state, open_run, parse_args


def main() -> None:
    faults = argparse.ArgumentParser(add_help=False)
    faults.add_argument("--block-at-step", type=int, default=0)
    faults.add_argument("--skip-collective-at-step", type=int, default=0)
    faults.add_argument("--jitter", type=float, default=0.0)
    faults.add_argument("--slow-factor", type=float, default=1.0)
    faults.add_argument("--long-step-every", type=int, default=0)
    faults.add_argument("--long-step-s", type=float, default=0.0)
    faults.add_argument("--straggler-factor", type=float, default=0.0)
    faults.add_argument("--straggler-window-s", type=float, default=10.0)
    faults.add_argument("--straggler-hold-windows", type=int, default=None)
    fault, rest = faults.parse_known_args()
    args = parse_args(rest)
    torch.set_num_threads(1)
    rng = random.Random(args.name)
    state = make_state()
    inputs, targets = make_data()
    model, optimizer = state.model, state.optimizer
    forever = threading.Event()

    def block(where: str) -> None:
        emit("blocked", {"t": time.time(), "name": args.name, "step": state.step, "where": where})
        forever.wait()

    options = {
        "collective_timeout_s": 120.0,  # only hang detection may end a round here
        "straggler_factor": fault.straggler_factor,
        "straggler_window_s": fault.straggler_window_s,
    }
    if fault.straggler_hold_windows is not None:
        options["straggler_hold_windows"] = fault.straggler_hold_windows
    with open_run(args, state, **options) as run:
        for round_ in run.rounds():
            for batch in round_.batches():
                upcoming = state.step + 1
                if upcoming == fault.block_at_step:
                    block("start of step")
                loss = torch.nn.functional.mse_loss(model(inputs[batch]), targets[batch])
                loss.backward()  # type: ignore[no-untyped-call]
                if upcoming == fault.skip_collective_at_step:
                    block("before the all-reduce")
                round_.all_reduce_gradients(model)
                optimizer.step()
                optimizer.zero_grad()
                sleep_s = args.step_sleep_s * fault.slow_factor
                if fault.jitter:
                    sleep_s *= rng.uniform(1 - fault.jitter, 1 + fault.jitter)
                if fault.long_step_every and upcoming % fault.long_step_every == 0:
                    sleep_s = fault.long_step_s
                time.sleep(sleep_s)  # the step's own work, outside collectives
                if round_.step_done(loss=loss.item()):
                    emit(
                        "step",
                        {
                            "t": time.time(),
                            "name": run.name,
                            "round": round_.number,
                            "rank": round_.rank,
                            "world_size": round_.world_size,
                            "step": state.step,
                        },
                    )
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
