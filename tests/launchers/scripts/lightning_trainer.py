"""A ``LightningModule`` trained by ``Trainer(strategy="ddp")`` under torchrun: Lightning finds
torchrun's environment (TorchElasticEnvironment) and joins the process group it describes.
A ``ModelCheckpoint`` saves every 10 steps; a restarted round resumes from ``last.ckpt``.

    torchrun --nnodes=2 --nproc-per-node=2 ... lightning_trainer.py --out DIR [--steps N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader
from train_common import BATCH, SAVE_EVERY, Events, dataset, model


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = model()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class StepEvents(L.Callback):
    def __init__(self, out: Path, step_s: float) -> None:
        self.out = out
        self.step_s = step_s
        self.events: Events | None = None
        self.loss = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.events = Events(self.out, trainer.global_rank, trainer.world_size)
        self.events.emit("started", resumed_from=trainer.global_step)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        assert self.events is not None
        self.loss = float(outputs["loss"].item())
        self.events.emit("step", step=trainer.global_step, loss=self.loss)
        time.sleep(self.step_s)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        assert self.events is not None
        self.events.emit("done", step=trainer.global_step, loss=self.loss)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--step-s", type=float, default=0.05)
    args = parser.parse_args()

    folder = args.out / "ckpt"
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=2,
        num_nodes=2,
        max_steps=args.steps,
        callbacks=[
            StepEvents(args.out, args.step_s),
            ModelCheckpoint(dirpath=folder, every_n_train_steps=SAVE_EVERY, save_last=True),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    last = folder / "last.ckpt"
    loader = DataLoader(dataset(), batch_size=BATCH, shuffle=True)
    trainer.fit(Regression(), loader, ckpt_path=str(last) if last.exists() else None)


if __name__ == "__main__":
    main()
