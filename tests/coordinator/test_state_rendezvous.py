"""Rendezvous rules: closing, ending, carrying survivors, stable ranks, the wait list and
scale-up, failures (stale ones ignored), sessions, config changes, history, snapshots."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from rallypoint.coordinator.state.commands import (
    CloseJob,
    CloseRound,
    Configure,
    Evict,
    Join,
    Leave,
    MemberFailed,
    SessionClose,
    SessionKeepAlive,
)
from rallypoint.coordinator.state.errors import (
    ConfigConflict,
    InvalidCommand,
    JobClosed,
    JobNotFound,
    LimitExceeded,
    NameTaken,
    ParticipantNotFound,
)
from rallypoint.coordinator.state.jobs import (
    EndReason,
    JobConfig,
    RendezvousLimits,
    RoundState,
    assign_ranks,
)
from rallypoint.coordinator.state.machine import Limits, StateMachine
from rallypoint.coordinator.state.results import (
    CloseJobResult,
    CloseRoundResult,
    ConfigureResult,
    JoinResult,
    RemoveResult,
)

from .job_replica import CONFIG, JobReplica


def test_a_round_closes_when_the_last_call_is_over_and_the_leader_says_so() -> None:
    r = JobReplica()
    first = r.join(r.open(), "w0")
    assert first == JoinResult("j", first.participant_id, 1, False)
    assert r.sm.rendezvous.reason("j", r.time_ms) == (
        "1 of min 2 joined; last call not started; waiting for max 4 or the last call; "
        "joining for 0.0 s of the 600 s join timeout"
    )
    r.time_ms = 1_200
    r.join(r.open(), "w1")
    assert r.job().round.min_reached_ms == 1_200
    r.time_ms = 1_400
    assert str(r.sm.rendezvous.reason("j", r.time_ms)).startswith(
        "2 of min 2 joined; last call ends in 0.8 s (at leader time 2200 ms)"
    )
    assert r.sm.rendezvous.closes_due(r.time_ms) == []
    # A close proposed early (a leader whose clock ran ahead) changes nothing.
    assert r.close_round() == CloseRoundResult("j", 1, False)
    assert r.job().round.state is RoundState.JOINING
    r.time_ms = 2_200
    assert r.sm.rendezvous.closes_due(r.time_ms) == [("j", 1)]
    assert r.close_round() == CloseRoundResult("j", 1, True)
    active = r.job().round
    assert (active.state, active.fencing_token, active.closed_ms) == (
        RoundState.ACTIVE, r.index, 2_200,
    )  # fmt: skip
    assert [seat.rank for seat in active.members] == [0, 1]  # join order
    assert r.sm.rendezvous.reason("j", 5_000) == (
        f"active since leader time 2200 ms with 2 members (fencing token {r.index})"
    )
    assert r.close_round() == CloseRoundResult("j", 1, False)  # repeated: no-op


def test_max_nodes_close_at_once_and_late_joiners_wait_without_scale_up() -> None:
    r = JobReplica()
    r.workers(4)
    assert r.job().round.state is RoundState.ACTIVE
    late = r.join(r.open(), "late")
    assert late.waiting and late.round == 1
    assert r.job().waiting == [late.participant_id]
    assert str(r.sm.rendezvous.reason("j", r.time_ms)).endswith("; 1 waiting for the next round")
    # The next natural round change takes the waiter in.
    first = r.job().round.members[0].participant_id
    assert r.fail(first) == RemoveResult("j", first, True, 1)
    second = r.job().round
    assert second.number == 2 and second.state is RoundState.ACTIVE
    assert late.participant_id in second.member_ids and r.job().waiting == []


def test_scale_up_ends_a_round_below_max_for_a_waiter() -> None:
    config = replace(CONFIG, last_call_ms=0, scale_up=True)
    r = JobReplica()
    a, b = r.workers(2, config)
    assert r.job().round.state is RoundState.ACTIVE  # min reached, no last call
    joined = r.join(r.open(), "w2", config)
    assert not joined.waiting and joined.round == 2
    record = r.job().history[-1]
    assert (record.number, record.end_reason) == (1, EndReason.SCALE_UP)
    assert r.ranks() == {a: 0, b: 1, joined.participant_id: 2}
    assert r.job().round.state is RoundState.ACTIVE


def test_a_full_round_does_not_end_for_a_scale_up() -> None:
    config = replace(CONFIG, scale_up=True)
    r = JobReplica()
    r.workers(4, config)
    assert r.join(r.open(), "w4", config).waiting
    assert r.job().round.number == 1


def test_a_failure_ends_the_round_and_survivors_keep_their_ranks() -> None:
    r = JobReplica()
    pids = r.workers(4)
    before = r.ranks()
    token = r.job().round.fencing_token
    r.time_ms = 5_000
    assert r.fail(pids[1], cause="phi 12.0") == RemoveResult("j", pids[1], True, 1)
    record = r.job().history[-1]
    assert (record.end_reason, record.ended_by, record.detail) == (
        EndReason.MEMBER_FAILED, pids[1], "phi 12.0",
    )  # fmt: skip
    assert (record.fencing_token, record.ended_ms) == (token, 5_000)
    assert [m.rank for m in record.members] == [0, 1, 2, 3]
    # Survivors are carried over: 3 >= min 2, the last call runs from the opening.
    second = r.job().round
    assert (second.number, second.state, second.min_reached_ms) == (2, RoundState.JOINING, 5_000)
    r.time_ms = 6_000
    assert r.close_round() == CloseRoundResult("j", 2, True)
    ranks = r.ranks()
    assert ranks[pids[0]] == before[pids[0]] == 0
    assert ranks[pids[2]] == before[pids[2]] == 2
    assert ranks[pids[3]] == 1  # rank 3 no longer fits a world of 3: fills the gap
    assert r.job().round.fencing_token > token


def test_stale_failure_proposals_change_nothing() -> None:
    r = JobReplica()
    pids = r.workers(4)
    r.fail(pids[0])
    revision = r.job().revision
    # Same participant again, and another one named with the round that already ended.
    assert r.fail(pids[0]) == RemoveResult("j", pids[0], False, 0)
    assert r.apply(MemberFailed("j", pids[1], 1, "late")) == RemoveResult("j", pids[1], False, 0)
    assert r.apply(MemberFailed("nope", 1, 1, "x")) == RemoveResult("nope", 1, False, 0)
    assert r.apply(CloseRound("nope", 1)) == CloseRoundResult("nope", 1, False)
    assert r.job().revision == revision


def test_a_failure_in_a_joining_round_removes_the_member_and_stops_the_last_call() -> None:
    r = JobReplica()
    a, b = r.workers(2)
    assert r.job().round.min_reached_ms is not None
    assert r.fail(b) == RemoveResult("j", b, True, 0)
    assert r.job().round.member_ids == [a] and r.job().round.min_reached_ms is None
    assert r.job().round.number == 1


def test_leave_evict_and_their_failures() -> None:
    r = JobReplica()
    s = r.open()
    pids = r.workers(4)
    assert r.do(s, Leave("j", pids[0])) == RemoveResult("j", pids[0], True, 1)
    assert r.job().history[-1].end_reason is EndReason.MEMBER_LEFT
    r.time_ms += 1_000
    r.close_round()
    assert r.do(s, Evict("j", pids[1])) == RemoveResult("j", pids[1], True, 2)
    assert r.job().history[-1].end_reason is EndReason.MEMBER_EVICTED
    assert r.do(s, Leave("j", pids[0])) == ParticipantNotFound("j", pids[0])
    assert r.do(s, Evict("other", 1)) == JobNotFound("other")
    assert isinstance(r.do(s, Leave("bad job!", 1)), InvalidCommand)


def test_a_waiter_leaving_changes_no_round() -> None:
    r = JobReplica()
    r.workers(4)
    s = r.open()
    late = r.join(s, "late")
    assert r.do(s, Leave("j", late.participant_id)) == RemoveResult(
        "j", late.participant_id, True, 0
    )
    assert r.job().waiting == [] and r.job().round.number == 1


def test_an_ended_session_removes_its_participants_as_failed() -> None:
    r = JobReplica()
    pids = r.workers(3)
    r.time_ms += 1_000
    r.close_round()
    short = r.open(ttl_ms=500)
    mine = r.join(short, "short-lived").participant_id
    assert r.job().waiting == [mine]
    keeper = r.open()
    r.time_ms += 1_000
    r.do(keeper, SessionKeepAlive())  # the short session expires at this entry
    assert mine not in r.job().participants and r.job().round.number == 1
    closer = r.open()
    r.join(closer, "closer")
    r.apply(SessionClose(), closer)
    assert "closer" not in r.job().names
    assert r.job().round.number == 1 and sorted(r.job().participants) == pids


def test_names_are_unique_per_job_and_a_session_gets_its_own_participant_back() -> None:
    r = JobReplica()
    s, other = r.open(), r.open()
    first = r.join(s, "host:1:0")
    assert r.join(s, "host:1:0") == first
    assert r.do(other, Join("j", "host:1:0", b"", CONFIG)) == NameTaken(
        "j", "host:1:0", first.participant_id
    )
    assert r.join(other, "host:1:0", job="k").participant_id != first.participant_id


def test_joins_must_agree_with_the_jobs_config_and_configure_changes_it() -> None:
    r = JobReplica()
    s = r.open()
    assert r.do(s, Join("j", "w", b"", None)) == JobNotFound("j")
    r.join(s, "w0")
    conflict = r.do(s, Join("j", "w1", b"", replace(CONFIG, max_nodes=8)))
    assert conflict == ConfigConflict("j", "max_nodes 8 != 4")
    assert r.join(s, "w1", config=None).participant_id  # no config: accepted
    bad = r.do(s, Configure("j", replace(CONFIG, min_nodes=0)))
    assert isinstance(bad, InvalidCommand) and "min_nodes" in bad.message
    shrink = r.do(s, Configure("j", replace(CONFIG, max_nodes=1, min_nodes=1)))
    assert isinstance(shrink, ConfigConflict) and "below the round's 2 members" in shrink.message
    # Lowering the last call to 0 closes the JOINING round at once.
    assert r.do(s, Configure("j", replace(CONFIG, last_call_ms=0))) == ConfigureResult("j", False)
    assert r.job().round.state is RoundState.ACTIVE
    assert r.do(s, Configure("new", CONFIG)) == ConfigureResult("new", True)


def test_closing_a_job_and_reopening_it() -> None:
    r = JobReplica()
    s = r.open()
    r.workers(4)
    late = r.join(s, "late")
    assert r.do(s, CloseJob("j")) == CloseJobResult("j", 1)
    job = r.job()
    assert job.closed and job.participants == {} and job.waiting == [] and job.store is None
    assert job.round.state is RoundState.ENDED
    assert job.history[-1].end_reason is EndReason.JOB_CLOSED
    assert r.do(s, CloseJob("j")) == CloseJobResult("j", 0)
    assert r.do(s, Join("j", "w", b"", CONFIG)) == JobClosed("j")
    assert r.fail(late.participant_id) == RemoveResult("j", late.participant_id, False, 0)
    assert r.sm.rendezvous.reason("j", r.time_ms) == f"job closed at leader time {r.time_ms} ms"
    assert r.do(s, Configure("j", CONFIG)) == ConfigureResult("j", True)
    assert (r.job().round.number, r.job().round.state) == (2, RoundState.JOINING)
    assert r.join(s, "again").round == 2


def test_history_is_bounded_and_revisions_tell_watchers_of_changes() -> None:
    limits = Limits(rendezvous=RendezvousLimits(max_round_history=3))
    r = JobReplica(limits)
    config = replace(CONFIG, last_call_ms=0)
    r.workers(1, config)
    for n in range(6):
        revision = r.job().revision
        assert r.sm.rendezvous.job_changed_since("j", revision) is False
        r.join(r.open(), f"x{n}", config)
        assert r.sm.rendezvous.job_changed_since("j", revision) is True
        r.fail(r.job().round.member_ids[-1])
    assert [record.number for record in r.job().history] == [4, 5, 6]
    assert r.sm.rendezvous.revision == r.job().revision
    assert r.sm.rendezvous.job_changed_since("missing", 0) is None


def test_limits_on_waiters_metadata_and_jobs() -> None:
    limits = Limits(rendezvous=RendezvousLimits(max_jobs=2, max_waiting=1, max_metadata_bytes=4))
    r = JobReplica(limits)
    s = r.open()
    assert r.do(s, Join("j", "w", b"12345", CONFIG)) == LimitExceeded(
        "participant metadata bytes", 4
    )
    r.workers(4)
    r.join(s, "late")
    assert r.do(s, Join("j", "later", b"", CONFIG)) == LimitExceeded(
        "waiting participants per job", 1
    )
    assert r.do(s, Configure("k", CONFIG)) == ConfigureResult("k", True)
    assert r.do(s, Configure("m", CONFIG)) == LimitExceeded("jobs", 2)
    r.do(s, CloseJob("k"))
    assert r.do(s, Configure("m", CONFIG)) == ConfigureResult("m", True)  # "k" made room
    assert sorted(r.sm.rendezvous.jobs) == ["j", "m"]


def test_participant_keys_list_every_participant_for_the_detector() -> None:
    r = JobReplica()
    pids = r.workers(2, job="b")
    waiting = r.workers(1, job="a")
    assert r.sm.rendezvous.participant_keys() == [("a", waiting[0]), ("b", pids[0]), ("b", pids[1])]


def test_snapshot_restores_byte_identical_with_jobs_stores_and_checkpoints() -> None:
    r = JobReplica()
    r.workers(4, replace(CONFIG, scale_up=True))
    r.join(r.open(), "late", replace(CONFIG, scale_up=True))
    r.workers(1, job="other")
    image = r.sm.snapshot()
    restored = StateMachine()
    restored.restore(image)
    assert restored.snapshot() == image
    assert restored.rendezvous.jobs["j"].names == r.job().names


@given(
    previous=st.dictionaries(st.integers(1, 60), st.integers(0, 40), max_size=30),
    newcomers=st.sets(st.integers(61, 120), max_size=20),
    data=st.data(),
)
def test_ranks_move_least_and_form_a_permutation(
    previous: dict[int, int], newcomers: set[int], data: st.DataObject
) -> None:
    # Previous ranks are a permutation of range(len(previous)); some survivors stay.
    order = sorted(previous)
    old_ranks = dict(zip(order, data.draw(st.permutations(range(len(order)))), strict=True))
    survivors = data.draw(st.sets(st.sampled_from(order))) if order else set()
    members = sorted(survivors | newcomers)
    ranks = assign_ranks(old_ranks, members)
    world_size = len(members)
    assert sorted(ranks.values()) == list(range(world_size))
    assert set(ranks) == set(members)
    for pid in survivors:
        if old_ranks[pid] < world_size:
            assert ranks[pid] == old_ranks[pid]
    # Displaced survivors get the lowest free ranks before any newcomer.
    displaced = [ranks[p] for p in survivors if old_ranks[p] >= world_size]
    fresh = [ranks[p] for p in newcomers]
    assert not displaced or not fresh or max(displaced) < min(fresh)
    assert [ranks[p] for p in sorted(newcomers)] == sorted(fresh)


def test_job_configs_are_validated() -> None:
    limits = RendezvousLimits(max_nodes=8)
    assert JobConfig(1, 1).problem(limits) is None
    problem = JobConfig(3, 2, last_call_ms=-1, phi_window=1).problem(limits)
    assert problem == (
        "need 1 <= min_nodes <= max_nodes; last_call_ms must be >= 0; phi_window must be >= 2"
    )
    assert JobConfig(1, 9).problem(limits) == "max_nodes above 8"


def test_a_join_replacing_a_member_of_an_active_round_is_one_round_change() -> None:
    """A torchrun agent restarting its workers joins under a new name in its old
    participant's place. With scale-up on and room below max_nodes, joining and then leaving
    ended two rounds (the new name scaled the job up; the old name's leave ended the round
    that held both); replacing ends one, and the new participant keeps the old rank."""
    config = replace(CONFIG, min_nodes=1, max_nodes=3, last_call_ms=0, scale_up=True)
    r = JobReplica()
    a_session, b_session = r.open(), r.open()
    a = r.join(a_session, "a/1", config).participant_id
    b = r.join(b_session, "b/1", config).participant_id
    assert r.job().round.state is RoundState.ACTIVE
    first, ended_before = r.job().round.number, len(r.job().history)
    assert r.ranks() == {a: 0, b: 1}
    joined = r.do(b_session, Join("j", "b/2", b"b", config, replaces=b))
    assert isinstance(joined, JoinResult), joined
    new = joined.participant_id
    assert (joined.round, joined.waiting) == (first + 1, False)
    job = r.job()
    assert [(h.number, h.end_reason, h.ended_by) for h in job.history[ended_before:]] == [
        (first, EndReason.MEMBER_LEFT, b)
    ]
    assert job.history[-1].detail == f"rejoined as participant {new}"
    assert job.round.state is RoundState.ACTIVE and r.ranks() == {a: 0, new: 1}
    assert b not in job.participants and "b/1" not in job.names and job.waiting == []


def test_a_join_replacing_a_waiter_or_a_joining_member_changes_no_round() -> None:
    r = JobReplica()
    session = r.open()
    member = r.join(session, "m/1").participant_id
    assert r.job().round.state is RoundState.JOINING
    joined = r.do(session, Join("j", "m/2", b"", CONFIG, replaces=member))
    assert isinstance(joined, JoinResult) and not joined.waiting
    assert list(r.job().round.member_ids) == [joined.participant_id]
    assert r.job().round.number == 1 and not r.job().history
    others = r.workers(3)  # with m/2 the round is full (max 4) and closes
    assert r.job().round.state is RoundState.ACTIVE
    waiter_session = r.open()
    waiter = r.join(waiter_session, "late/1").participant_id
    again = r.do(waiter_session, Join("j", "late/2", b"", CONFIG, replaces=waiter))
    assert isinstance(again, JoinResult) and again.waiting
    assert r.job().waiting == [again.participant_id] and r.job().round.number == 1
    assert set(others) <= set(r.job().round.member_ids)


def test_a_join_replaces_only_its_own_sessions_participant_and_a_gone_one_is_a_join() -> None:
    r = JobReplica()
    theirs = r.join(r.open(), "theirs").participant_id
    session = r.open()
    refused = r.do(session, Join("j", "mine", b"", CONFIG, replaces=theirs))
    assert isinstance(refused, InvalidCommand) and "another session" in str(refused)
    assert theirs in r.job().participants and "mine" not in r.job().names
    gone = r.do(session, Join("j", "mine", b"", CONFIG, replaces=10_000))
    assert isinstance(gone, JoinResult) and theirs in r.job().participants
    negative = r.do(session, Join("j", "other", b"", CONFIG, replaces=-1))
    assert isinstance(negative, InvalidCommand)
