"""Failure detection spread over the members: a member's own detectors and guards, the report
it sends the leader, and the leader's coverage (moved participants, the backstop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgpack
import pytest

from rallypoint.coordinator.liveness import report as report_module
from rallypoint.coordinator.liveness.coverage import (
    MEMBER_SILENT_MS,
    Coverage,
    orphan_ms,
)
from rallypoint.coordinator.liveness.local import (
    INTAKE_LAG_GUARD_MS,
    MemberDetection,
    StreamClock,
)
from rallypoint.coordinator.liveness.phi import DetectorSettings
from rallypoint.coordinator.liveness.progress import ProgressReport
from rallypoint.coordinator.liveness.report import (
    BadReport,
    LivenessReport,
    Suspicion,
    decode,
    encode,
)
from rallypoint.coordinator.metrics import NodeMetrics

from .job_replica import JobReplica

SETTINGS = DetectorSettings(100, 8.0, 100, 50, 0)


class StreamedDetection(MemberDetection):
    """A member's detection with each key on a per-participant stream of its own, fed as
    ``service/heartbeats.py`` feeds it (a group of one per participant)."""

    def __init__(
        self, metrics: NodeMetrics | None = None, round_of: Callable[[str], int] | None = None
    ) -> None:
        super().__init__(metrics, round_of=round_of)
        self.streams: dict[tuple[str, int], int] = {}

    def carry(self, key: tuple[str, int], settings: DetectorSettings, now_ms: int) -> None:
        group = self.streams[key] = self.open_group(settings, now_ms, readings=True)
        self.group_update(group, {key}, now_ms)

    def heartbeat(self, key: tuple[str, int], now_ms: int) -> None:
        self.group_beat(self.streams[key], now_ms)

    def uncarry(self, key: tuple[str, int], now_ms: int, *, closed: bool) -> None:
        self.close_group(self.streams.pop(key), now_ms, closed=closed)


def beat(
    detection: StreamedDetection, keys: list[tuple[str, int]], start_ms: int, count: int
) -> int:
    """``count`` regular heartbeats of ``keys`` from ``start_ms``; the time after them."""
    now = start_ms
    for _ in range(count):
        now += 100
        for key in keys:
            detection.heartbeat(key, now)
    return now


# ------------------------------------------------------------------------ the report


def test_a_report_round_trips_and_groups_participants_by_job() -> None:
    progress = ProgressReport(3, 10, 5, 12.5, 7, 0, 0, "disk")
    report = LivenessReport(
        full=True,
        attach=[("a", 1), ("a", 2), ("b", 9)],
        detach=[("b", 4)],
        suspicions=[Suspicion("a", 3, "phi", "phi 9.1 crossed the threshold 8", 950)],
        progress=[(("a", 1), progress)],
        intake_lag_ms=12,
        boot=77,
        seq=5,
        heard=[(("a", 1), 40)],
        named=[(("a", 1), 3)],
    )
    payload = encode(report)
    assert msgpack.unpackb(payload)["attach"] == {"a": [1, 2], "b": [9]}
    assert decode(payload) == report


def test_a_report_without_named_rounds_leaves_the_key_out() -> None:
    """``named`` is new: sent only when any, so a report to a member that predates it
    (which ignores unknown keys) is unchanged, and one from such a member reads as none."""
    payload = encode(LivenessReport(heard=[(("a", 1), 40)]))
    assert "named" not in msgpack.unpackb(payload)
    assert decode(payload).named == []


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ({"v": 2}, "version 2 is not 1"),
        ({"v": 1, "attach": [1, 2]}, "attach must map job ids"),
        ({"v": 1, "attach": {"j": [0]}}, "participant id must be an integer >= 1"),
        ({"v": 1, "suspect": [["j", 1, "guess", "", 0]]}, "unknown suspicion kind"),
        ({"v": 1, "suspect": [["j", 1]]}, "a suspicion must be"),
        ({"v": 1, "progress": [["j", 1, 1]]}, "a progress entry has 10 fields"),
        ({"v": 1, "lag": -1}, "lag must be an integer"),
        ({"v": 1, "heard": [["j", 1]]}, "a heard entry must be"),
        ({"v": 1, "named": [["j", 1, -1]]}, "named round must be an integer"),
        ({"v": 1, "named": {"j": 1}}, "named must be a list"),
    ],
)
def test_a_report_that_cannot_be_read_is_refused_with_why(body: dict, complaint: str) -> None:
    with pytest.raises(BadReport, match=complaint):
        decode(msgpack.packb(body))


def test_garbage_and_oversized_reports_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(BadReport, match="not msgpack"):
        decode(b"\xc1\xc1")
    monkeypatch.setattr(report_module, "MAX_ENTRIES", 3)
    with pytest.raises(BadReport, match="more than 3 participants"):
        decode(msgpack.packb({"v": 1, "attach": {"j": [1, 2, 3, 4]}}))


# ------------------------------------------------------------------------ a member


def test_a_member_reports_what_it_starts_and_stops_carrying() -> None:
    detection = StreamedDetection()
    detection.carry(("j", 1), SETTINGS, 0)
    detection.carry(("j", 2), SETTINGS, 0)
    first = detection.take_report([])
    assert first.full and first.attach == [("j", 1), ("j", 2)]
    detection.carry(("j", 3), SETTINGS, 10)
    detection.uncarry(("j", 2), 10, closed=False)  # released: no evidence, forgotten
    second = detection.take_report([])
    assert not second.full
    assert second.attach == [("j", 3)] and second.detach == [("j", 2)]
    assert not detection.carries(("j", 2))
    # A key attached and released between two reports is never mentioned.
    detection.carry(("j", 4), SETTINGS, 20)
    detection.uncarry(("j", 4), 20, closed=False)
    third = detection.take_report([])
    assert third.attach == [] and third.detach == []
    detection.report_lost()
    assert detection.take_report([]).full


def test_a_closed_stream_is_suspected_and_then_left_to_the_leader() -> None:
    detection = StreamedDetection()
    keys = [("j", 1), ("j", 2)]
    for key in keys:
        detection.carry(key, SETTINGS, 0)
    now = beat(detection, keys, 0, 10)
    detection.uncarry(("j", 1), now, closed=True)
    assert detection.suspects(now + 100) == []
    (suspicion,) = detection.suspects(now + 200)
    assert (suspicion.key, suspicion.kind) == (("j", 1), "stream_closed")
    assert suspicion.silent_ms == 200
    # Nobody carries it here any more: forgotten once reported (the leader decides).
    assert not detection.carries(("j", 1))


def test_a_closed_stream_that_comes_back_in_time_is_not_suspected() -> None:
    detection = StreamedDetection()
    detection.carry(("j", 1), SETTINGS, 0)
    now = beat(detection, [("j", 1)], 0, 10)
    detection.uncarry(("j", 1), now, closed=True)
    detection.carry(("j", 1), SETTINGS, now + 50)  # a new stream, here
    detection.heartbeat(("j", 1), now + 50)
    assert detection.suspects(now + 300) == []


def test_a_peers_failed_collective_confirms_a_closed_stream_at_once() -> None:
    detection = StreamedDetection()
    keys = [("j", 1), ("j", 2), ("j", 3)]
    for key in keys:
        detection.carry(key, SETTINGS, 0)
    now = beat(detection, keys, 0, 10)
    detection.uncarry(("j", 3), now, closed=True)
    # Participant 1 reports; 2's stream is open (alive as far as this member knows).
    confirmed = detection.collective_failed("j", 1, [2, 3], "rank 0 reported it", now + 5)
    assert confirmed == [3]
    (suspicion,) = detection.suspects(now + 5)  # not two intervals later
    assert (suspicion.key, suspicion.kind) == (("j", 3), "stream_closed")
    assert suspicion.cause == "heartbeat stream closed, confirmed at once: rank 0 reported it"


def test_a_failed_collective_alone_confirms_nobody() -> None:
    detection = StreamedDetection()
    keys = [("j", 1), ("j", 2)]
    for key in keys:
        detection.carry(key, SETTINGS, 0)
    now = beat(detection, keys, 0, 10)
    assert detection.collective_failed("j", 1, [2], "rank 0 reported it", now) == []
    assert detection.collective_failed("j", 1, [7], "not carried here", now) == []
    assert detection.suspects(now + 50) == []


def test_a_stream_closing_just_after_a_report_is_confirmed_as_it_closes() -> None:
    rounds = {"j": 1}
    detection = StreamedDetection(round_of=rounds.__getitem__)
    keys = [("j", 1), ("j", 2), ("j", 3), ("j", 4), ("j", 5)]
    for key in keys:
        detection.carry(key, SETTINGS, 0)
    now = beat(detection, keys, 0, 10)
    # The survivor's gloo error won the race with the dead peer's stream end.
    assert detection.collective_failed("j", 1, [2, 3, 4, 5], "rank 0 reported it", now) == []
    detection.uncarry(("j", 3), now + 10, closed=True)
    (suspicion,) = detection.suspects(now + 10)
    assert suspicion.key == ("j", 3) and "rank 0 reported it" in suspicion.cause
    # While the round the first verdict opened is current (held for the host), a peer's
    # stream that closes then is confirmed as it closes too: left to its own window, each
    # such host-mate's removal would push the held round's close two intervals on.
    rounds["j"] = 2
    detection.uncarry(("j", 5), now + 15, closed=True)
    (suspicion,) = detection.suspects(now + 15)
    assert suspicion.key == ("j", 5) and "rank 0 reported it" in suspicion.cause
    # Once the round changed again, the held report counts for nothing: the next close
    # waits out its own window.
    rounds["j"] = 3
    detection.uncarry(("j", 4), now + 20, closed=True)
    assert detection.suspects(now + 20) == []
    # So does a stream that closes after the report's window.
    rounds["j"] = 1
    detection.collective_failed("j", 1, [2], "rank 0 reported it", now + 30)
    late = now + 30 + SETTINGS.confirm_closed_ms
    detection.uncarry(("j", 2), late, closed=True)
    assert [s.key for s in detection.suspects(late)] == [("j", 4)]  # 4's own window is over


def test_a_member_whose_intake_lags_suspects_nobody() -> None:
    detection = StreamedDetection()
    keys = [("j", i) for i in range(1, 5)]
    for key in keys:
        detection.carry(key, SETTINGS, 0)
    clock = StreamClock()
    now = 0
    for _ in range(10):  # requests arrive promptly: the baseline
        now += 100
        detection.request_lag(clock, now, now - 2)
        for key in keys:
            detection.heartbeat(key, now)
    # Then this member falls behind: requests sent long ago arrive now, and one worker's
    # last heartbeat was read late; phi alone would suspect it.
    lag = INTAKE_LAG_GUARD_MS * 4
    for _ in range(INTAKE_LAG_GUARD_MS):
        detection.request_lag(clock, now + 1500, now + 1500 - lag)
    assert detection.intake.current_ms() == lag - 2  # measured against the baseline
    for key in keys[1:]:
        detection.heartbeat(key, now + 1500)
    assert detection.suspects(now + 1500) == []
    # Once it has caught up (requests arrive promptly again) and the hold has passed, a
    # worker that really is silent is suspected.
    for _ in range(64):
        detection.request_lag(clock, now + 3000, now + 3000 - 2)
    for key in keys[1:]:
        detection.heartbeat(key, now + 3000)
    assert [s.key for s in detection.suspects(now + 3000)] == [("j", 1)]


def test_phi_against_most_of_what_a_member_carries_waits_before_it_is_believed() -> None:
    detection = StreamedDetection(NodeMetrics(1))
    keys = [("j", i) for i in range(1, 5)]
    for key in keys:
        detection.carry(key, SETTINGS, 0)
    now = beat(detection, keys, 0, 10)
    now = beat(detection, keys[:1], now + 2000, 1)
    assert detection.suspects(now) == []
    later = beat(detection, keys[:1], now, 60)
    assert {s.key for s in detection.suspects(later)} == set(keys[1:])


def test_a_young_detector_is_not_judged_by_phi_on_two_samples() -> None:
    """The first heartbeats after a join or a move are often late (the worker is busy
    joining): a detector with little history waits startup_ms before phi counts."""
    detection = StreamedDetection()
    detection.carry(("j", 1), SETTINGS, 0)
    detection.heartbeat(("j", 1), 100)
    detection.heartbeat(("j", 1), 200)
    # 1 s of silence would cross phi 8 for a detector with a long regular history.
    assert detection.suspects(1_200) == []
    assert [s.key for s in detection.suspects(SETTINGS.startup_ms + 10)] == [("j", 1)]


# ------------------------------------------------------------------------ the leader


def _report(**fields: object) -> LivenessReport:
    return LivenessReport(**fields)  # type: ignore[arg-type]


def test_a_suspicion_of_a_participant_another_member_carries_is_set_aside() -> None:
    replica = JobReplica()
    pids = replica.workers(3)
    coverage = Coverage(member_id=1)
    coverage.reset(0, grace_ms=0)
    coverage.take(2, _report(full=True, attach=[("j", p) for p in pids]), replica.sm, 0)
    # Participant 0 moved to member 3 (its stream to member 2 broke).
    coverage.take(3, _report(full=True, attach=[("j", pids[0])]), replica.sm, 100)
    closed = Suspicion("j", pids[0], "stream_closed", "heartbeat stream closed", 200)
    assert coverage.take(2, _report(suspicions=[closed]), replica.sm, 300) == []
    # Member 2's suspicion of one it still carries stands.
    phi = Suspicion("j", pids[1], "phi", "phi 9.0 crossed the threshold 8", 1000)
    (verdict,) = coverage.take(2, _report(suspicions=[phi]), replica.sm, 300)
    assert (verdict.participant_id, verdict.cause) == (pids[1], phi.cause)
    # Proposed again each second until the state no longer has it.
    assert coverage.step(replica.sm, 1_299) == []
    assert [v.participant_id for v in coverage.step(replica.sm, 1_300)] == [pids[1]]


def test_participants_of_a_silent_member_that_reach_no_other_are_declared_failed() -> None:
    replica = JobReplica()
    pids = replica.workers(4)
    keys = [("j", p) for p in pids]
    coverage = Coverage(member_id=1)
    coverage.reset(0, grace_ms=0)
    coverage.take(1, _report(full=True, attach=keys[:2]), replica.sm, 0)
    coverage.take(2, _report(full=True, attach=keys[2:]), replica.sm, 0)
    assert coverage.step(replica.sm, 100) == []
    # Member 2 dies: no report for MEMBER_SILENT_MS. One of its participants reconnects
    # to member 1 in time; the other never does.
    coverage.take(1, _report(attach=[keys[2]]), replica.sm, 500)
    silent_at = MEMBER_SILENT_MS
    assert coverage.step(replica.sm, silent_at) == []
    deadline = silent_at + orphan_ms(SETTINGS)
    coverage.member_reported(1, deadline - 1)
    assert coverage.step(replica.sm, deadline - 1) == []
    coverage.member_reported(1, deadline)
    (verdict,) = coverage.step(replica.sm, deadline)
    assert verdict.participant_id == pids[3] and verdict.kind == "unheard"
    assert "member 2 went silent" in verdict.cause


def test_a_participant_that_never_heartbeats_after_joining_is_declared_failed() -> None:
    replica = JobReplica()
    pids = replica.workers(2)
    coverage = Coverage(member_id=1, report_every_ms=250)
    coverage.reset(0, grace_ms=2_000)
    coverage.take(1, _report(full=True, attach=[("j", pids[0])]), replica.sm, 0)
    # Counted from the end of the leader's grace: startup_ms and two report periods.
    due = 2_000 + SETTINGS.startup_ms + 2 * 250
    assert coverage.step(replica.sm, 10) == []
    assert coverage.step(replica.sm, due - 1) == []
    (verdict,) = coverage.step(replica.sm, due)
    assert verdict.participant_id == pids[1]
    assert "never heartbeated" in verdict.cause


def test_a_replayed_report_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from rallypoint.coordinator.leader.supervisor import RendezvousSupervisor

    replica = JobReplica()
    replica.workers(2)

    async def propose(command: object) -> None:
        return None

    sup = RendezvousSupervisor(replica.sm, propose, lambda: 0, grace_ms=0, member_id=1)
    sup.is_leader = True
    payload = encode(_report(full=True, boot=5, seq=1))
    assert sup.take_report(2, payload)
    with pytest.raises(BadReport, match="already taken"):
        sup.take_report(2, payload)
    assert sup.take_report(2, encode(_report(boot=5, seq=2)))
    # A restarted member (another process) starts its count again.
    assert sup.take_report(2, encode(_report(boot=6, seq=1)))
    # Not the leader: nothing taken, nothing refused.
    sup.is_leader = False
    assert not sup.take_report(2, encode(_report(boot=6, seq=2)))


async def test_a_member_whose_reports_no_leader_takes_stops_serving_heartbeats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rallypoint.coordinator.leader import supervisor as supervisor_module

    now = [1_000_000]
    monkeypatch.setattr(supervisor_module, "monotonic_ms", lambda: now[0])
    replica = JobReplica()
    replica.workers(1)
    sent: list[int] = []
    answer = [True]

    async def send(leader: int, payload: bytes) -> bool:
        sent.append(leader)
        return answer[0]

    async def propose(command: object) -> None:
        return None

    sup = supervisor_module.RendezvousSupervisor(
        replica.sm, propose, lambda: 0, member_id=2, leader_id=lambda: 1, send_report=send
    )
    assert sup.serves_heartbeats()  # a new member gets a start's worth
    sup.step()
    await asyncio.sleep(0)
    assert sent == [1] and sup.serves_heartbeats()
    # The leader stops taking its reports (a partition): after UNREPORTED_MS it stops serving.
    answer[0] = False
    for _ in range(supervisor_module.UNREPORTED_MS // 100 + 2):
        now[0] += 100
        sup.step()
        await asyncio.sleep(0)
    assert not sup.serves_heartbeats()
    answer[0] = True
    now[0] += 300
    sup.step()
    await asyncio.sleep(0)
    assert sup.serves_heartbeats()


# ------------------------------------------------------------------------ batch streams


def test_a_batch_stream_beats_for_all_its_participants_with_one_detector() -> None:
    detection = MemberDetection()
    gid = detection.open_group(SETTINGS, 0)
    keys = [("j", i) for i in range(1, 1001)]
    detection.group_update(gid, set(keys), 0)
    assert detection.take_report([]).attach == keys  # carried, and the leader hears so
    now = 0
    for _ in range(10):
        now += 100
        detection.group_beat(gid, now)
    # One detector behind them all: the detector set holds the group, not 1000 entries.
    assert len(detection.detectors) == 1
    assert detection.phi(keys[0], now + 50) == detection.phi(keys[-1], now + 50) < 1
    assert detection.suspects(now + 100) == []


def test_a_participant_the_stream_stops_naming_goes_on_alone_and_is_suspected() -> None:
    detection = MemberDetection()
    gid = detection.open_group(SETTINGS, 0)
    keys = [("j", i) for i in range(1, 5)]
    detection.group_update(gid, set(keys), 0)
    now = 0
    for _ in range(10):
        now += 100
        detection.group_beat(gid, now)
    # The relay stops naming participant 4 (its process died) without releasing it.
    detection.group_update(gid, set(keys[:3]), now)
    for _ in range(20):
        now += 100
        detection.group_beat(gid, now)
    suspected = detection.suspects(now)
    assert [s.key for s in suspected] == [("j", 4)] and suspected[0].kind == "phi"
    assert suspected[0].silent_ms == 2000  # from its last request, not from the change


def test_a_released_participant_is_let_go_and_a_broken_stream_is_evidence_for_the_rest() -> None:
    detection = MemberDetection()
    gid = detection.open_group(SETTINGS, 0)
    keys = [("j", i) for i in range(1, 4)]
    detection.group_update(gid, set(keys), 0)
    detection.take_report([])
    now = 0
    for _ in range(10):
        now += 100
        detection.group_beat(gid, now)
    detection.group_release(gid, ("j", 1))
    assert detection.take_report([]).detach == [("j", 1)]
    detection.close_group(gid, now, closed=True)
    assert detection.suspects(now + 100) == []
    closed = detection.suspects(now + 200)
    assert [(s.key, s.kind) for s in closed] == [(k, "stream_closed") for k in keys[1:]]


def test_a_participant_that_moves_to_another_stream_of_the_member_is_not_suspected() -> None:
    detection = MemberDetection()
    first, second = detection.open_group(SETTINGS, 0), detection.open_group(SETTINGS, 0)
    detection.group_update(first, {("j", 1), ("j", 2)}, 0)
    detection.group_update(second, {("j", 3)}, 0)
    now = 0
    for _ in range(10):
        now += 100
        detection.group_beat(first, now)
        detection.group_beat(second, now)
    detection.group_update(second, {("j", 2), ("j", 3)}, now)  # 2 arrives on the second
    detection.group_update(first, {("j", 1)}, now)  # and is no longer named on the first
    for _ in range(20):
        now += 100
        detection.group_beat(first, now)
        detection.group_beat(second, now)
    assert detection.suspects(now) == []


def test_the_leader_shows_the_phi_of_workers_whose_streams_other_members_serve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rallypoint.coordinator.leader import supervisor as supervisor_module

    now = [1_000_000]
    monkeypatch.setattr(supervisor_module, "monotonic_ms", lambda: now[0])
    replica = JobReplica()
    (pid,) = replica.workers(1)

    async def propose(command: object) -> None:
        return None

    sup = supervisor_module.RendezvousSupervisor(
        replica.sm, propose, lambda: 0, grace_ms=0, member_id=1
    )
    sup.promote()
    report = _report(
        full=True, attach=[("j", pid)], boot=3, seq=1, readings=[(("j", pid), 2_500, 40)]
    )
    assert sup.take_report(2, encode(report))
    assert sup.phi("j", pid) == 2.5
    now[0] += 100
    assert sup.heartbeat_age_ms("j", pid) == 140
    # Stale after two report periods: no reading rather than an old one.
    now[0] += 1_000
    assert sup.phi("j", pid) is None


def test_only_groups_of_one_by_one_streams_report_readings() -> None:
    """A per-participant stream's group (``readings=True``) gives the leader its member's
    phi and heartbeat age, as a per-participant detector did; a batch stream's does not."""
    detection = MemberDetection()
    single = detection.open_group(SETTINGS, 0, readings=True)
    detection.group_update(single, {("j", 1)}, 0)
    batch = detection.open_group(SETTINGS, 0)
    detection.group_update(batch, {("j", 2), ("j", 3)}, 0)
    for now in (100, 200):
        detection.group_beat(single, now)
        detection.group_beat(batch, now)
    ((key, _, age_ms),) = detection.readings(250)
    assert (key, age_ms) == (("j", 1), 50)


