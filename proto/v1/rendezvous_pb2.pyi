from rallypoint.proto.v1 import common_pb2 as _common_pb2
from rallypoint.proto.v1 import kv_pb2 as _kv_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_OPEN: _ClassVar[JobState]
    JOB_STATE_FINISHED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CLOSED: _ClassVar[JobState]

class LeaveOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEAVE_OUTCOME_UNSPECIFIED: _ClassVar[LeaveOutcome]
    LEAVE_OUTCOME_FINISHED: _ClassVar[LeaveOutcome]
    LEAVE_OUTCOME_FAILED: _ClassVar[LeaveOutcome]

class RoundState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUND_STATE_UNSPECIFIED: _ClassVar[RoundState]
    ROUND_STATE_JOINING: _ClassVar[RoundState]
    ROUND_STATE_ACTIVE: _ClassVar[RoundState]
    ROUND_STATE_ENDED: _ClassVar[RoundState]

class RoundEndReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUND_END_REASON_UNSPECIFIED: _ClassVar[RoundEndReason]
    ROUND_END_REASON_MEMBER_FAILED: _ClassVar[RoundEndReason]
    ROUND_END_REASON_MEMBER_LEFT: _ClassVar[RoundEndReason]
    ROUND_END_REASON_MEMBER_EVICTED: _ClassVar[RoundEndReason]
    ROUND_END_REASON_SCALE_UP: _ClassVar[RoundEndReason]
    ROUND_END_REASON_JOB_CLOSED: _ClassVar[RoundEndReason]
    ROUND_END_REASON_STRAGGLER: _ClassVar[RoundEndReason]
    ROUND_END_REASON_DRAINED: _ClassVar[RoundEndReason]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_OPEN: JobState
JOB_STATE_FINISHED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CLOSED: JobState
LEAVE_OUTCOME_UNSPECIFIED: LeaveOutcome
LEAVE_OUTCOME_FINISHED: LeaveOutcome
LEAVE_OUTCOME_FAILED: LeaveOutcome
ROUND_STATE_UNSPECIFIED: RoundState
ROUND_STATE_JOINING: RoundState
ROUND_STATE_ACTIVE: RoundState
ROUND_STATE_ENDED: RoundState
ROUND_END_REASON_UNSPECIFIED: RoundEndReason
ROUND_END_REASON_MEMBER_FAILED: RoundEndReason
ROUND_END_REASON_MEMBER_LEFT: RoundEndReason
ROUND_END_REASON_MEMBER_EVICTED: RoundEndReason
ROUND_END_REASON_SCALE_UP: RoundEndReason
ROUND_END_REASON_JOB_CLOSED: RoundEndReason
ROUND_END_REASON_STRAGGLER: RoundEndReason
ROUND_END_REASON_DRAINED: RoundEndReason

class JobConfig(_message.Message):
    __slots__ = ("min_nodes", "max_nodes", "last_call_ms", "join_timeout_ms", "heartbeat_interval_ms", "phi_threshold", "phi_window", "min_std_ms", "acceptable_pause_ms", "scale_up", "keep_checkpoints", "hang_factor", "hang_floor_ms", "startup_timeout_ms", "straggler_factor", "straggler_windows", "straggler_window_ms", "unit_size", "domain_size", "units_within_domains", "straggler_hold_windows")
    MIN_NODES_FIELD_NUMBER: _ClassVar[int]
    MAX_NODES_FIELD_NUMBER: _ClassVar[int]
    LAST_CALL_MS_FIELD_NUMBER: _ClassVar[int]
    JOIN_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    PHI_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    PHI_WINDOW_FIELD_NUMBER: _ClassVar[int]
    MIN_STD_MS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTABLE_PAUSE_MS_FIELD_NUMBER: _ClassVar[int]
    SCALE_UP_FIELD_NUMBER: _ClassVar[int]
    KEEP_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    HANG_FACTOR_FIELD_NUMBER: _ClassVar[int]
    HANG_FLOOR_MS_FIELD_NUMBER: _ClassVar[int]
    STARTUP_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_FACTOR_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    UNIT_SIZE_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    UNITS_WITHIN_DOMAINS_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_HOLD_WINDOWS_FIELD_NUMBER: _ClassVar[int]
    min_nodes: int
    max_nodes: int
    last_call_ms: int
    join_timeout_ms: int
    heartbeat_interval_ms: int
    phi_threshold: float
    phi_window: int
    min_std_ms: int
    acceptable_pause_ms: int
    scale_up: bool
    keep_checkpoints: int
    hang_factor: float
    hang_floor_ms: int
    startup_timeout_ms: int
    straggler_factor: float
    straggler_windows: int
    straggler_window_ms: int
    unit_size: int
    domain_size: int
    units_within_domains: bool
    straggler_hold_windows: int
    def __init__(self, min_nodes: _Optional[int] = ..., max_nodes: _Optional[int] = ..., last_call_ms: _Optional[int] = ..., join_timeout_ms: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., phi_threshold: _Optional[float] = ..., phi_window: _Optional[int] = ..., min_std_ms: _Optional[int] = ..., acceptable_pause_ms: _Optional[int] = ..., scale_up: _Optional[bool] = ..., keep_checkpoints: _Optional[int] = ..., hang_factor: _Optional[float] = ..., hang_floor_ms: _Optional[int] = ..., startup_timeout_ms: _Optional[int] = ..., straggler_factor: _Optional[float] = ..., straggler_windows: _Optional[int] = ..., straggler_window_ms: _Optional[int] = ..., unit_size: _Optional[int] = ..., domain_size: _Optional[int] = ..., units_within_domains: _Optional[bool] = ..., straggler_hold_windows: _Optional[int] = ...) -> None: ...

