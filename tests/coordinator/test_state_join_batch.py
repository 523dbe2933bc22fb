"""JoinBatch: many joins in one command, all or nothing; participant ids that stay unique and
increasing across single and batch joins; the O(1) per-participant assignment; and the cost
of a batch, counted in seats written rather than timed."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from rallypoint.coordinator.state import codec, joins, rendezvous, rounds
from rallypoint.coordinator.state.commands import (
    CloseJob,
    CloseRound,
    Command,
    Envelope,
    Join,
    JoinBatch,
    Leave,
    MemberFailed,
    SessionClose,
    SessionOpen,
    decode_envelope,
    encode_envelope,
)
from rallypoint.coordinator.state.errors import (
    ConfigConflict,
    InvalidCommand,
    JobClosed,
    JobNotFound,
    LimitExceeded,
    NameTaken,
)
from rallypoint.coordinator.state.jobs import (
    JobConfig,
    ParticipantAssignment,
    RendezvousLimits,
    RoundState,
)
from rallypoint.coordinator.state.machine import Limits, StateMachine
from rallypoint.coordinator.state.results import JoinBatchResult, JoinResult, Result

from .job_replica import CONFIG, JobReplica

BIG = JobConfig(min_nodes=2, max_nodes=1_000, last_call_ms=1_000)


def batch(
    r: JobReplica,
    session_id: int,
    names: list[str],
    config: JobConfig | None = CONFIG,
    metadata: tuple[bytes, ...] = (),
    job: str = "j",
) -> Result:
    return r.do(session_id, JoinBatch(job, tuple(names), metadata, config))


def joined(result: Result) -> JoinBatchResult:
    assert isinstance(result, JoinBatchResult), result
    return result


def state_of(r: JobReplica) -> Any:
    """The rendezvous state as a snapshot holds it (what a refused batch must not change)."""
    return (r.sm.rendezvous.to_obj(), r.sm.rendezvous.next_participant_id)


# ----------------------------------------------------------------- semantics


def test_a_batch_creates_the_job_and_joins_everyone_in_order_with_consecutive_ids() -> None:
    r = JobReplica()
    s = r.open()
    result = joined(batch(r, s, ["a", "b", "c"], BIG, (b"ma", b"mb", b"mc")))
    index = r.index
    assert result == JoinBatchResult(
        "j", (index, index + 1, index + 2), (False, False, False), 1, RoundState.JOINING
    )
    job = r.job()
    assert [seat.participant_id for seat in job.round.members] == list(result.participant_ids)
    assert [job.participants[pid].name for pid in result.participant_ids] == ["a", "b", "c"]
    assert job.participants[index + 1].metadata == b"mb"
    assert {p.session_id for p in job.participants.values()} == {s}
    assert job.round.min_reached_ms == r.time_ms


def test_a_batch_fills_the_round_closes_it_and_the_rest_wait_in_order() -> None:
    r = JobReplica()
    result = joined(batch(r, r.open(), [f"w{n}" for n in range(6)]))  # max_nodes 4
    ids = result.participant_ids
    assert result.waiting == (False,) * 4 + (True,) * 2
    assert (result.round, result.state) == (1, RoundState.ACTIVE)
    assert r.ranks() == {pid: rank for rank, pid in enumerate(ids[:4])}
    assert r.job().waiting == list(ids[4:])
    assert r.job().round.fencing_token == r.index


def test_a_batch_waits_for_an_active_round_and_a_scale_up_takes_it_at_once() -> None:
    config = replace(CONFIG, max_nodes=6, last_call_ms=0, scale_up=True)
    r = JobReplica()
    first = joined(batch(r, r.open(), ["a", "b"], config))
    assert first.state is RoundState.ACTIVE  # min 2 reached, no last call
    second = joined(batch(r, r.open(), ["c", "d", "e"], config))
    # One scale-up for the whole batch, not one round per joiner.
    assert (second.round, second.state, second.waiting) == (2, RoundState.ACTIVE, (False,) * 3)
    assert r.ranks() == {
        pid: rank for rank, pid in enumerate(first.participant_ids + second.participant_ids)
    }
    assert len(r.job().history) == 1


def test_a_scale_up_seats_a_batch_larger_than_the_wait_list() -> None:
    """Joined one by one, each would start a round and none would wait long: the wait list's
    bound applies to who is still waiting once the batch is in."""
    limits = Limits(rendezvous=RendezvousLimits(max_waiting=2))
    config = JobConfig(2, 10, 0, scale_up=True)
    r = JobReplica(limits)
    s = r.open()
    joined(batch(r, s, ["a", "b"], config))
    more = joined(batch(r, s, [f"w{n}" for n in range(10)], config))
    assert more.waiting == (False,) * 8 + (True,) * 2
    assert (more.round, more.state) == (2, RoundState.ACTIVE)
    assert len(r.job().round.members) == 10 and len(r.job().waiting) == 2
    assert isinstance(batch(r, s, ["x"], config), LimitExceeded)


def test_the_same_session_gets_its_participants_back_and_others_are_added() -> None:
    r = JobReplica()
    s = r.open()
    first = joined(batch(r, s, ["a", "b"], BIG))
    again = joined(batch(r, s, ["b", "c", "a"], BIG))
    a, b = first.participant_ids
    assert again.participant_ids == (b, b + 1, a)
    assert len(r.job().participants) == 3


# ----------------------------------------------------------------- all or nothing


def refusals() -> list[tuple[str, Any]]:
    """(case, attempt(replica, session)): each batch has one entry (or field) refused."""
    other = replace(CONFIG, max_nodes=3)
    return [
        ("name taken", lambda r, s: batch(r, r.open(), ["new", "taken"])),
        ("repeated name", lambda r, s: batch(r, s, ["x", "y", "x"])),
        ("empty batch", lambda r, s: batch(r, s, [])),
        ("name too long", lambda r, s: batch(r, s, ["ok", "n" * 300])),
        ("metadata not parallel", lambda r, s: batch(r, s, ["x", "y"], metadata=(b"",))),
        ("metadata too large", lambda r, s: batch(r, s, ["x", "y"], metadata=(b"", b"m" * 5000))),
        ("config conflict", lambda r, s: batch(r, s, ["x"], other)),
        ("wait list full", lambda r, s: batch(r, s, [f"x{n}" for n in range(5)])),
        ("no such job", lambda r, s: batch(r, s, ["x"], None, job="nope")),
        ("bad config", lambda r, s: batch(r, s, ["x"], replace(CONFIG, min_nodes=0), job="k")),
    ]


@pytest.mark.parametrize(("case", "attempt"), refusals(), ids=[case for case, _ in refusals()])
def test_a_batch_with_one_refused_entry_changes_nothing(case: str, attempt: Any) -> None:
    limits = Limits(rendezvous=RendezvousLimits(max_waiting=3))
    r = JobReplica(limits)
    s = r.open()
    r.join(s, "taken")
    joined(batch(r, s, ["m1", "m2", "m3"]))
    assert r.job().round.state is RoundState.ACTIVE
    before = state_of(r)
    result = attempt(r, s)
    expected = {
        "name taken": NameTaken,
        "config conflict": ConfigConflict,
        "wait list full": LimitExceeded,
        "metadata too large": LimitExceeded,
        "no such job": JobNotFound,
    }.get(case, InvalidCommand)
    assert isinstance(result, expected), result
    assert state_of(r) == before


def test_refusals_name_the_entry() -> None:
    r = JobReplica()
    s = r.open()
    assert batch(r, s, ["a", "b", "a"]) == InvalidCommand("entry 2: name 'a' repeats entry 0")
    assert batch(r, s, ["a", ""]) == InvalidCommand("entry 1: name must be 1..256 characters")
    big = batch(r, s, ["a", "b"], metadata=(b"", b"m" * 5000))
    assert big == LimitExceeded("participant metadata bytes (entry 1)", 4096)


def test_a_batch_is_bounded_in_bytes_as_one_raft_entry() -> None:
    r = JobReplica(Limits(rendezvous=RendezvousLimits(max_batch_bytes=10)))
    s = r.open()
    assert batch(r, s, ["aaaa", "bbbb"], metadata=(b"12", b"3")) == LimitExceeded(
        "bytes of names and metadata in one batch", 10
    )
    assert batch(r, s, ["é" * 6]) == LimitExceeded("bytes of names and metadata in one batch", 10)
    assert isinstance(batch(r, s, ["aaaa", "bbbb"], metadata=(b"1", b"2")), JoinBatchResult)


def test_a_closed_job_refuses_a_batch_and_an_ended_one_starts_again() -> None:
    r = JobReplica()
    s = r.open()
    ids = joined(batch(r, s, ["a", "b"])).participant_ids
    r.do(s, CloseJob("j"))
    assert batch(r, s, ["c"]) == JobClosed("j")
    r2 = JobReplica()
    s2 = r2.open()
    (only,) = joined(batch(r2, s2, ["a"], BIG)).participant_ids
    r2.do(s2, Leave("j", only, outcome=rendezvous.LeaveOutcome.FINISHED))
    assert r2.job().ended
    again = joined(batch(r2, s2, ["a", "b"], replace(BIG, max_nodes=500)))
    assert not r2.job().ended and r2.job().config.max_nodes == 500
    assert min(again.participant_ids) > max(ids)


# ----------------------------------------------------------------- participant ids


def test_ids_stay_unique_and_increasing_across_single_and_batch_joins() -> None:
    r = JobReplica()
    s = r.open()
    single = r.join(s, "a", BIG).participant_id
    assert single == r.index  # no batch ahead of the log: a join's id is its index
    first = joined(batch(r, s, [f"b{n}" for n in range(5)], BIG)).participant_ids
    assert first == tuple(range(r.index, r.index + 5))
    assert r.sm.rendezvous.next_participant_id == r.index + 5
    # The next join's index is below the batch's last id: it takes the next free one.
    after = r.join(s, "c", BIG).participant_id
    assert after == first[-1] + 1 and after > r.index
    second = joined(batch(r, s, ["d0", "d1"], BIG)).participant_ids
    assert second == (after + 1, after + 2)
    # Once the log catches up, ids are indexes again and the high-water mark is cleared.
    while r.index + 1 < r.sm.rendezvous.next_participant_id:
        r.open()
    caught_up = r.join(s, "e", BIG).participant_id
    assert caught_up == r.index and r.sm.rendezvous.next_participant_id == 0
    ids = [single, *first, after, *second, caught_up]
    assert ids == sorted(set(ids))
    assert sorted(r.job().participants) == ids


def test_the_high_water_mark_survives_a_snapshot_in_format_5_and_only_then() -> None:
    r = JobReplica()
    s = r.open()
    r.join(s, "a", BIG)
    assert codec.unpack(r.sm.snapshot())[0] == 4  # no batch ahead of the log: as before
    ids = joined(batch(r, s, ["b", "c", "d"], BIG)).participant_ids
    image = r.sm.snapshot()
    assert codec.unpack(image)[0] == 5
    restored = StateMachine()
    restored.restore(image)
    assert restored.snapshot() == image
    assert restored.rendezvous.next_participant_id == ids[-1] + 1
    # Both go on to hand out the same next id.
    command = Envelope(s, 99, 0, r.time_ms, Join("j", "e", b"", BIG))
    answers = [m.apply(r.index + 1, encode_envelope(command)) for m in (r.sm, restored)]
    assert answers[0] == answers[1] and isinstance(answers[0], JoinResult)
    assert answers[0].participant_id == ids[-1] + 1


def test_a_participant_id_is_known_once_applied_or_handed_out_ahead() -> None:
    r = JobReplica()
    s = r.open()
    view = r.sm.rendezvous
    ids = joined(batch(r, s, ["a", "b", "c"], BIG)).participant_ids
    applied = r.sm.applied_index
    assert all(view.participant_id_known(pid, applied) for pid in ids)
    assert not view.participant_id_known(ids[-1] + 1, applied)
    assert not view.participant_id_known(applied + 10, applied)


def test_join_batch_encodes_and_decodes() -> None:
    command = JoinBatch("j", ("a", "b"), (b"\x00", b""), CONFIG)
    envelope = Envelope(3, 4, 1, 5, command)
    assert decode_envelope(encode_envelope(envelope)) == envelope
    bare = Envelope(3, 4, 1, 5, JoinBatch("j", ("a",)))
    assert decode_envelope(encode_envelope(bare)) == bare


# ----------------------------------------------------------------- assignments


def test_assignment_answers_joining_active_waiting_and_gone() -> None:
    r = JobReplica()
    s = r.open()
    view = r.sm.rendezvous
    a, b = joined(batch(r, s, ["a", "b"])).participant_ids
    assert view.assignment("j", a) == ParticipantAssignment(1, RoundState.JOINING, -1, 0, 0, False)
    c, d, late = joined(batch(r, s, ["c", "d", "late"])).participant_ids
    token = r.job().round.fencing_token
    assert view.assignment("j", c) == ParticipantAssignment(
        1, RoundState.ACTIVE, 2, 4, token, False
    )
    assert view.assignment("j", late) == ParticipantAssignment(
        1, RoundState.ACTIVE, -1, 4, token, True
    )
    r.fail(b)
    assert view.assignment("j", b) is None
    assert view.assignment("gone", a) is None
    # Round 2: the survivors and the waiter, full at once, so closed at once.
    ranks = r.ranks()
    for pid in (a, c, d, late):
        assignment = view.assignment("j", pid)
        assert assignment is not None and assignment.rank == ranks[pid]
        assert (assignment.round, assignment.world_size, assignment.waiting) == (2, 4, False)
    assert ranks[late] == 1  # the failed member's rank, least movement


def test_the_rank_index_is_built_once_per_round_and_is_not_state() -> None:
    r = JobReplica()
    s = r.open()
    ids = joined(batch(r, s, [f"w{n}" for n in range(4)])).participant_ids
    job = r.job()
    image = r.sm.snapshot()
    index = job.ranks()
    for pid in ids:
        r.sm.rendezvous.assignment("j", pid)
    assert job.ranks() is index  # not rebuilt per query
    assert r.sm.snapshot() == image  # a cache, not replicated state
    r.fail(ids[0])
    r.time_ms += 5_000
    r.close_round()
    assert job.ranks() is not index and set(job.ranks()) == set(ids[1:])


def test_frozen_copy_shares_records_and_sees_no_later_apply() -> None:
    r = JobReplica()
    s = r.open()
    ids = joined(batch(r, s, [f"w{n}" for n in range(4)])).participant_ids
    copy = r.sm.frozen_copy()
    image = copy.snapshot()
    assert copy.rendezvous.jobs["j"].participants[ids[0]] is r.job().participants[ids[0]]
    r.fail(ids[1])
    joined(batch(r, s, ["x", "y"]))
    assert copy.snapshot() == image
    assert r.sm.snapshot() != image


# ----------------------------------------------------------------- cost


class SeatCounter:
    """Counts what the rendezvous writes into rounds: Seats built and seats in each member
    tuple a round is given (by ``replace``), the work a join costs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seats_built = 0
        self.seats_written = 0
        real_seat, real_replace = rounds.Seat, rounds.replace

        def seat(*args: Any) -> Any:
            self.seats_built += 1
            return real_seat(*args)

        def replace_(obj: Any, **changes: Any) -> Any:
            if "members" in changes:
                self.seats_written += len(changes["members"])
            return real_replace(obj, **changes)

        # Wherever the rendezvous's rules build rounds (rendezvous.py, joins.py, rounds.py).
        for module in (rendezvous, joins, rounds):
            if hasattr(module, "Seat"):
                monkeypatch.setattr(module, "Seat", seat)
            monkeypatch.setattr(module, "replace", replace_)


