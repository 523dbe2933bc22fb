"""Values of the rendezvous: job configs, participants, rounds, history, checkpoints, limits,
and the rank assignment rule. See :mod:`.rendezvous` for how they change."""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rallypoint.proto.v1.defaults import JOB_CONFIG, milli

from .codec import record, since

_JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def job_id_problem(job_id: str) -> str | None:
    if _JOB_ID.fullmatch(job_id):
        return None
    return f"job id {job_id[:140]!r} is not 1..128 characters of [A-Za-z0-9._-]"


@dataclass(frozen=True, slots=True)
class RendezvousLimits:
    """Bounds on rendezvous state; like every limit, the same on every member."""

    max_jobs: int = 1024
    # One job of 100,000 participants is the target (issue 17), with room to spare.
    max_nodes: int = 131_072
    max_waiting: int = 4096
    max_name_chars: int = 256
    max_metadata_bytes: int = 4096
    max_round_history: int = 16
    max_store_keys: int = 65_536
    max_store_bytes: int = 64 * 1024 * 1024
    max_store_key_bytes: int = 4096
    max_store_value_bytes: int = 1024 * 1024
    max_pending_checkpoints: int = 16
    max_layout_bytes: int = 1024 * 1024
    max_uri_chars: int = 4096
    # A memory snapshot's placement (which peers hold which rank's replicas): opaque bytes,
    # bounded like a layout.
    max_placement_bytes: int = 1024 * 1024
    # Retention of ended jobs (finished, failed, closed): the most kept, and how long one is
    # kept after it ended, in the machine's (leader-stamped) time; 0: no age limit.
    max_ended_jobs: int = 256
    ended_job_retention_ms: int = 7 * 24 * 3600 * 1000
    max_leave_detail_chars: int = 1024
    # The most participants one JoinBatch adds (rendezvous.proto says 10,000), and the most
    # bytes of names and metadata it carries: one command is one raft entry, replicated and
    # written to every member's log, and 10,000 entries of the largest metadata would be 40 MiB.
    max_batch_joins: int = 10_000
    max_batch_bytes: int = 4 * 1024 * 1024
    # A failure domain's name (a host): on every participant, and in a Drain.
    max_domain_chars: int = 256


