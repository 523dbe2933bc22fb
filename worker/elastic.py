"""The elastic training loop: rounds of a process group that re-form in the same process.

Typical use (one process per worker; every worker runs the same code)::

    state = TrainState(model, optimizer, sampler)
    with elastic_training(endpoints, job="demo", name=name, min_nodes=2, max_nodes=4,
                          checkpoint_dir=root, state=state, max_steps=500) as run:
        for round in run.rounds():                 # each a formed group, state restored
            for batch in round.batches():          # ends early when the world changes
                loss = loss_fn(model(x[batch]), y[batch])
                loss.backward()
                round.all_reduce_gradients(model)  # abandoned (grads cleared) on a change
                optimizer.step()
                optimizer.zero_grad()
                round.step_done(checkpoint_every=50)

Theory of operation.

Rounds. The worker joins the job (``Participant``) once. ``rounds()`` waits for the next
ACTIVE round that includes it, then forms the round: the round store becomes a c10d store
(:class:`CoordinatorStore`), ``init_process_group`` (gloo on CPU, nccl on GPU) bootstraps
through it, and the state is restored (below). The round object is handed to the user's
loop. The round *ends* when any of these happen: the coordinator pushes a new (round, state)
(``on_round_change``: a member failed, left, was evicted, a worker waits to scale up), the
participant is lost, or a collective fails or passes its deadline. An ended round's
``batches()`` stops, so the user's loop falls back to ``rounds()``, which tears the group
down and forms the next round. No process restarts; the user's code has no try/except.

Formation. Forming a round must be given up as soon as the round ends, or the worker misses
the next round while the others wait for it there (and since its heartbeat goes on, nothing
ends that next round). Three steps, each abandonable or bounded:

- Arrival: every rank sets ``ARRIVED_KEY`` in the round store and waits for every rank's.
  The wait is held by the coordinator and refused with StaleRoundError the moment the round
  ends, so a rank whose peers never come leaves at once, before it has told anyone where
  to connect.
- Init: ``init_process_group`` through the round store, with gloo's timeout set to
  ``FORMATION_CONNECT_S`` (then raised to ``collective_timeout_s`` for the round's
  collectives). A round can end mid-init (a scale-up the instant a worker joins after the
  round closed, as at a fresh launch with ``last_call_s=0``). gloo writes each rank's address,
  then reads every rank's, then connects; the coordinator keeps an ended round's store
  readable, frozen, by its members (coordinator/state/roundstore.py, "Ended, read-only"),
  so either every rank wrote its address before the end and every rank connects in
  milliseconds (the gate below then sends them on), or one did not and every rank's read of
  its key is refused before anyone connects. Before that rule a rank whose read was refused
  gave up and left a peer that had read its address, and was the listening side of their
  pair, waiting in gloo's connect for about five times gloo's timeout (measured with torch
  2.13: 25 s for 5 s, 40 s for 8 s); at ``collective_timeout_s`` the recovery benchmark's
  workers sat there for minutes. The short timeout still bounds what the rule cannot help:
  a peer killed mid-init, or a coordinator member restored from a snapshot since the round
  ended (which does not keep the ended store).
  The in-memory snapshots' two gloo groups connect through the round store as well, so
  they are made in this step too (``MemorySnapshots.make_groups``), with the same connect
  timeout. Made after the gate, in ``attach``, a round that ended while they connected made
  the rank whose store read was refused give up and left a peer in gloo's connect for five
  times ``collective_timeout_s`` (or, when its connect went through, in the restore's
  synchronous collectives for ``collective_timeout_s``) while the next round waited for it:
  FSDP2 jobs scaling up 2 -> 3 -> 4 at start-up sat for minutes without training. Nothing
  of the formation after the gate uses the round store.
- Gate: one all-reduce, issued with ``async_op=True`` and waited for like the loop's
  collectives, before the restore. The restore's collectives are synchronous (object
  gathers, broadcasts, DCP's load), and a peer that saw the round end just after init skips
  them: without the gate this rank would wait in them for ``collective_timeout_s``.

Abandonable collectives. Collectives that the loop issues (``all_reduce``,
``all_reduce_gradients``) run with ``async_op=True``; the training thread waits on the
work's future in slices of ``WAIT_SLICE_S`` and gives up as soon as the round ended (a
round-change callback also wakes the waiter at once) or the collective deadline passed. A
SIGKILLed peer usually makes gloo fail its neighbours' collectives within milliseconds; a
SIGSTOPped one does not, and there the coordinator's phi-accrual detector and its push end
the wait. An abandoned collective leaves the state as it was before the step: its gradients
are cleared (``p.grad = None``), so the ``optimizer.step()`` that follows changes nothing,
and ``step_done`` does not count the step.

Teardown. ``destroy_process_group`` does not wait for pending gloo work (measured: it returns
in microseconds with an all-reduce stuck on a stopped peer), but the C++ process group's
destructor would: it joins gloo's worker threads. So the loop moves the group, its store,
its checkpointer and its in-flight work from the round to ``_abandoned`` and drops them as
soon as nothing of theirs can be inside gloo (every work completed, no checkpoint being
written), or once the group's own timeout (``collective_timeout_s``) has surely ended that
work. Leak bound: one group (its gloo threads and sockets) per round abandoned in the last
``collective_timeout_s`` seconds with work still pending. The next group always bootstraps
in the next round's store namespace, so nothing of the old group can be mistaken for the
new one. Leaving the run (``__exit__``) drops every group that is quiet, so a run that
finished leaves none for the interpreter's exit to destroy (its gloo threads and sockets
torn down while the process ends, peers closing theirs meanwhile); only a group with a
collective still stuck on a peer stays, since destroying it would block until that work
times out. (``ProcessGroupGloo.abort()`` and ``shutdown()`` do not help: measured with torch
2.13, neither ends a pending work nor closes the group, and a group shut down made its
process abort at exit with "terminate called without an active exception".)

Restore. At each formation every rank calls ``restore_state`` with what it holds: a worker
that trained in the previous round (and did not lose its participant) is a *survivor* at its
step. The same decision is made on every rank: KEEP (every rank is a survivor at one step),
BROADCAST from a survivor (replicated state, newcomers present), DISK (the latest committed
checkpoint, resharded by DCP to this world size) or FRESH (nothing to restore: rank 0's
initial replica is broadcast so every rank starts equal). ``restore="checkpoint"`` makes
every formation read the latest committed checkpoint when there is one (the classic
semantics: the state after a change is the last committed one). The sampler is
repartitioned for the new (rank, world size) and resumes at the restored global position.

Checkpoints. ``step_done(checkpoint_every=N)`` starts ``Checkpointer.save_async`` every N
steps (training goes on while DCP writes, one directory per step and round). The commit
protocol runs on a per-round commit thread, fenced by the round: when its save is durable,
rank 0 calls ``begin`` (step, world size, layout, uri) and publishes the checkpoint id in
the round store; every rank reports ``shard_done`` and marks its report in the store; rank 0
waits for every rank's mark, then commits with the round's fencing token and deletes the
checkpoints the registry retired (it keeps the last ``keep_checkpoints``). Everything the
commit thread does names the round, so a zombie (a worker paused past its detection and
resumed) is refused: its begin, report, commit and store writes raise StaleRoundError or
StaleTokenError; they are reported as a ``checkpoint_refused`` event, never retried.

Progress. Every heartbeat carries this rank's progress (``TrainingProgress``): the step it
completed last and when, its time per step outside collectives (a moving average), the
collectives it entered in the round and the one it waits in, and the round's restore source
(the leader keeps it in the round's record: ``rallypoint rounds`` shows each recovery's).
The leader names a rank that stops while the others wait for it (cause ``hang``) and, with
the job's straggler policy on, evicts a rank consistently slower than the others
(coordinator/leader/progress.py). Nothing here waits on it: a hung training thread cannot
report, which is the point.

Waiting. Joining (at ``with`` and when the worker joins again) waits for a coordinator that
no member of answers, or that has no leader, for ``connect_timeout_s`` (``join_timeout_s``
unless set), with a line in the log after each attempt ("waiting for the coordinator: no
member answered for 40 s; retrying ..."); a formed round is waited for ``join_timeout_s``.
Either running out ends the worker with one line saying what to check, not a traceback:
``CoordinatorUnreachableError`` and ``JoinTimeoutError`` (patience.py), which a program may
catch.

Events. ``on_event(kind, fields)`` is called (from the training or the commit thread) for
each event :class:`ElasticRun` lists, with its fields in a dict; every event carries ``t``
(wall clock, seconds) and ``name`` (the worker's). A callable that cannot take those two
arguments is refused when the run is made, not at its first event.

The arguments, events and public members are listed in ``docs/api.md``, generated from the
docstrings here (``docs/generate.py``; a test keeps it fresh and checks every argument and
every event is described).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import inspect
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.distributed.tensor import DTensor

from rallypoint.client import (
    DeadlineExceededError,
    JobConfig,
    LeaveOutcome,
    ParticipantLostError,
    RallypointError,
    RoundInfo,
    RoundState,
    StaleRoundError,
    StaleTokenError,
    SyncCheckpointRegistry,
    SyncClient,
    SyncParticipant,
    SyncRoundStore,
    TrainingProgress,
    UnauthenticatedError,
    token_or_environment,
)

from .checkpoint import (
    Checkpointer,
    PendingCheckpoint,
    RestoreResult,
    RestoreSource,
    broadcast_state,
    delete_checkpoints,
    describe_layout,
    restore_state,
)
from .patience import Patience, one_line_at_exit
from .sampler import ElasticSampler
from .snapshots import (
    MemorySnapshots,
    PendingSnapshot,
    RegisteredSnapshot,
    SnapshotError,
    SnapshotId,
    SnapshotPlacement,
)
from .store import CoordinatorStore
from .torch_compat import forget_previous_world

log = logging.getLogger("rallypoint.worker.elastic")

# How long the training thread sleeps at most between two looks at "has the round ended?".
WAIT_SLICE_S = 0.05
# Round-store keys of the commit protocol (the store is the round's own: no clash with c10d's).
CHECKPOINT_KEY = "rallypoint/checkpoint/{step}"
REPORTED_KEY = "rallypoint/checkpoint/{step}/reported/{rank}"
# Set by each rank as it starts forming the round; init waits for every rank's (Formation).
ARRIVED_KEY = "rallypoint/formation/arrived/{rank}"
# gloo's timeout while the group connects (at most collective_timeout_s); see "Formation".
FORMATION_CONNECT_S = 5.0

RestoreMode = Literal["auto", "checkpoint"]
EventHandler = Callable[[str, Mapping[str, Any]], object]
T = TypeVar("T")


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
        restore: how the state was restored (its ``source``: keep, broadcast, disk, fresh;
            ``reason``, ``step``, ``bytes_moved``, ``duration_s``).
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


class _Ended:
    """Why a round ended; set once."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason = ""
        # A collective failed while the coordinator still had the round ACTIVE.
        self.broken = False
        self._lock = threading.Lock()

    def set(self, reason: str, *, broken: bool = False) -> bool:
        with self._lock:
            if self.event.is_set():
                return False
            self.reason, self.broken = reason, broken
            self.event.set()
            return True

    def is_set(self) -> bool:
        return self.event.is_set()


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

    def __init__(self, run: ElasticRun, info: RoundInfo, rank: int) -> None:
        self.run = run
        self.info = info
        self.rank = rank
        self.world_size = info.world_size
        self.number = info.round
        self.fencing_token = info.fencing_token
        self.formation: Formation | None = None
        self._ended = _Ended()
        # The waiter to wake when the round ends (the training thread's current collective).
        self._waiter: threading.Event | None = None
        # Work handed to gloo and not known complete: kept alive past an abandon.
        self.in_flight: list[object] = []
        self.checkpointer: Checkpointer | None = None
        # One thread per round reports checkpoints: a report stuck on a dead round must not
        # delay the next round's.
        self.commit_thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix=f"rallypoint-commit-r{info.round}"
        )
        self.commits: list[concurrent.futures.Future[None]] = []
        # Per step of the user's loop: None (no collective yet), True (the gradients were
        # reduced), False (a collective was abandoned: the step must not count).
        self._step_reduced: bool | None = None
        self._awaiting_step_done = False
        self.steps_trained = 0
        # Progress reported with every heartbeat (hang and straggler detection): collectives
        # entered in this round, the one waited in and since when, the time the current step
        # has spent waiting in collectives, when the last step ended (or the round formed),
        # and a moving average of the time per step outside collectives.
        self._collectives = 0
        self._waiting_in = 0
        self._waiting_since_s = 0.0
        self._waited_in_step_s = 0.0
        self._step_started_s = time.monotonic()
        self._step_done_s = 0.0
        self._compute_ms = 0.0
        # The default group's collective timeout as step() last set it (sharded models).
        self._step_timeout_s = 0.0

    def __repr__(self) -> str:
        return (
            f"ElasticRound({self.run.job}/{self.number}, rank={self.rank}/{self.world_size}"
            f"{', ended: ' + self.end_reason if self.ended else ''})"
        )

    # -------------------------------------------------------------- progress

    def report_progress(self) -> None:
        """Hand the heartbeat this rank's progress as of now (see TrainingProgress)."""
        self.run.participant.report_progress(
            TrainingProgress(
                round=self.number,
                step=self.run.state.step,
                step_done_s=self._step_done_s or self._step_started_s,
                step_ms=self._compute_ms,
                collectives_entered=self._collectives,
                waiting_in=self._waiting_in,
                waiting_since_s=self._waiting_since_s,
                restore=self.formation.restore.source.value if self.formation else "",
            )
        )

    def _step_counted(self) -> None:
        now = time.monotonic()
        compute_ms = max(0.0, now - self._step_started_s - self._waited_in_step_s) * 1000
        # A short moving average: a straggler shows within a few steps, one odd step fades.
        self._compute_ms = (
            compute_ms if self._compute_ms == 0 else 0.7 * self._compute_ms + 0.3 * compute_ms
        )
        self._step_started_s = self._step_done_s = now
        self._waited_in_step_s = 0.0
        self.report_progress()

    # -------------------------------------------------------------- state

    @property
    def ended(self) -> bool:
        """The round is over for this worker: its ``batches()`` stops."""
        return self._ended.is_set()

    @property
    def end_reason(self) -> str:
        """Why the round ended ("" while it goes on)."""
        return self._ended.reason

    def end(self, reason: str, *, broken: bool = False) -> None:
        """End the round locally (the loop stops at the next batch); idempotent."""
        if self._ended.set(reason, broken=broken):
            self.run.emit("round_ended", round=self.number, rank=self.rank, reason=reason)
            waiter = self._waiter
            if waiter is not None:
                waiter.set()

    @property
    def store(self) -> SyncRoundStore:
        """The round's store (refused once the round is over)."""
        return self.run.client.round_store(
            self.info.job, self.number, self.run.participant.participant_id
        )

    @property
    def checkpoints(self) -> SyncCheckpointRegistry:
        """The checkpoint registry fenced by this round and its token."""
        return self.run.client.checkpoint_registry(self.info)

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
                    config.hang_floor_ms / 1000, config.hang_factor * self._compute_ms / 1000
                )
            bound_s = min(bound_s, self.run.collective_timeout_s)
            if bound_s != self._step_timeout_s:
                group = dist.group.WORLD
                assert group is not None
                group.set_timeout(timedelta(seconds=bound_s))
                self._step_timeout_s = bound_s
        try:
            yield
        except RuntimeError as error:
            if not _collective_failure(error):
                raise
            self.end(f"a collective of the step failed: {str(error).splitlines()[0][:200]}")
            self._step_reduced = False
            self._awaiting_step_done = False
            for param in self.run.state.model.parameters():
                param.grad = None

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
        """Average the gradients of a replicated model over the world (one flat all-reduce).
        False if the round ended first: the gradients are then cleared, so the following
        ``optimizer.step()`` leaves the parameters and the optimizer state as they were."""
        params = [p for p in model.parameters() if p.requires_grad]
        if any(isinstance(p, DTensor) for p in params):
            raise ValueError("all_reduce_gradients is for replicated models, not DTensors")
        grads = [
            p.grad
            if p.grad is not None
            else torch.zeros_like(p, memory_format=torch.contiguous_format)
            for p in params
        ]
        flat = torch.cat([g.reshape(-1) for g in grads]) if grads else torch.zeros(0)
        reduced = self.all_reduce(flat)
        if not reduced:
            for p in params:
                p.grad = None
            self._step_reduced = False
            return False
        flat /= self.world_size
        offset = 0
        for p, g in zip(params, grads, strict=True):
            numel = g.numel()
            p.grad = flat[offset : offset + numel].view_as(p).clone()
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
        self._step_counted()
        if self.steps_trained == 1:
            self.run.emit("trained", round=self.number, rank=self.rank, step=state.step)
        if loss is not None:
            self.run.last_loss = loss
        if checkpoint_every > 0 and state.step % checkpoint_every == 0 and not self.ended:
            self.checkpoint()
        every = self.run.snapshot_every
        if every > 0 and state.step % every == 0 and not self.ended:
            self.snapshot()
        return True

    def wait(self, work: dist.Work, what: str) -> bool:
        """Wait for ``work`` until it completes, the round ends or the deadline passes."""
        started = time.monotonic()
        self._collectives += 1
        self._waiting_in, self._waiting_since_s = self._collectives, started
        self.report_progress()
        try:
            return self._await(work, what, started)
        finally:
            self._waited_in_step_s += time.monotonic() - started
            self._waiting_in = 0
            self.report_progress()

    def _gate(self, what: str = "the formation's gate") -> bool:
        """The formation's gate (module docstring, "Formation"): an all-reduce every rank
        must reach before the restore's synchronous collectives; False if the round ended
        (or the deadline passed) first. Not reported as progress: the round is not formed.
        (The first checkpoint of a round passes one too, after making its group.)"""
        if self.ended:
            return False
        # nccl reduces CUDA tensors only.
        cuda = dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        try:
            work = dist.all_reduce(torch.ones(1, device=device), async_op=True)
        except (RuntimeError, ValueError) as error:
            self.end(f"{what} failed to start: {error}", broken=True)
            return False
        assert work is not None
        return self._await(work, what, time.monotonic())

    def _await(self, work: dist.Work, what: str, started: float) -> bool:
        """The wait itself: in slices, abandoned when the round ends or at the deadline."""
        self.in_flight.append(work)
        done = threading.Event()
        self._waiter = done
        wait_slice: Callable[[float], bool] = done.wait
        try:
            work.get_future().add_done_callback(lambda _: done.set())
        except RuntimeError:
            # gloo's all_gather_into_tensor (FSDP2's) has no future: look at the work
            # itself, often at first (it takes milliseconds).
            wait_slice = functools.partial(_poll, work, done)
        deadline = started + self.run.collective_timeout_s
        try:
            while not wait_slice(WAIT_SLICE_S):
                if self.ended:
                    return False
                if time.monotonic() >= deadline:
                    self.end(
                        f"{what} passed its {self.run.collective_timeout_s:g} s deadline",
                        broken=True,
                    )
                    return False
            if self.ended and not work.is_completed():
                return False
            try:
                work.wait()
            except RuntimeError as error:  # gloo's failures (DistBackendError among them)
                self.end(f"{what} failed: {str(error).splitlines()[0][:200]}", broken=True)
                return False
        finally:
            self._waiter = None
        self.in_flight.remove(work)
        return True

    # -------------------------------------------------------------- checkpoints

    def checkpoint(self) -> PendingCheckpoint | None:
        """Start an asynchronous checkpoint of the state at its current step (every rank at
        the same step); its commit follows on the commit thread."""
        state = self.run.state
        try:
            if self.checkpointer is None:
                # Collective (DCP's own gloo group); made on first use so that forming a
                # round does not wait for it. Its connect goes through the round store: if
                # the round ends meanwhile, the ended round's store stays readable by its
                # members, so every rank connects or every rank fails ("Formation"); what
                # that cannot help (a peer killed mid-connect) is bounded as the
                # formation's connects are, then widened.
                # A peer whose connect went through would then wait in DCP's synchronous
                # collectives on it for the whole collective timeout: every rank passes a
                # gate first, given up when the round ends.
                group = dist.new_group(backend="gloo", timeout=self.run._connect_timeout())
                self.in_flight.append(group)
                group.set_timeout(timedelta(seconds=self.run.collective_timeout_s))
                if not self._gate("the checkpoint group's gate"):
                    return None
                self.checkpointer = Checkpointer(self.run.checkpoint_dir, process_group=group)
            pending = self.checkpointer.save_async(
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
        self.commits.append(self.commit_thread.submit(self._report, pending))
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

    def _register_snapshot(
        self, snapshot: SnapshotId, world_size: int, placement: SnapshotPlacement
    ) -> bool:
        """Register a snapshot every rank protected (rank 0's protection thread): fenced by
        this round, so a zombie's is refused. Whether it was registered."""
        run = self.run
        fields = {"round": self.number, "rank": self.rank, "step": snapshot.step}
        try:
            self.checkpoints.commit_memory_snapshot(
                snapshot.step,
                world_size,
                layout=describe_layout(run.state.model, world_size).to_bytes(),
                placement=placement.to_bytes(),
            )
        except (StaleRoundError, StaleTokenError) as error:
            run.emit("snapshot_refused", **fields, error=f"{type(error).__name__}: {error}")
            return False
        except RallypointError as error:
            run.emit("snapshot_failed", **fields, error=f"{type(error).__name__}: {error}")
            return False
        blocked_s = run.memory.last_blocked_s if run.memory is not None else 0.0
        run.emit("snapshot_committed", **fields, blocked_s=blocked_s)
        return True

    def _report(self, pending: PendingCheckpoint) -> None:
        """The commit protocol for one save (see the module docstring); commit thread."""
        run, step = self.run, pending.step
        fields = {"round": self.number, "rank": self.rank, "step": step}
        try:
            saved = pending.wait()
            run.emit("checkpoint_saved", **fields, path=str(saved.path), bytes=saved.bytes_total)
            registry, store = self.checkpoints, self.store
            key = CHECKPOINT_KEY.format(step=step)
            wait_s = run.collective_timeout_s
            if self.rank == 0:
                checkpoint_id = registry.begin(
                    step,
                    uri=str(saved.path),
                    layout=pending.layout.to_bytes(),
                    world_size=self.world_size,
                )
                store.set(key, str(checkpoint_id))
            else:
                checkpoint_id = int(store.get(key, timeout_s=wait_s))
            registry.shard_done(checkpoint_id, self.rank)
            store.set(REPORTED_KEY.format(step=step, rank=self.rank), b"1")
            if self.rank != 0:
                return
            store.wait(
                [REPORTED_KEY.format(step=step, rank=r) for r in range(self.world_size)],
                timeout_s=wait_s,
            )
            run.emit("committing", **fields, checkpoint_id=checkpoint_id)
            result = registry.commit(checkpoint_id)
            deleted = delete_checkpoints(run.checkpoint_dir, [c.uri for c in result.retired])
            run.emit(
                "checkpoint_committed",
                **fields,
                checkpoint_id=checkpoint_id,
                path=str(saved.path),
                deleted=[str(p) for p in deleted],
            )
        except (StaleRoundError, StaleTokenError) as error:
            run.emit("checkpoint_refused", **fields, error=f"{type(error).__name__}: {error}")
        except (RallypointError, RuntimeError, OSError) as error:
            # The round ended under the save, or the coordinator could not be reached in
            # time: this checkpoint is not committed; the next one will be.
            run.emit("checkpoint_failed", **fields, error=f"{type(error).__name__}: {error}")

    def wait_for_commits(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for this round's checkpoint reports (a normal finish)."""
        concurrent.futures.wait(self.commits, timeout=timeout_s)


class ElasticRun:
    """A worker's membership of an elastic job (worker/elastic.py says how it works). Use it
    in a ``with`` statement, as ``elastic_training(...)``: entering joins the job, leaving tears
    the last round down and leaves the job, saying how it went (finished when ``rounds()``
    ran to its end, failed when the training code raised; the last worker to leave ends the
    job by it, and ``rallypoint jobs`` shows it).

    Arguments:
        endpoints: the coordinator members' client addresses: "host:port,host:port" or a
            list.
        job: the job's id (1-128 characters of A-Z a-z 0-9 . _ -); every worker of the job
            gives the same one.
        name: this worker's name, unique in the job (e.g. the host and the local rank).
        state: what is trained and checkpointed (a ``TrainState``).
        checkpoint_dir: where checkpoints are written: a directory every worker can reach
            (a shared filesystem across hosts). A relative path is taken from the working
            directory the run is made in, and registered with the coordinator as absolute.
        min_nodes: the fewest workers a round forms with.
        max_nodes: the most workers in a round; more wait for a place.
        max_steps: stop once the world has taken this many steps (None: never; the loop
            ends when your code stops iterating).
        resume: only when this worker's join starts the job again after it ended (a job id
            used again is a new run): True restores the old run's latest checkpoint, False
            (the default) fences the old run's checkpoints off and starts fresh. A job that
            never ended (its workers were killed) is the same run, always restored.
        keep_checkpoints: how many committed checkpoints the coordinator keeps (older ones
            are deleted).
        restore: "auto" (the fastest correct source: keep, broadcast, disk, fresh) or
            "checkpoint" (always the latest committed checkpoint when there is one).
        backend: the process group's backend (default: nccl with CUDA, else gloo).
        collective_timeout_s: how long a collective may take before the round is given up.
        reform_timeout_s: after a collective broke, how long to wait for the coordinator
            to end the round before joining again.
        join_timeout_s: how long a worker waits for a round to form.
        connect_timeout_s: how long joining keeps trying while no coordinator member
            answers or none leads (default: join_timeout_s), logging its progress;
            running out raises CoordinatorUnreachableError.
        heartbeat_interval_ms: how often the worker heartbeats the coordinator.
        phi_threshold: the phi-accrual failure detector's threshold (higher: slower to
            declare a silent worker failed, fewer false alarms).
        acceptable_pause_ms: a pause the detector tolerates on top of the heartbeats'
            usual spread.
        last_call_s: once min_nodes are present, how long a forming round waits for more.
        rejoin: join again, as a newcomer, when this worker was declared failed (it was
            paused past its detection); False raises ParticipantLostError instead.
        on_event: called as ``on_event(kind, fields)`` for each event below.
        token: the bearer token (a ``job:<id>`` role is enough; default
            ``$RALLYPOINT_TOKEN``).
        client_options: more keyword arguments for the client (``SyncClient``), e.g.
            ``timeout_s`` or ``tls``.
        hang_factor: a rank that completed no step for hang_factor x the job's median step
            time (at least hang_floor_s) while others wait for it is declared hung.
        hang_floor_s: the least time before a hang verdict, whatever the step time.
        startup_timeout_s: the bound before a rank's first step in a round (first steps
            include compiling, warming up, loading).
        straggler_factor: evict a rank whose time per step outside collectives is over this
            many times the others' median (0: off) ...
        straggler_windows: ... for this many windows in a row ...
        straggler_window_s: ... of this many seconds.
        snapshot_every: take an in-memory snapshot every this many steps (0: none), kept
            in this process's memory and protected on peers (worker/memory.py); every
            worker of the job gives the same. After a failure the world restores the
            newest registered one from the survivors' memory (source ``memory``) when
            nothing newer is on disk, losing at most ``snapshot_every`` steps.
        snapshot_copies: how many copies of each rank's snapshot are kept (its own
            included), on distinct hosts where the world has enough of them (2 unless
            ``snapshot_erasure`` is given).
        snapshot_erasure: ``(k, m)`` protects snapshots by erasure coding instead of copies:
            the ranks form groups of k, each with m parity shares kept on other hosts where
            the world allows; up to m losses per group come back from memory, at (k+m)/k
            of the state held (worker/erasure.py). Give it or ``snapshot_copies``, not both.
        host: the failure domain this worker runs on (default: the machine's host name);
            snapshot copies go to workers of other hosts.
        snapshot_address: the address other workers reach this worker's snapshot server
            at (default: the address the host name resolves to); the server listens on
            every interface unless this is a loopback address.

    ``on_event(kind, fields)`` hears of each event below; every event's fields also hold
    ``t``, the wall clock in seconds, and ``name``, this worker's.

    Events:
        joined: participant_id. The worker joined the job.
        round_formed: round, rank, world_size, token, step, source, reason, restore_s,
            bytes, init_s, formed_s, checkpoint. A round formed: its process group is up and
            the state restored from ``source`` (keep, broadcast, disk, fresh) for ``reason``,
            ``bytes`` moved in ``restore_s``; ``step`` is the restored step; ``init_s`` and
            ``formed_s`` are the seconds from the round's start to the group's init and to
            the restore's end; ``checkpoint`` the latest committed checkpoint's path (or None).
        trained: round, rank, step. The round's first step is done: training again.
        round_ended: round, rank, reason. The round ended for this worker (a member failed,
            left or joined; a collective failed; the run finished) and why.
        checkpoint_saved: round, rank, step, path, bytes. This rank's shard is written.
        committing: round, rank, step, checkpoint_id. Rank 0 commits the checkpoint.
        checkpoint_committed: round, rank, step, checkpoint_id, path, deleted. Committed;
            ``deleted`` lists the older checkpoints removed.
        checkpoint_refused: round, rank, step, error. The coordinator refused a stale
            round's checkpoint (a zombie).
        checkpoint_failed: round, rank, step, error. The checkpoint was not committed (the
            round ended under it, or the coordinator was not reached in time).
        snapshot_committed: round, rank, step, blocked_s. Rank 0 registered the world's
            in-memory snapshot of ``step``: every rank's copy is protected on its peers
            (``blocked_s``: how long rank 0's training was held to copy its state).
        snapshot_refused: round, rank, step, error. The coordinator refused a stale round's
            snapshot (a zombie's).
        snapshot_failed: round, rank, step, error. The snapshot was not protected or not
            registered (a peer was lost under it, the coordinator was not reached).
        rejoined: reason, participant_id. The worker joined again, as a newcomer.
        finished: step, round. The run reached its end.

    Attributes:
        state: the ``TrainState`` (``run.state.step`` is the current step).
        current: the round being trained in (None between rounds).
        formations: how each round this worker trained in was formed (``Formation``).
        last_loss: the last ``loss`` given to ``step_done`` (None: none yet).
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        job: str,
        name: str,
        state: TrainState,
        checkpoint_dir: str | Path,
        min_nodes: int,
        max_nodes: int,
        max_steps: int | None = None,
        resume: bool = False,
        keep_checkpoints: int = 3,
        restore: RestoreMode = "auto",
        backend: str | None = None,
        collective_timeout_s: float = 30.0,
        reform_timeout_s: float = 10.0,
        join_timeout_s: float = 600.0,
        connect_timeout_s: float | None = None,
        heartbeat_interval_ms: int = 100,
        phi_threshold: float = 8.0,
        acceptable_pause_ms: int = 0,
        last_call_s: float = 0.0,
        rejoin: bool = True,
        on_event: EventHandler | None = None,
        token: str | None = None,
        client_options: Mapping[str, Any] | None = None,
        hang_factor: float = 2.5,
        hang_floor_s: float = 1.5,
        startup_timeout_s: float = 60.0,
        straggler_factor: float = 0.0,
        straggler_windows: int = 3,
        straggler_window_s: float = 10.0,
        snapshot_every: int = 0,
        snapshot_copies: int | None = None,
        snapshot_erasure: tuple[int, int] | None = None,
        host: str | None = None,
        snapshot_address: str | None = None,
    ) -> None:
        self.endpoints = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
        self.job = job
        self.name = name
        self.state = state
        # Absolute: the registry's URIs must mean the same from any worker's directory.
        self.checkpoint_dir = Path(checkpoint_dir).absolute()
        self.max_steps = max_steps
        self.resume = resume
        self.restore_mode: RestoreMode = restore
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.collective_timeout_s = collective_timeout_s
        self.reform_timeout_s = reform_timeout_s
        self.join_timeout_s = join_timeout_s
        # How long joining waits while no coordinator member can serve it (patience.py).
        self.connect_timeout_s = join_timeout_s if connect_timeout_s is None else connect_timeout_s
        for setting, seconds in (
            ("join_timeout_s", join_timeout_s),
            ("connect_timeout_s", self.connect_timeout_s),
        ):
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"elastic_training({setting}={seconds!r}): must be more than 0")
        self.rejoin = rejoin
        if snapshot_every < 0:
            raise ValueError(f"elastic_training(snapshot_every={snapshot_every!r}): must be >= 0")
        if snapshot_copies is not None and snapshot_erasure is not None:
            raise ValueError("elastic_training: give snapshot_copies or snapshot_erasure, not both")
        self.snapshot_every = snapshot_every
        self.host = host or socket.gethostname()
        # This process's in-memory snapshots and their server, across rounds (None: off).
        self.memory: MemorySnapshots | None = None
        if snapshot_every > 0:
            advertise = snapshot_address or socket.gethostbyname(socket.gethostname())
            loopback = advertise.startswith("127.") or advertise in ("::1", "localhost")
            self.memory = MemorySnapshots(
                self.host,
                copies=snapshot_copies,
                erasure=snapshot_erasure,
                bind=advertise if loopback else "0.0.0.0",
                advertise=advertise,
            )
        self.config = JobConfig(
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            last_call_ms=int(last_call_s * 1000),
            join_timeout_ms=int(join_timeout_s * 1000),
            heartbeat_interval_ms=heartbeat_interval_ms,
            phi_threshold=phi_threshold,
            acceptable_pause_ms=acceptable_pause_ms,
            scale_up=True,
            keep_checkpoints=keep_checkpoints,
            hang_factor=hang_factor,
            hang_floor_ms=int(hang_floor_s * 1000),
            startup_timeout_ms=int(startup_timeout_s * 1000),
            straggler_factor=straggler_factor,
            straggler_windows=straggler_windows,
            straggler_window_ms=int(straggler_window_s * 1000),
        )
        self._on_event = _event_handler(on_event)
        # The job's token (a "job:<id>" role is enough: README, "Security"), else the one
        # in client_options, else $RALLYPOINT_TOKEN.
        self._client_options = dict(client_options or {})
        self._client_options["token"] = token_or_environment(
            token or self._client_options.get("token")
        )
        # The session opens with the join, which waits for an unreachable coordinator.
        self._client_options.setdefault("open_session_on_connect", False)
        # A refused token's message names this interface's ways to pass one.
        self._client_options.setdefault(
            "token_hint", "elastic_training(token=...) or $RALLYPOINT_TOKEN"
        )
        self._client: SyncClient | None = None
        self._participant: SyncParticipant | None = None
        # The round being trained in; None between rounds.
        self.current: ElasticRound | None = None
        # Rounds formed so far, by this process.
        self.formations: list[Formation] = []
        # The model and optimizer hold a state that the world trained (not a fresh process's
        # initial state, nor one from before this participant was lost).
        self._survivor = False
        # Abandoned groups and their work, with the time they were abandoned; see "Teardown".
        self._abandoned: list[tuple[float, list[object]]] = []
        self.last_loss: float | None = None
        self._finished = False

    # -------------------------------------------------------------- lifecycle

    def __enter__(self) -> ElasticRun:
        self._client = SyncClient(self.endpoints, **self._client_options)
        try:
            self._join()
        except UnauthenticatedError:
            # Its message says which member refused and how to pass a token: one line, not
            # a traceback through the client (a program that catches it is not affected).
            self._client.close()
            one_line_at_exit(UnauthenticatedError)
            raise
        except BaseException:
            self._client.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self.current is not None:
                self._teardown(self.current, finished=exc_info[0] is None)
            # Destroy every group that can be destroyed without blocking now, not at the
            # interpreter's exit ("Teardown").
            self._drop_abandoned(expired_after_s=0.0)
            if self._participant is not None and not self._participant.lost.is_set():
                outcome, detail = self._outcome(exc_info[1])
                with contextlib.suppress(RallypointError):
                    self._participant.leave(timeout_s=5, outcome=outcome, detail=detail)
        finally:
            if self._client is not None:
                self._client.close()
            if self.memory is not None:
                self.memory.close()

    def _outcome(self, error: object) -> tuple[LeaveOutcome | None, str]:
        """What this worker tells the job as it leaves (the last to leave ends the job by
        it): finished once ``rounds()`` ran to its end, failed when the training code
        raised, nothing when interrupted (the job stays open for a restarted worker)."""
        if isinstance(error, Exception):
            return LeaveOutcome.FAILED, f"{self.name}: {type(error).__name__}: {error}"[:1024]
        if error is None and self._finished:
            return LeaveOutcome.FINISHED, f"{self.name} finished at step {self.state.step}"
        return None, ""

    @property
    def client(self) -> SyncClient:
        """The run's coordinator client (a ``SyncClient``)."""
        if self._client is None:
            raise RuntimeError("the run is not started: use it in a with statement")
        return self._client

    @property
    def participant(self) -> SyncParticipant:
        """This worker's participant in the job (it changes when the worker rejoins)."""
        if self._participant is None:
            raise RuntimeError("the run is not started: use it in a with statement")
        return self._participant

    def emit(self, kind: str, **fields: Any) -> None:
        """Call ``on_event(kind, fields)`` (with ``t`` and ``name`` added), if given."""
        if self._on_event is not None:
            self._on_event(kind, {"t": time.time(), "name": self.name, **fields})

    def reached_max_steps(self) -> bool:
        """The world has taken ``max_steps`` steps."""
        return self.max_steps is not None and self.state.step >= self.max_steps

    def _join(self) -> None:
        client = self.client
        patience = Patience(
            client.endpoints,
            timeout_s=self.connect_timeout_s,
            attempt_s=float(self._client_options.get("timeout_s", 10.0)),
            who=f"{self.name} of job {self.job!r}",
            log=log,
        )
        participant = patience.call(
            "joining",
            lambda timeout_s: client.join(
                self.job,
                self.name,
                config=self.config,
                # Where the worker runs, for operators (rounds, the dashboard).
                metadata=f"{socket.gethostname()} pid {os.getpid()}".encode(),
                resume=self.resume,
                timeout_s=timeout_s,
            ),
        )
        participant.on_round_change(self._on_round_change)
        self._participant = participant
        # A lost participant ends the round at once, from the client's thread.
        lost = participant.lost
        threading.Thread(
            target=self._watch_lost, args=(participant, lost), name="rallypoint-lost", daemon=True
        ).start()
        self.emit("joined", participant_id=participant.participant_id)

    def _watch_lost(self, participant: SyncParticipant, lost: threading.Event) -> None:
        lost.wait()
        current = self.current
        if current is not None and participant is self._participant:
            current.end(f"participant lost: {participant.lost_reason}")

    def _on_round_change(self, info: RoundInfo) -> None:
        """On the client's thread: end the current round if the job moved past it."""
        current = self.current
        if current is None:
            return
        if info.round != current.number or info.state is not RoundState.ACTIVE:
            current.end(f"round {info.round} is {info.state.value}: {info.reason}")

    # -------------------------------------------------------------- rounds

    def rounds(self) -> Iterator[ElasticRound]:
        """Formed rounds, one after the other, until ``max_steps`` is reached (or the user's
        loop stops iterating a round's batches while it is still healthy)."""
        broken = False
        while not self._finished:
            info = self._next_round(broken)
            if info is None:
                broken = False
                continue
            round_ = self._form(info)
            if round_.formation is None:
                broken = round_._ended.broken
                continue
            self.current = round_
            yield round_
            if not round_.ended:
                # The user's loop is done with a healthy round: the run is finished.
                self._teardown(round_, finished=True)
                self.current = None
                self._finished = True
                self.emit("finished", step=self.state.step, round=round_.number)
                return
            broken = round_._ended.broken
            self._teardown(round_, finished=False)
            self.current = None

    def _next_round(self, broken: bool) -> RoundInfo | None:
        """The next ACTIVE round with this worker, joining again if the participant was lost
        (or if a collective broke and the coordinator saw nothing for reform_timeout_s)."""
        participant = self.participant
        timeout_s = self.reform_timeout_s if broken else self.join_timeout_s
        try:
            return participant.wait_for_round(timeout_s=timeout_s)
        except ParticipantLostError as error:
            if not self.rejoin:
                raise
            reason = str(error)
        except DeadlineExceededError as error:
            if not broken:
                one_line_at_exit(JoinTimeoutError)
                raise JoinTimeoutError(
                    f"{self.name} of job {self.job!r}: no round within join_timeout_s "
                    f"({timeout_s:g} s): {error}"
                ) from None
            reason = f"a collective broke and round {participant.round.round} did not change"
            with contextlib.suppress(RallypointError):
                participant.leave(timeout_s=5)
        # Whatever this process holds is no longer the world's state.
        self._survivor = False
        with contextlib.suppress(RallypointError):
            participant.close()
        self._join()
        self.emit("rejoined", reason=reason, participant_id=self.participant.participant_id)
        return None

    def _connect_timeout(self) -> timedelta:
        """How long a gloo group's connect may take (every group connects through the
        round's store, which stops answering once the round ended)."""
        return timedelta(seconds=min(FORMATION_CONNECT_S, self.collective_timeout_s))

    def _form(self, info: RoundInfo) -> ElasticRound:
        """Init the process group and restore. A round that could not be formed comes back
        ended, without a ``formation``."""
        started = time.monotonic()
        participant_id = self.participant.participant_id
        rank = info.rank_of(participant_id)
        if rank is None:
            raise AssertionError(f"wait_for_round returned round {info.round} without us")
        round_ = ElasticRound(self, info, rank)
        self.current = round_
        latest_view = self.participant.round
        if latest_view.round != info.round or latest_view.state is not RoundState.ACTIVE:
            round_.end(f"round {latest_view.round} is {latest_view.state.value}")
        try:
            store = CoordinatorStore.for_round(
                self.client,
                info,
                participant_id,
                timeout=timedelta(seconds=self.collective_timeout_s),
            )
            round_.in_flight.append(store)
            if not round_.ended:
                self._arrive(round_, store)
                # torch names unnamed groups by a per-process counter that only destroying
                # the default group resets; an init that failed half-way (its round ended)
                # leaves it advanced, and ranks whose counters differ never find each other's
                # gloo keys. Every round starts from zero on every rank.
                distributed_c10d._world.group_count = 0
                connect_timeout = self._connect_timeout()
                dist.init_process_group(
                    self.backend,
                    store=store,
                    rank=rank,
                    world_size=info.world_size,
                    timeout=connect_timeout,
                )
                group = dist.group.WORLD
                assert group is not None
                round_.in_flight.append(group)
                group.set_timeout(timedelta(seconds=self.collective_timeout_s))
                if self.memory is not None:
                    # The snapshots' groups connect through the round store too: made now,
                    # bounded as the init is, before the gate ("Formation").
                    self.memory.make_groups(connect_timeout=connect_timeout)
            init_s = time.monotonic() - started
            if round_.ended or not round_._gate():
                raise _RoundGone(round_.end_reason)
            if self.state.sampler is not None:
                self.state.sampler.set_world(rank, info.world_size)
            if self.state.build is not None:
                # A sharded model is laid out for one world: a new one for this world, its
                # state restored below (what this process held is no longer in place). torch
                # would hand its DTensors the previous world's mesh (memory.py says why).
                forget_previous_world()
                self.state.model, self.state.optimizer = self.state.build()
                _abandonable_fsdp(self.state.model, round_)
                self._survivor = False
            latest = self.client.latest_checkpoint(self.job)
            checkpoint = Path(latest.uri) if latest is not None else None
            memory_snapshot = None
            if self.memory is not None:
                # Collective: the new world's token and placement, before a restore that
                # may read from the peers' snapshot servers.
                self.memory.attach(
                    info.round,
                    on_complete=round_._register_snapshot,
                    timeout=timedelta(seconds=self.collective_timeout_s),
                )
                registered = self.client.latest_memory_snapshot(self.job)
                if registered is not None:
                    memory_snapshot = RegisteredSnapshot(
                        registered.round, registered.step, registered.world_size
                    )
            restored = self._restore(checkpoint, round_, memory_snapshot)
        except (_RoundGone, RuntimeError, RallypointError, SnapshotError) as error:
            # Broken (not merely ended) if the coordinator still has the round ACTIVE.
            round_.end(f"forming failed: {str(error).splitlines()[0][:200]}", broken=True)
            self._teardown(round_, finished=False)
            self.current = None
            return round_
        self._survivor = True
        self.state.step = restored.step
        formation = Formation(
            round_number=info.round,
            rank=rank,
            world_size=info.world_size,
            fencing_token=info.fencing_token,
            init_s=init_s,
            restore=restored,
            formed_s=time.monotonic() - started,
            checkpoint=str(checkpoint) if checkpoint is not None else None,
        )
        round_.formation = formation
        self.formations.append(formation)
        round_._step_started_s = time.monotonic()
        round_.report_progress()
        self.emit(
            "round_formed",
            round=info.round,
            rank=rank,
            world_size=info.world_size,
            token=info.fencing_token,
            step=self.state.step,
            source=restored.source.value,
            reason=restored.reason,
            restore_s=restored.duration_s,
            bytes=restored.bytes_moved,
            init_s=init_s,
            formed_s=formation.formed_s,
            checkpoint=formation.checkpoint,
        )
        return round_

    def _arrive(self, round_: ElasticRound, store: CoordinatorStore) -> None:
        """Say this rank is forming ``round_`` and wait until every rank is (module
        docstring, "Formation"). Raises StaleStoreRoundError the moment the round ends, and
        StoreTimeoutError after ``collective_timeout_s``."""
        store.set(ARRIVED_KEY.format(rank=round_.rank), b"1")
        store.wait(
            [ARRIVED_KEY.format(rank=rank) for rank in range(round_.world_size)],
            timedelta(seconds=self.collective_timeout_s),
        )

    def _restore(
        self,
        checkpoint: Path | None,
        round_: ElasticRound,
        memory_snapshot: RegisteredSnapshot | None,
    ) -> RestoreResult:
        state = self.state
        survivor_step: int | None = state.step if self._survivor else None
        if self.restore_mode == "checkpoint" and checkpoint is not None:
            survivor_step, memory_snapshot = None, None
        result = restore_state(
            state.model,
            state.optimizer,
            checkpoint=checkpoint,
            survivor_step=survivor_step,
            extra=state.extra,
            sampler=state.sampler,
            memory=self.memory,
            memory_snapshot=memory_snapshot,
        )
        if result.source is RestoreSource.FRESH:
            replicated = not any(isinstance(p, DTensor) for p in state.model.parameters())
            if replicated and round_.world_size > 1:
                # Every rank starts from rank 0's initial replica.
                fresh = broadcast_state(
                    state.model, state.optimizer, src=0, step=0, sampler=state.sampler
                )
                result = RestoreResult(
                    RestoreSource.FRESH,
                    "no checkpoint and no survivor: rank 0's initial state, broadcast",
                    0,
                    fresh.extra,
                    fresh.bytes_moved,
                    result.duration_s + fresh.duration_s,
                )
        if result.source is not RestoreSource.KEEP:
            state.extra = result.extra
        return result

    def _teardown(self, round_: ElasticRound, *, finished: bool) -> None:
        """Leave the round's group. A finished round first lets its checkpoint commit (and
        waits for every rank's, so nobody leaves the job before rank 0 committed)."""
        if finished and not round_.ended:
            round_.wait_for_commits(self.collective_timeout_s)
            if dist.is_initialized():
                round_.all_reduce(torch.zeros(1))
        round_.commit_thread.shutdown(wait=False)
        now = time.monotonic()
        if not round_.ended:
            round_.end("finished" if finished else "left")
        if dist.is_initialized():
            round_.in_flight.append(dist.group.WORLD)
            dist.destroy_process_group()
        # The run holds them from now on, not the round (the user's loop variable may keep
        # the round object alive for as long as the program runs).
        self._abandoned.append((now, [round_.checkpointer, *round_.in_flight]))
        round_.in_flight = []
        round_.checkpointer = None
        self._drop_abandoned(expired_after_s=self.collective_timeout_s + 5)

    def _drop_abandoned(self, *, expired_after_s: float) -> None:
        """Let go of abandoned groups (and what came with them) that are quiet, or whose
        group's timeout has surely ended their work (abandoned over ``expired_after_s``
        ago; 0: only the quiet ones). Their destructors run here: none can block."""
        now = time.monotonic()
        self._abandoned = [
            (at, held)
            for at, held in self._abandoned
            if not _quiet(held) and not (expired_after_s and now - at >= expired_after_s)
        ]

    def held_groups(self) -> int:
        """Process groups of past rounds this run still holds because a collective is still
        pending on them (destroying one would block until that collective times out); 0
        once the run is left after every collective completed."""
        return sum(
            isinstance(item, dist.ProcessGroup) for _, held in self._abandoned for item in held
        )


def _quiet(held: Sequence[object]) -> bool:
    """Nothing in ``held`` (a round's group, store, checkpointer, works) can be inside gloo:
    every work completed and no checkpoint being written, so destroying them cannot block."""
    for item in held:
        if isinstance(item, dist.Work) and not item.is_completed():
            return False
        if isinstance(item, Checkpointer) and item.busy:
            return False
    return True


def _poll(work: dist.Work, woken: threading.Event, slice_s: float) -> bool:
    """Up to ``slice_s``: True once ``work`` completed or ``woken`` is set (the round
    ended), looking after 0.1 ms, then twice as long each time, at most every 2 ms."""
    end = time.monotonic() + slice_s
    pause = 0.0001
    while not (work.is_completed() or woken.is_set()):
        remaining = end - time.monotonic()
        if remaining <= 0:
            return False
        woken.wait(min(pause, remaining))
        pause = min(pause * 2, 0.002)
    return True


class CollectiveAbandoned(RuntimeError):
    """A collective inside a step (FSDP2's) was given up: the round ended under it."""


class _RoundComm:
    """What FSDP2's custom collectives below share: the round they wait in, and plain
    allocation."""

    def __init__(self, round_: ElasticRound) -> None:
        self.round = round_

    def allocate(
        self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class _AbandonableAllGather(_RoundComm, AllGather):
    """FSDP2's all-gather, waited for as the loop's own collectives are (``round.wait``): in
    slices, given up as soon as the round ends (the coordinator's push), counted as progress
    for hang detection. gloo cannot interrupt a collective that waits on a peer that is gone;
    this lets the training thread leave it (the work is kept alive until it times out)."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> dist.Work | None:
        work = dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=True)
        return _waited(self.round, work, "FSDP's all-gather", async_op)


class _AbandonableReduceScatter(_RoundComm, ReduceScatter):
    """FSDP2's reduce-scatter, waited for abandonably (see _AbandonableAllGather)."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        # gloo's asynchronous reduce-scatter only runs once waited for (it never completes
        # on its own, measured with torch 2.13), so it cannot be waited for abandonably: an
        # all-reduce of the whole input (twice the traffic) and this rank's part of it.
        work = dist.all_reduce(input_tensor, op=op, group=group, async_op=True)
        _waited(self.round, work, "FSDP's reduce-scatter (an all-reduce)", True)
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        output_tensor.copy_(input_tensor.view(world, -1)[rank].view_as(output_tensor))
        return None


def _waited(
    round_: ElasticRound, work: dist.Work | None, what: str, async_op: bool
) -> dist.Work | None:
    if work is None:
        raise AssertionError(f"{what}: an async collective returned no work")
    if not round_.wait(work, what):
        raise CollectiveAbandoned(f"{what} was given up: {round_.end_reason}")
    return work if async_op else None


def _abandonable_fsdp(model: torch.nn.Module, round_: ElasticRound) -> None:
    """Give every FSDP2 module of ``model`` the loop's abandonable all-gather and
    reduce-scatter (gloo only: NCCL keeps FSDP's own)."""
    if dist.get_backend() != "gloo":
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            with contextlib.suppress(ValueError):  # several parameter groups: FSDP's own
                module.set_custom_all_gather(_AbandonableAllGather(round_))
                module.set_custom_reduce_scatter(_AbandonableReduceScatter(round_))


def _collective_failure(error: RuntimeError) -> bool:
    """Whether ``error`` is a collective's failure (torch's distributed errors, gloo's and
    NCCL's transport errors, one given up), not the training code's."""
    if isinstance(error, dist.DistError | CollectiveAbandoned):
        return True
    text = str(error)
    return any(mark in text for mark in ("gloo", "NCCL", "ProcessGroup", "c10d"))


class JoinTimeoutError(DeadlineExceededError):
    """No round formed with this worker within ``join_timeout_s`` (the message says what the
    job's round is waiting for)."""


class _RoundGone(Exception):
    """The round ended while it was being formed."""


def _event_handler(on_event: EventHandler | None) -> EventHandler | None:
    """``on_event`` if it can be called as ``on_event(kind, fields)``. A callable that takes
    one argument (``def cb(event)``) would raise at the first event, inside the run, and
    kill the worker at its join: it is refused here, saying how it is called."""
    if on_event is None:
        return None
    if not callable(on_event):
        raise TypeError(f"on_event must be a callable, got {type(on_event).__name__}")
    try:
        inspect.signature(on_event).bind("joined", {})
    except TypeError:
        shown = getattr(on_event, "__qualname__", repr(on_event))
        raise TypeError(
            f"on_event is called as on_event(kind, fields): kind is the event's name (e.g. "
            f"'round_formed'), fields a dict of its values; {shown} cannot take those two "
            "arguments (see docs/api.md, 'Events')"
        ) from None
    except ValueError:  # no signature to read (some builtins): trust it
        pass
    return on_event


# The loop's entry point, as the README spells it: ``with elastic_training(...) as run``.
elastic_training = ElasticRun


__all__ = [
    "ElasticRound",
    "ElasticRun",
    "Formation",
    "JoinTimeoutError",
    "TrainState",
    "elastic_training",
]
