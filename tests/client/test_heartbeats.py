"""The batched heartbeat (client/heartbeats.py) against fake HeartbeatBatch members: real
grpc.aio servers on loopback that record every request and answer as the test scripts them.

Each test waits on a condition with a deadline (``eventually``), never on a bare sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

from rallypoint.client import (
    Assignment,
    Backoff,
    Client,
    HeartbeatBatcher,
    InvalidValueError,
    RoundState,
    TrainingProgress,
)
from rallypoint.proto.v1 import rendezvous_pb2, rendezvous_pb2_grpc

FAST_BACKOFF = Backoff(base_s=0.002, cap_s=0.02)
INTERVAL_S = 0.05
JOB = "job-a"


class FakeMember(rendezvous_pb2_grpc.RendezvousServicer):
    """One member serving HeartbeatBatch: records requests, answers each with its seq and
    whatever assignments the test queued; ``silent`` stops it answering (a paused member);
    ``answer_delay_s`` delays every answer; ``refuse`` ends each stream with that status."""

    def __init__(self) -> None:
        self.requests: list[rendezvous_pb2.HeartbeatBatchRequest] = []
        self.streams = 0
        self.queued: list[rendezvous_pb2.Assignment] = []
        self.silent = False
        self.answer_delay_s = 0.0
        self.refuse: tuple[grpc.StatusCode, str, str] | None = None
        # Never read the stream (a member whose loop is stuck): writes block once HTTP/2's
        # flow-control window is full.
        self.stalled = asyncio.Event()
        # Unsolicited answers to send on the stream (round changes pushed at once).
        self.pushed: asyncio.Queue[rendezvous_pb2.HeartbeatBatchResponse] = asyncio.Queue()
        self.server: grpc.aio.Server | None = None
        # Streams whose requests ended with the client's half-close (not a cancellation).
        self.half_closed = 0
        # The requests of each stream, in the order the streams opened.
        self.by_stream: list[list[rendezvous_pb2.HeartbeatBatchRequest]] = []
        self.address = ""

    async def HeartbeatBatch(
        self,
        request_iterator: AsyncIterator[rendezvous_pb2.HeartbeatBatchRequest],
        context: Any,
    ) -> AsyncIterator[rendezvous_pb2.HeartbeatBatchResponse]:
        self.streams += 1
        mine: list[rendezvous_pb2.HeartbeatBatchRequest] = []
        self.by_stream.append(mine)
        if self.stalled.is_set():
            await asyncio.Event().wait()
        if self.refuse is not None:
            code, reason, message = self.refuse
            await context.abort(code, message, (("rallypoint-error-reason", reason),))
        async for request in request_iterator:
            self.requests.append(request)
            mine.append(request)
            while not self.pushed.empty():
                yield self.pushed.get_nowait()
            if self.silent:
                continue
            if self.answer_delay_s:
                await asyncio.sleep(self.answer_delay_s)
            assignments, self.queued = self.queued, []
            yield rendezvous_pb2.HeartbeatBatchResponse(seq=request.seq, assignments=assignments)
        self.half_closed += 1

    async def start(self) -> None:
        self.server = grpc.aio.server()
        rendezvous_pb2_grpc.add_RendezvousServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)


@pytest.fixture
async def members() -> AsyncIterator[list[FakeMember]]:
    started = [FakeMember() for _ in range(3)]
    for member in started:
        await member.start()
    yield started
    for member in started:
        await member.stop()


@pytest.fixture
async def client(members: list[FakeMember]) -> AsyncIterator[Client]:
    made = Client(
        [m.address for m in members],
        backoff=FAST_BACKOFF,
        timeout_s=5.0,
        open_session_on_connect=False,
    )
    await made.connect()
    yield made
    await made.close()


async def eventually(condition: Callable[[], Any], what: str, timeout_s: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)
    return value


def after(member: FakeMember, count: int, least: int = 1) -> Callable[[], list[Any] | None]:
    """The member's requests from index ``count`` on, once there are ``least`` of them."""
    return lambda: member.requests[count:] if len(member.requests) >= count + least else None


def assignment(participant_id: int, round_number: int, **fields: Any) -> rendezvous_pb2.Assignment:
    return rendezvous_pb2.Assignment(participant_id=participant_id, round=round_number, **fields)


async def started(client: Client, ids: range, **options: Any) -> HeartbeatBatcher:
    batcher = client.heartbeat_batcher(JOB, heartbeat_interval_s=INTERVAL_S, **options)
    batcher.add_many(ids, round_number=1)
    batcher.start()
    return batcher


