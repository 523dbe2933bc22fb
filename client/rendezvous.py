"""Joining a job and staying in it: a participant's heartbeat, its view of the rounds, leaving.

Theory of operation (rendezvous.proto). ``join`` adds a participant, tied to the client's
session, and returns a :class:`Participant` that runs two background tasks until it leaves,
is lost, or the client closes. It calls the cluster through the client's :class:`Caller`
(writes stamped by the session; both streams reconnect under its one retry policy):

- The heartbeat: one bidirectional ``Heartbeat`` stream to the leader, a request every
  ``heartbeat_interval_ms`` naming the round the participant believes current. A follower
  ends the stream with UNAVAILABLE and the leader's address; the participant reconnects there
  at once, otherwise after a full-jitter backoff capped at two heartbeat intervals
  (:func:`reconnect_backoff`): after a leader change the new leader suspects nobody for a
  grace period, and the participant must reach it well within that. The leader answers at
  least every few heartbeats and whenever the job's round differs from the one the request
  named; an answer ahead of the participant's view triggers a linearizable GetJob, so a
  round change is learnt from the heartbeat even when the watch is stuck on a paused member.
  A stream with no answer for ``ANSWER_PATIENCE_BEATS`` intervals is abandoned for another
  member.
- The watch: ``WatchJob`` sends the job's RoundInfo at once and after every change. It is
  reopened after any failure; the first message of a new stream is the current state, so a
  reconnect misses no change for good (intermediate states may be coalesced, by the server
  as by the reconnect, but the latest never is).

Both feed :meth:`Participant._observe`, which keeps the newest RoundInfo by ``job_revision``
(never going back), hands each new (round, state) to ``rounds()`` iterators and
``on_round_change`` callbacks once, and wakes ``wait_for_round``. A RoundInfo that no longer
lists the participant as a member or as waiting means the coordinator removed it (declared
failed, evicted, session ended, job closed): ``lost`` is set and stays set. So is it when the
heartbeat is refused with NOT_FOUND (the participant or the job is gone): a worker that was
paused past its failure detection finds out as soon as it runs again.

``leave`` sends Leave *before* closing the streams: the leader then no longer counts the
participant, and the stream's end is not taken for a death.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc
import grpc.aio

from rallypoint.proto.v1 import rendezvous_pb2

from .arguments import non_negative_seconds
from .backoff import Backoff
from .caller import Caller
from .checkpoints import CheckpointRegistry
from .errors import (
    DeadlineExceededError,
    InternalError,
    InvalidValueError,
    NotFoundError,
    RallypointError,
    UnavailableError,
    map_rpc_error,
)
from .jobs import get_job, services
from .rendezvous_errors import (
    JobNotFoundError,
    ParticipantLostError,
    ParticipantNotFoundError,
    refine,
    refined,
)
from .rendezvous_values import (
    LEAVE_OUTCOMES,
    JobConfig,
    JoinResult,
    LeaveOutcome,
    RoundInfo,
    RoundState,
    TrainingProgress,
    round_state,
)
from .roundstore import RoundStore
from .tasks import cancel_and_wait
from .transport import Retrier, Transport

log = logging.getLogger("rallypoint.client.rendezvous")

# The leader answers at least every ten heartbeats (rendezvous.proto: "now and then"); a
# stream silent for this many intervals is taken as a member that stopped answering.
ANSWER_PATIENCE_BEATS = 30
# ... but never less than this, so a short interval does not make a slow leader look dead.
MIN_ANSWER_PATIENCE_S = 2.0
# How long wait_for_round, out of time, waits for a fresh account of the round it names.
_DESCRIBE_TIMEOUT_S = 5.0

_STATE_ORDER = {RoundState.JOINING: 0, RoundState.ACTIVE: 1, RoundState.ENDED: 2}

RoundCallback = Callable[[RoundInfo], object]


def reconnect_backoff(heartbeat_interval_s: float, backoff: Backoff) -> Backoff:
    """The heartbeat's reconnect backoff: the client's, capped at two heartbeat intervals."""
    cap_s = max(min(backoff.cap_s, 2 * heartbeat_interval_s), min(backoff.base_s, 0.001))
    return Backoff(base_s=min(backoff.base_s, cap_s), cap_s=cap_s)


def round_position(round_number: int, state: RoundState) -> tuple[int, int]:
    """Orders (round, state) pairs: rounds increase, and within one JOINING < ACTIVE < ENDED."""
    return round_number, _STATE_ORDER[state]


class Participant:
    """A participant of a job; see the module docstring. Use it from the client's loop."""

    def __init__(self, caller: Caller, name: str, joined: JoinResult, config: JobConfig) -> None:
        self.caller = caller
        self.job = joined.round.job
        self.name = name
        self.participant_id = joined.participant_id
        # The Join's answer (``joined.waiting``: the round was ACTIVE, so it waited).
        self.joined = joined
        self.config = config
        self.heartbeat_interval_s = config.heartbeat_interval_ms / 1000
        # The newest RoundInfo seen. Invariant: its job_revision never decreases.
        self.round: RoundInfo = joined.round
        # time.monotonic() when ``round`` was last taken from an answer or a push.
        self._observed_s = time.monotonic()
        self.lost = asyncio.Event()
        # Why the participant was lost; None while it is not.
        self.lost_reason: str | None = None
        # Leave was called (it may still be in flight): a view without us is then expected.
        self.leaving = False
        # close() was called: the background work stops without leaving.
        self.closed = False
        # What the training loop last reported (report_progress); sent with every heartbeat.
        self._progress: TrainingProgress | None = None
        # The member the heartbeat stream goes (or last went) to; "" before the first.
        self._heartbeat_address = ""
        # The (round, state) last handed to iterators and callbacks.
        self._delivered = (joined.round.round, joined.round.state)
        # The round number wait_for_round returned last (0: none yet).
        self._returned_round = 0
        self._subscribers: list[asyncio.Queue[RoundInfo | None]] = []
        self._callbacks: list[RoundCallback] = []
        # Set (and replaced) on every change of view, lost or left.
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._refresh: asyncio.Task[None] | None = None
        # The watch stream in use, so a refresh that finds it behind can restart it.
        self._watch_call: (
            grpc.aio.UnaryStreamCall[
                rendezvous_pb2.WatchJobRequest, rendezvous_pb2.WatchJobResponse
            ]
            | None
        ) = None
        self._watch_restart = False
        self._observe(joined.round)

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else ("left" if self.leaving else "in")
        return (
            f"Participant(job={self.job!r}, name={self.name!r}, id={self.participant_id}, "
            f"round={self.round.round} {self.round.state.value}, {state})"
        )

    # -------------------------------------------------------------- the view

    @property
    def rank(self) -> int | None:
        """This participant's rank in the current round; None unless it is ACTIVE with us."""
        return self.round.rank_of(self.participant_id)

    @property
    def waiting(self) -> bool:
        return any(m.participant_id == self.participant_id for m in self.round.waiting)

    def report_progress(self, progress: TrainingProgress) -> None:
        """Tell the coordinator, with every heartbeat from now on, how training goes: the
        leader declares a rank that stops while its peers wait for it hung, and finds
        stragglers (coordinator/liveness/progress.py), and keeps the round's restore source
        (``TrainingProgress.restore``) in its record. Safe to call from any thread: it only
        swaps a reference to a frozen value."""
        self._progress = progress

    async def report_collective_failure(
        self, round_number: int, detail: str, *, timeout_s: float | None = None
    ) -> list[int]:
        """Tell the coordinator that a collective of round ``round_number`` failed under
        this participant (a peer vanished): the member this participant heartbeats to
        confirms at once the failure of the round's members whose heartbeat stream it saw
        close, instead of waiting out two heartbeat intervals, and the round ends sooner for
        every survivor. Returns the participant ids so confirmed (none: nothing was
        hastened; the detectors decide as before). A report for a round that is not the
        job's current ACTIVE one, or from a participant not in it, is refused
        (:class:`StaleRoundError`) and confirms nothing."""
        address = self._heartbeat_address or self.caller.transport.pick()
        request = rendezvous_pb2.ReportCollectiveFailureRequest(
            job=self.job,
            participant_id=self.participant_id,
            round=round_number,
            detail=detail[:1024],
        )
        response = await refined(
            self.caller.ask(
                address,
                lambda s: services(s).rendezvous.ReportCollectiveFailure,
                request,
                timeout_s,
            )
        )
        return list(response.confirmed)

    def on_round_change(self, callback: RoundCallback) -> None:
        """Call ``callback(round_info)`` on the loop for each new (round, state)."""
        self._callbacks.append(callback)

    async def rounds(self) -> AsyncIterator[RoundInfo]:
        """The current round, then each new (round, state) as it is learnt; ends when the
        participant leaves or is lost."""
        queue: asyncio.Queue[RoundInfo | None] = asyncio.Queue()
        self._subscribers.append(queue)
        try:
            if not self._running():
                return
            yield self.round
            while (info := await queue.get()) is not None:
                yield info
        finally:
            self._subscribers.remove(queue)

    async def wait_for_round(self, timeout_s: float | None = None) -> RoundInfo:
        """The next ACTIVE round that includes this participant: the current one if it is
        ACTIVE with us and was not returned by an earlier call, else the first such round to
        come. Waits up to ``timeout_s`` (default: the job's join_timeout_ms), then raises
        DeadlineExceededError; raises ParticipantLostError once the participant is lost."""
        wait_s = self.config.join_timeout_ms / 1000 if timeout_s is None else timeout_s
        non_negative_seconds(wait_s, "timeout_s")
        try:
            async with asyncio.timeout(wait_s):
                while True:
                    self._check_in_job()
                    info = self.round
                    if info.rank_of(self.participant_id) is not None and (
                        info.round > self._returned_round
                    ):
                        self._returned_round = info.round
                        return info
                    await self._changed.wait()
        except TimeoutError:
            raise DeadlineExceededError(
                f"job {self.job!r}: no ACTIVE round with participant {self.participant_id} "
                f"within {wait_s:g} s ({await self._describe_round()})"
            ) from None

    async def _describe_round(self) -> str:
        """The round as the leader sees it now. The view's ``reason`` was written when the
        round last changed: a round that has been JOINING since would read "joining for
        0.2 s" after ten minutes. One linearizable read refreshes it; without an answer the
        old reason is given with its age."""
        try:
            status = await get_job(self.caller, self.job, timeout_s=_DESCRIBE_TIMEOUT_S)
        except RallypointError as error:
            age_s = time.monotonic() - self._observed_s
            return (
                f"round {self.round.round} was {self.round.state.value} {age_s:.0f} s ago: "
                f"{self.round.reason}; the coordinator did not answer since: {error}"
            )
        self._observe(status.round)
        return f"round {status.round.round} is {status.round.state.value}: {status.round.reason}"

    def _check_in_job(self) -> None:
        if self.lost.is_set():
            raise ParticipantLostError(self.lost_reason or "the participant was lost")
        if self.leaving or self.closed:
            what = "left job" if self.leaving else "was closed without leaving job"
            raise ParticipantLostError(f"participant {self.participant_id} {what} {self.job}")

    def store(self) -> RoundStore:
        """The current round's store (raises StaleRoundError once the round is over)."""
        return RoundStore(self.caller, self.job, self.round.round, self.participant_id)

    def checkpoints(self) -> CheckpointRegistry:
        """The checkpoint registry, fenced by the current round and its token."""
        return CheckpointRegistry.for_round(self.caller, self.round)

    def _observe(self, info: RoundInfo) -> bool:
        """Take a RoundInfo from any source; True if it was newer than the view."""
        if info.job_revision < self.round.job_revision:
            return False
        newer = info.job_revision > self.round.job_revision
        self.round = info
        self._observed_s = time.monotonic()
        if self.lost.is_set() or self.leaving:
            return newer
        if not info.includes(self.participant_id):
            what = "the job was closed" if info.job_closed else "declared failed or evicted"
            self._mark_lost(
                f"participant {self.participant_id} ({self.name}) is no longer in job "
                f"{self.job!r} as of round {info.round} ({what})"
            )
            return newer
        position = (info.round, info.state)
        if position != self._delivered:
            self._delivered = position
            for queue in self._subscribers:
                queue.put_nowait(info)
            loop = asyncio.get_running_loop()
            for callback in self._callbacks:
                loop.call_soon(callback, info)
        self._wake()
        return newer

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _end_iterators(self) -> None:
        for queue in self._subscribers:
            queue.put_nowait(None)
        self._wake()

    def _mark_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        log.warning("%s", reason)
        self.lost_reason = reason
        self.lost.set()
        self._end_iterators()
        self._cancel_tasks()

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the heartbeat and the watch (``join`` does)."""
        if self._tasks or not self._running():
            return
        tag = f"{self.job}/{self.participant_id}"
        self._tasks = [
            asyncio.create_task(self._heartbeat_forever(), name=f"heartbeat {tag}"),
            asyncio.create_task(self._watch_forever(), name=f"round watch {tag}"),
        ]

    def _cancel_tasks(self) -> list[asyncio.Task[None]]:
        current = asyncio.current_task()
        tasks = [t for t in [*self._tasks, self._refresh] if t is not None and t is not current]
        for task in tasks:
            task.cancel()
        return tasks

    async def _stop(self) -> None:
        tasks = self._cancel_tasks()
        try:
            await cancel_and_wait(*tasks)
        finally:
            self._tasks = []

    async def leave(
        self,
        *,
        timeout_s: float | None = None,
        outcome: LeaveOutcome | None = None,
        detail: str = "",
    ) -> None:
        """Leave the job (Leave first, then close the streams). Leaving twice, or after the
        participant was lost, does nothing more. ``outcome`` says how the job went for this
        participant: the last one to leave ends the job FINISHED or FAILED by it (None: the
        job stays open, waiting for workers); ``detail`` says it in words."""
        if self.leaving:
            return
        self.leaving = True
        wire_outcome = (
            LEAVE_OUTCOMES[outcome]
            if outcome is not None
            else rendezvous_pb2.LEAVE_OUTCOME_UNSPECIFIED
        )
        try:
            if not self.lost.is_set():
                with contextlib.suppress(ParticipantNotFoundError, JobNotFoundError):
                    await refined(
                        self.caller.write(
                            lambda s: services(s).rendezvous.Leave,
                            lambda header: rendezvous_pb2.LeaveRequest(
                                header=header,
                                job=self.job,
                                participant_id=self.participant_id,
                                outcome=wire_outcome,
                                detail=detail[:1024],
                            ),
                            timeout_s,
                        )
                    )
        finally:
            await self._stop()
            self._end_iterators()

    async def close(self) -> None:
        """Stop heartbeating without leaving: the leader will count this participant failed
        (what a process that dies does). The client's close does this."""
        self.closed = True
        self._end_iterators()
        await self._stop()

    async def __aenter__(self) -> Participant:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.leave()

    # -------------------------------------------------------------- heartbeat

    def _running(self) -> bool:
        return not (self.lost.is_set() or self.leaving or self.closed)

    async def _heartbeat_forever(self) -> None:
        transport = self.caller.transport
        retrier = self.caller.retrier(
            reconnect_backoff(self.heartbeat_interval_s, transport.backoff)
        )
        while self._running():
            address = transport.pick()
            error = await self._heartbeat_stream(transport, address, retrier)
            if self._gone(error, "heartbeat"):
                return
            log.debug("heartbeat stream to %s ended: %s", address, error)
            await retrier.after_failure(address, error)

    async def _heartbeat_stream(
        self, transport: Transport, address: str, retrier: Retrier
    ) -> RallypointError:
        """Heartbeat over one stream until it fails; the failure."""
        # Where this participant's detector runs: a collective failure is reported there.
        self._heartbeat_address = address
        try:
            call = services(transport.stubs(address)).rendezvous.Heartbeat(
                None, metadata=transport.metadata
            )
        except UnavailableError as closed:  # the client was closed
            return closed
        sender = asyncio.create_task(self._send_heartbeats(call), name="heartbeat-send")
        patience_s = max(MIN_ANSWER_PATIENCE_S, ANSWER_PATIENCE_BEATS * self.heartbeat_interval_s)
        try:
            while True:
                try:
                    async with asyncio.timeout(patience_s):
                        response = await call.read()
                except TimeoutError:
                    return UnavailableError(f"{address} answered no heartbeat in {patience_s:g} s")
                if not isinstance(response, rendezvous_pb2.HeartbeatResponse):  # grpc.aio.EOF
                    return UnavailableError(f"{address} ended the heartbeat stream")
                retrier.answered()
                transport.note_success(address)
                self._on_heartbeat_answer(response)
        except grpc.aio.AioRpcError as rpc_error:
            return refine(map_rpc_error(rpc_error, address))
        finally:
            try:
                await cancel_and_wait(sender)
            finally:
                call.cancel()

    async def _send_heartbeats(
        self,
        call: grpc.aio.StreamStreamCall[
            rendezvous_pb2.HeartbeatRequest, rendezvous_pb2.HeartbeatResponse
        ],
    ) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            request = rendezvous_pb2.HeartbeatRequest(
                job=self.job,
                participant_id=self.participant_id,
                round=self.round.round,
                sent_ms=int(time.monotonic() * 1000),
            )
            progress = self._progress
            if progress is not None:
                _add_progress(request, progress, time.monotonic())
            try:
                await call.write(request)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                return  # the stream ended; the reader reports why
            # A fixed schedule, not sleep(interval) after each write: the detector learns the
            # intervals, and drift would read as lateness.
            next_at = max(next_at + self.heartbeat_interval_s, loop.time())
            await asyncio.sleep(next_at - loop.time())

    def _on_heartbeat_answer(self, response: rendezvous_pb2.HeartbeatResponse) -> None:
        answered = round_position(response.current_round, round_state(response.state))
        if answered > round_position(self.round.round, self.round.state):
            self._refresh_soon()

    def _refresh_soon(self) -> None:
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.create_task(self._refresh_view(), name="round refresh")

    async def _refresh_view(self) -> None:
        """Read the job linearizably; if that shows the watch was behind, restart it."""
        try:
            status = await get_job(self.caller, self.job)
        except JobNotFoundError as error:
            self._gone(error, "refresh")
            return
        except RallypointError as error:
            log.debug("refreshing job %s failed: %s", self.job, error)
            return
        if self._observe(status.round) and self._watch_call is not None:
            self._watch_restart = True
            self._watch_call.cancel()

    def _gone(self, error: RallypointError, source: str) -> bool:
        """Whether ``error`` ends the participant's background work (marking it lost when the
        coordinator no longer knows it)."""
        if not self._running():
            return True
        if isinstance(error, NotFoundError) and error.reason in (
            "PARTICIPANT_NOT_FOUND",
            "JOB_NOT_FOUND",
        ):
            self._mark_lost(
                f"participant {self.participant_id} ({self.name}) of job {self.job!r} is gone "
                f"({source} refused: {error})"
            )
            return True
        # INTERNAL comes from gRPC's core when a stream breaks mid-flight (e.g. its member was
        # killed): a transport failure like UNAVAILABLE, not a verdict on the participant.
        if not isinstance(error, UnavailableError | DeadlineExceededError | InternalError):
            # Nothing else is expected of these streams: stop acting rather than guess.
            self._mark_lost(f"the {source} of participant {self.participant_id} failed: {error}")
            return True
        return False

    # -------------------------------------------------------------- watch

    async def _watch_forever(self) -> None:
        transport = self.caller.transport
        retrier = self.caller.retrier()
        request = rendezvous_pb2.WatchJobRequest(job=self.job)
        while self._running():
            address = transport.pick()
            try:
                call = services(transport.stubs(address)).rendezvous.WatchJob(
                    request, metadata=transport.metadata
                )
            except UnavailableError:  # the client was closed
                return
            self._watch_call = call
            error: RallypointError
            try:
                async for response in call:
                    retrier.answered()
                    self._observe(RoundInfo.from_proto(response.round))
                error = UnavailableError(f"{address} ended the round watch")
            except grpc.aio.AioRpcError as rpc_error:
                error = refine(map_rpc_error(rpc_error, address))
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not self._watch_restart or (task is not None and task.cancelling()):
                    raise
                error = UnavailableError("restarted: the watch was behind")
            finally:
                self._watch_call = None
                call.cancel()
            if self._watch_restart:
                self._watch_restart = False
                continue
            if self._gone(error, "round watch"):
                return
            await retrier.after_failure(address, error)


