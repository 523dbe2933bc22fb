"""Where a new world's training state comes from: the same decision on every rank.

Before a restore every rank gathers every rank's ``PeerState`` (survivor or newcomer, the step
it holds, whether its model is a full replica, what it holds of the registered memory
snapshot); ``choose_restore_source`` then picks KEEP, BROADCAST, MEMORY, DISK or FRESH from
those alone, so every rank picks the same without another exchange. The rule and the argument
for it are in its docstring. checkpoint.py's ``restore_state`` carries the decision out.
No IO and no collective here.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from .snapshots import MemoryHolding, RegisteredSnapshot, memory_blocker


class RestoreSource(enum.Enum):
    DISK = "disk"  # read a committed checkpoint, resharded to this world
    BROADCAST = "broadcast"  # received from a survivor over the process group
    KEEP = "keep"  # every rank already holds the same full state: nothing moved
    # Nothing saved and no survivor to copy from: the world starts from rank 0's state (a
    # new world's initial one), or, for a sharded model, from the state build() made.
    FRESH = "fresh"
    MEMORY = "memory"  # rebuilt from the in-memory snapshot held by the world's processes


# -- choosing where the state comes from ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerState:
    """What one rank holds before a restore; every rank gathers every rank's."""

    rank: int
    survivor: bool  # it trained in the previous world and holds that state in memory
    replicated: bool  # its model's parameters are full replicas (no sharded DTensors)
    step: int | None  # the step of the state it holds (survivors only)
    state_bytes: int  # bytes of its model and optimizer state
    # Throughputs measured in earlier restores, in bytes/s; None until measured.
    disk_bytes_per_s: float | None = None
    broadcast_bytes_per_s: float | None = None
    # What it holds of the registered memory snapshot (None: it keeps no snapshots).
    memory: MemoryHolding | None = None


@dataclass(frozen=True, slots=True)
class RestorePolicy:
    # Without measurements, broadcast only states up to this size (a gloo broadcast of a
    # large state holds every rank for its whole duration; reading shards does not).
    broadcast_max_bytes: int = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RestoreDecision:
    source: RestoreSource
    src_rank: int | None  # the survivor that broadcasts (BROADCAST only)
    reason: str
    # Steps the most advanced survivor had trained past the state chosen (0: nothing is
    # lost). For FRESH above 0 the world goes back to its initial state: restore_state says
    # so in the log.
    steps_rolled_back: int = 0