async def test_one_request_carries_every_participant(
    client: Client, members: list[FakeMember]
) -> None:
    batcher = await started(client, range(101, 301))
    first = (await eventually(after(members[0], 0), "a request"))[0]
    assert first.job == JOB
    assert list(first.participant_ids) == list(range(101, 301))
    assert list(first.rounds) == [1] * 200
    assert first.seq == 1
    assert first.known_index == 300
    assert abs(first.sent_ms - time.monotonic() * 1000) < 2000
    await eventually(after(members[0], 3), "more requests")
    # One stream, one request per interval, seq increasing by one.
    assert members[0].streams == 1 and members[1].streams == members[2].streams == 0
    seqs = [r.seq for r in members[0].requests]
    assert seqs == list(range(1, len(seqs) + 1))
    await batcher.close()


async def test_answers_are_matched_by_seq_and_timed(
    client: Client, members: list[FakeMember]
) -> None:
    members[0].answer_delay_s = 0.03
    batcher = await started(client, range(1, 5))
    await eventually(after(members[0], 4), "four requests")
    taken = []

    def answered() -> bool | None:
        taken.append(batcher.take_samples())
        return taken[-1].answers > 0 or None

    await eventually(answered, "answers", 5.0)
    await eventually(after(members[0], 10), "more requests")
    samples = batcher.take_samples()
    taken.append(samples)
    # A window's answers may be to requests of the window before it (in flight when it was
    # taken): only the totals since the start compare.
    assert samples.answers >= 3
    assert sum(t.requests for t in taken) >= sum(t.answers for t in taken)
    assert len(samples.answer_latency_s) == samples.answers
    # Each latency is the delay of the answer to its own request, not to another one's.
    assert all(0.025 <= latency < 1.0 for latency in samples.answer_latency_s)
    assert samples.failovers == 0
    await batcher.close()


async def test_an_assignment_is_applied_and_named_in_later_requests(
    client: Client, members: list[FakeMember]
) -> None:
    heard: list[Assignment] = []
    batcher = await started(client, range(1, 4), on_assignment=heard.append)
    await eventually(after(members[0], 0), "a request")
    members[0].queued = [
        assignment(
            2,
            5,
            state=rendezvous_pb2.ROUND_STATE_ACTIVE,
            rank=1,
            world_size=3,
            fencing_token=77,
            store_namespace=f"{JOB}/5",
        )
    ]
    found = await batcher.wait_for(2, lambda a: a.state is RoundState.ACTIVE, timeout_s=5.0)
    assert found == Assignment(2, 5, RoundState.ACTIVE, 1, 3, 77, f"{JOB}/5", False, False)
    assert heard == [found]
    assert batcher.assignment(2) == found and batcher.assignment(1) is None
    count = len(members[0].requests)
    later = (await eventually(after(members[0], count), "a later request"))[0]
    assert dict(zip(later.participant_ids, later.rounds, strict=True)) == {1: 1, 2: 5, 3: 1}
    await batcher.close()


async def test_a_pushed_round_change_is_applied_and_not_timed(
    client: Client, members: list[FakeMember]
) -> None:
    batcher = await started(client, range(1, 3))
    await eventually(after(members[0], 1), "two requests")
    batcher.take_samples()
    members[0].pushed.put_nowait(
        rendezvous_pb2.HeartbeatBatchResponse(
            seq=0, assignments=[assignment(1, 7, state=rendezvous_pb2.ROUND_STATE_JOINING)]
        )
    )
    found = await batcher.wait_for(1, lambda a: a.round == 7, timeout_s=5.0)
    assert found.state is RoundState.JOINING
    count = len(members[0].requests)
    later = (await eventually(after(members[0], count), "a later request"))[0]
    assert dict(zip(later.participant_ids, later.rounds, strict=True)) == {1: 7, 2: 1}
    samples = batcher.take_samples()
    assert samples.pushes == 1
    assert samples.answers == len(samples.answer_latency_s)
    await batcher.close()


async def test_a_round_change_is_sent_at_once_between_two_of_the_schedule(
    client: Client, members: list[FakeMember]
) -> None:
    """The member hears a participant name its new round without waiting for the next
    interval: a heartbeat naming the round a failure opened is the coordinator's word that
    its sender lived past the failure (coordinator/leader/held.py). The interval is
    far longer than the test's deadline: only a request sent at once arrives in time."""
    # The answer to the first request moves participant 1 to round 7.
    members[0].queued = [assignment(1, 7, state=rendezvous_pb2.ROUND_STATE_JOINING)]
    batcher = client.heartbeat_batcher(JOB, heartbeat_interval_s=60.0)
    batcher.add_many(range(1, 3), round_number=1)
    batcher.start()
    second = (await eventually(after(members[0], 1), "a request naming round 7"))[0]
    assert dict(zip(second.participant_ids, second.rounds, strict=True)) == {1: 7, 2: 1}
    batcher.set_round(2, 7)  # learnt elsewhere (a watch): the same
    third = (await eventually(after(members[0], 2), "a request naming it for 2"))[0]
    assert dict(zip(third.participant_ids, third.rounds, strict=True)) == {1: 7, 2: 7}
    batcher.set_round(2, 7)  # no change: nothing sent
    await asyncio.sleep(0.05)
    assert len(members[0].requests) == 3
    assert [r.seq for r in members[0].requests] == [1, 2, 3]
    await batcher.close()