class RoundMember(_message.Message):
    __slots__ = ("participant_id", "name", "rank", "metadata", "phi", "step", "step_ms", "step_ratio", "heartbeat_age_ms", "domain")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PHI_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_MS_FIELD_NUMBER: _ClassVar[int]
    STEP_RATIO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    participant_id: int
    name: str
    rank: int
    metadata: bytes
    phi: float
    step: int
    step_ms: float
    step_ratio: float
    heartbeat_age_ms: int
    domain: str
    def __init__(self, participant_id: _Optional[int] = ..., name: _Optional[str] = ..., rank: _Optional[int] = ..., metadata: _Optional[bytes] = ..., phi: _Optional[float] = ..., step: _Optional[int] = ..., step_ms: _Optional[float] = ..., step_ratio: _Optional[float] = ..., heartbeat_age_ms: _Optional[int] = ..., domain: _Optional[str] = ...) -> None: ...

class RoundInfo(_message.Message):
    __slots__ = ("job", "round", "state", "members", "world_size", "fencing_token", "store_namespace", "reason", "waiting", "opened_ms", "closed_ms", "job_closed", "job_revision", "job_state", "job_ended_ms", "job_end_detail", "trained_ms", "restore", "spares")
    JOB_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STORE_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    OPENED_MS_FIELD_NUMBER: _ClassVar[int]
    CLOSED_MS_FIELD_NUMBER: _ClassVar[int]
    JOB_CLOSED_FIELD_NUMBER: _ClassVar[int]
    JOB_REVISION_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    JOB_ENDED_MS_FIELD_NUMBER: _ClassVar[int]
    JOB_END_DETAIL_FIELD_NUMBER: _ClassVar[int]
    TRAINED_MS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    SPARES_FIELD_NUMBER: _ClassVar[int]
    job: str
    round: int
    state: RoundState
    members: _containers.RepeatedCompositeFieldContainer[RoundMember]
    world_size: int
    fencing_token: int
    store_namespace: str
    reason: str
    waiting: _containers.RepeatedCompositeFieldContainer[RoundMember]
    opened_ms: int
    closed_ms: int
    job_closed: bool
    job_revision: int
    job_state: JobState
    job_ended_ms: int
    job_end_detail: str
    trained_ms: int
    restore: str
    spares: int
    def __init__(self, job: _Optional[str] = ..., round: _Optional[int] = ..., state: _Optional[_Union[RoundState, str]] = ..., members: _Optional[_Iterable[_Union[RoundMember, _Mapping]]] = ..., world_size: _Optional[int] = ..., fencing_token: _Optional[int] = ..., store_namespace: _Optional[str] = ..., reason: _Optional[str] = ..., waiting: _Optional[_Iterable[_Union[RoundMember, _Mapping]]] = ..., opened_ms: _Optional[int] = ..., closed_ms: _Optional[int] = ..., job_closed: _Optional[bool] = ..., job_revision: _Optional[int] = ..., job_state: _Optional[_Union[JobState, str]] = ..., job_ended_ms: _Optional[int] = ..., job_end_detail: _Optional[str] = ..., trained_ms: _Optional[int] = ..., restore: _Optional[str] = ..., spares: _Optional[int] = ...) -> None: ...

