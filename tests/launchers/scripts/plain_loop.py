"""A plain DDP loop as a user writes it for torchrun: ``init_process_group("gloo")`` from
torchrun's environment, resume from the newest checkpoint, ``--steps`` SGD steps
``--step-s`` apart. What the TorchX, Kubeflow and Slurm tests run (events: train_common.py).

    torchrun ... plain_loop.py --out DIR [--steps N] [--step-s S]
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta
from itertools import cycle
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from train_common import BATCH, SAVE_EVERY, Checkpoints, Events, dataset, model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-s", type=float, default=0.05)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    events = Events(args.out, rank, world_size)
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    checkpoints = Checkpoints(args.out)
    step = 0
    latest = checkpoints.latest()
    if latest is not None:
        state = torch.load(latest[1])
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    ddp = DistributedDataParallel(net)
    events.emit("started", resumed_from=step)
    data = dataset()
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, seed=step)
    batches = cycle(DataLoader(data, batch_size=BATCH, sampler=sampler))
    loss = torch.tensor(0.0)
    while step < args.steps:
        x, y = next(batches)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        events.emit("step", step=step, loss=loss.item())
        if step % SAVE_EVERY == 0 and rank == 0:
            state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            torch.save(state, checkpoints.path_for(step))
            checkpoints.commit(step)
        time.sleep(args.step_s)
    dist.barrier()
    events.emit("done", step=step, loss=loss.item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
