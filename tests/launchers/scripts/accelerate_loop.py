"""A plain PyTorch loop wrapped by Hugging Face ``Accelerator`` (CPU, gloo), as ``accelerate
launch`` runs it; ``accelerator.save_state``/``load_state`` checkpoint every 10 steps.

    accelerate launch --multi_gpu --num_machines 2 ... accelerate_loop.py --out DIR
"""

from __future__ import annotations

import argparse
import time
from itertools import cycle
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from train_common import BATCH, SAVE_EVERY, Checkpoints, Events, dataset, model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-s", type=float, default=0.05)
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True)
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    loader = DataLoader(dataset(), batch_size=BATCH, shuffle=True)
    net, optimizer, loader = accelerator.prepare(net, optimizer, loader)
    checkpoints = Checkpoints(args.out)
    step = 0
    latest = checkpoints.latest()
    if latest is not None:
        step, folder = latest
        accelerator.load_state(str(folder))
    events = Events(args.out, accelerator.process_index, accelerator.num_processes)
    events.emit("started", resumed_from=step)
    batches = cycle(loader)
    loss = torch.tensor(0.0)
    while step < args.steps:
        x, y = next(batches)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        accelerator.backward(loss)
        optimizer.step()
        step += 1
        events.emit("step", step=step, loss=loss.item())
        if step % SAVE_EVERY == 0:
            accelerator.save_state(str(checkpoints.path_for(step, "")))
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                checkpoints.commit(step, "")
        time.sleep(args.step_s)
    accelerator.wait_for_everyone()
    events.emit("done", step=step, loss=loss.item())
    accelerator.end_training()


if __name__ == "__main__":
    main()