class RoundRecord(_message.Message):
    __slots__ = ("round", "members", "fencing_token", "opened_ms", "closed_ms", "ended_ms", "end_reason", "ended_by", "detail", "trained_ms", "restore")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OPENED_MS_FIELD_NUMBER: _ClassVar[int]
    CLOSED_MS_FIELD_NUMBER: _ClassVar[int]
    ENDED_MS_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    ENDED_BY_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    TRAINED_MS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    round: int
    members: _containers.RepeatedCompositeFieldContainer[RoundMember]
    fencing_token: int
    opened_ms: int
    closed_ms: int
    ended_ms: int
    end_reason: RoundEndReason
    ended_by: int
    detail: str
    trained_ms: int
    restore: str
    def __init__(self, round: _Optional[int] = ..., members: _Optional[_Iterable[_Union[RoundMember, _Mapping]]] = ..., fencing_token: _Optional[int] = ..., opened_ms: _Optional[int] = ..., closed_ms: _Optional[int] = ..., ended_ms: _Optional[int] = ..., end_reason: _Optional[_Union[RoundEndReason, str]] = ..., ended_by: _Optional[int] = ..., detail: _Optional[str] = ..., trained_ms: _Optional[int] = ..., restore: _Optional[str] = ...) -> None: ...

class CheckpointInfo(_message.Message):
    __slots__ = ("checkpoint_id", "step", "round", "world_size", "layout", "uri", "committed_ms")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_MS_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: int
    step: int
    round: int
    world_size: int
    layout: bytes
    uri: str
    committed_ms: int
    def __init__(self, checkpoint_id: _Optional[int] = ..., step: _Optional[int] = ..., round: _Optional[int] = ..., world_size: _Optional[int] = ..., layout: _Optional[bytes] = ..., uri: _Optional[str] = ..., committed_ms: _Optional[int] = ...) -> None: ...

class MemorySnapshotInfo(_message.Message):
    __slots__ = ("snapshot_id", "step", "round", "world_size", "layout", "placement", "committed_ms")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_MS_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: int
    step: int
    round: int
    world_size: int
    layout: bytes
    placement: bytes
    committed_ms: int
    def __init__(self, snapshot_id: _Optional[int] = ..., step: _Optional[int] = ..., round: _Optional[int] = ..., world_size: _Optional[int] = ..., layout: _Optional[bytes] = ..., placement: _Optional[bytes] = ..., committed_ms: _Optional[int] = ...) -> None: ...

class ConfigureRequest(_message.Message):
    __slots__ = ("header", "job", "config")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    job: str
    config: JobConfig
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., job: _Optional[str] = ..., config: _Optional[_Union[JobConfig, _Mapping]] = ...) -> None: ...

class ConfigureResponse(_message.Message):
    __slots__ = ("header", "created", "round")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    created: bool
    round: RoundInfo
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., created: _Optional[bool] = ..., round: _Optional[_Union[RoundInfo, _Mapping]] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("header", "job", "name", "metadata", "config", "resume", "replaces", "domain")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    REPLACES_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    job: str
    name: str
    metadata: bytes
    config: JobConfig
    resume: bool
    replaces: int
    domain: str
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., job: _Optional[str] = ..., name: _Optional[str] = ..., metadata: _Optional[bytes] = ..., config: _Optional[_Union[JobConfig, _Mapping]] = ..., resume: _Optional[bool] = ..., replaces: _Optional[int] = ..., domain: _Optional[str] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("header", "participant_id", "waiting", "round")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    participant_id: int
    waiting: bool
    round: RoundInfo
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., participant_id: _Optional[int] = ..., waiting: _Optional[bool] = ..., round: _Optional[_Union[RoundInfo, _Mapping]] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("header", "job", "participant_id", "outcome", "detail")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    job: str
    participant_id: int
    outcome: LeaveOutcome
    detail: str
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., job: _Optional[str] = ..., participant_id: _Optional[int] = ..., outcome: _Optional[_Union[LeaveOutcome, str]] = ..., detail: _Optional[str] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ("header", "ended_round")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ENDED_ROUND_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    ended_round: int
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., ended_round: _Optional[int] = ...) -> None: ...

