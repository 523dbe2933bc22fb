"""Joining a job and staying in it: a participant's heartbeat, its view of the rounds, leaving.

Theory of operation (rendezvous.proto). ``join`` adds a participant, tied to the client's
session, and returns a :class:`Participant` that is heartbeated until it leaves, is lost, or
the client closes. It calls the cluster through the client's :class:`Caller` (writes stamped
by the session).

- The heartbeat: every participant a client joins to one job rides the client's one
  ``HeartbeatBatch`` stream for that job (process_heartbeats.py over heartbeats.py): a
  request every ``heartbeat_interval_ms`` names them all, each with the round it believes
  current and the training progress it reported (``report_progress``). The stream goes to
  any member (the processes of a job spread over them), fails over to the next one when its
  member stops answering, and hands its participants off without their silence counting.
  The per-participant ``Heartbeat`` RPC is kept on the server for older clients only.
- Round changes: the member pushes each participant its :class:`Assignment` when its round
  moves. An assignment ahead of the view is followed by one linearizable GetJob for every
  participant of the process that is behind, so each learns the round with its members
  (the member lists are read on request, not pushed to every participant). A view is thus
  refreshed on round changes, not on every join: while a round is JOINING, ``round`` may
  not list the latest joiners.

The views feed :meth:`Participant._observe`, which keeps the newest RoundInfo by
``job_revision`` (never going back), hands each new (round, state) to ``rounds()`` iterators
and ``on_round_change`` callbacks once, and wakes ``wait_for_round``. A RoundInfo that no
longer lists the participant as a member or as waiting means the coordinator removed it
(declared failed, evicted, session ended, job closed): ``lost`` is set and stays set. So is
it when the member says the participant is ``gone`` or refuses the stream (the job is gone):
a worker that was paused past its failure detection finds out as soon as it runs again.

``leave`` sends Leave *before* the participant is released from the stream: the leader then
no longer counts it, and its silence is not taken for a death. ``close`` drops it from the
stream unannounced: its silence then counts, as a dead process's would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from rallypoint.proto.v1 import rendezvous_pb2

from .arguments import non_negative_seconds
from .caller import Caller
from .checkpoints import CheckpointRegistry
from .errors import (
    DeadlineExceededError,
    InvalidValueError,
    RallypointError,
    UnavailableError,
)
from .heartbeats import Assignment, reconnect_backoff
from .jobs import get_job, services
from .process_heartbeats import ProcessHeartbeats, shared_heartbeats
from .rendezvous_errors import (
    JobNotFoundError,
    ParticipantLostError,
    ParticipantNotFoundError,
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
)
from .roundstore import RoundStore

log = logging.getLogger("rallypoint.client.rendezvous")

# How long wait_for_round, out of time, waits for a fresh account of the round it names.
_DESCRIBE_TIMEOUT_S = 5.0

_STATE_ORDER = {RoundState.JOINING: 0, RoundState.ACTIVE: 1, RoundState.ENDED: 2}

RoundCallback = Callable[[RoundInfo], object]

__all__ = ["Participant", "join", "reconnect_backoff", "round_position"]


def round_position(round_number: int, state: RoundState) -> tuple[int, int]:
    """Orders (round, state) pairs: rounds increase, and within one JOINING < ACTIVE < ENDED."""
    return round_number, _STATE_ORDER[state]


class Participant:
    """A participant of a job; see the module docstring. Use it from the client's loop."""

    def __init__(
        self,
        caller: Caller,
        name: str,
        joined: JoinResult,
        config: JobConfig,
        heartbeats: ProcessHeartbeats | None = None,
    ) -> None:
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
        # A Join of this client names this participant in ``replaces`` (expect_replacement):
        # a view without us then means that join took our place, not that we failed.
        self.replacing = False
        # close() was called: the background work stops without leaving.
        self.closed = False
        # What the training loop last reported (report_progress); sent with every heartbeat.
        self._progress: TrainingProgress | None = None
        # The stream that heartbeats this participant (shared by the client's participants
        # of this job); None before start().
        self._heartbeats: ProcessHeartbeats | None = heartbeats
        # The latest assignment the member pushed to it; None before the first.
        self._assignment: Assignment | None = None
        # The (round, state) last handed to iterators and callbacks.
        self._delivered = (joined.round.round, joined.round.state)
        # The round number wait_for_round returned last (0: none yet).
        self._returned_round = 0
        self._subscribers: list[asyncio.Queue[RoundInfo | None]] = []
        self._callbacks: list[RoundCallback] = []
        # Set (and replaced) on every change of view, lost or left.
        self._changed = asyncio.Event()
        # start() ran: the participant is carried (until detached).
        self._started = False
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
        this participant (a peer vanished): the member that carried a dead peer's heartbeat
        stream confirms at once the failure of the round's members whose stream it saw
        close, instead of waiting out two heartbeat intervals, and the round ends sooner for
        every survivor. Each process's stream may go to another member, so the report goes
        to every member at once (a member that carried none of them confirms nothing).
        Returns the participant ids so confirmed (none: nothing was hastened; the detectors
        decide as before). A report for a round that is not the job's current ACTIVE one,
        or from a participant not in it, is refused (:class:`StaleRoundError`) and confirms
        nothing; it is raised when no member took the report."""
        request = rendezvous_pb2.ReportCollectiveFailureRequest(
            job=self.job,
            participant_id=self.participant_id,
            round=round_number,
            detail=detail[:1024],
        )

        async def report(address: str) -> list[int]:
            response = await refined(
                self.caller.ask(
                    address,
                    lambda s: services(s).rendezvous.ReportCollectiveFailure,
                    request,
                    timeout_s,
                )
            )
            return list(response.confirmed)

        answers = await asyncio.gather(
            *(report(address) for address in self.caller.transport.endpoints),
            return_exceptions=True,
        )
        taken = [answer for answer in answers if isinstance(answer, list)]
        if not taken:
            errors = [answer for answer in answers if isinstance(answer, RallypointError)]
            # A refusal (stale round) says more than a member that could not be reached.
            refusals = [
                e for e in errors if not isinstance(e, UnavailableError | DeadlineExceededError)
            ]
            for answer in answers:
                if isinstance(answer, BaseException) and not isinstance(answer, RallypointError):
                    raise answer
            raise (refusals or errors)[0]
        return sorted({pid for answer in taken for pid in answer})

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
            if info.job_closed:
                what = "the job was closed"
            elif self.replacing:
                what = "replaced by a new participant of this client"
            else:
                what = "declared failed or evicted"
            self._mark_lost(
                f"participant {self.participant_id} ({self.name}) is no longer in job "
                f"{self.job!r} as of round {info.round} ({what})",
                expected=self.replacing and not info.job_closed,
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

    def expect_replacement(self, expected: bool = True) -> None:
        """Say that a Join of this client is about to name this participant in ``replaces``
        (False: that join failed): leaving the job then is the replacement, logged as such at
        INFO, not a failure. ``lost`` is still set, as it must be."""
        self.replacing = expected

    def _mark_lost(self, reason: str, *, expected: bool = False) -> None:
        if self.lost.is_set():
            return
        log.log(logging.INFO if expected else logging.WARNING, "%s", reason)
        self.lost_reason = reason
        self.lost.set()
        self._end_iterators()
        # Carried no more: it is not a participant, so its silence says nothing. The stream's
        # closing (if it was the last) finishes on its own.
        self._detach(evidence=False)

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start heartbeating (``join`` does): on the client's shared stream for this job
        unless one was given."""
        if self._started or not self._running():
            return
        self._started = True
        if self._heartbeats is None:
            self._heartbeats = shared_heartbeats(self.caller, self.job, self.heartbeat_interval_s)
        self._heartbeats.carry(self, self.round.round, self._progress_now)

    def _detach(self, *, evidence: bool) -> asyncio.Task[None] | None:
        """Stop being heartbeated (see ProcessHeartbeats.detach); the stream's closing, if
        this was its last participant."""
        if not self._started or self._heartbeats is None:
            return None
        return self._heartbeats.detach(self.participant_id, evidence=evidence)

    async def _stop(self, *, evidence: bool) -> None:
        closing = self._detach(evidence=evidence)
        if closing is not None:
            await asyncio.shield(closing)

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
            # Released after Leave: the member is told it moved on, not that it died.
            await self._stop(evidence=False)
            self._end_iterators()

    async def close(self) -> None:
        """Stop heartbeating without leaving: the leader will count this participant failed
        (what a process that dies does). The client's close does this."""
        self.closed = True
        self._end_iterators()
        # Dropped unannounced: its silence is evidence, as a dead process's would be.
        await self._stop(evidence=True)

    async def __aenter__(self) -> Participant:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.leave()

    # -------------------------------------------------------------- heartbeat

    def _running(self) -> bool:
        return not (self.lost.is_set() or self.leaving or self.closed)

    def assigned(self, assignment: Assignment) -> None:
        """The member pushed this participant its round (process_heartbeats.py): kept, so
        ``behind`` can tell whether the view must be read."""
        self._assignment = assignment

    def behind(self) -> bool:
        """Whether the latest assignment is ahead of the view (or says the participant is
        gone while the view has it in): a read of the job should follow."""
        assignment = self._assignment
        if assignment is None or not self._running():
            return False
        if assignment.gone or assignment.state is None:
            return True
        return round_position(assignment.round, assignment.state) > round_position(
            self.round.round, self.round.state
        )

    def observe(self, info: RoundInfo) -> bool:
        """Take a view of the job's round read elsewhere (process_heartbeats.py); True if
        it was newer than the view."""
        return self._observe(info)

    def heartbeat_stopped(self, reason: str) -> None:
        """Nothing heartbeats this participant any more (process_heartbeats.py): unless it
        left or was closed, it is lost."""
        if self._running():
            self._mark_lost(
                f"participant {self.participant_id} ({self.name}) of job {self.job!r} is "
                f"gone: {reason}"
            )

    def _progress_now(self) -> TrainingProgress | None:
        return self._progress


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
