"""What the rendezvous, round-store and checkpoint calls return: frozen values converted from
the wire messages of ``proto/v1/rendezvous.proto`` in one place."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from rallypoint.proto.v1 import rendezvous_pb2
from rallypoint.proto.v1.defaults import JOB_CONFIG

from .errors import InvalidValueError


@dataclass(frozen=True, slots=True)
class JobConfig:
    """A job's configuration (rendezvous.proto, ``JobConfig``). The defaults are the wire
    contract's (``rallypoint.proto.v1.defaults``, the coordinator's too); every field goes on
    the wire, since the server reads no zero as "default"."""

    min_nodes: int
    max_nodes: int
    last_call_ms: int = JOB_CONFIG.last_call_ms
    join_timeout_ms: int = JOB_CONFIG.join_timeout_ms
    heartbeat_interval_ms: int = JOB_CONFIG.heartbeat_interval_ms
    phi_threshold: float = JOB_CONFIG.phi_threshold
    phi_window: int = JOB_CONFIG.phi_window
    min_std_ms: int = JOB_CONFIG.min_std_ms
    acceptable_pause_ms: int = JOB_CONFIG.acceptable_pause_ms
    scale_up: bool = JOB_CONFIG.scale_up
    keep_checkpoints: int = JOB_CONFIG.keep_checkpoints
    # Hang detection: a rank that completed no step for max(hang_factor x the job's median
    # step time, hang_floor_ms) while others wait for it is declared failed (cause "hang");
    # before its first step in a round, startup_timeout_ms is the bound.
    hang_factor: float = JOB_CONFIG.hang_factor
    hang_floor_ms: int = JOB_CONFIG.hang_floor_ms
    startup_timeout_ms: int = JOB_CONFIG.startup_timeout_ms
    # Straggler eviction (off at 0): over straggler_factor x the median time per step outside
    # collectives for straggler_windows windows of straggler_window_ms in a row.
    straggler_factor: float = JOB_CONFIG.straggler_factor
    straggler_windows: int = JOB_CONFIG.straggler_windows
    straggler_window_ms: int = JOB_CONFIG.straggler_window_ms
    # Shape (docs/client.md, "Domains and units"): world sizes are multiples of unit_size,
    # ranks [k*unit_size, (k+1)*unit_size) form unit k, kept inside one failure domain where
    # it has room; domain_size: how many participants a full domain holds (0: not said);
    # units_within_domains: a unit never straddles two domains.
    unit_size: int = JOB_CONFIG.unit_size
    domain_size: int = JOB_CONFIG.domain_size
    units_within_domains: bool = JOB_CONFIG.units_within_domains
    # A rank the straggler policy evicted may not join again (HeldOutError) for this many
    # windows of straggler_window_ms.
    straggler_hold_windows: int = JOB_CONFIG.straggler_hold_windows

    def __post_init__(self) -> None:
        # The shape is checked here, before anything is sent: a unit that cannot tile the
        # world is a mistake in the caller's config. (The other fields are the server's to
        # judge; it names each bound.)
        problem = shape_problem(
            self.min_nodes,
            self.max_nodes,
            self.unit_size,
            self.domain_size,
            self.units_within_domains,
        )
        if problem is not None:
            raise InvalidValueError(problem)

    def to_proto(self) -> rendezvous_pb2.JobConfig:
        return rendezvous_pb2.JobConfig(
            min_nodes=self.min_nodes,
            max_nodes=self.max_nodes,
            last_call_ms=self.last_call_ms,
            join_timeout_ms=self.join_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            phi_threshold=self.phi_threshold,
            phi_window=self.phi_window,
            min_std_ms=self.min_std_ms,
            acceptable_pause_ms=self.acceptable_pause_ms,
            scale_up=self.scale_up,
            keep_checkpoints=self.keep_checkpoints,
            hang_factor=self.hang_factor,
            hang_floor_ms=self.hang_floor_ms,
            startup_timeout_ms=self.startup_timeout_ms,
            straggler_factor=self.straggler_factor,
            straggler_windows=self.straggler_windows,
            straggler_window_ms=self.straggler_window_ms,
            unit_size=self.unit_size,
            domain_size=self.domain_size,
            units_within_domains=self.units_within_domains,
            straggler_hold_windows=self.straggler_hold_windows,
        )

    @staticmethod
    def from_proto(config: rendezvous_pb2.JobConfig) -> JobConfig:
        return JobConfig(
            min_nodes=config.min_nodes,
            max_nodes=config.max_nodes,
            last_call_ms=config.last_call_ms,
            join_timeout_ms=config.join_timeout_ms,
            heartbeat_interval_ms=config.heartbeat_interval_ms,
            phi_threshold=config.phi_threshold,
            phi_window=config.phi_window,
            min_std_ms=config.min_std_ms,
            acceptable_pause_ms=config.acceptable_pause_ms,
            scale_up=config.scale_up,
            keep_checkpoints=config.keep_checkpoints,
            hang_factor=config.hang_factor,
            hang_floor_ms=config.hang_floor_ms,
            startup_timeout_ms=config.startup_timeout_ms,
            straggler_factor=config.straggler_factor,
            straggler_windows=config.straggler_windows,
            straggler_window_ms=config.straggler_window_ms,
            # A member that predates shapes sends 0: the flat job it runs.
            unit_size=config.unit_size or JOB_CONFIG.unit_size,
            domain_size=config.domain_size,
            units_within_domains=config.units_within_domains,
            # A member that predates the hold sends 0: the default.
            straggler_hold_windows=config.straggler_hold_windows
            or JOB_CONFIG.straggler_hold_windows,
        )


def shape_problem(
    min_nodes: int, max_nodes: int, unit_size: int, domain_size: int, units_within_domains: bool
) -> str | None:
    """Why a job's shape cannot work, in one line, or None. Sizes that are wrong on their own
    (min_nodes < 1, ...) are left to the server's checks."""
    if isinstance(unit_size, bool) or not isinstance(unit_size, int) or unit_size < 1:
        return f"unit_size must be an integer of at least 1, got {unit_size!r}"
    if isinstance(domain_size, bool) or not isinstance(domain_size, int) or domain_size < 0:
        return (
            f"domain_size must be an integer of at least 0 (0: not declared), got {domain_size!r}"
        )
    for name, nodes in (("min_nodes", min_nodes), ("max_nodes", max_nodes)):
        if isinstance(nodes, int) and nodes >= 1 and nodes % unit_size:
            return (
                f"unit_size {unit_size} does not divide {name} {nodes}: every world size "
                f"must be a whole number of units"
            )
    if units_within_domains and domain_size and domain_size % unit_size:
        units, stranded = divmod(domain_size, unit_size)
        return (
            f"a domain of {domain_size} holds {units} unit{'s' if units != 1 else ''} of "
            f"{unit_size} and strands {stranded} rank{'s' if stranded != 1 else ''} "
            f"(units_within_domains: domain_size must be a multiple of unit_size)"
        )
    return None


