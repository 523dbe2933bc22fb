"""Where a new world's training state comes from: the same decision on every rank.

Before a restore every rank gathers every rank's ``PeerState`` (survivor or newcomer, the step
it holds, whether its model is a full replica, what it holds of the registered memory
snapshot, and, for a sharded model, the layout of the shards it held in the previous world and
of those it needs in this one); ``choose_restore_source`` then picks KEEP, BROADCAST,
REPLICAS, MEMORY, DISK or FRESH from those alone, so every rank picks the same without another
exchange. The rule and the argument for it are in its docstring. checkpoint.py's
``restore_state`` carries the decision out (REPLICAS: replica_restore.py). No IO and no
collective here.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .snapshots import MemoryHolding, RegisteredSnapshot


class RestoreSource(enum.Enum):
    DISK = "disk"  # read a committed checkpoint, resharded to this world
    BROADCAST = "broadcast"  # received from a survivor over the process group
    KEEP = "keep"  # every rank already holds the same full state: nothing moved
    # Nothing saved and no survivor to copy from: the world starts from rank 0's state (a
    # new world's initial one), or, for a sharded model, from the state build() made.
    FRESH = "fresh"
    MEMORY = "memory"  # rebuilt from the in-memory snapshot held by the world's processes
    # Each rank's shards kept, or received from a survivor that holds the same shard at the
    # most advanced step (a model replicated across units, sharded only inside one).
    REPLICAS = "replicas"


# One local tensor of a rank's training state: (name, global offset, local shape, dtype).
# The name is "model.<parameter or buffer>" or "optimizer.<parameter>.<state field>"; the
# offset and shape place the local piece in the global tensor (a scalar: () and ()).
ShardKey = tuple[str, tuple[int, ...], tuple[int, ...], str]
MODEL_PREFIX, OPTIMIZER_PREFIX = "model.", "optimizer."


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
    # The pieces of the previous world's state it holds in memory, laid out for that world
    # (model and optimizer; survivors of a sharded model only, else None), and the pieces of
    # the model this world lays out for it (None: not given).
    holds: tuple[ShardKey, ...] | None = None
    needs: tuple[ShardKey, ...] | None = None


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    """Where every rank's pieces come from, for REPLICAS. Invariant: ``transfers`` holds one
    (receiver, sender, key) per piece each rank needs, sorted; sender == receiver means the
    rank keeps its own; every sender is a survivor at the most advanced step holding the
    key. ``progress_rank`` sends the step, sampler position, extra state and optimizer
    hyperparameters (the lowest-ranked survivor at that step)."""

    transfers: tuple[tuple[int, int, ShardKey], ...]
    progress_rank: int


def optimizer_needs(
    model_needs: Sequence[ShardKey], held: Sequence[ShardKey]
) -> tuple[ShardKey, ...]:
    """The optimizer pieces a rank needs beside ``model_needs`` (its model's pieces), read
    from what the sources ``held``: a fresh optimizer has no state to lay out yet. A state
    field held as a scalar (a step count) is needed as one; any other is laid out as its
    parameter's piece (elementwise optimizers: Adam's moments)."""
    fields: dict[str, dict[str, tuple[bool, str]]] = {}
    for name, _offset, shape, dtype in held:
        if not name.startswith(OPTIMIZER_PREFIX):
            continue
        parameter, _, field = name[len(OPTIMIZER_PREFIX) :].rpartition(".")
        fields.setdefault(parameter, {})[field] = (shape == (), dtype)
    needs: list[ShardKey] = []
    for name, offset, shape, _dtype in model_needs:
        parameter = name[len(MODEL_PREFIX) :]
        for field, (scalar, dtype) in sorted(fields.get(parameter, {}).items()):
            key = f"{OPTIMIZER_PREFIX}{parameter}.{field}"
            needs.append((key, (), (), dtype) if scalar else (key, offset, shape, dtype))
    return tuple(needs)


def plan_from_replicas(peers: Sequence[PeerState], top_step: int) -> ReplicaPlan | str:
    """Every rank's pieces from the survivors at ``top_step`` that hold them, or why not.

    A piece is identified by its layout (name, global offset, local shape, dtype): two ranks
    holding the same key at the same step hold the same bits when the state is replicated
    across units (every unit applied the same reduced gradients to the same replica). A
    rank keeps a piece it holds itself; any other comes from a holder chosen by the
    receiver's rank among the holders, so that receivers spread over senders."""
    top = [
        peer
        for peer in sorted(peers, key=lambda peer: peer.rank)
        if peer.survivor and peer.step == top_step and peer.holds is not None
    ]
    if not top:
        return f"no survivor at step {top_step} said what it holds"
    missing_needs = [peer.rank for peer in peers if peer.needs is None]
    if missing_needs:
        return f"rank(s) {', '.join(map(str, missing_needs))} did not say what they need"
    holders: dict[ShardKey, list[int]] = {}
    for peer in top:
        assert peer.holds is not None
        for key in peer.holds:
            holders.setdefault(key, []).append(peer.rank)
    held = sorted(holders)
    transfers: list[tuple[int, int, ShardKey]] = []
    for peer in sorted(peers, key=lambda peer: peer.rank):
        assert peer.needs is not None
        for key in (*peer.needs, *optimizer_needs(peer.needs, held)):
            ranks = holders.get(key)
            if not ranks:
                name, offset, shape, dtype = key
                return (
                    f"no survivor at step {top_step} holds {name} at offset {list(offset)} "
                    f"shape {list(shape)} ({dtype}), which rank {peer.rank} needs"
                )
            sender = peer.rank if peer.rank in ranks else ranks[peer.rank % len(ranks)]
            transfers.append((peer.rank, sender, key))
    return ReplicaPlan(tuple(sorted(transfers)), top[0].rank)