@record(340)
@dataclass(frozen=True, slots=True)
class JobConfig:
    """A job's configuration. ``phi_threshold_milli`` is the phi threshold in thousandths
    (8000 = 8.0): replicated state holds no floats, whose text forms differ by platform. The
    defaults are the wire contract's (``rallypoint.proto.v1.defaults``): a Join or Configure
    replicated with fewer fields (an older writer) reads them."""

    min_nodes: int
    max_nodes: int
    last_call_ms: int = JOB_CONFIG.last_call_ms
    join_timeout_ms: int = JOB_CONFIG.join_timeout_ms
    heartbeat_interval_ms: int = JOB_CONFIG.heartbeat_interval_ms
    phi_threshold_milli: int = milli(JOB_CONFIG.phi_threshold)
    phi_window: int = JOB_CONFIG.phi_window
    min_std_ms: int = JOB_CONFIG.min_std_ms
    acceptable_pause_ms: int = JOB_CONFIG.acceptable_pause_ms
    scale_up: bool = JOB_CONFIG.scale_up
    keep_checkpoints: int = JOB_CONFIG.keep_checkpoints
    # Hang detection (liveness/progress.py); factors in thousandths, as the phi threshold.
    hang_factor_milli: int = milli(JOB_CONFIG.hang_factor)
    hang_floor_ms: int = JOB_CONFIG.hang_floor_ms
    startup_timeout_ms: int = JOB_CONFIG.startup_timeout_ms
    # Straggler eviction; off while straggler_factor_milli is 0.
    straggler_factor_milli: int = milli(JOB_CONFIG.straggler_factor)
    straggler_windows: int = JOB_CONFIG.straggler_windows
    straggler_window_ms: int = JOB_CONFIG.straggler_window_ms
    # Shaped jobs (rendezvous.py, "Units", "Failure domains"): every closed round's world
    # size is a multiple of ``unit_size``; ``domain_size`` is how many participants a full
    # domain holds (0: not declared); with ``units_within_domains`` a unit never straddles
    # two domains. The defaults are the flat job of before.
    unit_size: int = since(2, 1)
    domain_size: int = since(2, 0)
    units_within_domains: bool = since(2, False)
    # How many straggler windows a participant the straggler policy evicted is held out of
    # the job: a join by its name is refused until then (rendezvous.py, "Stragglers"). The
    # rule applies from cluster version 5 (state/versions.py, STRAGGLER_HOLD_VERSION), so
    # below it every member admits the join as before, whatever this field reads; a record
    # written before the field reads the default, which is never written (a default config
    # encodes as format 2 and needs no newer cluster).
    straggler_hold_windows: int = since(3, JOB_CONFIG.straggler_hold_windows)

    def problem(self, limits: RendezvousLimits) -> str | None:
        """What makes this config invalid, or None."""
        checks = [
            (1 <= self.min_nodes <= self.max_nodes, "need 1 <= min_nodes <= max_nodes"),
            (self.max_nodes <= limits.max_nodes, f"max_nodes above {limits.max_nodes}"),
            (self.last_call_ms >= 0, "last_call_ms must be >= 0"),
            (self.join_timeout_ms > 0, "join_timeout_ms must be > 0"),
            (self.heartbeat_interval_ms > 0, "heartbeat_interval_ms must be > 0"),
            (self.phi_threshold_milli > 0, "the phi threshold must be > 0"),
            (self.phi_window >= 2, "phi_window must be >= 2"),
            (self.min_std_ms > 0, "min_std_ms must be > 0"),
            (self.acceptable_pause_ms >= 0, "acceptable_pause_ms must be >= 0"),
            (self.keep_checkpoints >= 1, "keep_checkpoints must be >= 1"),
            (self.hang_factor_milli > 0, "hang_factor must be > 0"),
            (self.hang_floor_ms > 0, "hang_floor_ms must be > 0"),
            (self.startup_timeout_ms > 0, "startup_timeout_ms must be > 0"),
            (self.straggler_factor_milli >= 0, "straggler_factor must be >= 0"),
            (self.straggler_windows >= 1, "straggler_windows must be >= 1"),
            (self.straggler_window_ms > 0, "straggler_window_ms must be > 0"),
            (self.straggler_hold_windows >= 1, "straggler_hold_windows must be >= 1"),
        ]
        failed = [message for holds, message in checks if not holds]
        shape = self.shape_problem()
        if shape:
            failed.append(shape)
        return "; ".join(failed) if failed else None

    def shape_problem(self) -> str | None:
        """What makes the units and domains of this config invalid, in one line, or None
        (rendezvous.py, "Units")."""
        unit, domain = self.unit_size, self.domain_size
        if unit < 1:
            return f"unit_size must be >= 1, got {unit}"
        if domain < 0:
            return f"domain_size must be >= 0, got {domain}"
        if self.min_nodes % unit or self.max_nodes % unit:
            return (
                f"unit_size {unit} must divide min_nodes {self.min_nodes} and max_nodes "
                f"{self.max_nodes}: every round's world size is a multiple of the unit"
            )
        if self.units_within_domains and domain % unit:
            units = domain // unit
            return (
                f"a domain of {domain} holds {units} unit{'' if units == 1 else 's'} of {unit} "
                f"and strands {domain % unit} rank{'' if domain % unit == 1 else 's'} "
                "(units_within_domains: domain_size must be a multiple of unit_size)"
            )
        return None

    def differences(self, other: JobConfig) -> str:
        """``field this != other`` for each field that differs, for error messages."""
        names = [
            f.name
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]
        return ", ".join(f"{n} {getattr(self, n)!r} != {getattr(other, n)!r}" for n in names)


class JobState(enum.IntEnum):
    """A job's lifecycle. Values match rallypoint.v1.JobState."""

    OPEN = 1
    FINISHED = 2
    FAILED = 3
    CLOSED = 4


class LeaveOutcome(enum.IntEnum):
    """What a leaving participant says of the job. Values match rallypoint.v1.LeaveOutcome."""

    UNSPECIFIED = 0
    FINISHED = 1
    FAILED = 2


class RoundState(enum.IntEnum):
    """Values match rallypoint.v1.RoundState."""

    JOINING = 1
    ACTIVE = 2
    ENDED = 3


class EndReason(enum.IntEnum):
    """Why a round ended. Values match rallypoint.v1.RoundEndReason."""

    MEMBER_FAILED = 1
    MEMBER_LEFT = 2
    MEMBER_EVICTED = 3
    SCALE_UP = 4
    JOB_CLOSED = 5
    STRAGGLER = 6
    # An operator (or a worker's health hook) drained a failure domain of a member.
    DRAINED = 7


@record(341)
@dataclass(frozen=True, slots=True)
class Participant:
    """A worker in a job. ``participant_id`` is at least the raft index of its join, unique
    and increasing in join order (see :mod:`.rendezvous`, "Participant ids"); it is removed
    (as failed) when ``session_id`` ends."""

    participant_id: int
    name: str
    metadata: bytes
    session_id: int
    # Its failure domain (a host): participants of one domain fail together ("": none).
    domain: str = since(2, "")


@record(342)
@dataclass(frozen=True, slots=True)
class Seat:
    """A participant's place in a round: its rank, or -1 while the round is JOINING."""

    participant_id: int
    rank: int