class ReportCollectiveFailureRequest(_message.Message):
    __slots__ = ("job", "participant_id", "round", "detail")
    JOB_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    job: str
    participant_id: int
    round: int
    detail: str
    def __init__(self, job: _Optional[str] = ..., participant_id: _Optional[int] = ..., round: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class ReportCollectiveFailureResponse(_message.Message):
    __slots__ = ("header", "confirmed")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    confirmed: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., confirmed: _Optional[_Iterable[int]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("job", "participant_id", "round", "reports_progress", "step", "step_age_ms", "step_ms", "collectives_entered", "waiting_in", "waiting_ms", "restore", "sent_ms")
    JOB_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    REPORTS_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    STEP_MS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_ENTERED_FIELD_NUMBER: _ClassVar[int]
    WAITING_IN_FIELD_NUMBER: _ClassVar[int]
    WAITING_MS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    SENT_MS_FIELD_NUMBER: _ClassVar[int]
    job: str
    participant_id: int
    round: int
    reports_progress: bool
    step: int
    step_age_ms: int
    step_ms: float
    collectives_entered: int
    waiting_in: int
    waiting_ms: int
    restore: str
    sent_ms: int
    def __init__(self, job: _Optional[str] = ..., participant_id: _Optional[int] = ..., round: _Optional[int] = ..., reports_progress: _Optional[bool] = ..., step: _Optional[int] = ..., step_age_ms: _Optional[int] = ..., step_ms: _Optional[float] = ..., collectives_entered: _Optional[int] = ..., waiting_in: _Optional[int] = ..., waiting_ms: _Optional[int] = ..., restore: _Optional[str] = ..., sent_ms: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("header", "current_round", "state")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    current_round: int
    state: RoundState
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., current_round: _Optional[int] = ..., state: _Optional[_Union[RoundState, str]] = ...) -> None: ...

class HeartbeatBatchRequest(_message.Message):
    __slots__ = ("job", "participant_ids", "rounds", "seq", "sent_ms", "released", "known_index", "progress")
    JOB_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_IDS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SENT_MS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    KNOWN_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    job: str
    participant_ids: _containers.RepeatedScalarFieldContainer[int]
    rounds: _containers.RepeatedScalarFieldContainer[int]
    seq: int
    sent_ms: int
    released: _containers.RepeatedScalarFieldContainer[int]
    known_index: int
    progress: _containers.RepeatedCompositeFieldContainer[ProgressReport]
    def __init__(self, job: _Optional[str] = ..., participant_ids: _Optional[_Iterable[int]] = ..., rounds: _Optional[_Iterable[int]] = ..., seq: _Optional[int] = ..., sent_ms: _Optional[int] = ..., released: _Optional[_Iterable[int]] = ..., known_index: _Optional[int] = ..., progress: _Optional[_Iterable[_Union[ProgressReport, _Mapping]]] = ...) -> None: ...

class ProgressReport(_message.Message):
    __slots__ = ("participant_id", "round", "step", "step_age_ms", "step_ms", "collectives_entered", "waiting_in", "waiting_ms", "restore")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    STEP_MS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_ENTERED_FIELD_NUMBER: _ClassVar[int]
    WAITING_IN_FIELD_NUMBER: _ClassVar[int]
    WAITING_MS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    participant_id: int
    round: int
    step: int
    step_age_ms: int
    step_ms: float
    collectives_entered: int
    waiting_in: int
    waiting_ms: int
    restore: str
    def __init__(self, participant_id: _Optional[int] = ..., round: _Optional[int] = ..., step: _Optional[int] = ..., step_age_ms: _Optional[int] = ..., step_ms: _Optional[float] = ..., collectives_entered: _Optional[int] = ..., waiting_in: _Optional[int] = ..., waiting_ms: _Optional[int] = ..., restore: _Optional[str] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("participant_id", "round", "state", "rank", "world_size", "fencing_token", "store_namespace", "waiting", "gone")
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STORE_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    GONE_FIELD_NUMBER: _ClassVar[int]
    participant_id: int
    round: int
    state: RoundState
    rank: int
    world_size: int
    fencing_token: int
    store_namespace: str
    waiting: bool
    gone: bool
    def __init__(self, participant_id: _Optional[int] = ..., round: _Optional[int] = ..., state: _Optional[_Union[RoundState, str]] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., fencing_token: _Optional[int] = ..., store_namespace: _Optional[str] = ..., waiting: _Optional[bool] = ..., gone: _Optional[bool] = ...) -> None: ...

class HeartbeatBatchResponse(_message.Message):
    __slots__ = ("header", "seq", "assignments")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    seq: int
    assignments: _containers.RepeatedCompositeFieldContainer[Assignment]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., seq: _Optional[int] = ..., assignments: _Optional[_Iterable[_Union[Assignment, _Mapping]]] = ...) -> None: ...

class JoinBatchRequest(_message.Message):
    __slots__ = ("header", "job", "names", "metadata", "config", "resume", "domains")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    DOMAINS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    job: str
    names: _containers.RepeatedScalarFieldContainer[str]
    metadata: _containers.RepeatedScalarFieldContainer[bytes]
    config: JobConfig
    resume: bool
    domains: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., job: _Optional[str] = ..., names: _Optional[_Iterable[str]] = ..., metadata: _Optional[_Iterable[bytes]] = ..., config: _Optional[_Union[JobConfig, _Mapping]] = ..., resume: _Optional[bool] = ..., domains: _Optional[_Iterable[str]] = ...) -> None: ...

class JoinBatchResponse(_message.Message):
    __slots__ = ("header", "participant_ids", "waiting", "round", "state")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_IDS_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    participant_ids: _containers.RepeatedScalarFieldContainer[int]
    waiting: _containers.RepeatedScalarFieldContainer[bool]
    round: int
    state: RoundState
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., participant_ids: _Optional[_Iterable[int]] = ..., waiting: _Optional[_Iterable[bool]] = ..., round: _Optional[int] = ..., state: _Optional[_Union[RoundState, str]] = ...) -> None: ...