@dataclass(frozen=True, slots=True)
class TrainingProgress:
    """What a training loop reports about itself with every heartbeat, so the leader can
    tell a rank that hangs (its process alive) from one that trains, and find stragglers.
    Times are ``time.monotonic()`` of the reporting process; the heartbeat sends durations."""

    # The round these numbers belong to (collectives are counted per round).
    round: int
    # The last training step completed (0: none yet), and when.
    step: int = 0
    step_done_s: float = 0.0
    # Recent time per step spent outside collectives (computing, loading, saving), in ms.
    step_ms: float = 0.0
    # Collectives entered in this round (1 after the first), and the one waited in now (0:
    # none) since when.
    collectives_entered: int = 0
    waiting_in: int = 0
    waiting_since_s: float = 0.0
    # Where this rank's state came from when the round formed ("keep", "broadcast",
    # "replicas", "memory", "disk", "fresh"; the same on every rank of the round), or "" when
    # not known. The leader keeps
    # the first one reported in the round's record (``RoundInfo.restore``).
    restore: str = ""


class RoundState(enum.Enum):
    JOINING = "joining"
    ACTIVE = "active"
    ENDED = "ended"


class JobState(enum.Enum):
    """A job's lifecycle (rendezvous.proto, "Job lifecycle")."""

    OPEN = "open"
    FINISHED = "finished"
    FAILED = "failed"
    CLOSED = "closed"


class LeaveOutcome(enum.Enum):
    """What a participant says of the job as it leaves; the last one to leave ends the job
    FINISHED or FAILED by it (FAILED if any leave since the job opened said so)."""

    FINISHED = "finished"
    FAILED = "failed"


