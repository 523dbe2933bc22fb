"""One formed round, as the user's loop sees it (:class:`ElasticRound`): its batches, its
abandonable collectives, its step accounting, its checkpoints and snapshots.

The round is made of parts the run drives through their own methods, never through the
round's private state: ``ending`` (why it ended, collectives.py), ``collectives`` (its gloo
work, collectives.py), ``progress`` (progress.py) and ``commits`` (commit.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist

from rallypoint.client import RallypointError, RoundInfo, SyncCheckpointRegistry, SyncRoundStore

from ..lazy import any_dtensor, dtensors
from ..snapshots import SnapshotError
from .collectives import (
    FORMATION_CONNECT_S,
    Collectives,
    RoundEnd,
    collective_failure,
    connect_timeout,
)
from .commit import RoundCommits, round_registry, round_store
from .progress import Progress
from .state import Formation, RunView

if TYPE_CHECKING:
    from ..checkpoint import PendingCheckpoint
    from ..snapshots import PendingSnapshot

T = TypeVar("T")

log = logging.getLogger(__name__)


class ElasticRound:
    """One formed round: a process group at (rank, world size) with the state restored.
    ``run.rounds()`` yields them; the loop's body trains on ``round.batches()``.

    Attributes:
        rank: this worker's rank in the round (stable: a survivor keeps its rank).
        world_size: the number of workers in the round.
        number: the round's number (increases with every re-formation).
        fencing_token: the round's fencing token (checkpoint commits carry it).
        formation: how the round was formed (a ``Formation``: restore source, timings).
        info: the coordinator's ``RoundInfo`` of the round (members, ranks, reason).
        steps_trained: steps this worker counted in this round.
    """

    def __init__(self, run: RunView, info: RoundInfo, rank: int) -> None:
        self.run = run
        self.info = info
        self.rank = rank
        self.world_size = info.world_size
        self.number = info.round
        self.fencing_token = info.fencing_token
        self.formation: Formation | None = None
        self.ending = RoundEnd()
        self.collectives = Collectives(
            self.ending, self.end, run.settings.collective_timeout_s, self._report_failure
        )
        self.progress = Progress(run, info.round)
        self.commits = RoundCommits(run, info, rank)
        # Per step of the user's loop: None (no collective yet), True (the gradients were
        # reduced), False (a collective was abandoned: the step must not count).
        self._step_reduced: bool | None = None
        self._awaiting_step_done = False
        self.steps_trained = 0
        # The default group's collective timeout as step() last set it (sharded models).
        self._step_timeout_s = 0.0
        # A planned change (a drain, a scale-up: nobody left the job) this rank has seen:
        # why, "" while none. The round then ends at a step boundary every rank agrees on
        # ("Planned changes" in __init__.py), not at once.
        self._planned = ""
        self._planned_lock = threading.Lock()
        # A rank of the round saw a planned change by the time of this step's agreement:
        # every rank stops after the same step.
        self._stop_agreed = False
        # The model whose step groups were found, and those groups (_step_groups).
        self._mesh_groups: tuple[torch.nn.Module, list[dist.ProcessGroup]] | None = None

    def __repr__(self) -> str:
        return (
            f"ElasticRound({self.run.job}/{self.number}, rank={self.rank}/{self.world_size}"
            f"{', ended: ' + self.end_reason if self.ended else ''})"
        )

    def report_progress(self) -> None:
        """Hand the heartbeat this rank's progress as of now (see TrainingProgress)."""
        self.progress.report()

    # -------------------------------------------------------------- state

    @property
    def ended(self) -> bool:
        """The round is over for this worker: its ``batches()`` stops."""
        return self.ending.is_set()

    @property
    def end_reason(self) -> str:
        """Why the round ended ("" while it goes on)."""
        return self.ending.reason

    def end(self, reason: str, *, broken: bool = False) -> None:
        """End the round locally (the loop stops at the next batch); idempotent."""
        if self.ending.set(reason, broken=broken):
            self.run.emit("round_ended", round=self.number, rank=self.rank, reason=reason)
            self.collectives.wake()

    def end_at_step_boundary(self, reason: str) -> None:
        """End the round after the step every rank agrees on, for a planned change (the
        coordinator ended the round while every member is still in the job: a drain, a
        scale-up). The step in flight completes (nobody it waits for is gone) and counts;
        the next step's agreement carries this rank's flag to the others ("Planned changes"
        in __init__.py). Bounded: a round that reaches no agreed boundary within the hang
        bound (hang_factor x the step time, at least hang_floor_s) ends at once, as an
        unplanned change does. Idempotent; called from the client's thread."""
        with self._planned_lock:
            if self._planned or self.ended:
                return
            self._planned = reason
        config = self.run.config
        bound_s = max(
            config.hang_floor_ms / 1000, config.hang_factor * self.progress.compute_ms / 1000
        )
        timer = threading.Timer(
            bound_s, self.end, (f"{reason} (no agreed step boundary within {bound_s:.1f} s)",)
        )
        timer.daemon = True
        timer.start()
        self.run.emit("round_ending", round=self.number, rank=self.rank, reason=reason)

    def _stop_flag(self) -> float:
        """This rank's vote in a step's agreement: 1.0 once it saw a planned change."""
        return 1.0 if self._planned else 0.0

    def _agree_to_stop(self) -> None:
        """The agreement of a step whose gradients did not carry the flag (a sharded model's
        step, or a loop that reduces its gradients itself): one one-element all-reduce."""
        if not dist.is_initialized() or self.ended:
            return
        flag = torch.tensor([self._stop_flag()])
        if self.all_reduce(flag) and flag.item() > 0:
            self._stop_agreed = True

    def _report_failure(self, detail: str) -> None:
        """A collective of this round failed under this rank (gloo: a peer vanished) while the
        coordinator still had the round going: report it (``ReportCollectiveFailure``), so
        the member that saw the dead peer's heartbeat stream close confirms it at once and
        the round ends for every survivor, instead of two heartbeat intervals later. Sent
        from the client's thread: the training thread goes on leaving the collective. A
        refused or lost report changes nothing: the detectors decide as before."""

        def answered(future: concurrent.futures.Future[list[int]]) -> None:
            try:
                confirmed = future.result()
            except (RallypointError, concurrent.futures.CancelledError) as error:
                log.debug(
                    "round %d: the collective failure report was not taken: %s", self.number, error
                )
                return
            log.debug(
                "round %d: the report confirmed participants %s failed", self.number, confirmed
            )

        self.run.participant.report_collective_failure(self.number, detail).add_done_callback(
            answered
        )

    @property
    def store(self) -> SyncRoundStore:
        """The round's store (refused once the round is over)."""
        return round_store(self.run, self.info)

    @property
    def checkpoints(self) -> SyncCheckpointRegistry:
        """The checkpoint registry fenced by this round and its token."""
        return round_registry(self.run, self.info)

    # -------------------------------------------------------------- the loop

    def batches(self, loader: Iterable[T] | None = None) -> Iterator[Any]:
        """This rank's batches from the restored position until the round ends or the run
        reaches ``max_steps``; epochs roll over. Without ``loader``, the batches are the
        sampler's lists of dataset indices; a ``loader`` (e.g. ``DataLoader(dataset,
        batch_sampler=state.sampler)``) is iterated instead, once per epoch."""
        state = self.run.state
        sampler = state.sampler
        if sampler is None and loader is None:
            raise ValueError("batches() needs a loader or a TrainState with a sampler")
        while not self.ended and not self.run.reached_max_steps():
            if sampler is not None and sampler.epoch_done():
                sampler.set_epoch(sampler.epoch + 1)
            source: Iterable[Any] = loader if loader is not None else sampler  # type: ignore[assignment]
            produced = False
            for batch in source:
                if self.ended or self.run.reached_max_steps():
                    return
                produced = True
                self._step_reduced = None
                self._awaiting_step_done = True
                yield batch
                if self._awaiting_step_done:
                    raise RuntimeError("call round.step_done() once after each batch")
            if not produced and sampler is None:
                return  # a loader with no sampler of ours: its end is the end

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Wrap a step whose model runs collectives of its own (FSDP2's all-gathers in the
        forward pass and reduce-scatters in the backward pass): when one of them fails (a
        peer was lost) the round ends and the step does not count, instead of the error
        ending the program; the loop moves to the next round. Errors that are not a
        collective's are raised as they are. On gloo, a model built by ``TrainState.build``
        has its FSDP2 all-gathers and reduce-scatters replaced by the loop's, waited for as
        the loop's own collectives are: given up as soon as the round ends (the
        coordinator's push), since gloo cannot interrupt a collective that waits on a peer
        that is gone. As a safety net for collectives outside them, each collective of a
        sharded model's step is also bounded by the job's hang verdict (hang_factor x the
        step time, at least hang_floor_s).

        ::

            for batch in round.batches():
                with round.step():
                    loss_fn(model(x[batch]), y[batch]).backward()
                    optimizer.step()
                    optimizer.zero_grad()
                round.step_done()
        """
        sharded = self.run.state.build is not None
        if sharded and dist.is_initialized():
            # The step's collectives are synchronous and gloo cannot be interrupted: bound
            # each by the coordinator's own hang verdict (hang_factor x the step time, at
            # least hang_floor_s; startup_timeout_s before the round's first step), so a
            # rank waiting on a peer that is gone leaves within that bound (the first step:
            # at most FORMATION_CONNECT_S, unless hang_floor_s is longer).
            config = self.run.config
            if self.steps_trained == 0:
                # Not the whole startup_timeout_s: a round that changes during its first
                # step (a scale-up as workers arrive) would hold every rank that long.
                bound_s = min(
                    config.startup_timeout_ms / 1000,
                    max(config.hang_floor_ms / 1000, FORMATION_CONNECT_S),
                )
            else:
                bound_s = max(
                    config.hang_floor_ms / 1000,
                    config.hang_factor * self.progress.compute_ms / 1000,
                )
            bound_s = min(bound_s, self.run.settings.collective_timeout_s)
            if bound_s != self._step_timeout_s:
                for group in self._step_groups():
                    group.set_timeout(timedelta(seconds=bound_s))
                self._step_timeout_s = bound_s
        try:
            yield
        except RuntimeError as error:
            if not collective_failure(error):
                raise
            self.end(f"a collective of the step failed: {str(error).splitlines()[0][:200]}")
            self._step_reduced = False
            self._awaiting_step_done = False
            for param in self.run.state.model.parameters():
                param.grad = None

    def _step_groups(self) -> list[dist.ProcessGroup]:
        """The groups a sharded model's step runs collectives on: the default group and
        every group of its parameters' device meshes (a 2-D mesh's "dp" and "tp" groups).
        Tensor-parallel collectives (DTensor's redistributions) cannot be given up on gloo
        as FSDP2's are: a rank inside one whose partner left the step (its own collective
        failed on a lost peer) waits out the group's timeout, so each is bounded as the
        default group's are (measured: a 2 x 2 mesh losing a host held the surviving unit's
        other rank for two collective timeouts)."""
        model = self.run.state.model
        if self._mesh_groups is None or self._mesh_groups[0] is not model:
            world = dist.group.WORLD
            assert world is not None
            groups: dict[int, dist.ProcessGroup] = {id(world): world}
            meshes = {id(p.device_mesh): p.device_mesh for p in dtensors(model.parameters())}
            for mesh in meshes.values():
                for dim in range(mesh.ndim):
                    group = mesh.get_group(dim)
                    groups.setdefault(id(group), group)
            self._mesh_groups = (model, list(groups.values()))
        return self._mesh_groups[1]

    def release_mesh_groups(self) -> None:
        """Let go of the sharded model's mesh groups once the round's groups are destroyed
        (``destroy_process_group``), so that they close now rather than when the model is
        replaced at the next formation: a peer waiting in a tensor-parallel collective on
        this rank (which left the step) then fails at once ("connection closed by peer",
        measured) instead of at its step bound. torch keeps a device mesh's groups in the
        mesh (``_pg_registry``), and its DTensor caches keep the meshes."""
        self._mesh_groups = None
        meshes = {
            id(p.device_mesh): p.device_mesh for p in dtensors(self.run.state.model.parameters())
        }
        for mesh in meshes.values():
            registry = getattr(mesh, "_pg_registry", None)
            if isinstance(registry, dict):
                registry.clear()
            root = getattr(mesh, "_root_mesh", None)
            registry = getattr(root, "_pg_registry", None)
            if isinstance(registry, dict):
                registry.clear()

    def all_reduce(
        self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
    ) -> bool:
        """All-reduce ``tensor`` in place; False if the round ended first (``tensor`` is then
        unspecified)."""
        if self.ended:
            return False
        try:
            work = dist.all_reduce(tensor, op=op, async_op=True)
        except (RuntimeError, ValueError) as error:
            self.end(f"all_reduce failed to start: {error}", broken=True)
            return False
        assert work is not None
        return self.wait(work, "all_reduce")

    def all_reduce_gradients(self, model: torch.nn.Module) -> bool:
        """Average the gradients of a replicated model over the world (one flat all-reduce);
        each averaged gradient is a view of the reduced buffer, not a copy. False if the round
        ended first: the gradients are then cleared, so the following ``optimizer.step()``
        leaves the parameters and the optimizer state as they were."""
        params = [p for p in model.parameters() if p.requires_grad]
        if any_dtensor(params):
            raise ValueError("all_reduce_gradients is for replicated models, not DTensors")
        grads = [
            p.grad
            if p.grad is not None
            else torch.zeros_like(p, memory_format=torch.contiguous_format)
            for p in params
        ]
        dtype = grads[0].dtype if grads else torch.float32
        # The last element is this rank's vote in the step's agreement on a planned change
        # ("Planned changes" in __init__.py): no collective of its own for it.
        flat = torch.cat(
            [*(g.reshape(-1) for g in grads), torch.tensor([self._stop_flag()], dtype=dtype)]
        )
        reduced = self.all_reduce(flat)
        if not reduced:
            for p in params:
                p.grad = None
            self._step_reduced = False
            return False
        if flat[-1].item() > 0:
            self._stop_agreed = True
        flat = flat[:-1]
        flat /= self.world_size
        # Each gradient becomes a view of the reduced buffer, not a copy of it: a second copy
        # of every gradient cost ~1 ms a step for a 1.3 M-parameter model (2 % of its step
        # on gloo, most of what the loop cost over plain DDP). The buffer lives as long as the
        # gradients do (``zero_grad()`` lets it go); in-place changes to one gradient (clipping)
        # touch only its own slice.
        offset = 0
        for p, g in zip(params, grads, strict=True):
            numel = g.numel()
            p.grad = flat[offset : offset + numel].view_as(p)
            offset += numel
        if self._step_reduced is None:
            self._step_reduced = True
        return True

    def step_done(self, *, checkpoint_every: int = 0, loss: float | None = None) -> bool:
        """Count the step (every rank has trained on this batch): the step and the sampler
        advance, and every ``checkpoint_every`` steps a checkpoint starts. False when the
        step's collective was abandoned (nothing counts; the loop moves to the next round)."""
        self._awaiting_step_done = False
        if self._step_reduced is False:
            return False
        state = self.run.state
        state.step += 1
        if state.sampler is not None:
            state.sampler.advance()
        self.steps_trained += 1
        self.progress.step_counted()
        if self.steps_trained == 1:
            self.run.emit("trained", round=self.number, rank=self.rank, step=state.step)
        if loss is not None:
            self.run.last_loss = loss
        if self._step_reduced is None:
            # No gradient all-reduce of ours carried this step's vote.
            self._agree_to_stop()
        if self._stop_agreed:
            # Every rank agreed to stop after this step: it counts on all of them.
            self.final_snapshot()
            self.end(self._planned or "a planned round change (seen by a peer first)")
            return True
        if checkpoint_every > 0 and state.step % checkpoint_every == 0 and not self.ended:
            self.checkpoint()
        every = self.run.settings.snapshot_every
        if every > 0 and state.step % every == 0 and not self.ended:
            self.snapshot()
        return True

    def final_snapshot(self) -> None:
        """A sharded model's round ending by plan: take and register a memory snapshot of
        the step every rank agreed to stop after, before this rank leaves the round. The
        next world rebuilds a sharded model for its mesh and restores it from the newest
        registered snapshot; registration runs a step or two behind training, so without
        this the steps since would be trained again ("Planned changes" in __init__.py).
        The coordinator already ended the round: the registration is fenced by it as the
        round that ended by plan (``planned_end``). Rank 0 registers and tells every rank
        (the snapshot's last broadcast), so no rank forms the next world, where it reads
        the newest registered snapshot, before the registration. Bounded by the hang bound;
        when it fails, the next world restores from the snapshot registered before, and
        ``final_snapshot_failed`` says why. A replicated model keeps its state: nothing to
        do."""
        run = self.run
        memory = run.memory
        if memory is None or run.state.build is None or self.ended:
            return
        config = run.config
        bound_s = max(
            config.hang_floor_ms / 1000, config.hang_factor * self.progress.compute_ms / 1000
        )
        started = time.monotonic()
        step = run.state.step
        fields = {"round": self.number, "rank": self.rank, "step": step}
        # The snapshot in flight first: a new one is skipped while it is protected. Its
        # outcome is not this one's (its own events say it).
        with contextlib.suppress(TimeoutError, SnapshotError, RuntimeError):
            memory.wait(bound_s)
        self.commits.planned_end = True
        try:
            pending = self.snapshot()
            if pending is None:
                raise SnapshotError("skipped: the previous snapshot was still being protected")
            remaining_s = max(0.0, bound_s - (time.monotonic() - started))
            taken = pending.wait(remaining_s)
        except (TimeoutError, SnapshotError, RuntimeError) as error:
            run.emit("final_snapshot_failed", **fields, error=f"{type(error).__name__}: {error}")
            return
        run.emit(
            "final_snapshot",
            **fields,
            committed=taken.committed,
            s=round(time.monotonic() - started, 3),
        )

    def wait(self, work: dist.Work, what: str) -> bool:
        """Wait for ``work`` until it completes, the round ends or the deadline passes."""
        started = time.monotonic()
        self.progress.entered_collective(started)
        try:
            return self.collectives.wait(work, what, started)
        finally:
            self.progress.left_collective(started)

    # -------------------------------------------------------------- checkpoints

    def checkpoint(self) -> PendingCheckpoint | None:
        """Start an asynchronous checkpoint of the state at its current step (every rank at
        the same step); its commit follows on the commit thread."""
        state, commits = self.run.state, self.commits
        timeout_s = self.run.settings.collective_timeout_s
        try:
            if commits.checkpointer is None:
                # Collective (DCP's own gloo group); made on first use so that forming a
                # round does not wait for it. Its connect goes through the round store: if
                # the round ends meanwhile, the ended round's store stays readable by its
                # members, so every rank connects or every rank fails ("Formation"); what
                # that cannot help (a peer killed mid-connect) is bounded as the
                # formation's connects are, then widened.
                # A peer whose connect went through would then wait in DCP's synchronous
                # collectives on it for the whole collective timeout: every rank passes a
                # gate first, given up when the round ends.
                group = dist.new_group(backend="gloo", timeout=connect_timeout(timeout_s))
                self.collectives.hold(group)
                group.set_timeout(timedelta(seconds=timeout_s))
                if not self.collectives.gate("the checkpoint group's gate"):
                    return None
                from ..checkpoint import Checkpointer  # loaded by the formation's restore

                commits.checkpointer = Checkpointer(self.run.checkpoint_dir, process_group=group)
            pending = commits.checkpointer.save_async(
                state.step,
                state.model,
                state.optimizer,
                sampler=state.sampler,
                extra=state.extra,
                round_number=self.number,
            )
        except RuntimeError as error:
            self.end(f"checkpoint at step {state.step} failed to start: {error}", broken=True)
            return None
        # The commit thread waits for the save itself (in order, one save after another).
        commits.submit(pending)
        return pending

    def snapshot(self) -> PendingSnapshot | None:
        """Take an in-memory snapshot of the state at its current step (every rank at the
        same step): training is held only while the state is copied; protecting it on peers
        and registering it follow in the background. None when skipped (the previous one is
        still being protected) or when the round ended."""
        memory, state = self.run.memory, self.run.state
        if memory is None:
            raise RuntimeError("in-memory snapshots are off: give elastic_training snapshot_every")
        try:
            return memory.take(
                state.step,
                state.model,
                state.optimizer,
                sampler=state.sampler,
                extra=state.extra,
                wait_collective=lambda work: self.wait(work, "the snapshot's agreement"),
            )
        except (RuntimeError, SnapshotError) as error:
            self.end(f"snapshot at step {state.step} failed to start: {error}", broken=True)
            return None

    def wait_for_commits(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for this round's checkpoint reports (a normal finish)."""
        self.commits.wait(timeout_s)
