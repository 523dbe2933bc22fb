"""The replicated state machine: applies committed entries, answers reads, snapshots.

Theory of operation. Every replica applies the same committed entries in the same order and
must reach the same state, byte for byte: ``apply`` is a pure function of the current state
and the entry. So nothing here reads a clock (time is the largest ``leader_time_ms`` applied
so far, ``now_ms``), draws a random number, or iterates a hash-ordered container of strings
or bytes (their order depends on the process's hash seed): maps are walked in sorted order.

An entry's data is an encoded :class:`~.commands.Envelope`; empty data is the leader's no-op.
Applying one envelope: advance ``now_ms``; expire idle sessions; then, for a session command,
apply it at most once per (session, sequence) and cache its answer (see :mod:`.sessions`).
Every key-value change made by the entry at raft index ``i`` has revision ``i``, and its
events enter the watch history together.

Rendezvous, round-store and checkpoint commands are delegated to :mod:`.rendezvous`,
:mod:`.roundstore` and :mod:`.checkpoints` (each states its own rules); this module only
routes them, fencing round-scoped writes through the rendezvous first. A session that ends
(expired or closed) removes its rendezvous participants as failed, at the same index on
every replica.

Expected outcomes (a failed compare, a stale fence, an unknown lease, an expired session) are
returned as :mod:`.errors` values; an exception means a broken invariant or a corrupt entry,
and the replica must stop rather than diverge.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from rallypoint.proto.v1.counters import fits_int64, parse_counter

from ..version import BASELINE_RECORD_VERSION
from . import codec
from .commands import (
    Add,
    CheckpointCommand,
    CloseRound,
    ClusterVersion,
    CompareAndSet,
    Delete,
    Drain,
    Envelope,
    JobCommand,
    LeaseExpire,
    LeaseGrant,
    LeaseRevoke,
    MemberFailed,
    MemorySnapshotCommit,
    OwnedSessionOpen,
    PruneJobs,
    Put,
    RoundTrained,
    SessionClose,
    SessionCommand,
    SessionKeepAlive,
    SessionOpen,
    StoreCommand,
    decode_envelope,
)
from .errors import (
    AddOverflow,
    Compacted,
    Failure,
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
from .kv import KeyValueStore
from .leases import LeaseInfo, LeaseTable
from .limits import Limits as Limits
from .rendezvous import Rendezvous
from .results import (
    AddResult,
    ClusterVersionResult,
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
from .sessions import Session, SessionInfo, SessionTable
from .values import Event, EventType, Fence, KeyValue
from .watch import WatchHistory

# Test-only: breaks linearizability/fencing on purpose for the fault-injection suite's negative
# controls (tests/jepsen). With RALLYPOINT_UNSAFE_ACCEPT_STALE_FENCE=1 in the environment when a
# member starts, _check_fence accepts any token (and _record_fence records none). Every member
# of such a cluster gets the same environment, so the state machine stays deterministic. Never
# set it outside that suite.
UNSAFE_ACCEPT_STALE_FENCE = os.environ.get("RALLYPOINT_UNSAFE_ACCEPT_STALE_FENCE") == "1"

# 3: each session carries its owner (``OwnedSessionOpen``). Format 2 (sessions without one)
# is still restored, its sessions owned by "". 4: each job carries its lifecycle (state, when
# it ended, why; rendezvous.py); formats 2 and 3 are still restored, their jobs open or
# closed. A field added to a record inside the snapshot (a round's ``restore``) needs no new
# snapshot format: the record's own format version says it (codec.py, "Format versions").
# 5: the rendezvous state carries ``next_participant_id`` (a JoinBatch handed out ids beyond
# the log); written only while that is set, format 4 otherwise, so a cluster that runs no
# batch writes the bytes it always wrote and an older member refuses only what it cannot read.
# 6: a job's checkpoint registry may carry its latest memory snapshot (checkpoints.py), and
# the rendezvous state carries ``next_participant_id`` as in 5 (0 when unset); written only
# while some job holds a memory snapshot (``Rendezvous.snapshot_format`` picks the oldest
# format that holds the state).
# 7: the rendezvous state carries the drained failure domains after
# ``next_participant_id``; written only while a domain is drained.
# 8: the last element is [the format 4..7 the rendezvous state is in, that state, the cluster
# version] (coordinator/version.py);
# written exactly while the cluster version is 2 or more, so the snapshot format follows the
# cluster version: a cluster some member of the baseline may still join writes format 7 or
# older, and a member of the baseline opening a format-8 snapshot refuses it in one line
# ("snapshot format 8 is newer ...": it is older than the cluster).
SNAPSHOT_FORMAT = 8
_SNAPSHOT_FORMATS = {2: 5, 3: 6, 4: 6, 5: 6, 6: 6, 7: 6, 8: 6}  # format -> fields per session
# The snapshot format that carries the cluster version, and the first cluster version it may
# be written at.
_CLUSTER_VERSION_FORMAT = 8


# What frozen_copy copies: the immutable limits and counters shallowly, the rest as it says.
_FIELDS = frozenset(
    {
        "limits",
        "applied_index",
        "now_ms",
        "revision",
        "kv",
        "leases",
        "sessions",
        "history",
        "rendezvous",
        "cluster_version",
    }
)


class StateMachine:
    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        # Invariant: the index of the last entry applied (or restored); only grows.
        self.applied_index = 0
        # The largest leader clock reading applied; only grows.
        self.now_ms = 0
        # The raft index of the last key-value change. Invariant: <= applied_index.
        self.revision = 0
        self.kv = KeyValueStore()
        self.leases = LeaseTable()
        self.sessions = SessionTable()
        self.history = WatchHistory(self.limits.max_history_events, self.limits.max_history_bytes)
        self.rendezvous = Rendezvous(self.limits.rendezvous)
        # The cluster version (coordinator/version.py) as committed by ClusterVersion
        # commands. Invariant: >= BASELINE_RECORD_VERSION; only grows.
        self.cluster_version = BASELINE_RECORD_VERSION

    # ----------------------------------------------------------------- applying entries

    def apply(self, index: int, data: bytes, decoded: Envelope | None = None) -> Result:
        """Apply the committed entry at ``index``. Raises on a corrupt entry (the log is
        shared by every replica, so skipping it would diverge) or an out-of-order index.
        ``decoded``: ``data`` already decoded (by a follower validating it), used as is."""
        if index <= self.applied_index:
            raise AssertionError(f"entry {index} applied after {self.applied_index}")
        self.applied_index = index
        if not data:
            return NoOp()
        envelope = decode_envelope(data) if decoded is None else decoded
        self.now_ms = max(self.now_ms, envelope.leader_time_ms)
        expired = self.sessions.expire(self.now_ms)
        if expired:
            self.rendezvous.sessions_ended(index, self.now_ms, expired)
        return self._apply_envelope(index, envelope)

    def _apply_envelope(self, index: int, envelope: Envelope) -> Result:
        command = envelope.command
        if isinstance(command, SessionOpen):
            if envelope.session_id or envelope.sequence:
                return InvalidCommand("SessionOpen is sent with session_id 0 and sequence 0")
            if command.ttl_ms <= 0:
                return InvalidCommand(f"session ttl_ms must be positive, got {command.ttl_ms}")
            owner = command.owner if isinstance(command, OwnedSessionOpen) else ""
            self.sessions.open(index, command.ttl_ms, self.now_ms, owner)
            return SessionOpenResult(index, command.ttl_ms)
        if isinstance(command, LeaseExpire):
            return self._end_lease(index, command.lease_id)
        if isinstance(command, ClusterVersion):
            # Never lowered: a stale proposal (a leader that had not seen a raise) changes
            # nothing.
            raised = command.version > self.cluster_version
            self.cluster_version = max(self.cluster_version, command.version)
            self.rendezvous.cluster_version = self.cluster_version
            return ClusterVersionResult(self.cluster_version, raised)
        if isinstance(command, CloseRound):
            return self.rendezvous.close_round(index, self.now_ms, command)
        if isinstance(command, MemberFailed):
            return self.rendezvous.member_failed(index, self.now_ms, command)
        if isinstance(command, RoundTrained):
            return self.rendezvous.round_trained(index, self.now_ms, command)
        if envelope.session_id == 0:
            return InvalidCommand(f"{type(command).__name__} requires a session")
        session = self.sessions.get(envelope.session_id)
        if session is None:
            return SessionExpired(envelope.session_id)
        self.sessions.touch(session, self.now_ms)
        session.acknowledge(envelope.first_unacked)
        if isinstance(command, SessionKeepAlive):
            return SessionKeepAliveResult(session.ttl_ms)
        if isinstance(command, SessionClose):
            self.sessions.close(session.session_id)
            self.rendezvous.sessions_ended(index, self.now_ms, [session.session_id])
            return SessionCloseResult(session.session_id)
        if not isinstance(command, SessionCommand):
            raise AssertionError(f"no rule to apply {command!r}")
        return self._apply_once(index, session, envelope.sequence, command)

    def _apply_once(
        self, index: int, session: Session, sequence: int, command: SessionCommand
    ) -> Result:
        if sequence < 1:
            return InvalidCommand(f"{type(command).__name__} requires a sequence >= 1")
        if sequence < session.first_unacked:
            return SequenceDiscarded(session.session_id, sequence, session.first_unacked)
        cached = session.answers.get(sequence)
        if cached is not None:
            return cached
        if len(session.answers) >= self.limits.max_outstanding_answers:
            return TooManyOutstanding(session.session_id, self.limits.max_outstanding_answers)
        result = self._execute(index, session.session_id, command)
        session.answers[sequence] = result
        return result

    def _execute(self, index: int, session_id: int, command: SessionCommand) -> Result:
        if isinstance(command, Put):
            return self._put(index, command)
        if isinstance(command, Delete):
            return self._delete(index, command)
        if isinstance(command, CompareAndSet):
            return self._compare_and_set(index, command)
        if isinstance(command, Add):
            return self._add(index, command)
        if isinstance(command, LeaseGrant):
            if command.ttl_ms <= 0:
                return InvalidCommand(f"lease ttl_ms must be positive, got {command.ttl_ms}")
            self.leases.grant(index, command.ttl_ms)
            return LeaseGrantResult(index, index, command.ttl_ms)
        if isinstance(command, LeaseRevoke):
            return self._end_lease(index, command.lease_id)
        if isinstance(command, JobCommand):
            return self.rendezvous.execute(index, session_id, self.now_ms, command)
        if isinstance(command, PruneJobs):
            return self.rendezvous.prune(index, self.now_ms, command)
        if isinstance(command, Drain):
            return self.rendezvous.drain(index, self.now_ms, command)
        if isinstance(command, StoreCommand):
            store = self.rendezvous.member_store(command.job, command.round, command.participant_id)
            if isinstance(store, Failure):
                return store
            return store.execute(command, self.limits.rendezvous)
        if isinstance(command, CheckpointCommand):
            job = self.rendezvous.fenced_job(command.job, command.round, command.fencing_token)
            world_size = 0 if isinstance(job, Failure) else len(job.round.members)
            planned = isinstance(command, MemorySnapshotCommit) and command.planned_end
            if isinstance(job, Failure) and planned:
                # The final snapshot of the round that just ended by plan (rendezvous.py,
                # "Drain"), fenced by that round.
                job = self.rendezvous.planned_end_job(
                    command.job, command.round, command.fencing_token
                )
                if not isinstance(job, Failure):
                    world_size = len(job.history[-1].members)
            if isinstance(job, Failure):
                return job
            return job.checkpoints.execute(
                job.job_id,
                index,
                self.now_ms,
                world_size,
                job.config.keep_checkpoints,
                command,
                self.limits.rendezvous,
            )
        raise AssertionError(f"no rule to execute {command!r}")

    # ----------------------------------------------------------------- key-value writes

    def _check_write(
        self, key: bytes, value: bytes, lease_id: int, fence: Fence | None
    ) -> Failure | None:
        if not key:
            return InvalidCommand("the key must not be empty")
        if len(key) > self.limits.max_key_bytes:
            return KeyTooLarge(len(key), self.limits.max_key_bytes)
        if len(value) > self.limits.max_value_bytes:
            return ValueTooLarge(len(value), self.limits.max_value_bytes)
        if lease_id and self.leases.get(lease_id) is None:
            return LeaseNotFound(lease_id)
        return self._check_fence(fence, [key])

    def _check_fence(self, fence: Fence | None, keys: list[bytes]) -> StaleFence | None:
        """Refuse a fenced write whose token is not the lease's, or is below a token a key
        was already written under (a newer holder got there first)."""
        if fence is None or UNSAFE_ACCEPT_STALE_FENCE:
            return None
        key = keys[0] if keys else b""
        lease = self.leases.get(fence.lease_id)
        if lease is None:
            return StaleFence(key, fence.lease_id, fence.token, "the lease no longer exists")
        if fence.token != lease.fencing_token:
            detail = f"the lease's token is {lease.fencing_token}"
            return StaleFence(key, fence.lease_id, fence.token, detail)
        for key in keys:
            highest = self.kv.fence_token(key)
            if fence.token < highest:
                detail = f"key {key!r} was written under token {highest}"
                return StaleFence(key, fence.lease_id, fence.token, detail)
        return None

    def _record_fence(self, fence: Fence | None, keys: list[bytes]) -> None:
        # Under the test-only switch a stale token is accepted but not recorded (the store
        # keeps the highest token as an invariant).
        if fence is not None and not UNSAFE_ACCEPT_STALE_FENCE:
            for key in keys:
                self.kv.record_fence_token(key, fence.token)

    def _write(
        self, index: int, key: bytes, value: bytes, lease_id: int, fence: Fence | None
    ) -> tuple[KeyValue, KeyValue | None]:
        previous = self.kv.get(key)
        if previous is not None and previous.lease_id != lease_id:
            self.leases.detach(previous.lease_id, key)
        kv = self.kv.put(key, value, index, lease_id)
        self.leases.attach(lease_id, key)
        self._record_fence(fence, [key])
        self.revision = index
        self.history.append([Event(EventType.PUT, kv, previous)])
        return kv, previous

    def _delete_keys(self, index: int, keys: list[bytes]) -> list[KeyValue]:
        """Delete existing ``keys`` (sorted) at revision ``index``, as one revision."""
        deleted = self.kv.delete_many(keys)
        if not deleted:
            return deleted
        detach = self.leases.detach
        for previous in deleted:
            if previous.lease_id:
                detach(previous.lease_id, previous.key)
        delete = EventType.DELETE
        self.revision = index
        self.history.append(
            [Event(delete, KeyValue(kv.key, b"", 0, index, 0), kv) for kv in deleted]
        )
        return deleted

    def _put(self, index: int, command: Put) -> Result:
        lease_id = command.lease_id
        if command.keep_lease:
            if lease_id:
                return InvalidCommand("a put keeps the key's lease or sets lease_id, not both")
            current = self.kv.get(command.key)
            lease_id = current.lease_id if current is not None else 0
        failure = self._check_write(command.key, command.value, lease_id, command.fence)
        if failure is not None:
            return failure
        kv, previous = self._write(index, command.key, command.value, lease_id, command.fence)
        return PutResult(kv, previous if command.return_prev else None)

    def _delete(self, index: int, command: Delete) -> Result:
        if not command.key and not command.prefix:
            return InvalidCommand("the key must not be empty (use prefix to delete everything)")
        if len(command.key) > self.limits.max_key_bytes:
            return KeyTooLarge(len(command.key), self.limits.max_key_bytes)
        if command.prefix:
            keys = self.kv.prefix_keys(command.key)
        else:
            keys = [command.key] if self.kv.get(command.key) is not None else []
        failure = self._check_fence(command.fence, keys or [command.key])
        if failure is not None:
            return failure
        deleted = self._delete_keys(index, keys)
        self._record_fence(command.fence, keys or [command.key])
        return DeleteResult(len(deleted), tuple(deleted) if command.return_prev else ())

    def _compare_and_set(self, index: int, command: CompareAndSet) -> Result:
        comparisons = (
            (command.expected_value is not None)
            + (command.expected_mod_revision is not None)
            + command.must_not_exist
        )
        if comparisons != 1:
            return InvalidCommand(
                f"compare-and-set needs exactly one comparison, got {comparisons}"
            )
        failure = self._check_write(command.key, command.value, command.lease_id, command.fence)
        if failure is not None:
            return failure
        current = self.kv.get(command.key)
        if command.must_not_exist:
            holds = current is None
        elif command.expected_value is not None:
            holds = current is not None and current.value == command.expected_value
        else:
            holds = current is not None and current.mod_revision == command.expected_mod_revision
        if not holds:
            return CompareAndSetResult(False, current)
        kv, _ = self._write(index, command.key, command.value, command.lease_id, command.fence)
        return CompareAndSetResult(True, kv)

    def _add(self, index: int, command: Add) -> Result:
        failure = self._check_write(command.key, b"", command.lease_id, command.fence)
        if failure is not None:
            return failure
        current = self.kv.get(command.key)
        base = 0 if current is None else parse_counter(current.value)
        if base is None:
            return NotAnInteger(command.key)
        total = base + command.delta
        if not fits_int64(total):
            return AddOverflow(command.key)
        value = str(total).encode("ascii")
        kv, _ = self._write(index, command.key, value, command.lease_id, command.fence)
        return AddResult(total, kv)

    def _end_lease(self, index: int, lease_id: int) -> Result:
        lease = self.leases.get(lease_id)
        if lease is None:
            return LeaseNotFound(lease_id)
        keys = sorted(lease.keys)
        self._delete_keys(index, keys)
        self.leases.remove(lease_id)
        return LeaseEndResult(lease_id, tuple(keys))

    # ----------------------------------------------------------------- reads

    def get(self, key: bytes) -> KeyValue | None:
        return self.kv.get(key)

    def range(
        self,
        prefix: bytes,
        limit: int = 0,
        start_after: bytes = b"",
        *,
        max_bytes: int = 0,
        count_values: bool = True,
    ) -> tuple[tuple[KeyValue, ...], bool]:
        """Keys under ``prefix`` in key order, at most ``limit`` (0: all) and ``max_bytes``
        (0: no bound; see ``KeyValueStore.range``); True if cut."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        return self.kv.range(prefix, limit, start_after, max_bytes, count_values)

    def count_prefix(self, prefix: bytes) -> int:
        """How many keys start with ``prefix`` (O(log n))."""
        return self.kv.count_prefix(prefix)

    def lease_key_count(self, lease_id: int) -> int:
        """How many keys the lease holds (0 when it does not exist)."""
        lease = self.leases.get(lease_id)
        return 0 if lease is None else len(lease.keys)

    def lease_list(self) -> tuple[LeaseInfo, ...]:
        return tuple(self.leases.info(lease, with_keys=False) for lease in self.leases.in_order())

    def lease_info(self, lease_id: int) -> LeaseInfo | None:
        lease = self.leases.get(lease_id)
        return None if lease is None else self.leases.info(lease)

    def session_info(self, session_id: int) -> SessionInfo | None:
        s = self.sessions.get(session_id)
        if s is None:
            return None
        return SessionInfo(
            s.session_id, s.ttl_ms, s.last_activity_ms, s.first_unacked, len(s.answers), s.owner
        )

    def events_since(
        self, revision: int, key: bytes, prefix: bool = False
    ) -> tuple[Event, ...] | Compacted:
        """Changes at ``revision`` (>= 1) or later to ``key`` (or under it), in order."""
        if revision < 1:
            raise ValueError(f"revision must be >= 1, got {revision}")
        return self.history.events_since(revision, key, prefix)

    # ----------------------------------------------------------------- snapshots

    def frozen_copy(self) -> StateMachine:
        """A copy that later applies do not change, so ``snapshot()`` can encode it on
        another thread while this machine keeps applying (the node takes it on the event
        loop, between applies). The large parts, the keys and the watch history, hold frozen
        values, so their containers are copied without a Python step per item; the small
        mutable parts (leases, sessions) are copied deeply, and the rendezvous jobs by
        ``Rendezvous.copy`` (their containers copied, their frozen records shared: a job of
        100,000 participants copies in C-speed steps)."""
        if set(vars(self)) != _FIELDS:
            # A new field must be copied here too, or a snapshot could see later applies.
            raise AssertionError(f"frozen_copy does not know fields {set(vars(self)) ^ _FIELDS}")
        clone = copy.copy(self)
        clone.kv = self.kv.copy()
        clone.history = self.history.copy()
        clone.leases = copy.deepcopy(self.leases)
        clone.sessions = copy.deepcopy(self.sessions)
        clone.rendezvous = self.rendezvous.copy()
        return clone

    def snapshot(self) -> bytes:
        """Canonical bytes of the whole state: equal states give equal bytes."""
        sessions = [
            [
                s.session_id,
                s.ttl_ms,
                s.last_activity_ms,
                s.first_unacked,
                [[seq, codec.to_obj(s.answers[seq])] for seq in sorted(s.answers)],
                s.owner,
            ]
            for s in self.sessions.in_order()
        ]
        rendezvous = self.rendezvous.to_obj()
        snapshot_format = self.rendezvous.snapshot_format()
        if self.cluster_version > BASELINE_RECORD_VERSION:
            snapshot_format = _CLUSTER_VERSION_FORMAT
            rendezvous = [self.rendezvous.snapshot_format(), rendezvous, self.cluster_version]
        return codec.pack_sliced(
            [
                snapshot_format,
                self.applied_index,
                self.now_ms,
                self.revision,
                [codec.to_obj(kv) for kv in self.kv.in_order()],
                [[key, token] for key, token in self.kv.fence_tokens_in_order()],
                [[lease.lease_id, lease.ttl_ms] for lease in self.leases.in_order()],
                sessions,
                self.history.compacted_revision,
                [codec.to_obj(event) for event in self.history.in_order()],
                rendezvous,
            ]
        )

    def adopt(self, other: StateMachine) -> None:
        """Take ``other``'s state (a machine restored off the event loop from the snapshot
        being installed): as ``restore`` would, without decoding on the loop. ``other`` must
        not be used afterwards."""
        if other.limits != self.limits:
            raise AssertionError("adopting a state decoded under other limits")
        for name in _FIELDS - {"limits"}:
            setattr(self, name, getattr(other, name))

    def restore(self, data: bytes) -> None:
        """Replace the state with a snapshot's. Raises StateCodecError on malformed data."""
        obj = _array(codec.unpack(data), 11, "snapshot")
        session_fields = _SNAPSHOT_FORMATS.get(obj[0]) if type(obj[0]) is int else None
        if session_fields is None:
            readable = f"the formats this build reads ({min(_SNAPSHOT_FORMATS)}..{SNAPSHOT_FORMAT})"
            if type(obj[0]) is int and obj[0] > SNAPSHOT_FORMAT:
                raise codec.StateCodecError(
                    f"snapshot format {obj[0]} is newer than {readable}: it was written by a "
                    "newer version of rallypoint; upgrade this member"
                )
            raise codec.StateCodecError(f"snapshot format {obj[0]!r} is not one of {readable}")
        applied_index, now_ms, revision = (_int(v) for v in obj[1:4])
        kvs = [codec.from_obj(item, KeyValue) for item in _list(obj[4])]
        tokens = [_pair(item, bytes) for item in _list(obj[5])]
        leases = LeaseTable()
        for item in _list(obj[6]):
            lease_id, ttl_ms = _pair(item, int)
            leases.grant(lease_id, ttl_ms)
        for kv in kvs:
            if kv.lease_id and leases.get(kv.lease_id) is None:
                raise codec.StateCodecError(f"key {kv.key!r} names missing lease {kv.lease_id}")
            leases.attach(kv.lease_id, kv.key)
        sessions = SessionTable()
        for item in _list(obj[7]):
            fields = _array(item, session_fields, "session")
            session_id, ttl_ms, last_activity_ms, first_unacked, answers = fields[:5]
            owner = fields[5] if session_fields > 5 else ""
            if type(owner) is not str:
                raise codec.StateCodecError(f"session owner is not a string: {owner!r}"[:200])
            session = Session(
                _int(session_id),
                _int(ttl_ms),
                _int(last_activity_ms),
                _int(first_unacked),
                owner=owner,
            )
            for answer in _list(answers):
                sequence, result = _array(answer, 2, "cached answer")
                session.answers[_int(sequence)] = codec.from_obj(result, Result)
            sessions.add_restored(session)
        history = WatchHistory(self.limits.max_history_events, self.limits.max_history_bytes)
        history.restore(_int(obj[8]), [codec.from_obj(item, Event) for item in _list(obj[9])])
        rendezvous_format, rendezvous_obj, cluster_version = (
            obj[0],
            obj[10],
            BASELINE_RECORD_VERSION,
        )
        if obj[0] >= _CLUSTER_VERSION_FORMAT:
            rendezvous_format, rendezvous_obj, cluster_version = _array(
                obj[10], 3, "versioned rendezvous state"
            )
            if rendezvous_format not in (4, 5, 6, 7):
                raise codec.StateCodecError(f"rendezvous format {rendezvous_format!r} in format 8")
            if type(cluster_version) is not int or cluster_version <= BASELINE_RECORD_VERSION:
                raise codec.StateCodecError(f"malformed cluster version {cluster_version!r}")
        rendezvous = Rendezvous(self.limits.rendezvous)
        rendezvous.cluster_version = cluster_version
        rendezvous.restore(
            rendezvous_obj,
            lifecycle=rendezvous_format >= 4,
            high_water=rendezvous_format >= 5,
            memory_snapshots=rendezvous_format >= 6,
            drained=rendezvous_format >= 7,
        )

        self.applied_index, self.now_ms, self.revision = applied_index, now_ms, revision
        self.kv = KeyValueStore()
        self.kv.restore(kvs, tokens)
        self.leases, self.sessions, self.history = leases, sessions, history
        self.rendezvous = rendezvous
        self.cluster_version = cluster_version


def _list(obj: Any) -> list[Any]:
    if not isinstance(obj, list):
        raise codec.StateCodecError(f"expected an array, got {obj!r}"[:200])
    return obj


def _array(obj: Any, length: int, what: str) -> list[Any]:
    if not isinstance(obj, list) or len(obj) != length:
        raise codec.StateCodecError(f"malformed {what}: {obj!r}"[:200])
    return obj


def _int(obj: Any) -> int:
    if type(obj) is not int:
        raise codec.StateCodecError(f"expected an integer, got {obj!r}"[:200])
    return obj


def _pair(obj: Any, first: type[Any]) -> tuple[Any, int]:
    a, b = _array(obj, 2, "pair")
    if type(a) is not first:
        raise codec.StateCodecError(f"expected {first.__name__}, got {a!r}"[:200])
    return a, _int(b)
