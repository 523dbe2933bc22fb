"""What the launcher tests' training scripts share (each script imports it from its own folder,
which is the first entry of ``sys.path`` when a launcher runs the script by path).

- ``Events``: each process appends JSON lines to ``OUT/events-<pid>.jsonl``: ``started``
  (pid, rank, world size, torchrun's restart count, group rank, the parent process - the
  torchrun agent - and the step it resumed from), ``step`` after each optimizer step (wall
  time, step, loss) and ``done`` (the last step and loss). The tests measure from a kill they
  make to the first ``step`` of every new worker, as ``make bench-torchrun`` does.
- The data and model: a linear regression (16 features, fixed seed) that an SGD step improves,
  so "the final loss is below the first" says training went on.
- ``Checkpoints``: rank 0 saves every ``SAVE_EVERY`` steps under ``OUT/ckpt/`` and names the
  newest in ``OUT/ckpt/latest`` (written by rename, so a kill never leaves it half written); a
  restarted round resumes from it. The simulated nodes share this machine's file system, as
  real nodes share a network file system or object store.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

FEATURES = 16
SAMPLES = 2048
BATCH = 16
SAVE_EVERY = 10


class Events:
    def __init__(self, out: Path, rank: int, world_size: int) -> None:
        self.path = out / f"events-{os.getpid()}.jsonl"
        self.common = {
            "pid": os.getpid(),
            "rank": rank,
            "world_size": world_size,
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            "group_rank": int(os.environ.get("GROUP_RANK", "-1")),
            "agent": os.getppid(),
        }

    def emit(self, event: str, **fields: Any) -> None:
        with open(self.path, "a") as log:
            print(json.dumps({"event": event, "t": time.time(), **self.common, **fields}), file=log)


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    w = torch.randn(FEATURES, 1, generator=generator)
    y = x @ w + 0.01 * torch.randn(SAMPLES, 1, generator=generator)
    return TensorDataset(x, y)


def model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Linear(FEATURES, 1)


class Checkpoints:
    def __init__(self, out: Path) -> None:
        self.folder = out / "ckpt"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.latest_path = self.folder / "latest"

    def latest(self) -> tuple[int, Path] | None:
        """(step, path) of the newest committed checkpoint; None before the first."""
        try:
            name = self.latest_path.read_text().strip()
        except FileNotFoundError:
            return None
        return int(name.rsplit("-", 1)[1].split(".")[0]), self.folder / name

    def path_for(self, step: int, suffix: str = ".pt") -> Path:
        return self.folder / f"step-{step:06d}{suffix}"

    def commit(self, step: int, suffix: str = ".pt") -> None:
        """Name ``path_for(step)`` the newest (rank 0, once the checkpoint is whole)."""
        temporary = self.latest_path.with_suffix(f".{os.getpid()}")
        temporary.write_text(self.path_for(step, suffix).name)
        os.replace(temporary, self.latest_path)
