"""Behaviour of every state-machine command and every typed failure."""

from __future__ import annotations

import msgpack
import pytest

from rallypoint.coordinator.state.commands import (
    Add,
    Command,
    CompareAndSet,
    Delete,
    Envelope,
    Join,
    LeaseExpire,
    LeaseGrant,
    LeaseRevoke,
    OwnedSessionOpen,
    Put,
    SessionClose,
    SessionKeepAlive,
    SessionOpen,
    encode_envelope,
)
from rallypoint.coordinator.state.errors import (
    AddOverflow,
    Compacted,
    InvalidCommand,
    KeyTooLarge,
    LeaseNotFound,
    NotAnInteger,
    SequenceDiscarded,
    SessionExpired,
    StaleFence,
    TooManyOutstanding,
    ValueTooLarge,
)
from rallypoint.coordinator.state.jobs import JobConfig
from rallypoint.coordinator.state.machine import Limits, StateMachine
from rallypoint.coordinator.state.results import (
    AddResult,
    CompareAndSetResult,
    DeleteResult,
    LeaseEndResult,
    LeaseGrantResult,
    NoOp,
    PutResult,
    Result,
    SessionCloseResult,
    SessionKeepAliveResult,
    SessionOpenResult,
)
from rallypoint.coordinator.state.values import EventType, Fence, KeyValue


