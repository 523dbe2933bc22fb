"""The same regression with Lightning Fabric under torchrun: ``Fabric(strategy="ddp")`` joins
torchrun's process group; ``fabric.save``/``fabric.load`` checkpoint every 10 steps.

    torchrun --nnodes=2 --nproc-per-node=2 ... lightning_fabric.py --out DIR [--steps N]
"""

from __future__ import annotations

import argparse
import time
from itertools import cycle
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader
from train_common import BATCH, SAVE_EVERY, Checkpoints, Events, dataset, model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-s", type=float, default=0.05)
    args = parser.parse_args()

    fabric = L.Fabric(accelerator="cpu", strategy="ddp", devices=2, num_nodes=2)
    fabric.launch()
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    net, optimizer = fabric.setup(net, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(dataset(), batch_size=BATCH, shuffle=True))
    state = {"model": net, "optimizer": optimizer, "step": 0}
    checkpoints = Checkpoints(args.out)
    latest = checkpoints.latest()
    if latest is not None:
        fabric.load(latest[1], state)
    events = Events(args.out, fabric.global_rank, fabric.world_size)
    events.emit("started", resumed_from=state["step"])
    batches = cycle(loader)
    loss = torch.tensor(0.0)
    while state["step"] < args.steps:
        x, y = next(batches)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        fabric.backward(loss)
        optimizer.step()
        state["step"] += 1
        events.emit("step", step=state["step"], loss=loss.item())
        if state["step"] % SAVE_EVERY == 0:
            fabric.save(checkpoints.path_for(state["step"], ".ckpt"), state)
            fabric.barrier()
            if fabric.global_rank == 0:
                checkpoints.commit(state["step"], ".ckpt")
        time.sleep(args.step_s)
    fabric.barrier()
    events.emit("done", step=state["step"], loss=loss.item())


if __name__ == "__main__":
    main()