class ListMembersRequest(_message.Message):
    __slots__ = ("job", "after", "limit", "waiting", "serializable")
    JOB_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    SERIALIZABLE_FIELD_NUMBER: _ClassVar[int]
    job: str
    after: int
    limit: int
    waiting: bool
    serializable: bool
    def __init__(self, job: _Optional[str] = ..., after: _Optional[int] = ..., limit: _Optional[int] = ..., waiting: _Optional[bool] = ..., serializable: _Optional[bool] = ...) -> None: ...

class ListMembersResponse(_message.Message):
    __slots__ = ("header", "round", "state", "members", "more")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    round: int
    state: RoundState
    members: _containers.RepeatedCompositeFieldContainer[RoundMember]
    more: bool
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., round: _Optional[int] = ..., state: _Optional[_Union[RoundState, str]] = ..., members: _Optional[_Iterable[_Union[RoundMember, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class WatchJobResponse(_message.Message):
    __slots__ = ("header", "round")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    round: RoundInfo
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., round: _Optional[_Union[RoundInfo, _Mapping]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job", "serializable")
    JOB_FIELD_NUMBER: _ClassVar[int]
    SERIALIZABLE_FIELD_NUMBER: _ClassVar[int]
    job: str
    serializable: bool
    def __init__(self, job: _Optional[str] = ..., serializable: _Optional[bool] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("header", "config", "round", "history", "latest_checkpoint", "latest_memory_snapshot")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    LATEST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    LATEST_MEMORY_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    config: JobConfig
    round: RoundInfo
    history: _containers.RepeatedCompositeFieldContainer[RoundRecord]
    latest_checkpoint: CheckpointInfo
    latest_memory_snapshot: MemorySnapshotInfo
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., config: _Optional[_Union[JobConfig, _Mapping]] = ..., round: _Optional[_Union[RoundInfo, _Mapping]] = ..., history: _Optional[_Iterable[_Union[RoundRecord, _Mapping]]] = ..., latest_checkpoint: _Optional[_Union[CheckpointInfo, _Mapping]] = ..., latest_memory_snapshot: _Optional[_Union[MemorySnapshotInfo, _Mapping]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("header", "domain", "reason")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    domain: str
    reason: str
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., domain: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DrainedRound(_message.Message):
    __slots__ = ("job", "round")
    JOB_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    job: str
    round: int
    def __init__(self, job: _Optional[str] = ..., round: _Optional[int] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("header", "changed", "ended")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    changed: bool
    ended: _containers.RepeatedCompositeFieldContainer[DrainedRound]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., changed: _Optional[bool] = ..., ended: _Optional[_Iterable[_Union[DrainedRound, _Mapping]]] = ...) -> None: ...

class UndrainRequest(_message.Message):
    __slots__ = ("header", "domain")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    domain: str
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., domain: _Optional[str] = ...) -> None: ...

class UndrainResponse(_message.Message):
    __slots__ = ("header", "changed")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    changed: bool
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., changed: _Optional[bool] = ...) -> None: ...

class ListDrainedRequest(_message.Message):
    __slots__ = ("serializable",)
    SERIALIZABLE_FIELD_NUMBER: _ClassVar[int]
    serializable: bool
    def __init__(self, serializable: _Optional[bool] = ...) -> None: ...

class DrainedDomain(_message.Message):
    __slots__ = ("domain", "reason", "since_ms")
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    domain: str
    reason: str
    since_ms: int
    def __init__(self, domain: _Optional[str] = ..., reason: _Optional[str] = ..., since_ms: _Optional[int] = ...) -> None: ...

class ListDrainedResponse(_message.Message):
    __slots__ = ("header", "domains")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DOMAINS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    domains: _containers.RepeatedCompositeFieldContainer[DrainedDomain]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., domains: _Optional[_Iterable[_Union[DrainedDomain, _Mapping]]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("serializable",)
    SERIALIZABLE_FIELD_NUMBER: _ClassVar[int]
    serializable: bool
    def __init__(self, serializable: _Optional[bool] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("header", "jobs")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    jobs: _containers.RepeatedCompositeFieldContainer[RoundInfo]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., jobs: _Optional[_Iterable[_Union[RoundInfo, _Mapping]]] = ...) -> None: ...

class EvictRequest(_message.Message):
    __slots__ = ("header", "job", "participant_id")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    job: str
    participant_id: int
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., job: _Optional[str] = ..., participant_id: _Optional[int] = ...) -> None: ...

class EvictResponse(_message.Message):
    __slots__ = ("header", "ended_round")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ENDED_ROUND_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    ended_round: int
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., ended_round: _Optional[int] = ...) -> None: ...

class CloseJobRequest(_message.Message):
    __slots__ = ("header", "job")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    job: str
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., job: _Optional[str] = ...) -> None: ...

class CloseJobResponse(_message.Message):
    __slots__ = ("header", "ended_round")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ENDED_ROUND_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    ended_round: int
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., ended_round: _Optional[int] = ...) -> None: ...

class PruneJobsRequest(_message.Message):
    __slots__ = ("header", "older_than_ms", "keep", "jobs")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    OLDER_THAN_MS_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    older_than_ms: int
    keep: int
    jobs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., older_than_ms: _Optional[int] = ..., keep: _Optional[int] = ..., jobs: _Optional[_Iterable[str]] = ...) -> None: ...