@record(343)
@dataclass(frozen=True, slots=True)
class Round:
    """A job's current round. Invariants: ``members`` in participant-id order; JOINING: every
    rank is -1, ``closed_ms`` and ``fencing_token`` are 0, fewer than max_nodes members (a
    shaped job's may hold more, rendezvous.py "Shaped jobs"), and ``min_reached_ms`` is set
    exactly when at least min_nodes are present; ACTIVE: the ranks are a permutation of
    range(len(members)), a multiple of the job's unit_size, ``hold_until_ms`` is 0 and
    ``hold_domains`` empty, and ``fencing_token`` is the raft index of the close.
    ``previous`` holds the ranks the carried-over survivors had in the round before.
    ``trained_ms``: when the leader heard the round's first training step was done (0: not
    yet, or its workers report no progress); set once, while ACTIVE, together with
    ``restore``: where the round's state came from, as its workers reported it ("" when
    they did not say)."""

    number: int
    state: RoundState
    members: tuple[Seat, ...]
    previous: tuple[Seat, ...]
    opened_ms: int
    min_reached_ms: int | None
    closed_ms: int
    fencing_token: int
    trained_ms: int = 0
    restore: str = since(2, "")
    # JOINING only: the round does not close before this machine time (0: no hold), so
    # the domain-mates of a failed member are removed or readmitted in it first
    # (rendezvous.py, "Failure domains").
    hold_until_ms: int = since(3, 0)
    # JOINING only, set from cluster version 3 (state/versions.py): the failure domains
    # whose failed members set the hold, in name order. The hold ends as soon as none of
    # their participants remains (nobody is left to wait for). Empty with a hold: one set
    # below version 3, which runs its time.
    hold_domains: tuple[str, ...] = since(4, ())

    @property
    def member_ids(self) -> list[int]:
        return [seat.participant_id for seat in self.members]

    def rank_of(self, participant_id: int) -> int | None:
        """O(members): on a hot path use ``Job.rank_of``, which keeps an index."""
        for seat in self.members:
            if seat.participant_id == participant_id:
                return seat.rank
        return None


@dataclass(frozen=True, slots=True)
class ParticipantAssignment:
    """What one participant needs to know of its job's current round (``Rendezvous.assignment``):
    the round, its state and fencing token; the participant's ``rank`` (-1 while the round is
    JOINING or the participant waits for the next one); ``world_size`` (0 while JOINING); and
    ``waiting``. A query answer, never replicated."""

    round: int
    state: RoundState
    rank: int
    world_size: int
    fencing_token: int
    waiting: bool


@record(344)
@dataclass(frozen=True, slots=True)
class MemberRecord:
    participant_id: int
    name: str
    rank: int


@record(345)
@dataclass(frozen=True, slots=True)
class RoundRecord:
    """An ended round, for the history. ``ended_by`` is the participant whose failure,
    departure or eviction ended it (0 otherwise); ``detail`` says more (e.g. the cause the
    failure detector gave). ``trained_ms`` and ``restore`` are the round's (0 and "":
    unknown)."""

    number: int
    members: tuple[MemberRecord, ...]
    fencing_token: int
    opened_ms: int
    closed_ms: int
    ended_ms: int
    end_reason: EndReason
    ended_by: int
    detail: str
    trained_ms: int = 0
    restore: str = since(2, "")


@record(346)
@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """A committed checkpoint. ``checkpoint_id`` is the raft index of its begin."""

    checkpoint_id: int
    step: int
    round: int
    world_size: int
    layout: bytes
    uri: str
    committed_ms: int


@record(347)
@dataclass(frozen=True, slots=True)
class MemorySnapshotInfo:
    """A complete in-memory snapshot: every rank's state of ``step`` is held, protected, in
    the memory of peers. ``snapshot_id`` is the raft index of its commit. ``layout`` (how
    the state is sharded) and ``placement`` (where the protected copies live) are opaque to
    the coordinator."""

    snapshot_id: int
    step: int
    round: int
    world_size: int
    layout: bytes
    placement: bytes
    committed_ms: int


@record(348)
@dataclass(frozen=True, slots=True)
class DrainedDomain:
    """A failure domain an operator drained: its participants are admitted to no round
    until it is undrained. ``since_ms`` is the machine time of the drain."""

    domain: str
    reason: str
    since_ms: int


def assign_ranks(previous: Mapping[int, int], members: Sequence[int]) -> dict[int, int]:
    """Ranks for a closing round of ``members`` (participant ids), least movement first.

    A survivor (a key of ``previous``, its old rank) keeps its rank if it is below the new
    world size W. The ranks below W left free go, in increasing order, first to the survivors
    whose old rank no longer fits (in old-rank order), then to the newcomers in
    participant-id order. The result is a permutation of range(W)."""
    world_size = len(members)
    ranks = {
        pid: previous[pid] for pid in members if pid in previous and previous[pid] < world_size
    }
    if len(set(ranks.values())) != len(ranks):
        raise AssertionError(f"survivors share a rank: {sorted(ranks.items())}")
    free = iter(sorted(set(range(world_size)) - set(ranks.values())))
    displaced = sorted(
        (previous[pid], pid) for pid in members if pid in previous and pid not in ranks
    )
    newcomers = sorted(pid for pid in members if pid not in previous)
    for pid in [pid for _, pid in displaced] + newcomers:
        ranks[pid] = next(free)
    return ranks