class EndReason(enum.Enum):
    MEMBER_FAILED = "member_failed"
    MEMBER_LEFT = "member_left"
    MEMBER_EVICTED = "member_evicted"
    SCALE_UP = "scale_up"
    JOB_CLOSED = "job_closed"
    STRAGGLER = "straggler"
    # A failure domain of a member was drained (Client.drain).
    DRAINED = "drained"


_ROUND_STATES = {
    rendezvous_pb2.ROUND_STATE_JOINING: RoundState.JOINING,
    rendezvous_pb2.ROUND_STATE_ACTIVE: RoundState.ACTIVE,
    rendezvous_pb2.ROUND_STATE_ENDED: RoundState.ENDED,
}
_JOB_STATES = {
    rendezvous_pb2.JOB_STATE_OPEN: JobState.OPEN,
    rendezvous_pb2.JOB_STATE_FINISHED: JobState.FINISHED,
    rendezvous_pb2.JOB_STATE_FAILED: JobState.FAILED,
    rendezvous_pb2.JOB_STATE_CLOSED: JobState.CLOSED,
}
LEAVE_OUTCOMES = {
    LeaveOutcome.FINISHED: rendezvous_pb2.LEAVE_OUTCOME_FINISHED,
    LeaveOutcome.FAILED: rendezvous_pb2.LEAVE_OUTCOME_FAILED,
}
_END_REASONS = {
    rendezvous_pb2.ROUND_END_REASON_MEMBER_FAILED: EndReason.MEMBER_FAILED,
    rendezvous_pb2.ROUND_END_REASON_MEMBER_LEFT: EndReason.MEMBER_LEFT,
    rendezvous_pb2.ROUND_END_REASON_MEMBER_EVICTED: EndReason.MEMBER_EVICTED,
    rendezvous_pb2.ROUND_END_REASON_SCALE_UP: EndReason.SCALE_UP,
    rendezvous_pb2.ROUND_END_REASON_JOB_CLOSED: EndReason.JOB_CLOSED,
    rendezvous_pb2.ROUND_END_REASON_STRAGGLER: EndReason.STRAGGLER,
    rendezvous_pb2.ROUND_END_REASON_DRAINED: EndReason.DRAINED,
}


def round_state(value: int) -> RoundState:
    state: RoundState | None = _ROUND_STATES.get(value)  # type: ignore[call-overload]
    if state is None:
        raise ValueError(f"the server sent an unknown round state {value}")
    return state


@dataclass(frozen=True, slots=True)
class RoundMember:
    participant_id: int
    name: str
    # -1 while the round is JOINING (and for waiting participants).
    rank: int
    metadata: bytes
    # The leader's failure-detector reading (GetJob from the leader only; 0 otherwise).
    phi: float
    # Progress as the leader last heard it (GetJob from the leader, for workers that report
    # it; 0 otherwise): last step, ms per step outside collectives, and that over the job's
    # median (1.0 typical; a straggler is well above).
    step: int = 0
    step_ms: float = 0.0
    step_ratio: float = 0.0
    # Milliseconds since the leader last heard the participant's heartbeat, or began watching
    # it (its join; the leader's election). GetJob from the leader only; 0 otherwise.
    heartbeat_age_ms: int = 0
    # Its failure domain ("": none declared).
    domain: str = ""

    @staticmethod
    def from_proto(member: rendezvous_pb2.RoundMember) -> RoundMember:
        # + 0.0 turns the detector's -0.0 (a heartbeat just arrived) into 0.0.
        return RoundMember(
            member.participant_id,
            member.name,
            member.rank,
            member.metadata,
            member.phi + 0.0,
            member.step,
            member.step_ms,
            member.step_ratio,
            member.heartbeat_age_ms,
            member.domain,
        )