def test_a_report_says_whom_of_a_held_job_an_open_stream_carries_and_how_recently() -> None:
    """``heard``: only the held jobs' participants, and only on a stream still open (a
    closed stream's last heartbeat may have been sent before its process died)."""
    detection = MemberDetection()
    batch = detection.open_group(SETTINGS, 0)
    detection.group_update(batch, {("j", 1), ("j", 2), ("k", 3)}, 0)
    closing = detection.open_group(SETTINGS, 0)
    detection.group_update(closing, {("j", 4)}, 0)
    for now in (100, 200):
        detection.group_beat(batch, now)
        detection.group_beat(closing, now)
    detection.close_group(closing, 210, closed=True)
    report = detection.take_report([], 250, frozenset({"j"}))
    assert report.heard == [(("j", 1), 50), (("j", 2), 50)]
    assert detection.take_report([], 260).heard == []


def test_a_report_says_the_highest_round_an_open_streams_heartbeats_named() -> None:
    """``named``: as ``heard``, the held jobs' participants on a stream still open, with
    the highest round their heartbeats named; a newer round named is news (it goes at once
    while a round is held)."""
    detection = MemberDetection()
    batch = detection.open_group(SETTINGS, 0)
    detection.group_update(batch, {("j", 1), ("j", 2), ("k", 3)}, 0)
    closing = detection.open_group(SETTINGS, 0)
    detection.group_update(closing, {("j", 4)}, 0)
    detection.rounds_named("j", [(1, 7), (2, 6), (4, 7)])
    detection.rounds_named("k", [(3, 7)])
    detection.rounds_named("j", [(1, 6)])  # an older round named again: the highest stays
    assert detection.named_news
    detection.close_group(closing, 210, closed=True)
    report = detection.take_report([], 250, frozenset({"j"}))
    assert report.named == [(("j", 1), 7), (("j", 2), 6)]
    assert not detection.named_news
    detection.rounds_named("j", [(1, 7)])
    assert not detection.named_news
    detection.rounds_named("j", [(2, 7)])
    assert detection.named_news
    assert detection.take_report([], 260).named == []