class PruneJobsResponse(_message.Message):
    __slots__ = ("header", "pruned")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PRUNED_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    pruned: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., pruned: _Optional[_Iterable[str]] = ...) -> None: ...

class StoreScope(_message.Message):
    __slots__ = ("job", "round", "participant_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANT_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    round: int
    participant_id: int
    def __init__(self, job: _Optional[str] = ..., round: _Optional[int] = ..., participant_id: _Optional[int] = ...) -> None: ...

class StoreSetRequest(_message.Message):
    __slots__ = ("header", "scope", "key", "value", "cache")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    scope: StoreScope
    key: bytes
    value: bytes
    cache: bool
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., scope: _Optional[_Union[StoreScope, _Mapping]] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., cache: _Optional[bool] = ...) -> None: ...

class StoreSetResponse(_message.Message):
    __slots__ = ("header", "cache_ms")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CACHE_MS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    cache_ms: int
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., cache_ms: _Optional[int] = ...) -> None: ...

class StoreGetRequest(_message.Message):
    __slots__ = ("scope", "key", "timeout_ms")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    scope: StoreScope
    key: bytes
    timeout_ms: int
    def __init__(self, scope: _Optional[_Union[StoreScope, _Mapping]] = ..., key: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class StoreGetResponse(_message.Message):
    __slots__ = ("header", "value")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    value: bytes
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., value: _Optional[bytes] = ...) -> None: ...

class StoreAddRequest(_message.Message):
    __slots__ = ("header", "scope", "key", "delta")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    scope: StoreScope
    key: bytes
    delta: int
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., scope: _Optional[_Union[StoreScope, _Mapping]] = ..., key: _Optional[bytes] = ..., delta: _Optional[int] = ...) -> None: ...

class StoreAddResponse(_message.Message):
    __slots__ = ("header", "value")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    value: int
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., value: _Optional[int] = ...) -> None: ...

class StoreCompareSetRequest(_message.Message):
    __slots__ = ("header", "scope", "key", "expected", "desired")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    scope: StoreScope
    key: bytes
    expected: bytes
    desired: bytes
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., scope: _Optional[_Union[StoreScope, _Mapping]] = ..., key: _Optional[bytes] = ..., expected: _Optional[bytes] = ..., desired: _Optional[bytes] = ...) -> None: ...

class StoreCompareSetResponse(_message.Message):
    __slots__ = ("header", "swapped", "value")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SWAPPED_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    swapped: bool
    value: bytes
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., swapped: _Optional[bool] = ..., value: _Optional[bytes] = ...) -> None: ...

class StoreWaitRequest(_message.Message):
    __slots__ = ("scope", "keys", "timeout_ms")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    scope: StoreScope
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    timeout_ms: int
    def __init__(self, scope: _Optional[_Union[StoreScope, _Mapping]] = ..., keys: _Optional[_Iterable[bytes]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class StoreWaitResponse(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ...) -> None: ...

class StoreDeleteRequest(_message.Message):
    __slots__ = ("header", "scope", "key")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    scope: StoreScope
    key: bytes
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., scope: _Optional[_Union[StoreScope, _Mapping]] = ..., key: _Optional[bytes] = ...) -> None: ...

class StoreDeleteResponse(_message.Message):
    __slots__ = ("header", "existed")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    existed: bool
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., existed: _Optional[bool] = ...) -> None: ...

class StoreNumKeysRequest(_message.Message):
    __slots__ = ("scope",)
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    scope: StoreScope
    def __init__(self, scope: _Optional[_Union[StoreScope, _Mapping]] = ...) -> None: ...

class StoreNumKeysResponse(_message.Message):
    __slots__ = ("header", "num_keys")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    NUM_KEYS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    num_keys: int
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., num_keys: _Optional[int] = ...) -> None: ...