async def test_a_gone_participant_is_no_longer_heartbeated(
    client: Client, members: list[FakeMember]
) -> None:
    heard: list[Assignment] = []
    batcher = await started(client, range(1, 4), on_assignment=heard.append)
    await eventually(after(members[0], 0), "a request")
    members[0].queued = [assignment(3, 1, gone=True)]
    await batcher.wait_for(3, lambda a: a.gone, timeout_s=5.0)
    assert batcher.is_gone(3) and batcher.carried == [1, 2]
    assert heard[-1].gone and heard[-1].state is None
    count = len(members[0].requests)

    def two_without_it() -> list[Any] | None:
        # A request already on its way when the answer came may still name 3; once one does
        # not, none after it may.
        later = members[0].requests[count:]
        first = next((i for i, r in enumerate(later) if 3 not in r.participant_ids), None)
        return later[first:] if first is not None and len(later) - first >= 2 else None

    later = await eventually(two_without_it, "two later requests without participant 3")
    assert all(list(r.participant_ids) == [1, 2] for r in later)
    # Gone is not released: the member already knows.
    assert all(not r.released for r in later)
    await batcher.close()


async def test_release_names_the_participant_once_and_stops_carrying_it(
    client: Client, members: list[FakeMember]
) -> None:
    batcher = await started(client, range(1, 5))
    await eventually(after(members[0], 0), "a request")
    count = len(members[0].requests)
    batcher.release(2)
    batcher.release(99)  # never carried: nothing to say
    following = await eventually(after(members[0], count, 3), "three later requests")
    released = [list(r.released) for r in following]
    assert released[0] == [2] and released[1:] == [[], []]
    assert all(2 not in r.participant_ids for r in following)
    assert batcher.carried == [1, 3, 4]
    await batcher.close()


async def test_a_dead_member_is_failed_over_to_the_next(
    client: Client, members: list[FakeMember]
) -> None:
    batcher = await started(client, range(10, 20), first_endpoint=1)
    await eventually(after(members[1], 2), "requests to the first member")
    assert members[0].streams == 0
    batcher.set_round(11, 4)
    await members[1].stop()
    # The next endpoint in rotation, with every participant and its round.
    request = (await eventually(after(members[2], 0), "a request to the next member"))[0]
    assert list(request.participant_ids) == list(range(10, 20))
    assert dict(zip(request.participant_ids, request.rounds, strict=True))[11] == 4
    assert request.seq == 1  # a new stream starts its own sequence
    await eventually(lambda: batcher.address == members[2].address, "the new stream")
    assert batcher.take_samples().failovers >= 1
    await batcher.close()


async def test_a_member_that_stops_answering_is_abandoned(
    client: Client, members: list[FakeMember]
) -> None:
    members[0].silent = True
    batcher = await started(client, range(1, 3), answer_patience_s=0.3)
    await eventually(after(members[0], 0), "a request")
    await eventually(after(members[1], 0), "a request to the next member", timeout_s=5.0)
    assert members[0].streams == 1
    await batcher.close()


