"""The per-round store: torch's c10d semantics, fencing to the members of the ACTIVE round
(zombies and stragglers refused), dropped when the round ends, bounded."""

from __future__ import annotations

from dataclasses import replace

from rallypoint.coordinator.state.commands import (
    StoreAdd,
    StoreCompareSet,
    StoreDelete,
    StoreSet,
)
from rallypoint.coordinator.state.errors import (
    AddOverflow,
    InvalidCommand,
    JobNotFound,
    KeyTooLarge,
    LimitExceeded,
    NotAnInteger,
    StaleRound,
    ValueTooLarge,
)
from rallypoint.coordinator.state.jobs import RendezvousLimits
from rallypoint.coordinator.state.machine import Limits
from rallypoint.coordinator.state.results import (
    StoreAddResult,
    StoreCompareSetResult,
    StoreDeleteResult,
    StoreSetResult,
)
from rallypoint.coordinator.state.roundstore import EndedRoundStore, RoundStore

from .job_replica import CONFIG, JobReplica


def active(limits: Limits | None = None) -> tuple[JobReplica, int, list[int]]:
    """A replica with job "j" ACTIVE in round 1 of two workers; (replica, session, ids)."""
    r = JobReplica(limits)
    pids = r.workers(2, replace(CONFIG, last_call_ms=0))
    return r, r.open(), pids


def test_set_get_add_delete_num_keys_and_check() -> None:
    r, s, (a, b) = active()
    assert r.do(s, StoreSet("j", 1, a, b"addr", b"10.0.0.1:29500")) == StoreSetResult()
    store = r.sm.rendezvous.member_store("j", 1, b)
    assert isinstance(store, RoundStore)
    assert store.get(b"addr") == b"10.0.0.1:29500" and store.get(b"none") is None
    assert r.do(s, StoreAdd("j", 1, a, b"barrier", 1)) == StoreAddResult(1)
    assert r.do(s, StoreAdd("j", 1, b, b"barrier", 1)) == StoreAddResult(2)
    assert store.get(b"barrier") == b"2"
    assert store.num_keys() == 2
    assert store.check([b"addr", b"barrier"]) and not store.check([b"addr", b"none"])
    assert r.do(s, StoreDelete("j", 1, a, b"addr")) == StoreDeleteResult(True)
    assert r.do(s, StoreDelete("j", 1, a, b"addr")) == StoreDeleteResult(False)
    assert store.num_keys() == 1 and store.size_bytes == len(b"barrier") + 1


def test_compare_set_follows_torch() -> None:
    r, s, (a, _) = active()
    # Absent and expected empty: set.
    assert r.do(s, StoreCompareSet("j", 1, a, b"k", b"", b"one")) == StoreCompareSetResult(
        True, b"one"
    )
    # Present and matching: set; not matching: unchanged, the current value returned.
    assert r.do(s, StoreCompareSet("j", 1, a, b"k", b"one", b"two")) == StoreCompareSetResult(
        True, b"two"
    )
    assert r.do(s, StoreCompareSet("j", 1, a, b"k", b"one", b"three")) == StoreCompareSetResult(
        False, b"two"
    )
    # Absent and expected non-empty: nothing stored.
    assert r.do(s, StoreCompareSet("j", 1, a, b"x", b"one", b"v")) == StoreCompareSetResult(
        False, None
    )


def test_add_refuses_non_integers_and_overflow() -> None:
    r, s, (a, _) = active()
    r.do(s, StoreSet("j", 1, a, b"text", b"12a"))
    assert r.do(s, StoreAdd("j", 1, a, b"text", 1)) == NotAnInteger(b"text")
    r.do(s, StoreSet("j", 1, a, b"n", b"-5"))
    assert r.do(s, StoreAdd("j", 1, a, b"n", 2)) == StoreAddResult(-3)
    assert r.do(s, StoreAdd("j", 1, a, b"big", 2**63 - 1)) == StoreAddResult(2**63 - 1)
    assert r.do(s, StoreAdd("j", 1, a, b"big", 1)) == AddOverflow(b"big")


def test_only_members_of_the_active_round_may_use_it() -> None:
    r = JobReplica()
    s = r.open()
    a = r.join(s, "solo").participant_id
    joining = r.do(s, StoreSet("j", 1, a, b"k", b"v"))
    assert isinstance(joining, StaleRound) and "still joining" in joining.message
    b = r.workers(3)[0]
    outsider = r.join(r.open(), "late").participant_id  # waits: round 1 is full
    refused = r.do(s, StoreSet("j", 1, outsider, b"k", b"v"))
    assert isinstance(refused, StaleRound) and "not a member" in refused.message
    future = r.do(s, StoreSet("j", 2, b, b"k", b"v"))
    assert isinstance(future, StaleRound) and "does not exist yet" in future.message
    assert r.do(s, StoreSet("x", 1, b, b"k", b"v")) == JobNotFound("x")
    assert r.sm.rendezvous.member_store("j", 1, outsider) == refused


def test_a_zombie_cannot_write_to_the_round_it_was_removed_from() -> None:
    r, s, (a, b) = active()
    r.do(s, StoreSet("j", 1, a, b"k", b"v"))
    r.fail(a)  # a paused past its detection; round 1 ended, round 2 opened without it
    c = r.join(r.open(), "w2", replace(CONFIG, last_call_ms=0)).participant_id
    assert r.job().round.number == 2 and r.ranks() == {b: 1, c: 0}  # b keeps its rank
    # a resumes and writes as if nothing happened: refused, in every form.
    for command in [
        StoreSet("j", 1, a, b"k", b"zombie"),
        StoreAdd("j", 1, a, b"n", 1),
        StoreCompareSet("j", 1, a, b"k", b"v", b"zombie"),
        StoreDelete("j", 1, a, b"k"),
        StoreSet("j", 2, a, b"k", b"zombie"),
    ]:
        assert isinstance(r.do(s, command), StaleRound)
    # The new round's store started empty: nothing of round 1 leaked into it.
    store = r.sm.rendezvous.member_store("j", 2, b)
    assert isinstance(store, RoundStore) and store.num_keys() == 0
    assert isinstance(r.sm.rendezvous.member_store("j", 1, b), StaleRound)


