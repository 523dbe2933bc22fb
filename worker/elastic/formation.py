"""Forming a round: arrival, the process group's init, the gate, the model's build and the
restore (the package docstring's "Formation" and "Restore" say why each step is there).

Every step of a formation is abandonable or bounded: a round that ends while it forms raises
:class:`RoundGone` (or the store's, the client's, the snapshots' error) to the run, which
tears the half-formed round down and waits for the next.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..errors import WorkerError
from ..lazy import any_dtensor
from ..restore_choice import RestoreSource
from ..snapshots import RegisteredSnapshot
from ..store import CoordinatorStore
from ..torch_compat import forget_previous_world, reset_group_count
from .collectives import connect_timeout
from .round import ElasticRound
from .state import Formation, RunView

if TYPE_CHECKING:
    from ..checkpoint import RestoreResult
    from ..replica_restore import HeldState

# Set by each rank as it starts forming the round; init waits for every rank's (Formation).
ARRIVED_KEY = "rallypoint/formation/arrived/{rank}"


# Why every rank gives a forming round up when a rank's health check drained its domain.
HEALTH_VOTE_ENDED = "a rank's pre-admission health check drained its domain"


class RoundGone(WorkerError):
    """The round ended while it was being formed."""


class Former:
    """Forms the rounds of one run, and remembers what its process holds between them."""

    def __init__(self, run: RunView, backend: str) -> None:
        self._run = run
        self._backend = backend
        # The run's in-memory snapshots (None: off).
        self._memory = run.memory
        # The model and optimizer hold a state that the world trained (not a fresh process's
        # initial state, nor one from before this participant was lost).
        self.survivor = False

    def form(self, round_: ElasticRound, started: float) -> Formation:
        """Init the process group and restore (module docstring); the round's formation.
        ``started``: when the round's ACTIVE notice came (monotonic)."""
        run, info, rank = self._run, round_.info, round_.rank
        collective_timeout_s = run.settings.collective_timeout_s
        store = CoordinatorStore.for_round(
            run.client,
            info,
            run.participant.participant_id,
            timeout=timedelta(seconds=collective_timeout_s),
        )
        round_.collectives.hold(store)
        if not round_.ended:
            self._arrive(round_, store)
            # Every round starts torch's group names from zero on every rank (torch_compat).
            reset_group_count()
            group_connect = connect_timeout(collective_timeout_s)
            dist.init_process_group(
                self._backend,
                store=store,
                rank=rank,
                world_size=info.world_size,
                timeout=group_connect,
            )
            group = dist.group.WORLD
            assert group is not None
            round_.collectives.hold(group)
            group.set_timeout(timedelta(seconds=collective_timeout_s))
            if self._memory is not None:
                # The snapshots' groups connect through the round store too: made now,
                # bounded as the init is, before the gate ("Formation").
                self._memory.make_groups(connect_timeout=group_connect)
        init_s = time.monotonic() - started
        if round_.ended:
            raise RoundGone(round_.end_reason)
        self._check_health(round_)
        state = run.state
        if state.sampler is not None:
            state.sampler.set_world(rank, info.world_size)
        # The step this process trained to in the previous world (None: it did not train
        # in it), said to the restore even when a sharded model's shards are replaced below.
        trained_step = state.step if self.survivor else None
        # What a survivor of a sharded model held, laid out for the previous world, taken
        # before build() replaces it: the restore may heal the new world from it (replicas).
        sharded_survivor = self.survivor and state.build is not None
        held = None
        if sharded_survivor:
            from ..replica_restore import held_state  # the restore path (package, "Imports")

            held = held_state(state.model, state.optimizer)
        if state.build is not None:
            # A sharded model is laid out for one world: a new one for this world, its
            # state restored below (what this process held is no longer in place). torch
            # would hand its DTensors the previous world's mesh (torch_compat.py says why).
            forget_previous_world()
            state.model, state.optimizer = state.build()
            from .fsdp_comm import abandonable_fsdp  # FSDP's, only for a sharded model

            abandonable_fsdp(state.model, round_.wait, lambda: round_.end_reason)
            self.survivor = False
        latest = run.client.latest_checkpoint(run.job)
        checkpoint = Path(latest.uri) if latest is not None else None
        memory_snapshot = None
        if self._memory is not None:
            # Collective: the new world's token and placement, before a restore that
            # may read from the peers' snapshot servers.
            self._memory.attach(
                info.round,
                on_complete=round_.commits.register_snapshot,
                timeout=timedelta(seconds=collective_timeout_s),
            )
            registered = run.client.latest_memory_snapshot(run.job)
            if registered is not None:
                memory_snapshot = RegisteredSnapshot.of(registered)
        restored = self._restore(checkpoint, round_, memory_snapshot, trained_step, held)
        del held
        self.survivor = True
        state.step = restored.step
        return Formation(
            round_number=info.round,
            rank=rank,
            world_size=info.world_size,
            fencing_token=info.fencing_token,
            init_s=init_s,
            restore=restored,
            formed_s=time.monotonic() - started,
            checkpoint=str(checkpoint) if checkpoint is not None else None,
        )

    def _check_health(self, round_: ElasticRound) -> None:
        """Run the pre-admission health check (health.py) and pass the gate with this rank's
        vote on it; when any rank's check says its domain should be drained, every rank
        gives the round up before restoring anything and that rank drains its domain (the
        drain ends the round at the coordinator).

        Every rank votes, one with no check "healthy", whatever the others' settings: the
        vote rides on the gate's all-reduce, which every rank runs anyway, so it costs no
        collective of its own. A vote of its own run only by ranks with a check (as it once
        was) left them waiting in it, and the others in the restore's collectives, for
        ``collective_timeout_s`` at every formation of a job whose hosts differ in it. The
        check runs before the gate: it may use the round's group (health.py), through
        collectives that are given up when the round ends, as the gate's is."""
        run = self._run
        check = run.settings.health_check
        reason = check(round_) if check is not None and not round_.ended else None
        votes = torch.tensor([0.0 if reason is None else 1.0])
        passed = round_.collectives.gate(votes=votes)
        drained = passed and votes.item() > 0
        if drained:
            # Ended here on every rank at once (not by the drain's planned change, which
            # waits for a step boundary that a forming round never reaches).
            round_.end(f"{HEALTH_VOTE_ENDED} ({votes.item():g})")
        if reason is not None:
            detail = f"{run.name}: {reason}"[:1024]
            run.client.drain(run.host, reason=detail)
            run.emit("health_drained", round=round_.number, rank=round_.rank, reason=detail)
        if not passed or drained:
            raise RoundGone(round_.end_reason)

    def _arrive(self, round_: ElasticRound, store: CoordinatorStore) -> None:
        """Say this rank is forming ``round_`` and wait until every rank is (package
        docstring, "Formation"). Raises StaleStoreRoundError the moment the round ends, and
        StoreTimeoutError after ``collective_timeout_s``."""
        store.set(ARRIVED_KEY.format(rank=round_.rank), b"1")
        store.wait(
            [ARRIVED_KEY.format(rank=rank) for rank in range(round_.world_size)],
            timedelta(seconds=self._run.settings.collective_timeout_s),
        )

    def _restore(
        self,
        checkpoint: Path | None,
        round_: ElasticRound,
        memory_snapshot: RegisteredSnapshot | None,
        survivor_step: int | None,
        held: HeldState | None = None,
    ) -> RestoreResult:
        """Every rank to the same state, and every part of it from the same source: the
        parameters, the optimizer state, the step, the sampler's position and the extra
        state (the invariant of ``TrainState.step``)."""
        # Loaded here, not at import: the restore path (torch.distributed.checkpoint under
        # it) is warmed while the worker joins (package docstring, "Imports").
        from ..checkpoint import RestoreResult, broadcast_state, restore_state

        run, state = self._run, self._run.state
        if run.settings.restore == "checkpoint" and checkpoint is not None:
            survivor_step, memory_snapshot, held = None, None, None
        result = restore_state(
            state.model,
            state.optimizer,
            checkpoint=checkpoint,
            survivor_step=survivor_step,
            extra=state.extra,
            sampler=state.sampler,
            memory=self._memory,
            memory_snapshot=memory_snapshot,
            previous=held,
        )
        if result.source is RestoreSource.FRESH:
            replicated = not any_dtensor(state.model.parameters())
            if not replicated:
                # build() made the model and optimizer afresh: the sampler starts over with
                # them (it may hold a position the world trained to before; step 0 with
                # that position would skip the data before it).
                if state.sampler is not None:
                    state.sampler.load_state_dict(
                        {**state.sampler.state_dict(), "epoch": 0, "position": 0}
                    )
            elif round_.world_size > 1:
                # Every rank starts from rank 0's replica, with rank 0's step, sampler
                # position and extra state (a new world's: its initial ones). Sending rank
                # 0's parameters with step 0 instead is how a world whose survivors
                # disagreed once went from step 343 to 0 keeping its parameters.
                fresh = broadcast_state(
                    state.model,
                    state.optimizer,
                    src=0,
                    step=state.step,
                    extra=state.extra,
                    sampler=state.sampler,
                )
                result = RestoreResult(
                    RestoreSource.FRESH,
                    f"{result.reason}: rank 0's state, broadcast",
                    fresh.step,
                    fresh.extra,
                    fresh.bytes_moved,
                    result.duration_s + fresh.duration_s,
                )
            else:
                result = RestoreResult(
                    RestoreSource.FRESH,
                    result.reason,
                    state.step,
                    state.extra,
                    0,
                    result.duration_s,
                )
        if result.source is not RestoreSource.KEEP:
            state.extra = result.extra
        return result