def test_a_closed_stream_reopened_here_in_time_is_counted_and_keeps_its_history() -> None:
    metrics = NodeMetrics(1)
    detection = StreamedDetection(metrics)
    detection.carry(("j", 1), SETTINGS, 0)
    now = beat(detection, [("j", 1)], 0, 10)
    detection.uncarry(("j", 1), now, closed=True)
    detection.carry(("j", 1), SETTINGS, now + 50)  # the worker's new stream, to this member
    assert detection.detectors.streams_reopened == 1
    # The new group goes on from the participant's history (ten regular heartbeats), not
    # from a young detector: 1.5 s of silence is suspected by phi at once.
    group = detection.streams[("j", 1)]
    assert detection.detectors.last_heartbeat_ms(("\x00group", group)) == now
    assert [s.key for s in detection.suspects(now + 1_500)] == [("j", 1)]


def test_progress_held_for_the_next_report_is_aged_by_the_time_it_waited() -> None:
    # A follower forwards progress once a report period: the leader dates each report by its
    # receipt, so what the follower held must have aged meanwhile, or its ranks would look
    # a period behind those the leader carries itself (a healthy rank "two steps behind").
    detection = StreamedDetection()
    stepping = ProgressReport(3, 10, 5, 12.5, 7, 0, 0)
    waiting = ProgressReport(3, 10, 40, 12.5, 8, 8, 20)
    fresh = ProgressReport(3, 0, 0, 0.0, 0, 0, 0)
    detection.progress(("j", 1), stepping, 1_000)
    detection.progress(("j", 2), waiting, 1_100)
    detection.progress(("j", 3), fresh, 1_000)
    report = dict(detection.take_report([], 1_250).progress)
    assert report[("j", 1)].step_age_ms == 5 + 250
    assert report[("j", 1)].waiting_ms == 0
    assert (report[("j", 2)].step_age_ms, report[("j", 2)].waiting_ms) == (40 + 150, 20 + 150)
    # No step yet: no age to grow.
    assert report[("j", 3)] == fresh