def test_a_batch_costs_its_size_plus_the_round_not_their_product(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batches, size = 20, 500
    config = JobConfig(min_nodes=batches * size, max_nodes=batches * size, last_call_ms=1_000)
    r = JobReplica()
    s = r.open()
    counter = SeatCounter(monkeypatch)
    for n in range(batches):
        before_built, before_written = counter.seats_built, counter.seats_written
        present = len(r.job().round.members) if n else 0
        names = [f"w{n}-{i}" for i in range(size)]
        joined(batch(r, s, names, config))
        if n < batches - 1:
            # One member tuple of present + size seats, size new Seats: O(M + N) once.
            assert counter.seats_built - before_built == size
            assert counter.seats_written - before_written == present + size
    # The last batch filled the round, which closed: one more tuple of N ranked seats.
    assert r.job().round.state is RoundState.ACTIVE
    total = batches * size
    assert counter.seats_built == total + total
    assert counter.seats_written == sum((n + 1) * size for n in range(batches)) + total


def test_a_failure_at_scale_builds_the_next_round_once(monkeypatch: pytest.MonkeyPatch) -> None:
    total = 5_000
    config = JobConfig(min_nodes=total, max_nodes=total, last_call_ms=0)
    r = JobReplica()
    s = r.open()
    ids = joined(batch(r, s, [f"w{i}" for i in range(total)], config)).participant_ids
    counter = SeatCounter(monkeypatch)
    r.fail(ids[7])
    # The survivors' round, then (the next join fills it) its close: 2 N seats, not N^2.
    (late,) = joined(batch(r, s, ["late"], config)).participant_ids
    assert r.job().round.state is RoundState.ACTIVE and r.ranks()[late] == 7
    assert counter.seats_built <= 2 * total + 1


# ----------------------------------------------------------------- determinism


def test_logs_with_batches_replay_to_identical_snapshots_through_a_restore() -> None:
    rng = random.Random(17)
    limits = Limits(rendezvous=RendezvousLimits(max_waiting=3))
    config = JobConfig(2, 5, 0, scale_up=True)
    log: list[bytes] = []
    sessions = [1]
    time_ms = 0
    log.append(encode_envelope(Envelope(0, 0, 0, 0, SessionOpen(60_000))))
    shadow = StateMachine(limits)
    shadow.apply(1, log[0])
    sequence = {1: 1}
    for index in range(2, 200):
        time_ms += rng.choice([0, 10, 300])
        job = shadow.rendezvous.jobs.get("j")
        pids = sorted(job.participants) if job and job.participants else [1]
        session = rng.choice(sessions)
        names = tuple(rng.sample("abcdefghij", rng.randrange(1, 4)))
        choices: list[Command] = [
            JoinBatch("j", names, (), config),
            JoinBatch("j", names, (), config),
            Join("j", rng.choice("abcdefghij"), b"", config),
            MemberFailed("j", rng.choice(pids), job.round.number if job else 1, "phi"),
            Leave("j", rng.choice(pids)),
            CloseRound("j", job.round.number if job else 1),
            SessionClose() if rng.random() < 0.1 else SessionOpen(60_000),
        ]
        command = rng.choice(choices)
        if isinstance(command, SessionOpen):
            envelope = Envelope(0, 0, 0, time_ms, command)
            sessions.append(index)
            sequence[index] = 1
        else:
            envelope = Envelope(session, sequence[session], 0, time_ms, command)
            sequence[session] += 1
        log.append(encode_envelope(envelope))
        shadow.apply(index, log[-1])
    assert shadow.rendezvous.jobs["j"].participants  # the log did join people

    def replay(machine: StateMachine, start: int) -> StateMachine:
        for index, data in enumerate(log[start - 1 :], start):
            machine.apply(index, data)
        return machine

    whole = replay(StateMachine(limits), 1)
    halfway = StateMachine(limits)
    for index, data in enumerate(log[:100], 1):
        halfway.apply(index, data)
    restored = StateMachine(limits)
    restored.restore(halfway.snapshot())
    replay(restored, 101)
    assert whole.snapshot() == restored.snapshot() == shadow.snapshot()
    ids = sorted(whole.rendezvous.jobs["j"].participants)
    assert len(ids) == len(set(ids))


# ----------------------------------------------------------------- a batch's session ending


def remove_one_by_one(
    self: rendezvous.Rendezvous, index: int, now_ms: int, job: rendezvous.Job, pids: list[int]
) -> None:
    """The rule as it reads: each participant removed on its own (the reference)."""
    for pid in pids:
        session_id = job.participants[pid].session_id
        cause = f"session {session_id} ended"
        self._remove(index, now_ms, job, pid, rendezvous.EndReason.MEMBER_FAILED, cause)
        self._end_if_failed(index, now_ms, job)


@pytest.mark.parametrize("seed", range(12))
def test_a_session_ending_removes_its_participants_as_one_by_one_would(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    limits = Limits(rendezvous=RendezvousLimits(max_waiting=4, max_round_history=3))
    configs = [
        JobConfig(2, 6, rng.choice([0, 500])),
        JobConfig(3, 8, rng.choice([0, 2_000]), scale_up=rng.random() < 0.5),
    ]
    log: list[bytes] = []
    sequence: dict[int, int] = {}
    time_ms = 0
    index = 0
    shadow = StateMachine(limits)

    def add(session_id: int, command: Command) -> None:
        nonlocal index
        index += 1
        seq = 0
        if session_id and not isinstance(command, SessionClose):
            seq = sequence[session_id] = sequence[session_id] + 1
        log.append(encode_envelope(Envelope(session_id, seq, 0, time_ms, command)))
        shadow.apply(index, log[-1])

    for _ in range(60):
        time_ms += rng.choice([0, 100, 700, 2_500])
        live = sorted(sequence)
        if len(live) < 3 or rng.random() < 0.2:
            add(0, SessionOpen(rng.choice([1_000, 60_000])))
            sequence[index] = 0
            continue
        session_id = rng.choice(live)
        job = rng.choice(["j", "k"])
        config = configs[job == "k"]
        roll = rng.random()
        if roll < 0.5:
            names = tuple(f"s{session_id}-{n}" for n in rng.sample(range(9), rng.randrange(1, 5)))
            add(session_id, JoinBatch(job, names, (), config))
        elif roll < 0.6:
            add(session_id, Join(job, f"one{index}", b"", config))
        elif roll < 0.75:
            found = shadow.rendezvous.jobs.get(job)
            if found is not None:
                add(0, CloseRound(job, found.round.number))
        else:
            add(session_id, SessionClose())
            del sequence[session_id]
    # Sessions that are left expire (the short ones) as time moves on.
    time_ms += 5_000
    add(0, SessionOpen(60_000))

    fast = StateMachine(limits)
    for position, data in enumerate(log, 1):
        fast.apply(position, data)
    monkeypatch.setattr(rendezvous.Rendezvous, "_remove_failed", remove_one_by_one)
    slow = StateMachine(limits)
    for position, data in enumerate(log, 1):
        slow.apply(position, data)
    assert fast.snapshot() == slow.snapshot()


@pytest.mark.parametrize("active", [False, True])
def test_a_batch_session_ending_costs_one_pass_over_the_round(
    active: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    total = 3_000
    maximum = total if active else total + 1
    config = JobConfig(min_nodes=2, max_nodes=maximum, last_call_ms=60_000)
    r = JobReplica()
    s = r.open()
    keeper = r.open()
    r.join(keeper, "keeper", config)
    joined(batch(r, s, [f"w{i}" for i in range(total - 1)], config))
    assert r.job().round.state is (RoundState.ACTIVE if active else RoundState.JOINING)
    counter = SeatCounter(monkeypatch)
    r.do(s, SessionClose())
    assert [p.name for p in r.job().participants.values()] == ["keeper"]
    assert r.job().round.state is RoundState.JOINING and len(r.job().round.members) == 1
    # Removed one by one, each removal rebuilt the round: (N^2)/2 seats.
    assert counter.seats_built + counter.seats_written <= 2 * total
