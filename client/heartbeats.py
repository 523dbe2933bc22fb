"""Heartbeats for many participants of one job over one stream: the batched heartbeat.

Theory of operation (rendezvous.proto, ``HeartbeatBatch``). A :class:`HeartbeatBatcher` is
what one process (or one host's relay) runs for all the participants it carries: one
bidirectional stream to one member, and every ``heartbeat_interval_s`` one request naming
every carried participant (``participant_ids``, the round each believes current in
``rounds``, parallel), so the per-message cost of gRPC, the member's intake and its detector
bookkeeping is paid once per batch, not once per participant. Every member serves the RPC
and runs the failure detectors of the participants connected to it, so streams are spread
over the members and the leader's load stays Raft and proposals.

- Requests carry ``seq`` (one more per request on the stream) and ``sent_ms``, the sender's
  monotonic clock. The member answers each request with its ``seq``; the time from sending
  to that answer is the answer latency, kept per request. A member may also push an answer
  of its own, ``seq`` 0, when a round changes: it is applied like any other, and not timed.
- An answer holds an :class:`Assignment` only for participants whose round changed (or that
  the stream has not been told of yet) and for those that are ``gone``. An assignment becomes
  the participant's view and the round it names in later requests; ``on_assignment`` hears
  each one, and :meth:`HeartbeatBatcher.wait_for` waits for one. A ``gone`` participant is
  carried no more: the coordinator has removed it, and heartbeating it would be a zombie.
- A participant's round changing (an assignment, or ``set_round``) sends a request at once,
  between two of the schedule (which stays where it was): a heartbeat naming the round a
  failure opened is the coordinator's proof that its sender lived past that failure, and
  the hold for the failed member's host-mates ends on it (coordinator/leader/held.py).
- ``known_index`` is the highest participant id (the raft index of a join) the batcher knows,
  so a member that has not yet applied a join waits for it instead of calling the
  participant unknown.
- ``release`` stops carrying a participant and names it in the next request's ``released``:
  its silence on this stream is then not evidence of failure. ``drop`` stops carrying it
  unannounced: its silence counts, as a dead process's would (a participant closed without
  leaving).
- ``report_progress`` attaches a participant's training progress (the elastic loop's
  :class:`TrainingProgress`) to every request from then on, as ``ProgressReport`` entries
  with times turned into durations at the moment of sending; the members forward it to the
  leader, which judges hangs and stragglers. ``follow_progress`` reads it instead from a
  callable at every request, so a training thread reports by swapping a reference.
- The shipped client's participants (``client.join``) ride one batcher per client and job:
  see process_heartbeats.py.
- Failover. A stream that fails (an error, the end of the stream, or no answer to a request
  within ``answer_patience_s``) is abandoned, and the batcher reconnects to the NEXT endpoint
  in rotation (every member serves the RPC: another one is as good, and the one that failed
  may be dead) after a full-jitter backoff capped at two heartbeat intervals, so that the
  participants reach a new member well within the grace period a member gives participants
  that move to it. The participants continue on the new stream unchanged; its ``seq``
  starts over.
- Hand-off. A member that stopped answering may only be slow (its loop behind), and a stream
  it sees end counts as evidence against the participants it carried. So a stream left for
  want of answers is not cancelled when that can be avoided: its last request names every
  participant in ``released`` (they move: their silence there is not evidence), the stream is
  half-closed, and its answers are drained (and ignored) in the background for up to
  ``HANDOFF_DRAIN_S`` before it is cancelled. Cancelling would reset the stream, and the
  member could lose the unread release. A write still going out when the stream is left is
  waited for (up to the hand-off's bound, the larger of the interval and 1 s); a stream whose
  write is blocked that long (flow control: the member stopped reading) cannot hand off and
  is cancelled.
- Lag. The send loop keeps a fixed schedule (a drift would read as lateness to the detector)
  and records how late it woke for each interval: ``send_lag_s``. A sender whose own loop is
  behind sends late heartbeats, and its owner must be able to tell that from a slow cluster
  (the member guards against the converse from ``sent_ms``).

Errors: a stream refused with NOT_FOUND (the job is gone) ends the batcher and marks every
participant gone; UNAVAILABLE, DEADLINE_EXCEEDED and INTERNAL (a stream broken mid-flight)
are transport failures and fail over; any other refusal (INVALID_ARGUMENT: a request this
code should never have built) stops the batcher with ``failure`` set, rather than guess.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc
import grpc.aio

from rallypoint.proto.v1 import rendezvous_pb2

from .arguments import positive_seconds
from .backoff import Backoff
from .caller import Caller
from .errors import (
    DeadlineExceededError,
    InternalError,
    InvalidValueError,
    NotFoundError,
    RallypointError,
    UnavailableError,
    map_rpc_error,
)
from .jobs import services
from .rendezvous_errors import refine
from .rendezvous_values import RoundState, TrainingProgress, round_state
from .tasks import cancel_and_wait
from .transport import Retrier

log = logging.getLogger("rallypoint.client.heartbeats")

# A member answers every request; one that leaves a request unanswered this many intervals
# (and at least MIN_ANSWER_PATIENCE_S) is taken as a member that stopped serving. The leader
# declares participants failed when their member has been silent for 1.5 s and no other
# member took them within max(2 s, 5 intervals) (coordinator/liveness/coverage.py): they must
# have moved by then, check interval and reconnect backoff included.
ANSWER_PATIENCE_BEATS = 3
MIN_ANSWER_PATIENCE_S = 2.0
# How long a stream handed off (see the module docstring) is drained before it is cancelled.
HANDOFF_DRAIN_S = 30.0
# How many of the latest latency and lag samples are kept between take_samples() calls.
SAMPLES_KEPT = 4096

AssignmentCallback = Callable[["Assignment"], object]
ResponseObserver = Callable[[rendezvous_pb2.HeartbeatBatchResponse, float], object]
# A participant's latest progress, read at every request (see follow_progress).
ProgressSource = Callable[[], TrainingProgress | None]


def reconnect_backoff(heartbeat_interval_s: float, backoff: Backoff) -> Backoff:
    """The heartbeat's reconnect backoff: the client's, capped at two heartbeat intervals."""
    cap_s = max(min(backoff.cap_s, 2 * heartbeat_interval_s), min(backoff.base_s, 0.001))
    return Backoff(base_s=min(backoff.base_s, cap_s), cap_s=cap_s)


@dataclass(frozen=True, slots=True)
class Assignment:
    """What one participant needs of its round, pushed to it alone (rendezvous.proto,
    ``Assignment``). ``state`` is None only for a ``gone`` participant (no round is its)."""

    participant_id: int
    round: int
    state: RoundState | None
    # -1 while JOINING or waiting.
    rank: int
    # 0 while JOINING.
    world_size: int
    fencing_token: int
    store_namespace: str
    waiting: bool
    gone: bool

    @staticmethod
    def from_proto(message: rendezvous_pb2.Assignment) -> Assignment:
        unspecified = message.state == rendezvous_pb2.ROUND_STATE_UNSPECIFIED
        return Assignment(
            participant_id=message.participant_id,
            round=message.round,
            state=None if unspecified else round_state(message.state),
            rank=message.rank,
            world_size=message.world_size,
            fencing_token=message.fencing_token,
            store_namespace=message.store_namespace,
            waiting=message.waiting,
            gone=message.gone,
        )


@dataclass(frozen=True, slots=True)
class HeartbeatSamples:
    """What the batcher measured since the previous :meth:`HeartbeatBatcher.take_samples`."""

    # Send to answer, per answered request, in seconds.
    answer_latency_s: list[float]
    # How late the send loop woke for each interval, in seconds.
    send_lag_s: list[float]
    requests: int
    answers: int
    # Unsolicited answers (seq 0): round changes the member pushed at once.
    pushes: int
    # Streams abandoned (failures that led to a reconnect).
    failovers: int


class HeartbeatBatcher:
    """Carries many participants of ``job`` on one HeartbeatBatch stream; see the module
    docstring. Use it from one event loop. ``first_endpoint`` picks the member (an index into
    the endpoints, taken modulo their number) the first stream goes to: a process that runs
    several batchers spreads them over the members with it."""

    def __init__(
        self,
        caller: Caller,
        job: str,
        *,
        heartbeat_interval_s: float,
        first_endpoint: int = 0,
        answer_patience_s: float | None = None,
        on_assignment: AssignmentCallback | None = None,
        on_response: ResponseObserver | None = None,
    ) -> None:
        if not job:
            raise InvalidValueError("a heartbeat batcher needs a job id")
        self.caller = caller
        self.job = job
        self.heartbeat_interval_s = positive_seconds(heartbeat_interval_s, "heartbeat_interval_s")
        self.answer_patience_s = (
            positive_seconds(answer_patience_s, "answer_patience_s")
            if answer_patience_s is not None
            else max(MIN_ANSWER_PATIENCE_S, ANSWER_PATIENCE_BEATS * self.heartbeat_interval_s)
        )
        self._on_assignment = on_assignment
        # Hears every answer with its latency (benchmarks count bytes with it).
        self._on_response = on_response
        # Carried participants -> the round each names. Invariant: a participant is in at
        # most one of _rounds and _gone.
        self._rounds: dict[int, int] = {}
        # The request's parallel lists, rebuilt from _rounds when _dirty.
        self._ids: list[int] = []
        self._round_list: list[int] = []
        self._dirty = False
        self._released: list[int] = []
        # What the participants that report progress reported last (carried ones only).
        self._progress: dict[int, TrainingProgress] = {}
        # Where the participants that follow_progress read theirs (carried ones only).
        self._progress_sources: dict[int, ProgressSource] = {}
        self._known_index = 0
        # The latest assignment of each participant (gone ones included).
        self._assignments: dict[int, Assignment] = {}
        self._gone: set[int] = set()
        # Set, and replaced, whenever an answer brought assignments or the batcher stopped.
        self._changed = asyncio.Event()
        self._rotation = first_endpoint
        # The member the current stream goes to ("" between streams).
        self.address = ""
        # Why the batcher stopped on its own (the job is gone, an unexpected refusal).
        self.failure: RallypointError | None = None
        self.stopped = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Streams handed off, draining (see the module docstring).
        self._draining: set[asyncio.Task[None]] = set()
        # Clear while the current stream's sender is inside call.write (cancelling it would
        # cancel the call; the hand-off waits for it), and the seq of its latest request.
        self._between_writes = asyncio.Event()
        self._between_writes.set()
        self._seq = 0
        # The sender's wait for its next request, and whether a round change is owed a
        # request at once (``_beat_now``).
        self._pause: asyncio.Future[bool] | None = None
        self._beat_owed = False
        self._latencies_s: collections.deque[float] = collections.deque(maxlen=SAMPLES_KEPT)
        self._lags_s: collections.deque[float] = collections.deque(maxlen=SAMPLES_KEPT)
        self._requests = 0
        self._answers = 0
        self._pushes = 0
        self._failovers = 0

    def __repr__(self) -> str:
        return (
            f"HeartbeatBatcher(job={self.job!r}, carried={len(self._rounds)}, "
            f"address={self.address or '-'})"
        )

    # -------------------------------------------------------------- participants

    @property
    def carried(self) -> list[int]:
        """The participants heartbeated now, in the order they were added."""
        return list(self._rounds)

    def add(self, participant_id: int, round_number: int = 0) -> None:
        """Carry ``participant_id`` from the next request on, naming ``round_number`` (0:
        none yet) until an assignment says otherwise."""
        if participant_id <= 0:
            raise InvalidValueError(f"participant_id must be positive, got {participant_id}")
        self._gone.discard(participant_id)
        self._rounds[participant_id] = round_number
        self._known_index = max(self._known_index, participant_id)
        self._dirty = True

    def add_many(self, participant_ids: Iterable[int], round_number: int = 0) -> None:
        for participant_id in participant_ids:
            self.add(participant_id, round_number)

    def release(self, participant_id: int) -> None:
        """Stop carrying ``participant_id`` and tell the member so (its silence is then not
        evidence). Releasing one that is not carried does nothing."""
        if self._rounds.pop(participant_id, None) is not None:
            self._released.append(participant_id)
            self._forget_progress(participant_id)
            self._dirty = True

    def drop(self, participant_id: int) -> None:
        """Stop carrying ``participant_id`` WITHOUT telling the member: its silence from the
        next request on is evidence against it, as a dead process's would be (a participant
        closed without leaving). Dropping one that is not carried does nothing."""
        if self._rounds.pop(participant_id, None) is not None:
            self._forget_progress(participant_id)
            self._dirty = True

    def _forget_progress(self, participant_id: int) -> None:
        self._progress.pop(participant_id, None)
        self._progress_sources.pop(participant_id, None)

    def set_round(self, participant_id: int, round_number: int) -> None:
        """The round ``participant_id`` believes current (learnt elsewhere, e.g. a watch)."""
        if participant_id not in self._rounds:
            raise InvalidValueError(f"participant {participant_id} is not carried")
        if self._rounds[participant_id] != round_number:
            self._rounds[participant_id] = round_number
            self._dirty = True
            self._beat_now()

    def _beat_now(self) -> None:
        """A carried participant's round changed: the sender sends a request now, between
        two of its schedule, so the member hears the new round at once (a heartbeat naming
        a round a failure opened is word of life after that failure: the coordinator's
        hold for the failed member's host-mates ends on it)."""
        if self._pause is not None and not self._pause.done():
            self._pause.set_result(True)
        else:
            self._beat_owed = True

    def report_progress(self, participant_id: int, progress: TrainingProgress) -> None:
        """Send ``progress`` with every heartbeat of ``participant_id`` from now on (see the
        module docstring); it replaces what the participant reported before."""
        if participant_id not in self._rounds:
            raise InvalidValueError(f"participant {participant_id} is not carried")
        self._progress[participant_id] = progress

    def follow_progress(self, participant_id: int, source: ProgressSource) -> None:
        """Read ``participant_id``'s progress from ``source()`` at every request (None: it
        reported none yet) instead of :meth:`report_progress`: a training thread then only
        swaps the reference ``source`` returns, with no hop to this loop. ``source`` must be
        cheap and must not block."""
        if participant_id not in self._rounds:
            raise InvalidValueError(f"participant {participant_id} is not carried")
        self._progress_sources[participant_id] = source

    def note_known_index(self, index: int) -> None:
        """A join revision the caller knows of (e.g. JoinBatch's participant ids)."""
        self._known_index = max(self._known_index, index)

    def assignment(self, participant_id: int) -> Assignment | None:
        """The latest assignment pushed to ``participant_id``; None before the first."""
        return self._assignments.get(participant_id)

    def is_gone(self, participant_id: int) -> bool:
        return participant_id in self._gone

    async def wait_for(
        self,
        participant_id: int,
        predicate: Callable[[Assignment], bool],
        timeout_s: float,
    ) -> Assignment:
        """The first assignment of ``participant_id`` (its latest included) for which
        ``predicate`` holds. Raises DeadlineExceededError after ``timeout_s``, and
        UnavailableError once the batcher stopped."""
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    found = self._assignments.get(participant_id)
                    if found is not None and predicate(found):
                        return found
                    if self.stopped.is_set():
                        raise UnavailableError(
                            f"the heartbeat batcher of job {self.job!r} stopped: {self.failure}"
                        )
                    await self._changed.wait()
        except TimeoutError:
            raise DeadlineExceededError(
                f"job {self.job!r}: no matching assignment for participant {participant_id} "
                f"within {timeout_s:g} s (latest: {self._assignments.get(participant_id)})"
            ) from None

    # -------------------------------------------------------------- measurements

    def take_samples(self) -> HeartbeatSamples:
        """Answer latencies, send lag and counts since the previous call."""
        samples = HeartbeatSamples(
            answer_latency_s=list(self._latencies_s),
            send_lag_s=list(self._lags_s),
            requests=self._requests,
            answers=self._answers,
            pushes=self._pushes,
            failovers=self._failovers,
        )
        self._latencies_s.clear()
        self._lags_s.clear()
        self._requests = self._answers = self._pushes = self._failovers = 0
        return samples

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self._task is None and not self.stopped.is_set():
            self._task = asyncio.create_task(self._run(), name=f"heartbeat batch {self.job}")

    async def close(self) -> None:
        """Stop heartbeating (the participants carried count as silent from now on: release
        them first for a clean departure)."""
        task, self._task = self._task, None
        try:
            await cancel_and_wait(task, *self._draining)
        finally:
            self._stop(None)

    async def __aenter__(self) -> HeartbeatBatcher:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _stop(self, failure: RallypointError | None) -> None:
        if failure is not None and self.failure is None:
            self.failure = failure
        self.stopped.set()
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _next_address(self) -> str:
        endpoints = self.caller.transport.endpoints
        address = endpoints[self._rotation % len(endpoints)]
        self._rotation += 1
        return address

    async def _run(self) -> None:
        transport = self.caller.transport
        retrier = self.caller.retrier(
            reconnect_backoff(self.heartbeat_interval_s, transport.backoff)
        )
        while not self.stopped.is_set():
            address = self._next_address()
            self.address = address
            error = await self._stream(address, retrier)
            self.address = ""
            if self._ends(error):
                return
            self._failovers += 1
            log.debug("heartbeat batch stream to %s ended: %s; failing over", address, error)
            # The Retrier's backoff, without its leader-following: every member serves
            # HeartbeatBatch, so the next one in rotation is tried.
            await asyncio.sleep(retrier.delay_s(address, error))

    def _ends(self, error: RallypointError) -> bool:
        """Whether ``error`` ends the batcher (marking every participant gone when the job
        is)."""
        if isinstance(error, NotFoundError):
            for participant_id in list(self._rounds):
                self._apply(
                    Assignment(participant_id, 0, None, -1, 0, 0, "", waiting=False, gone=True)
                )
            self._stop(error)
            return True
        if isinstance(error, UnavailableError | DeadlineExceededError | InternalError):
            return False
        self._stop(error)
        return True

    async def _stream(self, address: str, retrier: Retrier) -> RallypointError:
        """Heartbeat over one stream to ``address`` until it fails; the failure."""
        transport = self.caller.transport
        try:
            call = services(transport.stubs(address)).rendezvous.HeartbeatBatch(
                None, metadata=transport.metadata
            )
        except UnavailableError as closed:  # the client was closed
            self._stop(closed)
            return closed
        # seq -> monotonic send time of the requests not answered yet, oldest first.
        owed: dict[int, float] = {}
        # Set once the stream is handed off: the reader then ignores what it reads.
        handed_off = asyncio.Event()
        self._between_writes.set()
        self._seq = 0
        sender = asyncio.create_task(self._send(call, owed), name="heartbeat batch send")
        reader = asyncio.create_task(
            self._read(call, address, owed, retrier, handed_off), name="heartbeat batch read"
        )
        # Apart from the sender: a write to a member that stopped reading blocks once the
        # stream's flow-control window is full, and the stream must still be abandoned.
        watchdog = asyncio.create_task(self._watch(address, owed), name="heartbeat batch watch")
        tasks = [sender, reader, watchdog]
        drained = False
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            failure = next(iter(done)).result()
            if watchdog in done and await self._write_finished():
                handed_off.set()
                drained = await self._hand_off(call, sender)
            return failure
        finally:
            try:
                await cancel_and_wait(*([sender, watchdog] if drained else tasks))
            except BaseException:
                if drained:
                    reader.cancel()
                call.cancel()
                raise
            if drained:
                draining = asyncio.create_task(self._drain(call, reader), name="heartbeat drain")
                self._draining.add(draining)
                draining.add_done_callback(self._draining.discard)
            else:
                call.cancel()

    @property
    def _hand_off_bound_s(self) -> float:
        """How long a hand-off waits for a write (the one in flight, the release, the
        half-close) before it gives up and cancels the stream."""
        return max(self.heartbeat_interval_s, 1.0)

    async def _write_finished(self) -> bool:
        """Whether the sender is between writes, waiting up to the hand-off's bound for a
        write in flight to finish. The watchdog and the sender keep the same schedule, so the
        watchdog often fires while a write is still going out (under load, for a while);
        cancelling the call then reset a stream that could have been handed off, and the
        member saw the participants' silence as evidence. A write that does not finish in
        time is blocked (the member stopped reading: flow control): no hand-off."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._hand_off_bound_s
        while not self._between_writes.is_set():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):
                    await self._between_writes.wait()
            except TimeoutError:
                return False
        return True

    async def _hand_off(
        self,
        call: grpc.aio.StreamStreamCall[
            rendezvous_pb2.HeartbeatBatchRequest, rendezvous_pb2.HeartbeatBatchResponse
        ],
        sender: asyncio.Task[RallypointError],
    ) -> bool:
        """Release every carried participant on ``call`` and half-close it; whether that
        was written (else the call is cancelled: a write cut short cancels it)."""
        # The sender sleeps between writes (it is not writing): cancelling it leaves the call.
        await cancel_and_wait(sender)
        request = rendezvous_pb2.HeartbeatBatchRequest(
            job=self.job,
            seq=self._seq + 1,
            sent_ms=int(time.monotonic() * 1000),
            released=[*self._rounds, *self._released],
            known_index=self._known_index,
        )
        bound_s = self._hand_off_bound_s
        try:
            async with asyncio.timeout(bound_s):
                await call.write(request)
            async with asyncio.timeout(bound_s):
                await call.done_writing()
        except (TimeoutError, grpc.aio.AioRpcError, asyncio.InvalidStateError):
            return False
        return True

    async def _drain(
        self,
        call: grpc.aio.StreamStreamCall[
            rendezvous_pb2.HeartbeatBatchRequest, rendezvous_pb2.HeartbeatBatchResponse
        ],
        reader: asyncio.Task[RallypointError],
    ) -> None:
        """Let a handed-off stream end on the member's side, then drop it."""
        try:
            async with asyncio.timeout(HANDOFF_DRAIN_S):
                await asyncio.shield(reader)
        except TimeoutError:
            pass
        finally:
            reader.cancel()
            call.cancel()

    def _request(self, seq: int) -> rendezvous_pb2.HeartbeatBatchRequest:
        if self._dirty:
            self._ids = list(self._rounds)
            self._round_list = list(self._rounds.values())
            self._dirty = False
        released, self._released = self._released, []
        now_s = time.monotonic()
        progress = [
            progress_report(participant_id, reported, now_s)
            for participant_id, reported in self._progress.items()
        ]
        for participant_id, source in self._progress_sources.items():
            followed = source()
            if followed is not None:
                progress.append(progress_report(participant_id, followed, now_s))
        return rendezvous_pb2.HeartbeatBatchRequest(
            job=self.job,
            participant_ids=self._ids,
            rounds=self._round_list,
            seq=seq,
            sent_ms=int(now_s * 1000),
            released=released,
            known_index=self._known_index,
            progress=progress,
        )

    async def _send(
        self,
        call: grpc.aio.StreamStreamCall[
            rendezvous_pb2.HeartbeatBatchRequest, rendezvous_pb2.HeartbeatBatchResponse
        ],
        owed: dict[int, float],
    ) -> RallypointError:
        loop = asyncio.get_running_loop()
        interval_s = self.heartbeat_interval_s
        next_at = loop.time()
        seq = 0
        woken = False
        while True:
            if self._rounds or self._released:
                seq += 1
                self._seq = seq
                request = self._request(seq)
                owed[seq] = time.monotonic()
                self._between_writes.clear()
                try:
                    await call.write(request)
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    # The stream ended; the reader reports why. Keep the schedule meanwhile.
                    pass
                else:
                    self._requests += 1
                finally:
                    self._between_writes.set()
            # A fixed schedule, not sleep(interval) after each write: the detector learns the
            # intervals, and drift would read as lateness. A request sent at once for a
            # round change leaves the schedule where it was.
            if not woken:
                next_at = max(next_at + interval_s, loop.time())
            woken = await self._sleep_until(loop, next_at)
            if not woken:
                self._lags_s.append(max(0.0, loop.time() - next_at))

    async def _sleep_until(self, loop: asyncio.AbstractEventLoop, at: float) -> bool:
        """Wait until loop time ``at``; True if a round change (``_beat_now``) ended the
        wait first."""
        if self._beat_owed:
            self._beat_owed = False
            return True
        waiter: asyncio.Future[bool] = loop.create_future()
        timer = loop.call_later(max(0.0, at - loop.time()), _resolve, waiter)
        self._pause = waiter
        try:
            return await waiter
        finally:
            timer.cancel()
            self._pause = None

    async def _watch(self, address: str, owed: dict[int, float]) -> RallypointError:
        """Returns once the oldest unanswered request is older than the patience (checked
        once an interval: one look at the oldest entry)."""
        while True:
            oldest_s = next(iter(owed.values()), None)
            if oldest_s is not None and time.monotonic() - oldest_s > self.answer_patience_s:
                return UnavailableError(
                    f"{address} left a heartbeat batch unanswered for {self.answer_patience_s:g} s"
                )
            await asyncio.sleep(self.heartbeat_interval_s)

    async def _read(
        self,
        call: grpc.aio.StreamStreamCall[
            rendezvous_pb2.HeartbeatBatchRequest, rendezvous_pb2.HeartbeatBatchResponse
        ],
        address: str,
        owed: dict[int, float],
        retrier: Retrier,
        handed_off: asyncio.Event,
    ) -> RallypointError:
        try:
            while True:
                response = await call.read()
                if not isinstance(response, rendezvous_pb2.HeartbeatBatchResponse):  # EOF
                    return UnavailableError(f"{address} ended the heartbeat batch stream")
                if handed_off.is_set():
                    continue  # the participants moved: a late answer here is stale
                # seq 0 is a push (a round change sent at once), not an answer; a seq this
                # stream does not owe (answered already) is not timed either.
                sent_s = owed.pop(response.seq, None) if response.seq else None
                latency_s = time.monotonic() - sent_s if sent_s is not None else math.nan
                if sent_s is not None:
                    self._latencies_s.append(latency_s)
                    self._answers += 1
                    # Requests older than the one answered were answered before it, or never
                    # will be: either way they no longer count against the member's patience.
                    for seq in [s for s in owed if s < response.seq]:
                        del owed[seq]
                elif not response.seq:
                    self._pushes += 1
                # Not transport.note_success: a follower serves this stream too, and the
                # client's unary calls should keep going to the member that leads.
                retrier.answered()
                if self._on_response is not None:
                    self._on_response(response, latency_s)
                if response.assignments:
                    for message in response.assignments:
                        self._apply(Assignment.from_proto(message))
                    self._wake()
        except grpc.aio.AioRpcError as rpc_error:
            return refine(map_rpc_error(rpc_error, address))

    def _apply(self, assignment: Assignment) -> None:
        participant_id = assignment.participant_id
        if participant_id in self._gone:
            return
        if assignment.gone:
            self._gone.add(participant_id)
            self._forget_progress(participant_id)
            if self._rounds.pop(participant_id, None) is not None:
                self._dirty = True
        elif participant_id in self._rounds:
            if self._rounds[participant_id] != assignment.round:
                self._rounds[participant_id] = assignment.round
                self._dirty = True
                self._beat_now()
        else:
            # Released (or never carried): its answer arrived late, nothing to apply.
            return
        self._assignments[participant_id] = assignment
        if self._on_assignment is not None:
            self._on_assignment(assignment)


def _resolve(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


def progress_report(
    participant_id: int, progress: TrainingProgress, now_s: float
) -> rendezvous_pb2.ProgressReport:
    """One participant's progress on a batch request: times become durations before
    ``now_s`` (as on the per-participant Heartbeat)."""
    return rendezvous_pb2.ProgressReport(
        participant_id=participant_id,
        round=progress.round,
        step=progress.step,
        step_age_ms=int((now_s - progress.step_done_s) * 1000) if progress.step else 0,
        step_ms=progress.step_ms,
        collectives_entered=progress.collectives_entered,
        waiting_in=progress.waiting_in,
        waiting_ms=int((now_s - progress.waiting_since_s) * 1000) if progress.waiting_in else 0,
        restore=progress.restore,
    )
