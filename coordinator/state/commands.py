"""Commands: what the leader proposes and every replica applies, and their envelope.

Each command is a frozen record (see :mod:`.codec`), wrapped in an :class:`Envelope` that
names the client request it came from and carries the leader's clock reading. Time enters
the state machine only through ``Envelope.leader_time_ms``: followers never read a clock.

Which commands need a session (``session_id != 0`` and ``sequence >= 1``, applied at most once
and their answer cached; Raft thesis 6.3): every KV write and lease grant and revoke, and
every rendezvous, round-store and checkpoint command a client sends. The others are
documented where they are defined: :class:`SessionOpen` creates the session,
:class:`SessionKeepAlive` and :class:`SessionClose` name the session without a sequence
(repeating them changes nothing more), and :class:`LeaseExpire`, :class:`CloseRound` and
:class:`MemberFailed` are the leader's own decisions with no client behind them (each
re-checks its condition when applied, so a repeated or stale one changes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

from .codec import StateCodecError, decode, encode, record, since
from .jobs import EndReason, JobConfig, LeaveOutcome
from .values import Fence


@dataclass(frozen=True, slots=True)
class Command:
    """Base of every command."""


@dataclass(frozen=True, slots=True)
class SessionCommand(Command):
    """A command that must carry (session_id, sequence) and is applied at most once."""


@record(1)
@dataclass(frozen=True, slots=True)
class Put(SessionCommand):
    key: bytes
    value: bytes
    lease_id: int = 0
    fence: Fence | None = None
    return_prev: bool = False
    # Keep the key's current lease (``lease_id`` must be 0); a new key gets none. Record
    # version 2 (coordinator/version.py): refused below cluster version 2.
    keep_lease: bool = since(2, False)


@record(2)
@dataclass(frozen=True, slots=True)
class Delete(SessionCommand):
    """Delete ``key``, or every key starting with it when ``prefix`` (all in one revision)."""

    key: bytes
    prefix: bool = False
    fence: Fence | None = None
    return_prev: bool = False


@record(3)
@dataclass(frozen=True, slots=True)
class CompareAndSet(SessionCommand):
    """Set ``key`` to ``value`` if exactly one comparison holds: the current value equals
    ``expected_value``, or its mod_revision equals ``expected_mod_revision``, or (with
    ``must_not_exist``) the key is absent."""

    key: bytes
    value: bytes
    expected_value: bytes | None = None
    expected_mod_revision: int | None = None
    must_not_exist: bool = False
    lease_id: int = 0
    fence: Fence | None = None


@record(4)
@dataclass(frozen=True, slots=True)
class Add(SessionCommand):
    """Add ``delta`` to the decimal integer stored at ``key`` (absent counts as 0)."""

    key: bytes
    delta: int
    lease_id: int = 0
    fence: Fence | None = None


@record(5)
@dataclass(frozen=True, slots=True)
class LeaseGrant(SessionCommand):
    ttl_ms: int


@record(6)
@dataclass(frozen=True, slots=True)
class LeaseRevoke(SessionCommand):
    lease_id: int


@record(7)
@dataclass(frozen=True, slots=True)
class LeaseExpire(Command):
    """Proposed by the leader's lessor when a lease's deadline passed; no session. Applied if
    the lease still exists (a keep-alive racing with expiry loses, which is safe: the holder
    learns from its next keep-alive that the lease is gone)."""

    lease_id: int


@record(8)
@dataclass(frozen=True, slots=True)
class SessionOpen(Command):
    """Opens a session whose id is the raft index of this entry. Sent with session_id 0 and
    sequence 0: not idempotent, a retried open makes a second session that expires unused."""

    ttl_ms: int


@record(11)
@dataclass(frozen=True, slots=True)
class OwnedSessionOpen(SessionOpen):
    """A SessionOpen by an authenticated client: the session belongs to the client's role
    (``owner``, e.g. ``"job:resnet"``), and only that role (or admin) may use it afterwards
    (``service/authz.py``). A session opened with plain SessionOpen has owner ""."""

    owner: str


@record(9)
@dataclass(frozen=True, slots=True)
class SessionKeepAlive(Command):
    """Records activity for the envelope's session (sequence 0)."""


@record(10)
@dataclass(frozen=True, slots=True)
class SessionClose(Command):
    """Ends the envelope's session and drops its cached answers (sequence 0)."""


# ---------------------------------------------------------------- rendezvous (tags 40-49)


@dataclass(frozen=True, slots=True)
class JobCommand(SessionCommand):
    """A client's rendezvous command (see :mod:`.rendezvous`)."""

    job: str


@record(40)
@dataclass(frozen=True, slots=True)
class Configure(JobCommand):
    """Create the job, change its config (if compatible), or reopen it if closed."""

    config: JobConfig