class Replica:
    """A state machine fed one entry at a time, as the daemon's apply loop would."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.sm = StateMachine(limits)
        self.index = 0
        self.time_ms = 1_000
        self.next_sequence: dict[int, int] = {}

    def apply(
        self, command: Command, session_id: int = 0, sequence: int = 0, first_unacked: int = 0
    ) -> Result:
        self.index += 1
        envelope = Envelope(session_id, sequence, first_unacked, self.time_ms, command)
        return self.sm.apply(self.index, encode_envelope(envelope))

    def open(self, ttl_ms: int = 10_000) -> int:
        result = self.apply(SessionOpen(ttl_ms))
        assert isinstance(result, SessionOpenResult)
        self.next_sequence[result.session_id] = 1
        return result.session_id

    def do(self, session_id: int, command: Command) -> Result:
        sequence = self.next_sequence[session_id]
        self.next_sequence[session_id] = sequence + 1
        return self.apply(command, session_id, sequence)

    def grant(self, session_id: int, ttl_ms: int = 5_000) -> int:
        result = self.do(session_id, LeaseGrant(ttl_ms))
        assert isinstance(result, LeaseGrantResult)
        return result.lease_id


@pytest.fixture
def replica() -> Replica:
    return Replica()


def test_noop_advances_applied_index_only(replica: Replica) -> None:
    before = replica.sm.snapshot()
    assert replica.sm.apply(1, b"") == NoOp()
    assert replica.sm.applied_index == 1
    assert replica.sm.snapshot() != before
    with pytest.raises(AssertionError):
        replica.sm.apply(1, b"")


def test_put_get_revisions_and_versions(replica: Replica) -> None:
    s = replica.open()
    first = replica.do(s, Put(b"a", b"1"))
    assert first == PutResult(KeyValue(b"a", b"1", 2, 2, 1), None)
    second = replica.do(s, Put(b"a", b"2", return_prev=True))
    assert second == PutResult(KeyValue(b"a", b"2", 2, 3, 2), KeyValue(b"a", b"1", 2, 2, 1))
    assert replica.sm.get(b"a") == KeyValue(b"a", b"2", 2, 3, 2)
    assert replica.sm.revision == 3
    assert replica.sm.get(b"missing") is None


def test_range_by_prefix_with_limit_and_paging(replica: Replica) -> None:
    s = replica.open()
    for key in [b"job/2", b"job/1", b"jobs", b"job/3", b"other", b"job\xff"]:
        replica.do(s, Put(key, b"v"))
    kvs, more = replica.sm.range(b"job/")
    assert [kv.key for kv in kvs] == [b"job/1", b"job/2", b"job/3"] and not more
    kvs, more = replica.sm.range(b"job/", limit=2)
    assert [kv.key for kv in kvs] == [b"job/1", b"job/2"] and more
    kvs, more = replica.sm.range(b"job/", limit=2, start_after=b"job/2")
    assert [kv.key for kv in kvs] == [b"job/3"] and not more
    assert [kv.key for kv in replica.sm.range(b"job")[0]] == [
        b"job/1", b"job/2", b"job/3", b"jobs", b"job\xff",
    ]  # fmt: skip
    assert len(replica.sm.range(b"")[0]) == 6
    with pytest.raises(ValueError):
        replica.sm.range(b"", limit=-1)


def test_delete_key_and_prefix(replica: Replica) -> None:
    s = replica.open()
    for key in [b"p/a", b"p/b", b"q"]:
        replica.do(s, Put(key, b"v"))
    assert replica.do(s, Delete(b"nothing")) == DeleteResult(0, ())
    assert replica.do(s, Delete(b"q")) == DeleteResult(1, ())
    result = replica.do(s, Delete(b"p/", prefix=True, return_prev=True))
    assert isinstance(result, DeleteResult) and result.deleted == 2
    assert [kv.key for kv in result.prev] == [b"p/a", b"p/b"]
    assert replica.sm.range(b"")[0] == ()
    assert isinstance(replica.do(s, Delete(b"")), InvalidCommand)
    replica.do(s, Put(b"x", b"1"))
    recreated = replica.do(s, Put(b"x", b"2"))
    assert isinstance(recreated, PutResult) and recreated.kv.version == 2
    replica.do(s, Delete(b"x"))
    again = replica.do(s, Put(b"x", b"3"))
    assert isinstance(again, PutResult) and again.kv.version == 1
    assert again.kv.create_revision == again.kv.mod_revision == replica.index


def test_compare_and_set_each_comparison(replica: Replica) -> None:
    s = replica.open()
    created = replica.do(s, CompareAndSet(b"k", b"v1", must_not_exist=True))
    assert isinstance(created, CompareAndSetResult) and created.succeeded
    assert created.kv is not None
    lost = replica.do(s, CompareAndSet(b"k", b"other", must_not_exist=True))
    assert lost == CompareAndSetResult(False, created.kv)
    wrong_value = replica.do(s, CompareAndSet(b"k", b"v2", expected_value=b"nope"))
    assert wrong_value == CompareAndSetResult(False, created.kv)
    by_value = replica.do(s, CompareAndSet(b"k", b"v2", expected_value=b"v1"))
    assert isinstance(by_value, CompareAndSetResult) and by_value.succeeded
    assert by_value.kv is not None
    stale_revision = created.kv.mod_revision
    assert not _succeeded(
        replica.do(s, CompareAndSet(b"k", b"v3", expected_mod_revision=stale_revision))
    )
    fresh_revision = by_value.kv.mod_revision
    assert _succeeded(
        replica.do(s, CompareAndSet(b"k", b"v3", expected_mod_revision=fresh_revision))
    )
    absent = replica.do(s, CompareAndSet(b"absent", b"v", expected_value=b""))
    assert absent == CompareAndSetResult(False, None)
    assert replica.sm.get(b"k") is not None and replica.sm.get(b"k").value == b"v3"  # type: ignore[union-attr]
    for bad in [CompareAndSet(b"k", b"v"), CompareAndSet(b"k", b"v", b"a", 3)]:
        assert isinstance(replica.do(s, bad), InvalidCommand)


def _succeeded(result: Result) -> bool:
    assert isinstance(result, CompareAndSetResult)
    return result.succeeded


def test_add_counts_in_decimal_ascii(replica: Replica) -> None:
    s = replica.open()
    assert replica.do(s, Add(b"n", 5)) == AddResult(5, KeyValue(b"n", b"5", 2, 2, 1))
    result = replica.do(s, Add(b"n", -7))
    assert isinstance(result, AddResult) and result.value == -2
    assert replica.sm.get(b"n") == result.kv and result.kv.value == b"-2"
    replica.do(s, Put(b"text", b"12a"))
    assert replica.do(s, Add(b"text", 1)) == NotAnInteger(b"text")
    replica.do(s, Put(b"big", str(2**63 - 1).encode()))
    assert replica.do(s, Add(b"big", 1)) == AddOverflow(b"big")
    assert replica.sm.get(b"big") is not None


def test_size_limits_are_typed_failures() -> None:
    replica = Replica(Limits(max_key_bytes=8, max_value_bytes=16))
    s = replica.open()
    assert replica.do(s, Put(b"k" * 9, b"v")) == KeyTooLarge(9, 8)
    assert replica.do(s, Put(b"k", b"v" * 17)) == ValueTooLarge(17, 16)
    assert replica.do(s, CompareAndSet(b"k", b"v" * 17, must_not_exist=True)) == ValueTooLarge(
        17, 16
    )
    assert replica.do(s, Add(b"k" * 9, 1)) == KeyTooLarge(9, 8)
    assert replica.do(s, Delete(b"k" * 9)) == KeyTooLarge(9, 8)
    assert isinstance(replica.do(s, Put(b"", b"v")), InvalidCommand)
    assert isinstance(replica.do(s, Put(b"k" * 8, b"v" * 16)), PutResult)


# ----------------------------------------------------------------------------- sessions


def test_same_sequence_is_applied_once_and_answered_from_cache(replica: Replica) -> None:
    s = replica.open()
    first = replica.apply(Add(b"n", 1), s, 1)
    state = replica.sm.snapshot()
    retry = replica.apply(Add(b"n", 1), s, 1)
    assert retry == first == AddResult(1, KeyValue(b"n", b"1", 2, 2, 1))
    assert replica.sm.get(b"n") == first.kv
    # Only the applied index moved: the store and the cache are untouched.
    replica_again = StateMachine()
    replica_again.restore(state)
    assert replica.sm.get(b"n") == replica_again.get(b"n")
    assert replica.sm.session_info(s) == replica_again.session_info(s)
    # A cached failure is a cached answer too, even once the state would now allow it:
    # lease 5 does not exist at index 4, then the grant at index 5 creates it.
    assert replica.apply(Put(b"k", b"v", lease_id=5), s, 2) == LeaseNotFound(5)
    assert replica.apply(LeaseGrant(1_000), s, 3) == LeaseGrantResult(5, 5, 1_000)
    assert replica.apply(Put(b"k", b"v", lease_id=5), s, 2) == LeaseNotFound(5)
    assert replica.sm.get(b"k") is None


def test_acknowledged_answers_are_dropped_and_refused(replica: Replica) -> None:
    s = replica.open()
    for sequence in (1, 2, 3):
        replica.apply(Put(b"k", b"%d" % sequence), s, sequence)
    info = replica.sm.session_info(s)
    assert info is not None and info.outstanding_answers == 3
    replica.apply(Put(b"k", b"4"), s, 4, first_unacked=3)
    info = replica.sm.session_info(s)
    assert info is not None and (info.first_unacked, info.outstanding_answers) == (3, 2)
    assert replica.apply(Put(b"k", b"again"), s, 2) == SequenceDiscarded(s, 2, 3)
    assert replica.sm.get(b"k").value == b"4"  # type: ignore[union-attr]


def test_outstanding_answers_are_bounded() -> None:
    replica = Replica(Limits(max_outstanding_answers=2))
    s = replica.open()
    replica.apply(Put(b"a", b"1"), s, 1)
    replica.apply(Put(b"a", b"2"), s, 2)
    assert replica.apply(Put(b"a", b"3"), s, 3) == TooManyOutstanding(s, 2)
    assert isinstance(replica.apply(Put(b"a", b"3"), s, 3, first_unacked=2), PutResult)


def test_session_rules_for_headers(replica: Replica) -> None:
    assert isinstance(replica.apply(Put(b"k", b"v")), InvalidCommand)  # no session
    assert replica.apply(Put(b"k", b"v"), 77, 1) == SessionExpired(77)
    s = replica.open()
    assert isinstance(replica.apply(Put(b"k", b"v"), s, 0), InvalidCommand)
    assert isinstance(replica.apply(SessionOpen(1_000), s, 1), InvalidCommand)
    assert isinstance(replica.apply(SessionOpen(0)), InvalidCommand)
    assert replica.apply(SessionKeepAlive(), s) == SessionKeepAliveResult(10_000)
    assert replica.apply(SessionClose(), s) == SessionCloseResult(s)
    assert replica.apply(Put(b"k", b"v"), s, 1) == SessionExpired(s)
    assert replica.apply(SessionClose(), s) == SessionExpired(s)


def test_a_session_keeps_its_owner_through_snapshots_of_both_formats(replica: Replica) -> None:
    plain = replica.open()
    owned = replica.apply(OwnedSessionOpen(10_000, "job:resnet"))
    assert isinstance(owned, SessionOpenResult)
    info = replica.sm.session_info(owned.session_id)
    assert info is not None and info.owner == "job:resnet"
    restored = StateMachine()
    restored.restore(replica.sm.snapshot())
    assert restored.snapshot() == replica.sm.snapshot()
    owners = [restored.session_info(s) for s in (plain, owned.session_id)]
    assert [info.owner if info else None for info in owners] == ["", "job:resnet"]
    # A format 2 snapshot (sessions without an owner) still restores, owned by "".
    current = msgpack.unpackb(replica.sm.snapshot())
    current[0] = 2
    current[7] = [session[:5] for session in current[7]]
    older = StateMachine()
    older.restore(msgpack.packb(current))
    legacy = older.session_info(owned.session_id)
    assert legacy is not None and legacy.owner == ""


def test_sessions_expire_by_leader_time_only(replica: Replica) -> None:
    idle = replica.open(ttl_ms=1_000)
    busy = replica.open(ttl_ms=1_000)
    replica.time_ms += 600
    replica.apply(SessionKeepAlive(), busy)
    replica.time_ms += 400  # idle exactly at its TTL: still alive (expiry is strictly after)
    replica.apply(SessionKeepAlive(), busy)
    assert replica.sm.session_info(idle) is not None
    replica.time_ms += 1
    assert isinstance(replica.apply(SessionKeepAlive(), busy), SessionKeepAliveResult)
    assert replica.sm.session_info(idle) is None
    assert replica.apply(SessionKeepAlive(), idle) == SessionExpired(idle)
    # A leader whose clock is behind does not move time backwards.
    replica.time_ms -= 10_000
    replica.apply(SessionKeepAlive(), busy)
    assert replica.sm.now_ms == 2_001


# ----------------------------------------------------------------------------- leases


def test_lease_ids_are_strictly_increasing_fencing_tokens(replica: Replica) -> None:
    s = replica.open()
    result = replica.do(s, LeaseGrant(3_000))
    assert result == LeaseGrantResult(2, 2, 3_000)
    ids = [replica.grant(s) for _ in range(3)]
    assert ids == sorted(set(ids)) and ids[0] > 2
    assert [lease.lease_id for lease in replica.sm.lease_list()] == [2, *ids]
    assert isinstance(replica.do(s, LeaseGrant(0)), InvalidCommand)


def test_revoke_and_expire_delete_attached_keys(replica: Replica) -> None:
    s = replica.open()
    lease = replica.grant(s)
    other = replica.grant(s)
    replica.do(s, Put(b"b", b"1", lease_id=lease))
    replica.do(s, Put(b"a", b"1", lease_id=lease))
    replica.do(s, Put(b"moved", b"1", lease_id=lease))
    replica.do(s, Put(b"moved", b"2", lease_id=other))  # re-attached elsewhere
    replica.do(s, Put(b"free", b"1"))
    info = replica.sm.lease_info(lease)
    assert info is not None and info.keys == (b"a", b"b")
    assert replica.do(s, LeaseRevoke(lease)) == LeaseEndResult(lease, (b"a", b"b"))
    assert replica.sm.get(b"a") is None and replica.sm.get(b"b") is None
    assert replica.do(s, LeaseRevoke(lease)) == LeaseNotFound(lease)
    assert replica.apply(LeaseExpire(other)) == LeaseEndResult(other, (b"moved",))
    assert replica.apply(LeaseExpire(other)) == LeaseNotFound(other)
    assert [kv.key for kv in replica.sm.range(b"")[0]] == [b"free"]
    assert replica.sm.lease_list() == () and replica.sm.lease_info(lease) is None
    assert replica.do(s, Put(b"k", b"v", lease_id=lease)) == LeaseNotFound(lease)


def test_stale_fences_are_refused(replica: Replica) -> None:
    s = replica.open()
    old = replica.grant(s)
    assert isinstance(replica.do(s, Put(b"ckpt", b"old", fence=Fence(old, old))), PutResult)
    new = replica.grant(s)
    assert new > old
    assert isinstance(replica.do(s, Put(b"ckpt", b"new", fence=Fence(new, new))), PutResult)
    # The old holder's lease still exists, but the key was written under a higher token.
    refused = replica.do(s, Put(b"ckpt", b"late", fence=Fence(old, old)))
    assert isinstance(refused, StaleFence) and refused.key == b"ckpt"
    assert isinstance(replica.do(s, Delete(b"ckpt", fence=Fence(old, old))), StaleFence)
    assert isinstance(replica.do(s, Add(b"ckpt", 1, fence=Fence(old, old))), StaleFence)
    assert isinstance(
        replica.do(s, CompareAndSet(b"ckpt", b"x", expected_value=b"new", fence=Fence(old, old))),
        StaleFence,
    )
    # A token that is not the lease's, and a lease that is gone.
    assert isinstance(replica.do(s, Put(b"other", b"v", fence=Fence(new, new + 1))), StaleFence)
    replica.do(s, LeaseRevoke(old))
    assert isinstance(replica.do(s, Put(b"fresh", b"v", fence=Fence(old, old))), StaleFence)
    assert replica.sm.get(b"ckpt").value == b"new"  # type: ignore[union-attr]
    # A deleted key keeps its highest token: the stale holder cannot recreate it.
    replica.do(s, Delete(b"ckpt", fence=Fence(new, new)))
    newest = replica.grant(s)
    replica.do(s, LeaseRevoke(new))
    assert isinstance(replica.do(s, Put(b"ckpt", b"v", fence=Fence(newest, newest))), PutResult)


# ----------------------------------------------------------------------------- watch


def test_events_are_ordered_per_revision_and_filtered(replica: Replica) -> None:
    s = replica.open()
    lease = replica.grant(s)
    replica.do(s, Put(b"w/a", b"1", lease_id=lease))
    replica.do(s, Put(b"w/b", b"1", lease_id=lease))
    replica.do(s, Put(b"x", b"1"))
    replica.do(s, Put(b"w/a", b"2", lease_id=lease))
    replica.do(s, LeaseRevoke(lease))
    events = replica.sm.events_since(1, b"w/", prefix=True)
    assert not isinstance(events, Compacted)
    summary = [(e.revision, e.type, e.kv.key, e.kv.value) for e in events]
    revoke = replica.index
    assert summary == [
        (3, EventType.PUT, b"w/a", b"1"),
        (4, EventType.PUT, b"w/b", b"1"),
        (6, EventType.PUT, b"w/a", b"2"),
        (revoke, EventType.DELETE, b"w/a", b""),
        (revoke, EventType.DELETE, b"w/b", b""),
    ]
    assert events[3].prev is not None and events[3].prev.value == b"2"
    single = replica.sm.events_since(5, b"x")
    assert not isinstance(single, Compacted)
    assert [(e.revision, e.kv.key) for e in single] == [(5, b"x")]
    assert replica.sm.events_since(revoke + 1, b"", prefix=True) == ()


def test_history_is_bounded_and_reports_compaction() -> None:
    replica = Replica(Limits(max_history_events=3))
    s = replica.open()
    for key in [b"p/a", b"p/b"]:
        replica.do(s, Put(key, b"v"))  # revisions 2, 3
    replica.do(s, Delete(b"p/", prefix=True))  # revision 4: two events
    replica.do(s, Put(b"q", b"v"))  # revision 5: the oldest whole revisions go
    assert replica.sm.events_since(3, b"", prefix=True) == Compacted(4)
    kept = replica.sm.events_since(4, b"", prefix=True)
    assert not isinstance(kept, Compacted)
    assert [e.revision for e in kept] == [4, 4, 5]
    # The compaction point survives a snapshot, so a restored member answers the same.
    restored = StateMachine(Limits(max_history_events=3))
    restored.restore(replica.sm.snapshot())
    assert restored.events_since(3, b"", prefix=True) == Compacted(4)
    assert restored.events_since(4, b"", prefix=True) == kept
    with pytest.raises(ValueError):
        restored.events_since(0, b"")


def test_history_bounded_by_bytes_drops_whole_revisions() -> None:
    # A revision goes once the revisions after it hold max_history_bytes.
    replica = Replica(Limits(max_history_bytes=100))
    s = replica.open()
    replica.do(s, Put(b"a", b"x" * 60))  # revision 2
    replica.do(s, Put(b"b", b"y" * 60))  # revision 3: 61 bytes after revision 2
    assert len(replica.sm.history) == 2
    replica.do(s, Put(b"c", b"z" * 60))  # revision 4: 122 bytes after revision 2
    assert replica.sm.events_since(2, b"a") == Compacted(3)
    assert len(replica.sm.history) == 2


def test_a_revision_larger_than_the_history_bound_stays_as_long_as_a_small_one() -> None:
    """A prefix delete of more keys than max_history_events is one revision: a watcher that
    was caught up before it still reads it, until as many newer events arrived as for any
    other revision (the fault: the delete dropped itself, "oldest" past the head)."""
    replica = Replica(Limits(max_history_events=3))
    s = replica.open()
    for i in range(5):
        replica.do(s, Put(b"big/%d" % i, b"v"))  # revisions 2..6
    replica.do(s, Delete(b"big/", prefix=True))  # revision 7: five events
    deleted = replica.sm.events_since(7, b"big/", prefix=True)
    assert not isinstance(deleted, Compacted) and len(deleted) == 5
    replica.do(s, Put(b"after/1", b"v"))  # revision 8, in the same apply batch as the delete
    replica.do(s, Put(b"after/2", b"v"))  # revision 9
    still = replica.sm.events_since(7, b"", prefix=True)
    assert not isinstance(still, Compacted)
    assert [e.revision for e in still] == [7] * 5 + [8, 9]
    replica.do(s, Put(b"after/3", b"v"))  # revision 10: three newer events, the bound
    assert replica.sm.events_since(7, b"", prefix=True) == Compacted(8)


def test_a_frozen_copy_does_not_see_later_applies(replica: Replica) -> None:
    """The node encodes snapshots of a frozen copy on another thread while it keeps
    applying: the copy must snapshot to exactly the state it was taken at."""
    s = replica.open()
    lease = replica.grant(s)
    replica.do(s, Put(b"a", b"1", lease_id=lease))
    replica.do(s, Put(b"b", b"2"))
    replica.do(s, Join("j", "w0", b"", JobConfig(min_nodes=2, max_nodes=2)))
    copy = replica.sm.frozen_copy()
    at_copy = replica.sm.snapshot()
    assert copy.snapshot() == at_copy
    # Every part changes after the copy: keys, fences, leases, sessions, history, jobs.
    replica.do(s, Put(b"a", b"3", lease_id=lease))
    replica.do(s, Delete(b"b"))
    fencing = replica.grant(s)
    replica.do(s, Put(b"c", b"4", fence=Fence(fencing, fencing)))
    replica.do(s, Join("j", "w1", b"", None))
    other = replica.open()
    replica.do(other, LeaseRevoke(lease))
    replica.time_ms += 60_000
    replica.apply(SessionKeepAlive(), other, 0)
    assert replica.sm.snapshot() != at_copy
    assert copy.snapshot() == at_copy
    assert copy.applied_index < replica.sm.applied_index


def test_frozen_copy_refuses_a_state_field_it_does_not_know(replica: Replica) -> None:
    replica.sm.cache = {}  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match="cache"):
        replica.sm.frozen_copy()
