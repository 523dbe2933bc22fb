"""An elastic, resumable data sampler: no sample repeated or skipped when the world changes.

Theory of operation. An epoch is a permutation of ``range(num_samples)`` drawn from a
``torch.Generator`` seeded with ``seed + epoch`` (identical in every process). The only state
that matters for resumption is the *global position*: how many samples of that permutation
the whole world has already trained on. It is part of the checkpoint.

From a global position ``p``, with the current world of ``world_size`` ranks and a per-rank
``batch_size``, the next *global step* is the run of the permutation starting at ``p``::

    step_size = min(world_size * batch_size, num_samples - p)

and rank ``r`` takes its contiguous slice of it. When a full step is left every rank gets
exactly ``batch_size`` samples. In the tail of an epoch (fewer than ``world_size *
batch_size`` samples left) the remainder is split as evenly as possible: every rank gets
``step_size // world_size`` samples and the first ``step_size % world_size`` ranks one more.
Nothing is padded or duplicated, so when fewer samples than ranks remain, the last ranks get an
*empty* batch: every rank still takes the same number of steps per epoch (which collectives
need), and the training step must accept an empty batch (contribute a zero gradient). With
``drop_last=True`` the epoch ends instead as soon as a full global step no longer fits; the
samples left over are skipped for that epoch (fewer than ``world_size * batch_size`` of them).

After every rank has trained on a step the loop calls ``advance()``; the position moves by
that step's size, which every rank computes identically from ``(position, world_size,
batch_size)``. Iterating never moves the position, so a DataLoader that prefetches batches
(``num_workers > 0``) cannot make the saved position run ahead of the model: a checkpoint
taken between ``advance()`` calls records exactly the samples every rank has trained on.

When the world changes (``set_world``), the new world resumes at the saved global position
with the new partition. Because steps are consecutive runs of one permutation, any sequence
of world sizes consumes the permutation's prefix ``[0, position)`` exactly once.

Typical use, as with ``DistributedSampler`` (but passed as ``batch_sampler``)::

    sampler = ElasticSampler(len(dataset), batch_size=32, rank=rank, world_size=world, seed=0)
    sampler.load_state_dict(restored)               # resume, possibly at another world size
    loader = DataLoader(dataset, batch_sampler=sampler)
    for epoch in range(sampler.epoch, num_epochs):
        sampler.set_epoch(epoch)                     # keeps the position when resuming
        for batch in loader:
            train_step(batch)
            sampler.advance()                        # every rank has trained on this step
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Sampler

STATE_FORMAT = 1


@dataclass(frozen=True, slots=True)
class GlobalStep:
    """One global step as seen by one rank.

    ``start``/``size`` locate the whole world's step in the epoch's permutation; ``indices``
    are this rank's samples (dataset indices), possibly empty in the tail of an epoch."""

    epoch: int
    start: int
    size: int
    indices: list[int]

    @property
    def end(self) -> int:
        """The global position once every rank has trained on this step."""
        return self.start + self.size