def choose_restore_source(
    peers: Sequence[PeerState],
    checkpoint_step: int | None,
    policy: RestorePolicy,
    memory: RegisteredSnapshot | None = None,
) -> RestoreDecision:
    """The same decision on every rank, from every rank's ``PeerState``; the most advanced
    consistent state wins.

    A survivor's memory is used only when the model is replicated on every rank and the
    most advanced survivors are at a step no older than the checkpoint's or the memory
    snapshot's: then KEEP if every rank is a survivor at that step, else BROADCAST from the
    lowest-ranked survivor at that step when the state is small enough (or broadcasting was
    measured at least as fast as reading). Otherwise MEMORY if ``memory`` (the registered
    memory snapshot) is no older than the checkpoint and every rank of its world is held by
    a process of this one; else DISK if there is a checkpoint, else FRESH. The reason names
    what ruled the others out.

    Survivors at different steps. A round can end while one rank waits in a step's
    all-reduce that its peers completed: the wait returns "abandoned" once the round has
    ended (collectives.py), although this rank's gradients were sent and summed into its
    peers' result. The peers count the step; the abandoned rank does not. Survivors of one
    world are therefore at most one step apart (a rank cannot complete step s + 1 without
    every rank's contribution to it, which a rank still at s - 1 never sent). What each
    holds is a whole, consistent state, only at different steps:

    - a survivor that counted step s holds the state after s steps: the parameters and
      optimizer state updated by the all-reduced gradients of every rank of the world (the
      abandoned rank's included), the step counter at s and the sampler advanced past the
      global step s, which covers every rank's slice of it (round.py, ``step_done``);
    - the abandoned rank holds the state after s - 1 steps: its gradients were cleared
      (``all_reduce_gradients``, or ``round.step()`` for a model's own collectives), so the
      ``optimizer.step()`` that followed changed neither parameters nor optimizer state
      (torch's optimizers skip a parameter without a gradient), and ``step_done`` counted
      nothing: step counter and sampler position stay at s - 1 (state.py's invariant).

    For a replicated model every survivor at the highest step holds the same bits (the same
    reduced gradients applied to the same replica), so broadcasting from the lowest-ranked
    of them gives every rank the state after step s, with its sampler position: no sample
    is repeated or skipped, and the step the others counted is not lost (torchft heals a
    replica that fell behind from one ahead the same way). Resetting instead (what this
    function did once: FRESH, since no checkpoint existed, sending rank 0's parameters with
    step 0) broke the invariant that the parameters are those after ``step`` steps.

    A sharded model (FSDP) cannot be healed from its survivors: each holds only its shards,
    laid out for the previous world, and ``TrainState.build`` replaces them at every
    formation. Survivors report the step they trained to all the same, so the choice can
    say what is lost: MEMORY or DISK if either exists (rolled back to that state, as with
    any restore from them); if neither does, FRESH, and when a survivor had trained past
    step 0 that is said (``steps_rolled_back``, the reason, a warning in the log) rather
    than done silently. Refusing instead would save nothing (the shards are gone already)
    and would end every job that changes its world before its first snapshot or checkpoint
    (a scale-up at start-up); FRESH is a consistent state: every rank starts from step 0
    with the sampler at the start of the data (formation.py)."""
    survivors = sorted((peer for peer in peers if peer.survivor), key=lambda peer: peer.rank)
    survivor_steps = sorted({peer.step for peer in survivors if peer.step is not None})
    # The most advanced step a survivor holds (None: no survivor, or none said its step).
    top_step = survivor_steps[-1] if survivor_steps else None

    def rolled_back(to_step: int) -> int:
        return max(0, (top_step or 0) - to_step)

    blocker = None
    if not survivors:
        blocker = "no survivor holds the state"
    elif not all(peer.replicated for peer in peers):
        blocker = "the model is sharded, no rank holds a full replica"
    elif top_step is None or any(peer.step is None for peer in survivors):
        blocker = "a survivor did not say its step"
    elif checkpoint_step is not None and top_step < checkpoint_step:
        blocker = f"survivors are at step {top_step}, older than the checkpoint"
    elif memory is not None and top_step < memory.step:
        blocker = f"survivors are at step {top_step}, older than the memory snapshot"
    if blocker is None:
        assert top_step is not None
        # The lowest-ranked survivor at the most advanced step (see the docstring).
        src = next(peer for peer in survivors if peer.step == top_step)
        behind = [peer.rank for peer in survivors if peer.step != top_step]
        if len(survivors) == len(peers) and not behind:
            return RestoreDecision(RestoreSource.KEEP, None, "every rank holds the same replica")
        healing = (
            f"; survivor(s) {', '.join(map(str, behind))} a step behind step {top_step}"
            if behind
            else ""
        )
        if checkpoint_step is None and memory is None:
            return RestoreDecision(
                RestoreSource.BROADCAST, src.rank, f"no checkpoint on disk{healing}"
            )
        if src.disk_bytes_per_s is not None and src.broadcast_bytes_per_s is not None:
            if src.broadcast_bytes_per_s >= src.disk_bytes_per_s:
                return RestoreDecision(
                    RestoreSource.BROADCAST,
                    src.rank,
                    f"broadcast measured at least as fast{healing}",
                )
            blocker = "disk measured faster than broadcast"
        elif src.state_bytes <= policy.broadcast_max_bytes:
            return RestoreDecision(
                RestoreSource.BROADCAST,
                src.rank,
                f"state of {src.state_bytes} bytes is within the broadcast limit{healing}",
            )
        else:
            blocker = f"state of {src.state_bytes} bytes is over the broadcast limit"
    if memory is not None:
        if checkpoint_step is not None and memory.step < checkpoint_step:
            memory_block: str | None = (
                f"the memory snapshot ({memory.snapshot}) is older than the checkpoint"
            )
        else:
            memory_block = memory_blocker(
                memory.snapshot, memory.world_size, [peer.memory for peer in peers]
            )
        if memory_block is None:
            return RestoreDecision(
                RestoreSource.MEMORY,
                None,
                f"{blocker}; the memory snapshot ({memory.snapshot}, {memory.world_size} ranks) "
                "is held by this world",
                rolled_back(memory.step),
            )
        blocker = f"{blocker}; {memory_block}"
    if checkpoint_step is not None:
        return RestoreDecision(RestoreSource.DISK, None, blocker, rolled_back(checkpoint_step))
    lost = rolled_back(0)
    if lost:
        blocker = (
            f"{blocker}; survivors had trained to step {top_step}, which nothing saved: "
            "the world starts again from step 0"
        )
    return RestoreDecision(RestoreSource.FRESH, None, f"no checkpoint and {blocker}", lost)
