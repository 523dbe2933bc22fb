"""A bounded training loop for torchrun tests and the benchmark, unchanged from what a user
would write: ``init_process_group("gloo")`` from torchrun's environment, then ``--steps``
all-reduces ``--step-s`` apart, each checked, then exit 0.

    torchrun ... tests/worker/torchrun_script.py --out DIR [--steps N] [--step-s S]

Each process appends JSON lines to DIR/events-<pid>.jsonl: ``started`` (pid, rank, world size,
torchrun's restart count, the agent's pid, MASTER_ADDR/PORT), ``step`` after each all-reduce
(with the wall time, so a test can measure from a fault it injected) and ``done``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-s", type=float, default=0.05)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    log_path = args.out / f"events-{os.getpid()}.jsonl"
    common = {
        "pid": os.getpid(),
        "rank": rank,
        "world_size": world_size,
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "group_rank": int(os.environ.get("GROUP_RANK", "-1")),
        # The torchrun agent that started this worker (its parent).
        "agent": os.getppid(),
    }

    def emit(event: str, **fields: Any) -> None:
        with open(log_path, "a") as log:
            print(json.dumps({"event": event, "t": time.time(), **common, **fields}), file=log)

    emit("started", master=f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")
    expected = world_size * (world_size + 1) / 2
    for step in range(args.steps):
        tensor = torch.tensor([float(rank + 1)])
        dist.all_reduce(tensor)
        if tensor.item() != expected:
            raise AssertionError(f"step {step}: all_reduce gave {tensor.item()}, not {expected}")
        emit("step", step=step)
        time.sleep(args.step_s)
    dist.barrier()
    emit("done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