async def join(
    caller: Caller,
    job: str,
    name: str,
    *,
    config: JobConfig | None = None,
    metadata: bytes = b"",
    resume: bool = False,
    replaces: int = 0,
    domain: str = "",
    timeout_s: float | None = None,
) -> Participant:
    """Join ``job`` as ``name`` (unique in the job) and start heartbeating.

    ``config`` creates the job when absent and must equal its config when present; without
    it the job must exist. ``metadata`` (addresses, device info) is shown to every member.
    A join that starts an ended job again begins a new run, which sees the old run's
    checkpoints only with ``resume``.
    ``replaces``: a participant id of this client's session that the new participant takes
    the place of in the same round change (rendezvous.proto, ``JoinRequest.replaces``); the
    caller closes that participant's handle.
    ``domain``: the participant's failure domain, e.g. its host name ("": none); a domain's
    participants are removed and readmitted together, and the job's units kept inside one.
    """
    if not isinstance(domain, str):
        raise InvalidValueError(f"domain must be a string (e.g. the host name), got {domain!r}")
    request_config = config.to_proto() if config is not None else None
    response = await refined(
        caller.write(
            lambda s: services(s).rendezvous.Join,
            lambda header: rendezvous_pb2.JoinRequest(
                header=header,
                job=job,
                name=name,
                metadata=metadata,
                config=request_config,
                resume=resume,
                replaces=replaces,
                domain=domain,
            ),
            timeout_s,
        )
    )
    joined = JoinResult(
        response.participant_id, response.waiting, RoundInfo.from_proto(response.round)
    )
    if config is None:
        config = (await get_job(caller, job, timeout_s=timeout_s)).config
    participant = Participant(caller, name, joined, config)
    participant.start()
    return participant


def _add_progress(
    request: rendezvous_pb2.HeartbeatRequest, progress: TrainingProgress, now_s: float
) -> None:
    """The progress fields of a heartbeat: times become durations before ``now_s``."""
    request.reports_progress = True
    request.round = progress.round
    request.step = progress.step
    request.step_age_ms = int((now_s - progress.step_done_s) * 1000) if progress.step else 0
    request.step_ms = progress.step_ms
    request.collectives_entered = progress.collectives_entered
    request.waiting_in = progress.waiting_in
    if progress.waiting_in:
        request.waiting_ms = int((now_s - progress.waiting_since_s) * 1000)
    request.restore = progress.restore