def test_keys_values_and_totals_are_bounded() -> None:
    bounds = RendezvousLimits(
        max_store_keys=2, max_store_bytes=19, max_store_key_bytes=4, max_store_value_bytes=8
    )
    r, s, (a, _) = active(Limits(rendezvous=bounds))
    assert isinstance(r.do(s, StoreSet("j", 1, a, b"", b"v")), InvalidCommand)
    assert r.do(s, StoreSet("j", 1, a, b"12345", b"v")) == KeyTooLarge(5, 4)
    assert r.do(s, StoreSet("j", 1, a, b"k", b"123456789")) == ValueTooLarge(9, 8)
    assert r.do(s, StoreSet("j", 1, a, b"k1", b"12345678")) == StoreSetResult()
    assert r.do(s, StoreSet("j", 1, a, b"k2", b"12345678")) == LimitExceeded(
        "bytes in one round's store", 19
    )
    assert r.do(s, StoreSet("j", 1, a, b"k2", b"1")) == StoreSetResult()
    assert r.do(s, StoreSet("j", 1, a, b"k3", b"1")) == LimitExceeded(
        "keys in one round's store", 2
    )
    assert r.do(s, StoreSet("j", 1, a, b"k1", b"2")) == StoreSetResult()  # overwrite fits


def test_an_ended_rounds_store_is_read_only_for_its_members_until_the_next_round_ends() -> None:
    """roundstore.py, "Ended, read-only": a scale-up ends round 1 while its ranks may be
    inside init_process_group; the keys they wrote stay readable (every rank gets the same
    answers), nothing can be written, and a key it lacks is refused at once."""
    config = replace(CONFIG, last_call_ms=0, scale_up=True)
    r = JobReplica()
    s = r.open()
    a, b = r.workers(2, config)
    assert r.do(s, StoreSet("j", 1, a, b"0", b"addr of rank 0")) == StoreSetResult()
    assert r.do(s, StoreSet("j", 1, b, b"1", b"addr of rank 1")) == StoreSetResult()
    c = r.join(r.open(), "late", config).participant_id  # scale-up: round 1 ends
    assert r.job().round.number == 2
    for pid in (a, b):
        ended = r.sm.rendezvous.readable_store("j", 1, pid)
        assert isinstance(ended, EndedRoundStore)
        assert ended.get(b"0") == b"addr of rank 0" and ended.get(b"1") == b"addr of rank 1"
        assert ended.check([b"0", b"1"]) and ended.num_keys() == 2
        assert ended.get(b"2") is None
        assert isinstance(ended.ended, StaleRound) and "read-only" in ended.ended.message
    # Writes stay refused, in every form.
    for command in [
        StoreSet("j", 1, a, b"2", b"x"),
        StoreAdd("j", 1, a, b"n", 1),
        StoreCompareSet("j", 1, a, b"0", b"addr of rank 0", b"x"),
        StoreDelete("j", 1, a, b"0"),
    ]:
        assert isinstance(r.do(s, command), StaleRound)
    assert isinstance(r.sm.rendezvous.member_store("j", 1, a), StaleRound)
    # Never for one that was not a member of round 1.
    assert isinstance(r.sm.rendezvous.readable_store("j", 1, c), StaleRound)
    # The live round's store is the live one (a read of a missing key there may wait).
    live = r.sm.rendezvous.readable_store("j", 2, c)
    assert isinstance(live, RoundStore) and live.ended is None and live.num_keys() == 0
    # Round 2 ends (b fails): round 1's store is gone, round 2's is the read-only one now,
    # and a participant removed as failed (a zombie) reads neither.
    r.fail(b)
    assert isinstance(r.sm.rendezvous.readable_store("j", 1, a), StaleRound)
    assert isinstance(r.sm.rendezvous.readable_store("j", 2, a), EndedRoundStore)
    assert isinstance(r.sm.rendezvous.readable_store("j", 2, b), StaleRound)


def test_an_ended_rounds_store_is_not_state() -> None:
    """Kept beside the state, not in it: snapshots are the bytes they were without the rule
    (so replaying any log, old ones included, gives the same bytes), and a replica restored
    from a snapshot refuses the reads, as every replica did before the rule existed."""
    config = replace(CONFIG, last_call_ms=0, scale_up=True)
    r = JobReplica()
    s = r.open()
    a, _ = r.workers(2, config)
    r.do(s, StoreSet("j", 1, a, b"0", b"addr"))
    before_end = r.sm.snapshot()
    r.join(r.open(), "late", config)
    assert isinstance(r.sm.rendezvous.readable_store("j", 1, a), EndedRoundStore)
    # The snapshot holds no round-1 key: only round 2's (empty) store is in it.
    data = r.sm.snapshot()
    assert b"addr" in before_end and b"addr" not in data
    restored = JobReplica()
    restored.sm.restore(data)
    assert restored.sm.snapshot() == data
    assert isinstance(restored.sm.rendezvous.readable_store("j", 1, a), StaleRound)
    # A frozen copy (what a snapshot is written from) keeps the read-only store.
    assert isinstance(r.sm.frozen_copy().rendezvous.readable_store("j", 1, a), EndedRoundStore)