@record(41)
@dataclass(frozen=True, slots=True)
class Join(JobCommand):
    """Add a participant tied to the envelope's session; its id is this entry's raft index,
    or the next free id if a JoinBatch handed out ids beyond it (:mod:`.rendezvous`,
    "Participant ids"). With a config, creates the job if absent; the config must equal the
    job's if present. ``resume`` matters only when the join starts an ended job again (a
    new run): False fences the old run's checkpoints and memory snapshot off (the new run
    starts fresh), True keeps them for the new run to restore. Records written before the
    field read as True, which is what every join did then.
    ``replaces`` (0: none) names a participant of the same session that
    the new one takes the place of in the same apply: a process restarting under a new name
    is one round change, not a scale-up by the new name and then a leave by the old one
    (:mod:`.rendezvous`, "Replacing")."""

    name: str
    metadata: bytes
    config: JobConfig | None = None
    resume: bool = since(2, True)
    replaces: int = since(2, 0)
    # The participant's failure domain (its host; "": none). See :mod:`.rendezvous`,
    # "Failure domains".
    domain: str = since(3, "")


@record(42)
@dataclass(frozen=True, slots=True)
class Leave(JobCommand):
    """Remove the participant. ``outcome`` is what it says of the job (the last one to leave
    ends the job with it, see :mod:`.rendezvous`); ``detail`` says it in words."""

    participant_id: int
    outcome: LeaveOutcome = LeaveOutcome.UNSPECIFIED
    detail: str = ""


@record(43)
@dataclass(frozen=True, slots=True)
class Evict(JobCommand):
    """An operator removes a participant."""

    participant_id: int


@record(44)
@dataclass(frozen=True, slots=True)
class CloseJob(JobCommand):
    """End the current round and remove every participant; the job stays, closed."""


@record(45)
@dataclass(frozen=True, slots=True)
class CloseRound(Command):
    """Proposed by the leader when its clock says the last call of a JOINING round is over;
    no session. Applied only if the round is still the job's JOINING round and the close
    condition holds at the state machine's time; otherwise nothing changes.

    With ``hold_over`` (format 2, cluster version 4), the leader's word that every remaining
    participant of the domains holding the round was heard from since the failure that held
    it: the round's hold ends at once, and the round closes if it may (rendezvous.py,
    "Failure domains")."""

    job: str
    round: int
    hold_over: bool = since(2, False)


@record(46)
@dataclass(frozen=True, slots=True)
class MemberFailed(Command):
    """Proposed by the leader's failure, hang or straggler detection; no session. Applied only
    if the participant is still in the job and ``round`` is still the job's current round."""

    job: str
    participant_id: int
    round: int
    cause: str
    # MEMBER_FAILED (the detectors, a hang) or STRAGGLER (the straggler policy).
    reason: EndReason = EndReason.MEMBER_FAILED


@record(47)
@dataclass(frozen=True, slots=True)
class RoundTrained(Command):
    """Proposed by the leader when a worker of the job's ACTIVE round reported its first
    training step in it; no session. Applied only if ``round`` is still the job's ACTIVE round
    and has no ``trained_ms`` yet: the round's ``trained_ms`` becomes the machine's time and
    its ``restore`` this command's. ``restore``: where the round's state came from, as the
    workers reported it ("keep", "broadcast", "replicas", "memory", "disk", "fresh"; "" when
    none said)."""

    job: str
    round: int
    restore: str = since(2, "")


@record(48)
@dataclass(frozen=True, slots=True)
class PruneJobs(SessionCommand):
    """An operator removes ended jobs: those in ``jobs`` (every job when empty) that ended at
    least ``older_than_ms`` before the machine's time, keeping the ``keep`` that ended last."""

    older_than_ms: int
    keep: int
    jobs: tuple[str, ...] = ()


@record(49)
@dataclass(frozen=True, slots=True)
class JoinBatch(JobCommand):
    """Add one participant per name, in order, all tied to the envelope's session: each as a
    Join would be, all or nothing (one refusal refuses the whole batch and changes nothing).
    ``metadata`` (and ``domains``) is parallel to ``names``, or empty (none for anyone). The new
    participants take consecutive ids from the first free one at or above this entry's raft
    index (:mod:`.rendezvous`, "Participant ids"). ``resume`` as Join's."""

    names: tuple[str, ...]
    metadata: tuple[bytes, ...] = ()
    config: JobConfig | None = None
    resume: bool = since(2, True)
    # Parallel to ``names``, or empty (no domain for anyone), as ``metadata``.
    domains: tuple[str, ...] = since(3, ())


@record(60)
@dataclass(frozen=True, slots=True)
class Drain(SessionCommand):
    """An operator (or a worker's health hook) drains failure domain ``domain`` (``drain``
    True) or undrains it (False). A drained domain's participants are admitted to no
    round; an ACTIVE round with a member in it ends (DRAINED) at once. See
    :mod:`.rendezvous`, "Drain"."""

    domain: str
    drain: bool
    reason: str = ""


