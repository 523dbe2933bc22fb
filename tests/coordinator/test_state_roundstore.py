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
from rallypoint.coordinator.state.roundstore import RoundStore

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