def epoch_permutation(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The order of the dataset's indices in ``epoch``: the same in every process."""
    if not shuffle:
        return list(range(num_samples))
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    order: list[int] = torch.randperm(num_samples, generator=generator).tolist()
    return order


def global_step_size(
    position: int, num_samples: int, world_size: int, batch_size: int, drop_last: bool
) -> int:
    """Samples in the global step starting at ``position``; 0 when the epoch is over."""
    remaining = num_samples - position
    if remaining < 0:
        raise ValueError(f"position {position} is past the epoch's {num_samples} samples")
    full_step = world_size * batch_size
    if remaining >= full_step:
        return full_step
    return 0 if drop_last else remaining


def rank_slice(step_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """Offsets ``[begin, end)`` of ``rank``'s samples within a step of ``step_size`` samples.

    An even split: ``step_size // world_size`` each, the first ``step_size % world_size`` ranks
    one more. For a full step (``world_size * batch_size``) that is ``batch_size`` each."""
    base, extra = divmod(step_size, world_size)
    begin = rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)


class ElasticSampler(Sampler[list[int]]):
    """Batches of dataset indices for one rank; use as ``DataLoader(batch_sampler=...)``.

    Iteration yields this rank's batch for every global step from the current position to the
    end of the epoch, and does not move the position: call ``advance()`` once per step, after
    every rank has trained on it. ``steps()`` yields the same batches as ``GlobalStep`` values.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.rank = 0
        self.world_size = 1
        self.set_world(rank, world_size)
        self.epoch = 0
        # Samples of this epoch's permutation the whole world has trained on.
        # Invariant: 0 <= position <= num_samples, and position is a sum of global step sizes.
        self.position = 0
        # Cache of (epoch, permutation) so iterating twice does not redraw it.
        self._permutation: tuple[int, list[int]] | None = None

    # -- world and epoch -----------------------------------------------------------------

    def set_world(self, rank: int, world_size: int) -> None:
        """Repartition for a new world; the global position is kept."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of size {world_size}")
        self.rank = rank
        self.world_size = world_size

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` at position 0, unless it is the current epoch (a resumed run)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self.epoch = epoch
            self.position = 0

    # -- iteration -----------------------------------------------------------------------

    def permutation(self) -> list[int]:
        """The current epoch's order of dataset indices."""
        if self._permutation is None or self._permutation[0] != self.epoch:
            order = epoch_permutation(self.num_samples, self.seed, self.epoch, self.shuffle)
            self._permutation = (self.epoch, order)
        return self._permutation[1]

    def next_step_size(self) -> int:
        """Samples in the next global step for the current world; 0 once the epoch is over."""
        return global_step_size(
            self.position, self.num_samples, self.world_size, self.batch_size, self.drop_last
        )

    def epoch_done(self) -> bool:
        return self.next_step_size() == 0

    def steps(self) -> Iterator[GlobalStep]:
        """This rank's global steps from the current position (which this does not move)."""
        order = self.permutation()
        epoch, rank, world_size = self.epoch, self.rank, self.world_size
        position = self.position
        while True:
            size = global_step_size(
                position, self.num_samples, world_size, self.batch_size, self.drop_last
            )
            if size == 0:
                return
            begin, end = rank_slice(size, rank, world_size)
            yield GlobalStep(epoch, position, size, order[position + begin : position + end])
            position += size

    def __iter__(self) -> Iterator[list[int]]:
        for step in self.steps():
            yield step.indices

    def __len__(self) -> int:
        """Global steps left in this epoch for the current world (the same on every rank)."""
        remaining = self.num_samples - self.position
        full_step = self.world_size * self.batch_size
        full_steps, tail = divmod(remaining, full_step)
        return full_steps + (1 if tail and not self.drop_last else 0)

    def advance(self, steps: int = 1) -> int:
        """Record that every rank has trained on the next ``steps`` global steps.

        Returns the new global position. Advancing past the end of the epoch is a bug in the
        training loop (it trained on batches this sampler never gave out), so it raises."""
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        for _ in range(steps):
            size = self.next_step_size()
            if size == 0:
                raise RuntimeError(
                    f"advance() past the end of epoch {self.epoch} "
                    f"(position {self.position} of {self.num_samples})"
                )
            self.position += size
        return self.position

    # -- checkpointing -------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The resumable state; identical on every rank, so any rank's copy restores all."""
        return {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "position": self.position,
            "num_samples": self.num_samples,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at the saved epoch and global position, in the current world.

        The dataset size, seed and shuffle must match the saved ones (otherwise the saved
        position would index a different permutation). ``batch_size``, ``drop_last`` and the
        world may differ: the position is counted in samples, not steps."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"unknown sampler state format {state.get('format')!r}")
        for name in ("num_samples", "seed", "shuffle"):
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"sampler state is for {name}={state[name]!r}, "
                    f"this sampler has {name}={getattr(self, name)!r}"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.num_samples:
            raise ValueError(f"sampler state out of range: epoch {epoch}, position {position}")
        self.epoch = epoch
        self.position = position