class StoreCheckRequest(_message.Message):
    __slots__ = ("scope", "keys")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    scope: StoreScope
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, scope: _Optional[_Union[StoreScope, _Mapping]] = ..., keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class StoreCheckResponse(_message.Message):
    __slots__ = ("header", "all_exist")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ALL_EXIST_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    all_exist: bool
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., all_exist: _Optional[bool] = ...) -> None: ...

class StoreKeyGroup(_message.Message):
    __slots__ = ("keys", "cache")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    cache: bool
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., cache: _Optional[bool] = ...) -> None: ...

class StoreMultiGetRequest(_message.Message):
    __slots__ = ("scope", "groups", "timeout_ms", "partial")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    scope: StoreScope
    groups: _containers.RepeatedCompositeFieldContainer[StoreKeyGroup]
    timeout_ms: int
    partial: bool
    def __init__(self, scope: _Optional[_Union[StoreScope, _Mapping]] = ..., groups: _Optional[_Iterable[_Union[StoreKeyGroup, _Mapping]]] = ..., timeout_ms: _Optional[int] = ..., partial: _Optional[bool] = ...) -> None: ...

class StoreGroupValues(_message.Message):
    __slots__ = ("complete", "values", "cache_ms")
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    CACHE_MS_FIELD_NUMBER: _ClassVar[int]
    complete: bool
    values: _containers.RepeatedScalarFieldContainer[bytes]
    cache_ms: int
    def __init__(self, complete: _Optional[bool] = ..., values: _Optional[_Iterable[bytes]] = ..., cache_ms: _Optional[int] = ...) -> None: ...

class StoreMultiGetResponse(_message.Message):
    __slots__ = ("header", "groups")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    groups: _containers.RepeatedCompositeFieldContainer[StoreGroupValues]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., groups: _Optional[_Iterable[_Union[StoreGroupValues, _Mapping]]] = ...) -> None: ...

class StoreBatchRequest(_message.Message):
    __slots__ = ("operations",)
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    operations: _containers.RepeatedCompositeFieldContainer[StoreBatchOperation]
    def __init__(self, operations: _Optional[_Iterable[_Union[StoreBatchOperation, _Mapping]]] = ...) -> None: ...

class StoreBatchOperation(_message.Message):
    __slots__ = ("id", "multi_get", "set", "add", "compare_set", "delete")
    ID_FIELD_NUMBER: _ClassVar[int]
    MULTI_GET_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    COMPARE_SET_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    id: int
    multi_get: StoreMultiGetRequest
    set: StoreSetRequest
    add: StoreAddRequest
    compare_set: StoreCompareSetRequest
    delete: StoreDeleteRequest
    def __init__(self, id: _Optional[int] = ..., multi_get: _Optional[_Union[StoreMultiGetRequest, _Mapping]] = ..., set: _Optional[_Union[StoreSetRequest, _Mapping]] = ..., add: _Optional[_Union[StoreAddRequest, _Mapping]] = ..., compare_set: _Optional[_Union[StoreCompareSetRequest, _Mapping]] = ..., delete: _Optional[_Union[StoreDeleteRequest, _Mapping]] = ...) -> None: ...

class StoreBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[StoreBatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[StoreBatchResult, _Mapping]]] = ...) -> None: ...

class StoreBatchResult(_message.Message):
    __slots__ = ("id", "multi_get", "set", "add", "compare_set", "delete", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    MULTI_GET_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    COMPARE_SET_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    multi_get: StoreMultiGetResponse
    set: StoreSetResponse
    add: StoreAddResponse
    compare_set: StoreCompareSetResponse
    delete: StoreDeleteResponse
    error: _kv_pb2.BatchError
    def __init__(self, id: _Optional[int] = ..., multi_get: _Optional[_Union[StoreMultiGetResponse, _Mapping]] = ..., set: _Optional[_Union[StoreSetResponse, _Mapping]] = ..., add: _Optional[_Union[StoreAddResponse, _Mapping]] = ..., compare_set: _Optional[_Union[StoreCompareSetResponse, _Mapping]] = ..., delete: _Optional[_Union[StoreDeleteResponse, _Mapping]] = ..., error: _Optional[_Union[_kv_pb2.BatchError, _Mapping]] = ...) -> None: ...

class CheckpointFence(_message.Message):
    __slots__ = ("job", "round", "fencing_token")
    JOB_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job: str
    round: int
    fencing_token: int
    def __init__(self, job: _Optional[str] = ..., round: _Optional[int] = ..., fencing_token: _Optional[int] = ...) -> None: ...

class CheckpointBeginRequest(_message.Message):
    __slots__ = ("header", "fence", "step", "world_size", "layout", "uri")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    fence: CheckpointFence
    step: int
    world_size: int
    layout: bytes
    uri: str
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., fence: _Optional[_Union[CheckpointFence, _Mapping]] = ..., step: _Optional[int] = ..., world_size: _Optional[int] = ..., layout: _Optional[bytes] = ..., uri: _Optional[str] = ...) -> None: ...

