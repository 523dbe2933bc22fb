"""The run: a worker's membership of an elastic job, its rounds one after the other, joining
again when its participant is lost, and its teardown (:class:`ElasticRun`).

``ElasticRun``'s keyword arguments are :class:`ElasticConfig`'s fields (config.py) plus
``state`` and ``on_event``: :class:`RunArguments` holds them all, and the run's signature is
made from it (:func:`_takes_run_arguments`), so no argument, type or default is written
twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec

import torch

from rallypoint.client import (
    DeadlineExceededError,
    LeaveOutcome,
    RallypointError,
    RoundInfo,
    SyncClient,
    SyncParticipant,
    UnauthenticatedError,
    token_or_environment,
)

from .. import joining
from ..errors import WorkerError
from ..patience import Patience, one_line_at_exit
from ..snapshots import SnapshotError
from .config import ElasticConfig, EventHandler, event_handler
from .formation import Former, RoundGone
from .round import ElasticRound
from .state import Formation, TrainState
from .teardown import Abandoned, leave_round

if TYPE_CHECKING:
    from ..snapshots import MemorySnapshots

log = logging.getLogger("rallypoint.worker.elastic")

# What forming a round needs beyond this package's own modules: the restore, the disk
# checkpoints and the memory snapshots (torch.distributed.checkpoint under them); warmed on
# a thread while the worker joins (package docstring, "Imports").
RESTORE_PATH = "rallypoint.worker.checkpoint"

P = ParamSpec("P")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunArguments(ElasticConfig):
    """Every argument of ``ElasticRun``: its settings, what it trains and whom it tells."""

    state: TrainState
    on_event: EventHandler | None = None

    def settings(self) -> ElasticConfig:
        """The settings alone (without ``state`` and ``on_event``)."""
        return ElasticConfig(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(ElasticConfig)}
        )


_Init = Callable[["ElasticRun", RunArguments], None]


def _takes_run_arguments(
    arguments: Callable[P, RunArguments],
) -> Callable[[_Init], Callable[Concatenate[ElasticRun, P], None]]:
    """Make ``__init__(self, arguments)`` take ``arguments``' parameters instead, for
    callers, type checkers and ``inspect.signature`` (docs/generate.py reads it)."""

    def decorate(init: _Init) -> Callable[Concatenate[ElasticRun, P], None]:
        def wrapper(self: ElasticRun, /, *args: P.args, **kwargs: P.kwargs) -> None:
            init(self, arguments(*args, **kwargs))

        signature = inspect.signature(arguments)
        this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[this, *signature.parameters.values()], return_annotation=None
        )
        # Its name, docstring and source (inspect.getsource follows __wrapped__) are init's.
        functools.update_wrapper(wrapper, init)
        return wrapper

    return decorate


class JoinTimeoutError(DeadlineExceededError, WorkerError):
    """No round formed with this worker within ``join_timeout_s`` (the message says what the
    job's round is waiting for)."""


class ElasticRun:
    """A worker's membership of an elastic job (worker/elastic/ says how it works). Use it
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
        restore: "auto" (the fastest correct source: keep, broadcast, replicas, memory, disk,
            fresh) or "checkpoint" (always the latest committed checkpoint when there is one).
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
        straggler_hold_windows: an evicted straggler is held out of the job for this many
            windows: its process waits (one log line says how long), then joins again.
        snapshot_every: take an in-memory snapshot every this many steps (0: none), kept
            in this process's memory and protected on peers (worker/snapshots/); every
            worker of the job gives the same. After a failure the world restores the
            newest registered one from the survivors' memory (source ``memory``) when
            nothing newer is on disk, losing at most ``snapshot_every`` steps.
        snapshot_copies: how many copies of each rank's snapshot are kept (its own
            included), on distinct hosts where the world has enough of them (2 unless
            ``snapshot_erasure`` is given).
        snapshot_erasure: ``(k, m)`` protects snapshots by erasure coding instead of copies:
            the ranks form groups of k, each with m parity shares kept on other hosts where
            the world allows; up to m losses per group come back from memory, at (k+m)/k
            of the state held (worker/snapshots/erasure.py). Give it or ``snapshot_copies``,
            not both.
        host: the failure domain this worker runs on (default: the machine's host name):
            the participant joins with it as its domain (a domain's participants are
            removed and readmitted together, a unit kept inside one), and snapshot copies
            go to workers of other hosts.
        unit_size: every round's world size is a multiple of it, and ranks
            ``[k*unit_size, (k+1)*unit_size)`` form unit k, kept on one host where it has
            room (e.g. the tensor-parallel degree); when a rank dies its unit's other ranks
            leave the world with it (docs/elastic.md, "Mesh jobs"). min_nodes and max_nodes
            must be multiples of it; every worker of the job gives the same.
        domain_size: how many workers a full host holds (0: not declared); a host's
            waiting workers are readmitted together once that many wait.
        units_within_domains: True never lets a unit straddle two hosts (a tensor-parallel
            group needs its host's interconnect); False lets leftovers of several hosts
            make a unit when no host has a whole one.
        snapshot_address: the address other workers reach this worker's snapshot server
            at (default: the address the host name resolves to); the server listens on
            every interface unless this is a loopback address.
        snapshot_dir: a directory in host memory (a tmpfs: ``"/dev/shm"``) where this
            worker keeps its snapshots, in files outside its process (under
            ``rallypoint-snapshots/<job>/<name>``), instead of in its own memory: when every
            worker dies at once (a crash, an out-of-memory kill) and they are started again
            on the same hosts with the same names, they restore the newest registered
            snapshot from there (source ``memory``) instead of the disk checkpoint. The files
            are removed when the worker leaves the job (finished or failed). None (the
            default): in the worker's memory.
        health_check: a pre-admission check, ``check(round) -> str | None``, run on every
            rank of a forming round before the state is restored (it may run collectives
            on the round's group; such a check must be set on every rank): a reason drains
            this worker's host (its failure domain) and the round forms again without it.
            Every rank votes on the outcome, a rank without a check "healthy", so the check
            may be set on some hosts only. ``CollectiveProbe()`` (health.py) is the
            built-in one: a ring exchange that names a rank whose links are far slower
            than its peers'. None: no check.
        state: what is trained and checkpointed (a ``TrainState``).
        on_event: called as ``on_event(kind, fields)`` for each event below.

    ``on_event(kind, fields)`` hears of each event below; every event's fields also hold
    ``t``, the wall clock in seconds, and ``name``, this worker's.

    Events:
        joined: participant_id. The worker joined the job.
        round_formed: round, rank, world_size, token, step, source, reason, restore_s,
            bytes, init_s, formed_s, checkpoint. A round formed: its process group is up and
            the state restored from ``source`` (keep, broadcast, replicas, memory, disk, fresh)
            for ``reason``, ``bytes`` moved in ``restore_s``; ``step`` is the restored step;
            ``init_s`` and ``formed_s`` are the seconds from the round's start to the group's
            init and to the restore's end; ``checkpoint`` the latest committed checkpoint's
            path (or None).
        trained: round, rank, step. The round's first step is done: training again.
        round_ending: round, rank, reason. A planned change (a drain, a scale-up: every
            member is still in the job) was seen: the round ends after the next step every
            rank agrees on, so no step is lost.
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
        snapshot_committed: round, rank, step, blocked_s, final. Rank 0 registered the world's
            in-memory snapshot of ``step``: every rank's copy is protected on its peers
            (``blocked_s``: how long rank 0's training was held to copy its state; ``final``:
            the last snapshot of a round ended by plan, ``ElasticRound.final_snapshot``).
        final_snapshot: round, rank, step, committed, s. A sharded model's round that ended
            by plan took and registered a snapshot of the step every rank stopped after
            (``committed``: registered; ``s``: what it took) before leaving the round.
        final_snapshot_failed: round, rank, step, error. It could not, within the bound:
            the next world restores from the newest snapshot registered before.
        snapshot_refused: round, rank, step, error. The coordinator refused a stale round's
            snapshot (a zombie's).
        snapshot_failed: round, rank, step, error. The snapshot was not protected or not
            registered (a peer was lost under it, the coordinator was not reached).
        rejoined: reason, participant_id. The worker joined again, as a newcomer.
        health_drained: round, rank, reason. This worker's health check failed: it drained
            its host, and the round forms again without it.
        finished: step, round. The run reached its end.

    Attributes:
        state: the ``TrainState`` (``run.state.step`` is the current step).
        current: the round being trained in (None between rounds).
        formations: how each round this worker trained in was formed (``Formation``).
        last_loss: the last ``loss`` given to ``step_done`` (None: none yet).
    """

    @_takes_run_arguments(RunArguments)
    def __init__(self, arguments: RunArguments) -> None:
        settings = self.settings = arguments.settings()
        endpoints = settings.endpoints
        self.endpoints = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
        self.job = settings.job
        self.name = settings.name
        self.state = arguments.state
        # Absolute: the registry's URIs must mean the same from any worker's directory.
        self.checkpoint_dir = Path(settings.checkpoint_dir).absolute()
        self.max_steps = settings.max_steps
        self.backend = settings.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.host = settings.host or socket.gethostname()
        # This process's in-memory snapshots and their server, across rounds (None: off).
        self.memory: MemorySnapshots | None = None
        if settings.snapshot_every > 0:
            advertise = settings.snapshot_address or socket.gethostbyname(socket.gethostname())
            loopback = advertise.startswith("127.") or advertise in ("::1", "localhost")
            from ..snapshots import MemorySnapshots, job_directory

            directory = settings.snapshot_dir
            self.memory = MemorySnapshots(
                self.host,
                copies=settings.snapshot_copies,
                erasure=settings.snapshot_erasure,
                bind=advertise if loopback else "0.0.0.0",
                advertise=advertise,
                directory=None
                if directory is None
                else job_directory(directory, self.job, self.name),
            )
        self.config = settings.job_config()
        self._on_event = event_handler(arguments.on_event)
        # The job's token, else the one in client_options, else $RALLYPOINT_TOKEN (a
        # "job:<id>" role is enough: docs/security.md, "Client tokens and roles").
        self._client_options = dict(settings.client_options or {})
        self._client_options["token"] = token_or_environment(
            settings.token or self._client_options.get("token")
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
        self._former = Former(self, self.backend)
        # Abandoned groups and their work; see teardown.py.
        self._abandoned = Abandoned()
        self.last_loss: float | None = None
        self._finished = False

    # -------------------------------------------------------------- lifecycle

    def __enter__(self) -> ElasticRun:
        # The restore path's imports run while the join below waits on the coordinator,
        # and the round on its peers ("Imports"); not a daemon, so the interpreter never
        # exits from under an import.
        threading.Thread(target=_warm_restore_path, name="rallypoint-warm").start()
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
        outcome, detail = self._outcome(exc_info[1])
        try:
            if self.current is not None:
                self._teardown(self.current, finished=exc_info[0] is None)
            # Destroy every group that can be destroyed without blocking now, not at the
            # interpreter's exit ("Teardown"), once the teardowns' own drops are done.
            self._abandoned.wait_dropped()
            self._abandoned.drop(expired_after_s=0.0)
            if self._participant is not None and not self._participant.lost.is_set():
                with contextlib.suppress(RallypointError):
                    self._participant.leave(timeout_s=5, outcome=outcome, detail=detail)
        finally:
            if self._client is not None:
                self._client.close()
            if self.memory is not None:
                # Interrupted, the job stays open for this worker: its snapshot files too.
                self.memory.close(keep_files=outcome is None)

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
        """Join the job as this worker's name (worker/joining.py: how this differs from the
        torchrun backend's join, and why), and follow the participant's rounds."""
        client = self.client
        patience = Patience(
            client.endpoints,
            timeout_s=self.settings.connect_s,
            attempt_s=float(self._client_options.get("timeout_s", 10.0)),
            who=f"{self.name} of job {self.job!r}",
            log=log,
        )
        participant = joining.join(
            client,
            self.job,
            lambda: self.name,
            config=self.config,
            # Where the worker runs, for operators (rounds, the dashboard).
            metadata=f"{socket.gethostname()} pid {os.getpid()}".encode(),
            patience=patience,
            resume=self.settings.resume,
            domain=self.host,
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
        if joining.is_live(info, current.number):
            return
        reason = f"round {info.round} is {info.state.value}: {info.reason}"
        if joining.is_planned(info, current.info):
            # Nobody of the round left the job (a drain, a scale-up): every rank finishes
            # the step in flight and stops after the same one ("Planned changes").
            current.end_at_step_boundary(f"planned change: {reason}")
        else:
            current.end(reason)

    # -------------------------------------------------------------- rounds

    def rounds(self) -> Iterator[ElasticRound]:
        """Formed rounds, one after the other, until ``max_steps`` is reached (or the user's
        loop stops iterating a round's batches while it is still healthy)."""
        broken = False
        while not self._finished:
            info = self._next_round(broken)
            round_ = self._form(info)
            if round_.formation is None:
                broken = round_.ending.broken
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
            broken = round_.ending.broken
            self._teardown(round_, finished=False)
            self.current = None

    def _next_round(self, broken: bool) -> RoundInfo:
        """The next ACTIVE round with this worker, joining again if the participant was lost
        (or if a collective broke and the coordinator saw nothing for reform_timeout_s).
        It waits first and joins again only then: worker/joining.py says why the torchrun
        backend does the opposite."""
        settings = self.settings

        def timeout_s() -> float:
            return settings.reform_timeout_s if broken else settings.join_timeout_s

        def lost(participant: SyncParticipant, error: Exception) -> SyncParticipant:
            nonlocal broken
            if not settings.rejoin:
                raise error
            broken = False
            return self._join_again(participant, str(error))

        def timed_out(participant: SyncParticipant, error: Exception) -> SyncParticipant:
            nonlocal broken
            if not broken:
                one_line_at_exit(JoinTimeoutError)
                raise JoinTimeoutError(
                    f"{self.name} of job {self.job!r}: no round within join_timeout_s "
                    f"({settings.join_timeout_s:g} s): {error}"
                ) from None
            reason = f"a collective broke and round {participant.round.round} did not change"
            with contextlib.suppress(RallypointError):
                participant.leave(timeout_s=5)
            broken = False
            return self._join_again(participant, reason)

        _, info = joining.next_round(
            self.participant, timeout_s=timeout_s, on_lost=lost, on_timeout=timed_out
        )
        return info

    def _join_again(self, participant: SyncParticipant, reason: str) -> SyncParticipant:
        """Join again, as a newcomer, in place of ``participant`` (lost, or left)."""
        # Whatever this process holds is no longer the world's state.
        self._former.survivor = False
        with contextlib.suppress(RallypointError):
            participant.close()
        self._join()
        self.emit("rejoined", reason=reason, participant_id=self.participant.participant_id)
        return self.participant

    def _form(self, info: RoundInfo) -> ElasticRound:
        """Form the round (formation.py). A round that could not be formed comes back
        ended, without a ``formation``."""
        started = time.monotonic()
        participant_id = self.participant.participant_id
        rank = info.rank_of(participant_id)
        if rank is None:
            raise AssertionError(f"wait_for_round returned round {info.round} without us")
        round_ = ElasticRound(self, info, rank)
        self.current = round_
        latest_view = self.participant.round
        if not joining.is_live(latest_view, info.round):
            round_.end(f"round {latest_view.round} is {latest_view.state.value}")
        try:
            formation = self._former.form(round_, started)
        except (RoundGone, RuntimeError, RallypointError, SnapshotError) as error:
            # Broken (not merely ended) if the coordinator still has the round ACTIVE.
            round_.end(f"forming failed: {str(error).splitlines()[0][:200]}", broken=True)
            self._teardown(round_, finished=False)
            self.current = None
            return round_
        round_.formation = formation
        self.formations.append(formation)
        restored = formation.restore
        round_.progress.formed(restored.source.value)
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
            init_s=formation.init_s,
            formed_s=formation.formed_s,
            checkpoint=formation.checkpoint,
        )
        return round_

    def _teardown(self, round_: ElasticRound, *, finished: bool) -> None:
        """Leave the round's group (teardown.py)."""
        leave_round(
            round_,
            self._abandoned,
            finished=finished,
            collective_timeout_s=self.settings.collective_timeout_s,
        )

    def held_groups(self) -> int:
        """Process groups of past rounds this run still holds because a collective is still
        pending on them (destroying one would block until that collective times out); 0
        once the run is left after every collective completed."""
        return self._abandoned.groups()


def _warm_restore_path() -> None:
    """Import the restore path (``RESTORE_PATH``), so that forming the first round finds it
    loaded. A failure is left to the formation's own import, which raises it to the run."""
    with contextlib.suppress(ImportError):
        importlib.import_module(RESTORE_PATH)


# The loop's entry point, as the README spells it: ``with elastic_training(...) as run``.
elastic_training = ElasticRun
