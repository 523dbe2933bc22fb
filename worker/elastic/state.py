"""What a round trains (:class:`TrainState`), how it was formed (:class:`Formation`) and
what a round needs of its run (:class:`RunView`): what every module of the loop shares."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from rallypoint.client import JobConfig, SyncClient, SyncParticipant

from ..sampler import ElasticSampler
from .config import ElasticConfig

if TYPE_CHECKING:
    from ..checkpoint import RestoreResult
    from ..snapshots import MemorySnapshots


@dataclass
class TrainState:
    """What a worker trains and what a checkpoint holds: model, optimizer, sampler, step and
    ``extra`` (picklable, the same on every rank, e.g. a schedule's state).

    ``step`` is the current step: the optimizer steps the whole world has taken. It is set
    by each round's restore (so a worker that joins late, or comes back, reads the world's
    step, not its own count) and advanced by ``round.step_done()``; read it as
    ``state.step`` (or ``run.state.step``) anywhere in the loop.

    Attributes:
        model: the module trained (replicated on every rank, or DTensor-sharded).
        optimizer: its optimizer; its state is checkpointed and restored with the model.
        sampler: the elastic sampler whose position is part of the checkpoint (None: the
            loop's ``batches(loader)`` gets a loader of its own).
        step: optimizer steps taken by the whole world (see above).
        extra: anything picklable to checkpoint with the state, the same on every rank.
        build: for a model sharded over the world (FSDP2's ``fully_shard`` over a mesh of
            the world's ranks): makes a new model and optimizer for the current world,
            called at every formation once the process group is up; the state is then
            restored into them (from peers' memory or disk, resharded). ``model`` and
            ``optimizer`` are replaced: read them from the state in each round. None: the
            model is replicated and kept across rounds.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    sampler: ElasticSampler | None = None
    # Optimizer steps taken by the whole world. Invariant: the model and optimizer hold the
    # state after exactly ``step`` steps (the sampler's position matches them).
    step: int = 0
    extra: Any = None
    build: Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer]] | None = None


@dataclass(frozen=True, slots=True)
class Formation:
    """How one round was formed, for logs and the demo.

    Attributes:
        round_number: the round's number.
        rank: this worker's rank in it.
        world_size: the number of workers in it.
        fencing_token: the round's fencing token.
        init_s: seconds from the round's start to the process group's init.
        restore: how the state was restored (its ``source``: keep, broadcast, replicas,
            memory, disk, fresh; ``reason``, ``step``, ``bytes_moved``, ``duration_s``).
        formed_s: seconds from the round's start to the end of the restore.
        checkpoint: the latest committed checkpoint's path when the round formed (None:
            there was none).
    """

    round_number: int
    rank: int
    world_size: int
    fencing_token: int
    # From the round's ACTIVE notice to the group's init, and to the end of the restore.
    init_s: float
    restore: RestoreResult
    formed_s: float
    # The latest committed checkpoint when the round formed (None: there was none).
    checkpoint: str | None


class RunView(Protocol):
    """What a round (round.py, commit.py, progress.py) uses of the run that formed it
    (:class:`ElasticRun`, run.py). A protocol, so that the round's modules do not import the
    run's: the run imports them."""

    job: str
    # This worker's name and failure domain (its host).
    name: str
    host: str
    state: TrainState
    # Where checkpoints are written, absolute.
    checkpoint_dir: Path
    settings: ElasticConfig
    # The job's configuration as the coordinator holds it (the hang verdict's numbers).
    config: JobConfig
    memory: MemorySnapshots | None
    last_loss: float | None

    @property
    def client(self) -> SyncClient: ...

    @property
    def participant(self) -> SyncParticipant: ...

    def emit(self, kind: str, **fields: Any) -> None: ...

    def reached_max_steps(self) -> bool: ...