async def test_a_stream_left_while_a_write_is_going_out_is_still_handed_off(
    client: Client, members: list[FakeMember], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Writes that take most of an interval (a loaded machine): the watchdog, on the sender's
    # schedule, finds a write going out nearly every time it looks. The stream used to be
    # cancelled then (a reset: the member could lose the release) instead of handed off once
    # the write was out.
    real_write = grpc.aio._call._StreamRequestMixin.write

    async def slow_write(self: Any, request: Any) -> None:
        await asyncio.sleep(INTERVAL_S * 0.8)
        await real_write(self, request)

    monkeypatch.setattr(grpc.aio._call._StreamRequestMixin, "write", slow_write)
    members[0].silent = True
    batcher = await started(client, range(1, 4), answer_patience_s=0.3)
    await eventually(lambda: members[0].half_closed, "the half-close")
    last = members[0].by_stream[0][-1]
    assert sorted(last.released) == [1, 2, 3] and not last.participant_ids
    await batcher.close()


async def test_leaving_a_silent_member_releases_everyone_there_and_half_closes(
    client: Client, members: list[FakeMember]
) -> None:
    members[0].silent = True
    batcher = await started(client, range(1, 4), answer_patience_s=0.3)
    await eventually(after(members[1], 0), "a request to the next member")
    # The last request to the silent member moves every participant away from it, and the
    # stream ends as a half-close the member reads, not a reset that could lose the release.
    await eventually(lambda: members[0].half_closed, "the half-close")
    # The first stream's requests (under load the rotation may come back here later).
    *before, last = members[0].by_stream[0]
    assert sorted(last.released) == [1, 2, 3] and not last.participant_ids
    assert all(not r.released for r in before)
    # The new stream carries them all.
    assert list(members[1].requests[0].participant_ids) == [1, 2, 3]
    await batcher.close()


async def test_progress_goes_with_every_request_as_durations(
    client: Client, members: list[FakeMember]
) -> None:
    batcher = await started(client, range(1, 4))
    done_s = time.monotonic() - 2.0
    batcher.report_progress(
        2,
        TrainingProgress(
            round=1,
            step=40,
            step_done_s=done_s,
            step_ms=120.0,
            collectives_entered=7,
            waiting_in=8,
            waiting_since_s=done_s,
            restore="disk",
        ),
    )
    count = len(members[0].requests)
    later = await eventually(after(members[0], count, 2), "two later requests")
    for request in later:
        (report,) = request.progress
        assert (report.participant_id, report.round, report.step) == (2, 1, 40)
        assert 1900 <= report.step_age_ms < 10_000 and 1900 <= report.waiting_ms < 10_000
        assert (report.step_ms, report.collectives_entered, report.waiting_in) == (120.0, 7, 8)
        assert report.restore == "disk"
    # Released, it reports no more.
    batcher.release(2)
    count = len(members[0].requests)
    later = await eventually(after(members[0], count, 2), "requests after the release")
    assert all(not r.progress for r in later)
    with pytest.raises(InvalidValueError, match="not carried"):
        batcher.report_progress(2, TrainingProgress(round=1))
    await batcher.close()


async def test_a_member_that_stops_reading_is_abandoned(
    client: Client, members: list[FakeMember]
) -> None:
    members[0].stalled.set()
    # Requests of ~250 kB: the stream's window fills after a few, and every write then blocks.
    batcher = await started(client, range(1_000_000, 1_050_000), answer_patience_s=1.0)
    request = (await eventually(after(members[1], 0), "a request to the next member"))[0]
    assert len(request.participant_ids) == 50_000
    assert members[0].streams == 1
    await batcher.close()


async def test_a_job_that_is_gone_stops_the_batcher(
    client: Client, members: list[FakeMember]
) -> None:
    for member in members:
        member.refuse = (grpc.StatusCode.NOT_FOUND, "JOB_NOT_FOUND", f"job {JOB!r} not found")
    heard: list[Assignment] = []
    batcher = await started(client, range(1, 3), on_assignment=heard.append)
    await asyncio.wait_for(batcher.stopped.wait(), 5.0)
    assert batcher.failure is not None and "not found" in str(batcher.failure)
    assert sorted(a.participant_id for a in heard if a.gone) == [1, 2]
    assert batcher.carried == []
    await batcher.close()


async def test_the_send_loop_reports_its_own_lag(client: Client, members: list[FakeMember]) -> None:
    batcher = await started(client, range(1, 3))
    await eventually(after(members[0], 1), "two requests")
    batcher.take_samples()
    # Blocks the loop on purpose, as a saturated sender's is.
    time.sleep(0.25)
    count = len(members[0].requests)
    await eventually(after(members[0], count + 1), "requests after the stall")
    assert max(batcher.take_samples().send_lag_s) >= 0.15
    await batcher.close()


async def test_arguments_are_checked(client: Client) -> None:
    checks: list[Callable[[], object]] = [
        lambda: client.heartbeat_batcher("", heartbeat_interval_s=1.0),
        lambda: client.heartbeat_batcher(JOB, heartbeat_interval_s=0),
    ]
    for check in checks:
        with pytest.raises(InvalidValueError):
            check()
    batcher = client.heartbeat_batcher(JOB, heartbeat_interval_s=1.0)
    with pytest.raises(InvalidValueError, match="positive"):
        batcher.add(0)
    with pytest.raises(InvalidValueError, match="not carried"):
        batcher.set_round(5, 1)


async def test_client_close_stops_its_batchers(client: Client, members: list[FakeMember]) -> None:
    batcher = await started(client, range(1, 3))
    await eventually(after(members[0], 0), "a request")
    await client.close()
    assert batcher.stopped.is_set()