@dataclass(frozen=True, slots=True)
class RestorePolicy:
    # Without measurements, broadcast only states up to this size (a gloo broadcast of a
    # large state holds every rank for its whole duration; reading shards does not).
    broadcast_max_bytes: int = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RestoreDecision:
    source: RestoreSource
    # The survivor that broadcasts (BROADCAST), or that sends the step, sampler position and
    # extra state (REPLICAS); None otherwise.
    src_rank: int | None
    reason: str
    # Steps the most advanced survivor had trained past the state chosen (0: nothing is
    # lost). For FRESH above 0 the world goes back to its initial state: restore_state says
    # so in the log.
    steps_rolled_back: int = 0
    # Where each rank's pieces come from (REPLICAS only).
    plan: ReplicaPlan | None = None
    # The ranks a BROADCAST sends the state to: every rank but the survivors at the step
    # chosen, which hold it already (the newcomers and any survivor a step behind).
    receivers: tuple[int, ...] = ()


def choose_restore_source(
    peers: Sequence[PeerState],
    checkpoint_step: int | None,
    policy: RestorePolicy,
    memory: RegisteredSnapshot | None = None,
) -> RestoreDecision:
    """The same decision on every rank, from every rank's ``PeerState``; the most advanced
    consistent state wins.

    A survivor's memory is used only when the most advanced survivors are at a step no
    older than the checkpoint's or the memory snapshot's and either the model is replicated
    on every rank or its sharded pieces are held by them (REPLICAS, below). A replicated
    model then takes KEEP if every rank is a survivor at that step, else BROADCAST from the
    lowest-ranked survivor at that step when the state is small enough (or broadcasting was
    measured at least as fast as reading), to the ``receivers`` only: the other survivors at
    that step hold the same bits already (below), so nothing is sent to them. Otherwise
    MEMORY if ``memory`` (the registered memory snapshot) is no older than the checkpoint
    and every rank of its world is held by a process of this one; else DISK if there is a
    checkpoint, else FRESH. The reason names what ruled the others out.

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

    A sharded model is healed from its survivors when they hold, between them, every
    piece the new world needs (REPLICAS, nothing rolled back). Each survivor says what it
    held in the previous world (``holds``: every local tensor of its model and optimizer
    state as (name, global offset, local shape, dtype)) and every rank what this world lays
    out for it (``needs``: its model's pieces; the optimizer's follow from the holders',
    ``optimizer_needs``). When every rank's every piece is held by a survivor at the most
    advanced step (``plan_from_replicas``), each rank keeps the pieces it holds itself and
    receives the others from such a survivor, with the step, sampler position and extra
    state of the lowest-ranked one (``src_rank``). That is the case of a model replicated
    across units and sharded only inside one (tensor parallel inside a unit and replicated
    over data parallel, or HSDP whose shard group is the unit): every unit holds a whole
    replica, a unit-local position's shard is the same bits in every unit (the same reduced
    gradients applied to the same shard), and a lost unit leaves the others' copies. The
    same rule as a replicated model's: only survivors at the most advanced step send, so a
    survivor a step behind is healed too. It is not the case of a model sharded across
    units (FSDP over data parallel): a new world's shards are cut at other offsets, which no
    survivor holds whole.

    Otherwise a sharded model cannot be healed from its survivors: each holds only its
    shards, laid out for the previous world, and ``TrainState.build`` replaces them at every
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
    sharded = not all(peer.replicated for peer in peers)
    if not survivors:
        blocker = "no survivor holds the state"
    elif top_step is None or any(peer.step is None for peer in survivors):
        blocker = "a survivor did not say its step"
    elif checkpoint_step is not None and top_step < checkpoint_step:
        blocker = f"survivors are at step {top_step}, older than the checkpoint"
    elif memory is not None and top_step < memory.step:
        blocker = f"survivors are at step {top_step}, older than the memory snapshot"
    elif sharded:
        blocker = "the model is sharded, no rank holds a full replica"
        if any(peer.holds is not None for peer in survivors):
            plan = plan_from_replicas(peers, top_step)
            if isinstance(plan, ReplicaPlan):
                return RestoreDecision(
                    RestoreSource.REPLICAS,
                    plan.progress_rank,
                    f"every rank's shards are held by a survivor at step {top_step}",
                    plan=plan,
                )
            blocker = f"{blocker}, and {plan}"
    if blocker is None:
        assert top_step is not None
        # The lowest-ranked survivor at the most advanced step (see the docstring).
        src = next(peer for peer in survivors if peer.step == top_step)
        behind = [peer.rank for peer in survivors if peer.step != top_step]
        if len(survivors) == len(peers) and not behind:
            return RestoreDecision(RestoreSource.KEEP, None, "every rank holds the same replica")
        receivers = tuple(
            peer.rank for peer in peers if not (peer.survivor and peer.step == top_step)
        )
        healing = (
            f"; survivor(s) {', '.join(map(str, behind))} a step behind step {top_step}"
            if behind
            else ""
        )
        if checkpoint_step is None and memory is None:
            return RestoreDecision(
                RestoreSource.BROADCAST,
                src.rank,
                f"no checkpoint on disk{healing}",
                receivers=receivers,
            )
        if src.disk_bytes_per_s is not None and src.broadcast_bytes_per_s is not None:
            if src.broadcast_bytes_per_s >= src.disk_bytes_per_s:
                return RestoreDecision(
                    RestoreSource.BROADCAST,
                    src.rank,
                    f"broadcast measured at least as fast{healing}",
                    receivers=receivers,
                )
            blocker = "disk measured faster than broadcast"
        elif src.state_bytes <= policy.broadcast_max_bytes:
            return RestoreDecision(
                RestoreSource.BROADCAST,
                src.rank,
                f"state of {src.state_bytes} bytes is within the broadcast limit{healing}",
                receivers=receivers,
            )
        else:
            blocker = f"state of {src.state_bytes} bytes is over the broadcast limit"
    if memory is not None:
        if checkpoint_step is not None and memory.step < checkpoint_step:
            memory_block: str | None = (
                f"the memory snapshot ({memory.snapshot}) is older than the checkpoint"
            )
        else:
            # Only a job with memory snapshots gets here; the others never load their
            # restore code (snapshots/__init__.py).
            from .snapshots import memory_blocker

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