def test_a_new_step_is_news_for_the_leader_at_once_and_the_same_step_again_is_not() -> None:
    # The supervisor reports news within ATTACH_REPORT_MS instead of the report period: a
    # rank carried by a follower must not look steps behind the ranks the leader carries.
    detection = StreamedDetection()
    detection.take_report([])
    assert not detection.has_news()
    detection.progress(("j", 1), ProgressReport(3, 10, 5, 12.5, 7, 0, 0), 1_000)
    assert detection.has_news()
    detection.take_report([], 1_050)
    detection.progress(("j", 1), ProgressReport(3, 10, 105, 12.5, 7, 0, 0), 1_100)
    assert not detection.has_news()  # the same step, older: the period will do
    detection.progress(("j", 1), ProgressReport(3, 10, 5, 12.5, 8, 8, 3), 1_150)
    assert detection.has_news()  # now waiting in a collective
    detection.take_report([], 1_200)
    detection.progress(("j", 1), ProgressReport(3, 11, 5, 12.5, 8, 0, 0), 1_250)
    assert detection.has_news()


def test_a_closed_stream_is_news_for_the_leader_at_once() -> None:
    # The leader confirms a closed stream at once when a peer's failed collective was
    # reported to it (supervisor.py, ``_corroborate``): the reading saying so must not wait
    # for the report period. A stream released, not closed, is news as a detach already.
    detection = StreamedDetection()
    detection.carry(("j", 1), SETTINGS, 1_000)
    detection.carry(("j", 2), SETTINGS, 1_000)
    detection.take_report([], 1_000)
    assert not detection.has_news()
    detection.uncarry(("j", 1), 1_050, closed=True)
    assert detection.has_news()
    report = detection.take_report([], 1_060)
    assert report.closed == [("j", 1)]
    assert not detection.has_news()
    # Listed in every report until heard again (or confirmed), and it goes over the wire.
    assert report_module.decode(report_module.encode(report)).closed == [("j", 1)]
    detection.carry(("j", 1), SETTINGS, 1_080)
    assert detection.take_report([], 1_090).closed == []