class CheckpointBeginResponse(_message.Message):
    __slots__ = ("header", "checkpoint_id")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    checkpoint_id: int
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., checkpoint_id: _Optional[int] = ...) -> None: ...

class CheckpointShardDoneRequest(_message.Message):
    __slots__ = ("header", "fence", "checkpoint_id", "rank")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    fence: CheckpointFence
    checkpoint_id: int
    rank: int
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., fence: _Optional[_Union[CheckpointFence, _Mapping]] = ..., checkpoint_id: _Optional[int] = ..., rank: _Optional[int] = ...) -> None: ...

class CheckpointShardDoneResponse(_message.Message):
    __slots__ = ("header", "reported", "world_size")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    REPORTED_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    reported: int
    world_size: int
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., reported: _Optional[int] = ..., world_size: _Optional[int] = ...) -> None: ...

class CheckpointCommitRequest(_message.Message):
    __slots__ = ("header", "fence", "checkpoint_id")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    fence: CheckpointFence
    checkpoint_id: int
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., fence: _Optional[_Union[CheckpointFence, _Mapping]] = ..., checkpoint_id: _Optional[int] = ...) -> None: ...

class CheckpointCommitResponse(_message.Message):
    __slots__ = ("header", "checkpoint", "retired")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    checkpoint: CheckpointInfo
    retired: _containers.RepeatedCompositeFieldContainer[CheckpointInfo]
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., checkpoint: _Optional[_Union[CheckpointInfo, _Mapping]] = ..., retired: _Optional[_Iterable[_Union[CheckpointInfo, _Mapping]]] = ...) -> None: ...

class CheckpointAbortRequest(_message.Message):
    __slots__ = ("header", "fence", "checkpoint_id")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    fence: CheckpointFence
    checkpoint_id: int
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., fence: _Optional[_Union[CheckpointFence, _Mapping]] = ..., checkpoint_id: _Optional[int] = ...) -> None: ...

class CheckpointAbortResponse(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ...) -> None: ...

class CheckpointLatestRequest(_message.Message):
    __slots__ = ("job", "serializable")
    JOB_FIELD_NUMBER: _ClassVar[int]
    SERIALIZABLE_FIELD_NUMBER: _ClassVar[int]
    job: str
    serializable: bool
    def __init__(self, job: _Optional[str] = ..., serializable: _Optional[bool] = ...) -> None: ...

class CheckpointLatestResponse(_message.Message):
    __slots__ = ("header", "checkpoint")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    checkpoint: CheckpointInfo
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., checkpoint: _Optional[_Union[CheckpointInfo, _Mapping]] = ...) -> None: ...

class MemorySnapshotCommitRequest(_message.Message):
    __slots__ = ("header", "fence", "step", "world_size", "layout", "placement", "planned_end")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    PLANNED_END_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.RequestHeader
    fence: CheckpointFence
    step: int
    world_size: int
    layout: bytes
    placement: bytes
    planned_end: bool
    def __init__(self, header: _Optional[_Union[_common_pb2.RequestHeader, _Mapping]] = ..., fence: _Optional[_Union[CheckpointFence, _Mapping]] = ..., step: _Optional[int] = ..., world_size: _Optional[int] = ..., layout: _Optional[bytes] = ..., placement: _Optional[bytes] = ..., planned_end: _Optional[bool] = ...) -> None: ...

class MemorySnapshotCommitResponse(_message.Message):
    __slots__ = ("header", "snapshot")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    snapshot: MemorySnapshotInfo
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., snapshot: _Optional[_Union[MemorySnapshotInfo, _Mapping]] = ...) -> None: ...

class MemorySnapshotLatestRequest(_message.Message):
    __slots__ = ("job", "serializable")
    JOB_FIELD_NUMBER: _ClassVar[int]
    SERIALIZABLE_FIELD_NUMBER: _ClassVar[int]
    job: str
    serializable: bool
    def __init__(self, job: _Optional[str] = ..., serializable: _Optional[bool] = ...) -> None: ...

class MemorySnapshotLatestResponse(_message.Message):
    __slots__ = ("header", "snapshot")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.ResponseHeader
    snapshot: MemorySnapshotInfo
    def __init__(self, header: _Optional[_Union[_common_pb2.ResponseHeader, _Mapping]] = ..., snapshot: _Optional[_Union[MemorySnapshotInfo, _Mapping]] = ...) -> None: ...