@dataclass(frozen=True, slots=True)
class RoundInfo:
    """A job's current round as one member saw it (rendezvous.proto, ``RoundInfo``)."""

    job: str
    round: int
    state: RoundState
    # In participant-id order.
    members: tuple[RoundMember, ...]
    # The number of members once ACTIVE; 0 while JOINING.
    world_size: int
    # The raft index of the round's close; 0 while JOINING.
    fencing_token: int
    store_namespace: str
    # Why the round is not closing (JOINING), or since when it is active.
    reason: str
    waiting: tuple[RoundMember, ...]
    opened_ms: int
    closed_ms: int
    job_closed: bool
    # Increases with every change to the job: orders two RoundInfos of one job.
    job_revision: int
    # The job's lifecycle: open, finished, failed or closed (a member that predates it sends
    # nothing: open, or closed by job_closed); the leader time it ended and what was said.
    job_state: JobState = JobState.OPEN
    job_ended_ms: int = 0
    job_end_detail: str = ""
    # Leader time the round's first training step was reported done (0: not known).
    trained_ms: int = 0
    # Where the round's state came from, as its workers reported it with that first step
    # ("keep", "broadcast", "replicas", "memory", "disk", "fresh"; "": not known).
    restore: str = ""
    # Waiting participants a round could admit (not in a drained domain): the spares a loss
    # is filled from.
    spares: int = 0

    @staticmethod
    def from_proto(info: rendezvous_pb2.RoundInfo) -> RoundInfo:
        return RoundInfo(
            job=info.job,
            round=info.round,
            state=round_state(info.state),
            members=tuple(RoundMember.from_proto(m) for m in info.members),
            world_size=info.world_size,
            fencing_token=info.fencing_token,
            store_namespace=info.store_namespace,
            reason=info.reason,
            waiting=tuple(RoundMember.from_proto(m) for m in info.waiting),
            opened_ms=info.opened_ms,
            closed_ms=info.closed_ms,
            job_closed=info.job_closed,
            job_revision=info.job_revision,
            job_state=_JOB_STATES.get(
                info.job_state, JobState.CLOSED if info.job_closed else JobState.OPEN
            ),
            job_ended_ms=info.job_ended_ms,
            job_end_detail=info.job_end_detail,
            trained_ms=info.trained_ms,
            restore=info.restore,
            spares=info.spares,
        )

    def member(self, participant_id: int) -> RoundMember | None:
        return next((m for m in self.members if m.participant_id == participant_id), None)

    def rank_of(self, participant_id: int) -> int | None:
        """The participant's rank in this round; None unless the round is ACTIVE and it is a
        member."""
        member = self.member(participant_id)
        if member is None or self.state is not RoundState.ACTIVE:
            return None
        return member.rank

    def includes(self, participant_id: int) -> bool:
        """The participant is in the job as of this round: a member or waiting."""
        return self.member(participant_id) is not None or any(
            m.participant_id == participant_id for m in self.waiting
        )


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """A finished round, from the job's history."""

    round: int
    members: tuple[RoundMember, ...]
    fencing_token: int
    opened_ms: int
    closed_ms: int
    ended_ms: int
    end_reason: EndReason | None
    # The participant whose failure, departure or eviction ended the round; 0 otherwise.
    ended_by: int
    # Why, in words (the detector's cause, e.g. "hang: ..." or "phi 9.1 crossed ...").
    detail: str = ""
    # Leader time the round's first training step was reported done (0: not known).
    trained_ms: int = 0
    # Where the round's state came from, as its workers reported it ("": not known).
    restore: str = ""

    @staticmethod
    def from_proto(record: rendezvous_pb2.RoundRecord) -> RoundRecord:
        return RoundRecord(
            round=record.round,
            members=tuple(RoundMember.from_proto(m) for m in record.members),
            fencing_token=record.fencing_token,
            opened_ms=record.opened_ms,
            closed_ms=record.closed_ms,
            ended_ms=record.ended_ms,
            end_reason=_END_REASONS.get(record.end_reason),
            ended_by=record.ended_by,
            detail=record.detail,
            trained_ms=record.trained_ms,
            restore=record.restore,
        )


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    checkpoint_id: int
    step: int
    round: int
    world_size: int
    # Opaque to the coordinator: how the state is sharded.
    layout: bytes
    uri: str
    committed_ms: int

    @staticmethod
    def from_proto(info: rendezvous_pb2.CheckpointInfo) -> CheckpointInfo:
        return CheckpointInfo(
            info.checkpoint_id,
            info.step,
            info.round,
            info.world_size,
            info.layout,
            info.uri,
            info.committed_ms,
        )


@dataclass(frozen=True, slots=True)
class MemorySnapshotInfo:
    """A complete in-memory snapshot the coordinator recorded: every rank's state of
    ``step`` was protected in peers' memory when it was committed in ``round``."""

    # The raft index of the commit: a later commit has a larger id.
    snapshot_id: int
    step: int
    round: int
    world_size: int
    # Opaque to the coordinator: how the state is sharded.
    layout: bytes
    # Opaque to the coordinator: which peers hold each rank's protected copy.
    placement: bytes
    committed_ms: int

    @staticmethod
    def from_proto(info: rendezvous_pb2.MemorySnapshotInfo) -> MemorySnapshotInfo:
        return MemorySnapshotInfo(
            info.snapshot_id,
            info.step,
            info.round,
            info.world_size,
            info.layout,
            info.placement,
            info.committed_ms,
        )