# ---------------------------------------------------------------- round store (tags 50-54)


@dataclass(frozen=True, slots=True)
class StoreCommand(SessionCommand):
    """A write to the store of (job, round), made by ``participant_id``: refused unless the
    round is the job's current ACTIVE round and the participant one of its members."""

    job: str
    round: int
    participant_id: int
    key: bytes


@record(50)
@dataclass(frozen=True, slots=True)
class StoreSet(StoreCommand):
    value: bytes


@record(51)
@dataclass(frozen=True, slots=True)
class StoreAdd(StoreCommand):
    """Add ``delta`` to the decimal integer at ``key`` (absent counts as 0)."""

    delta: int


@record(52)
@dataclass(frozen=True, slots=True)
class StoreCompareSet(StoreCommand):
    """torch's compare_set: set ``desired`` if the key holds ``expected``, or if it is
    absent and ``expected`` is empty."""

    expected: bytes
    desired: bytes


@record(53)
@dataclass(frozen=True, slots=True)
class StoreDelete(StoreCommand):
    pass


# ---------------------------------------------------------------- checkpoints (tags 55-59)


@dataclass(frozen=True, slots=True)
class CheckpointCommand(SessionCommand):
    """Refused unless ``round`` is the job's current ACTIVE round and ``fencing_token`` its
    token (see :mod:`.checkpoints`)."""

    job: str
    round: int
    fencing_token: int


@record(55)
@dataclass(frozen=True, slots=True)
class CheckpointBegin(CheckpointCommand):
    """Start a checkpoint (id: this entry's raft index) of ``world_size`` shards."""

    step: int
    world_size: int
    layout: bytes
    uri: str


@record(56)
@dataclass(frozen=True, slots=True)
class CheckpointShardDone(CheckpointCommand):
    checkpoint_id: int
    rank: int


@record(57)
@dataclass(frozen=True, slots=True)
class CheckpointCommit(CheckpointCommand):
    checkpoint_id: int


@record(58)
@dataclass(frozen=True, slots=True)
class CheckpointAbort(CheckpointCommand):
    checkpoint_id: int


@record(59)
@dataclass(frozen=True, slots=True)
class MemorySnapshotCommit(CheckpointCommand):
    """Record a complete in-memory snapshot of ``step`` (id: this entry's raft index): every
    one of ``world_size`` ranks has its state protected in peers' memory. It replaces the
    job's previous one and outlives its round (see :mod:`.checkpoints`)."""

    step: int
    world_size: int
    layout: bytes
    placement: bytes
    # The fence names the job's last ended round, ended by plan (DRAINED, SCALE_UP), not
    # the current ACTIVE one: that round's final snapshot (rendezvous.py, "Drain").
    planned_end: bool = since(2, False)


@record(349)
@dataclass(frozen=True, slots=True)
class ClusterVersion(Command):
    """Proposed by the leader (no session) when the minimum record version over every voter
    and learner rose (coordinator/version.py). Applied only if it raises the cluster
    version, which never goes down. Record version 2: it exists from version 2 on, and the
    leader proposes it only once every member advertises at least 2."""

    version: int


@record(20)
@dataclass(frozen=True, slots=True)
class Envelope:
    """A proposed command with the request identity and the leader's clock.

    ``first_unacked``: the lowest sequence the client still awaits an answer for; cached
    answers below it are dropped (0 = no change). ``leader_time_ms``: the proposing leader's
    clock; the state machine's time is the maximum seen, so it never goes backwards when
    leadership moves to a node whose clock is behind.
    """

    session_id: int
    sequence: int
    first_unacked: int
    leader_time_ms: int
    command: Command


def encode_envelope(envelope: Envelope) -> bytes:
    return encode(envelope)


def decode_envelope(data: bytes) -> Envelope:
    """Raises :class:`StateCodecError` on anything but an encoded envelope."""
    return decode(data, Envelope)


__all__ = [
    "Add",
    "CheckpointAbort",
    "CheckpointBegin",
    "CheckpointCommand",
    "CheckpointCommit",
    "CheckpointShardDone",
    "CloseJob",
    "CloseRound",
    "ClusterVersion",
    "Command",
    "CompareAndSet",
    "Configure",
    "Delete",
    "Drain",
    "Envelope",
    "Evict",
    "JobCommand",
    "Join",
    "JoinBatch",
    "LeaseExpire",
    "LeaseGrant",
    "LeaseRevoke",
    "Leave",
    "MemberFailed",
    "MemorySnapshotCommit",
    "OwnedSessionOpen",
    "PruneJobs",
    "Put",
    "RoundTrained",
    "SessionClose",
    "SessionCommand",
    "SessionKeepAlive",
    "SessionOpen",
    "StateCodecError",
    "StoreAdd",
    "StoreCommand",
    "StoreCompareSet",
    "StoreDelete",
    "StoreSet",
    "decode_envelope",
    "encode_envelope",
]