@dataclass(frozen=True, slots=True)
class JobStatus:
    """GetJob's answer: config, current round (members with phi), history (most recent
    last), the latest committed checkpoint and the latest in-memory snapshot."""

    config: JobConfig
    round: RoundInfo
    history: tuple[RoundRecord, ...]
    latest_checkpoint: CheckpointInfo | None
    # None also when the member answering predates memory snapshots.
    latest_memory_snapshot: MemorySnapshotInfo | None = None

    @staticmethod
    def from_proto(response: rendezvous_pb2.GetJobResponse) -> JobStatus:
        latest = (
            CheckpointInfo.from_proto(response.latest_checkpoint)
            if response.HasField("latest_checkpoint")
            else None
        )
        memory = (
            MemorySnapshotInfo.from_proto(response.latest_memory_snapshot)
            if response.HasField("latest_memory_snapshot")
            else None
        )
        return JobStatus(
            JobConfig.from_proto(response.config),
            RoundInfo.from_proto(response.round),
            tuple(RoundRecord.from_proto(r) for r in response.history),
            latest,
            memory,
        )


@dataclass(frozen=True, slots=True)
class JoinResult:
    participant_id: int
    # The participant waits for the next round (the current one is ACTIVE).
    waiting: bool
    round: RoundInfo


@dataclass(frozen=True, slots=True)
class JoinBatchResult:
    """A batch of participants joined (``Client.join_batch``): their ids and waiting flags
    in the order of the names, and the job's round after the batch applied."""

    # Strictly increasing for new participants, unique in the job; each at least the raft
    # index of the batch (a name this session joined before keeps its id).
    participant_ids: tuple[int, ...]
    # Parallel: the participant waits for the next round.
    waiting: tuple[bool, ...]
    round: int
    state: RoundState
    # The response header's revision (the cluster's key-value revision when it answered).
    revision: int

    @staticmethod
    def from_proto(response: rendezvous_pb2.JoinBatchResponse) -> JoinBatchResult:
        return JoinBatchResult(
            tuple(response.participant_ids),
            tuple(response.waiting),
            response.round,
            round_state(response.state),
            response.header.revision,
        )


@dataclass(frozen=True, slots=True)
class MembersPage:
    """One page of a round's members or its wait list (``Client.list_members``), in
    participant-id order, without detector readings (phi and progress read 0)."""

    round: int
    state: RoundState
    members: tuple[RoundMember, ...]
    # More follow: ask again with ``after`` = the last participant id here.
    more: bool

    @staticmethod
    def from_proto(response: rendezvous_pb2.ListMembersResponse) -> MembersPage:
        return MembersPage(
            response.round,
            round_state(response.state),
            tuple(RoundMember.from_proto(m) for m in response.members),
            response.more,
        )


@dataclass(frozen=True, slots=True)
class ShardProgress:
    """How many distinct ranks reported a checkpoint's shard, of ``world_size``."""

    reported: int
    world_size: int


@dataclass(frozen=True, slots=True)
class CommitResult:
    checkpoint: CheckpointInfo
    # Committed checkpoints beyond keep_checkpoints, dropped by this commit: delete their files.
    retired: tuple[CheckpointInfo, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class DrainedDomain:
    """A drained failure domain (``Client.drained``): its participants are admitted to no
    round until it is undrained."""

    domain: str
    reason: str
    # Leader time (Unix epoch ms) it was drained at.
    since_ms: int

    @staticmethod
    def from_proto(drained: rendezvous_pb2.DrainedDomain) -> DrainedDomain:
        return DrainedDomain(drained.domain, drained.reason, drained.since_ms)


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What a drain did (``Client.drain``)."""

    domain: str
    # False: the domain was drained already; nothing changed.
    changed: bool
    # (job, round) of each ACTIVE round the drain ended, in job order.
    ended: tuple[tuple[str, int], ...]

    @staticmethod
    def from_proto(domain: str, response: rendezvous_pb2.DrainResponse) -> DrainResult:
        return DrainResult(
            domain, response.changed, tuple((r.job, r.round) for r in response.ended)
        )
