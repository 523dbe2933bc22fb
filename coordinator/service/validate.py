"""Request validation, done before anything is proposed or read.

Each check names the offending field by its path in the request (``header.sequence``,
``fence.token``) so a client can tell exactly what to fix. Size limits are the cluster's
(``node.state.limits``) and are refused with the state machine's own failures
(KEY_TOO_LARGE, VALUE_TOO_LARGE), so a request is refused the same way whether the servicer
or the state machine notices first; refusing here keeps oversized requests out of the log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rallypoint.proto.v1 import common_pb2, rendezvous_pb2

from ..state.errors import KeyTooLarge, LimitExceeded, ValueTooLarge
from ..state.jobs import JobConfig, RendezvousLimits, job_id_problem
from ..state.machine import Limits
from ..state.values import Fence
from .errors import InvalidArgument, RequestFailed


def session_header(
    present: bool, header: common_pb2.RequestHeader, field: str = "header"
) -> common_pb2.RequestHeader:
    """The (session_id, sequence, first_unacked) of a mutating request, checked."""
    if not present:
        raise InvalidArgument(
            field, "required on a mutating request (session_id from Session.Open, sequence >= 1)"
        )
    if header.session_id == 0:
        raise InvalidArgument(f"{field}.session_id", "must be non-zero (from Session.Open)")
    if header.sequence == 0:
        raise InvalidArgument(f"{field}.sequence", "must be >= 1")
    if header.first_unacked > header.sequence:
        raise InvalidArgument(
            f"{field}.first_unacked",
            f"must not exceed {field}.sequence ({header.sequence}): this request is still "
            f"unanswered, got {header.first_unacked}",
        )
    return header


def key(value: bytes, limits: Limits, field: str = "key", allow_empty: bool = False) -> bytes:
    if not value and not allow_empty:
        raise InvalidArgument(field, "must not be empty")
    if len(value) > limits.max_key_bytes:
        raise RequestFailed(KeyTooLarge(len(value), limits.max_key_bytes))
    return value


def value(data: bytes, limits: Limits) -> bytes:
    if len(data) > limits.max_value_bytes:
        raise RequestFailed(ValueTooLarge(len(data), limits.max_value_bytes))
    return data


def optional_lease_id(lease_id: int, field: str = "lease_id") -> int:
    """A lease to attach a key to: 0 for none."""
    if lease_id < 0:
        raise InvalidArgument(field, f"must be >= 0 (0 for no lease), got {lease_id}")
    return lease_id


def lease_id(lease_id: int, field: str = "lease_id") -> int:
    """A lease the request is about: must name one."""
    if lease_id <= 0:
        raise InvalidArgument(field, f"must be a lease id (> 0), got {lease_id}")
    return lease_id


def fence(present: bool, fence: common_pb2.Fence, field: str = "fence") -> Fence | None:
    if not present:
        return None
    lease_id(fence.lease_id, f"{field}.lease_id")
    if fence.token == 0:
        raise InvalidArgument(f"{field}.token", "must be the fencing token of the lease's grant")
    return Fence(fence.lease_id, fence.token)


def positive(amount: int, field: str) -> int:
    if amount <= 0:
        raise InvalidArgument(field, f"must be > 0, got {amount}")
    return amount


def bounded(amount: int, field: str, most: int, why: str) -> int:
    """``amount`` if it is in 1..``most``; otherwise InvalidArgument naming the bound."""
    if amount <= 0:
        raise InvalidArgument(field, f"must be > 0, got {amount}")
    if amount > most:
        raise InvalidArgument(field, f"must be at most {most} ({why}), got {amount}")
    return amount


def non_negative(amount: int, field: str) -> int:
    if amount < 0:
        raise InvalidArgument(field, f"must be >= 0, got {amount}")
    return amount


def session_id(session: int, field: str = "session_id") -> int:
    if session == 0:
        raise InvalidArgument(field, "must be non-zero (from Session.Open)")
    return session


def member_id(member: int, field: str = "id") -> int:
    if member == 0:
        raise InvalidArgument(field, "must be a member id (non-zero)")
    return member


def address(text: str, field: str) -> str:
    """A "host:port" address: a non-empty host and a port in 1..65535."""
    host, colon, port = text.rpartition(":")
    if not text:
        raise InvalidArgument(field, 'must not be empty (expected "host:port")')
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(field, f'must be "host:port" with a port in 1..65535, got {text!r}')
    if host.startswith("[") != host.endswith("]"):
        raise InvalidArgument(field, f"unbalanced brackets around an IPv6 host in {text!r}")
    return text


# ---------------------------------------------------------------- rendezvous (rendezvous.proto)


def job_id(job: str, field: str = "job") -> str:
    problem = job_id_problem(job)
    if problem:
        raise InvalidArgument(field, problem)
    return job


def job_config(
    present: bool, config: rendezvous_pb2.JobConfig, limits: RendezvousLimits, field: str = "config"
) -> JobConfig:
    """A JobConfig, every bound rendezvous.proto states checked field by field. Zero is not
    read as "default": the wire contract states each bound, and a client fills them all."""
    if not present:
        raise InvalidArgument(field, "required")
    if config.min_nodes < 1:
        raise InvalidArgument(f"{field}.min_nodes", f"must be >= 1, got {config.min_nodes}")
    if not config.min_nodes <= config.max_nodes <= limits.max_nodes:
        raise InvalidArgument(
            f"{field}.max_nodes",
            f"must be in min_nodes..{limits.max_nodes} ({config.min_nodes}..), "
            f"got {config.max_nodes}",
        )
    non_negative(config.last_call_ms, f"{field}.last_call_ms")
    positive(config.join_timeout_ms, f"{field}.join_timeout_ms")
    positive(config.heartbeat_interval_ms, f"{field}.heartbeat_interval_ms")
    # The state machine keeps the threshold in thousandths (no floats in replicated state).
    threshold_milli = (
        round(config.phi_threshold * 1000) if math.isfinite(config.phi_threshold) else 0
    )
    if threshold_milli < 1 or threshold_milli > 2**62:
        raise InvalidArgument(
            f"{field}.phi_threshold",
            f"must be a finite number >= 0.001, got {config.phi_threshold}",
        )
    if config.phi_window < 2:
        raise InvalidArgument(f"{field}.phi_window", f"must be >= 2, got {config.phi_window}")
    positive(config.min_std_ms, f"{field}.min_std_ms")
    non_negative(config.acceptable_pause_ms, f"{field}.acceptable_pause_ms")
    positive(config.keep_checkpoints, f"{field}.keep_checkpoints")
    # Fields added after the first release read 0 (absent) as their default, so a client that
    # predates them still configures jobs; any value sent is checked.
    defaults = JobConfig(1, 1)
    hang_factor_milli = _milli(config.hang_factor, f"{field}.hang_factor", allow_zero=False)
    straggler_factor_milli = _milli(config.straggler_factor, f"{field}.straggler_factor")
    for name in (
        "hang_floor_ms",
        "startup_timeout_ms",
        "straggler_windows",
        "straggler_window_ms",
        "straggler_hold_windows",
    ):
        non_negative(getattr(config, name), f"{field}.{name}")
    unit_size = non_negative(config.unit_size, f"{field}.unit_size") or defaults.unit_size
    _shape(config, unit_size, field)
    return JobConfig(
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        last_call_ms=config.last_call_ms,
        join_timeout_ms=config.join_timeout_ms,
        heartbeat_interval_ms=config.heartbeat_interval_ms,
        phi_threshold_milli=threshold_milli,
        phi_window=config.phi_window,
        min_std_ms=config.min_std_ms,
        acceptable_pause_ms=config.acceptable_pause_ms,
        scale_up=config.scale_up,
        keep_checkpoints=config.keep_checkpoints,
        hang_factor_milli=hang_factor_milli or defaults.hang_factor_milli,
        hang_floor_ms=config.hang_floor_ms or defaults.hang_floor_ms,
        startup_timeout_ms=config.startup_timeout_ms or defaults.startup_timeout_ms,
        straggler_factor_milli=straggler_factor_milli,
        straggler_windows=config.straggler_windows or defaults.straggler_windows,
        straggler_window_ms=config.straggler_window_ms or defaults.straggler_window_ms,
        unit_size=unit_size,
        domain_size=config.domain_size,
        units_within_domains=config.units_within_domains,
        straggler_hold_windows=config.straggler_hold_windows or defaults.straggler_hold_windows,
    )


def _shape(config: rendezvous_pb2.JobConfig, unit_size: int, field: str) -> None:
    """A world of whole units: unit_size divides min_nodes and max_nodes, and a domain that
    must hold whole units holds a multiple of it (rendezvous.proto, JobConfig)."""
    for name in ("min_nodes", "max_nodes"):
        nodes = getattr(config, name)
        if nodes % unit_size:
            raise InvalidArgument(
                f"{field}.unit_size",
                f"unit_size {unit_size} does not divide {name} {nodes}: every world size "
                "must be a whole number of units",
            )
    non_negative(config.domain_size, f"{field}.domain_size")
    if config.units_within_domains and config.domain_size % unit_size:
        units, stranded = divmod(config.domain_size, unit_size)
        raise InvalidArgument(
            f"{field}.domain_size",
            f"a domain of {config.domain_size} holds {units} unit{'s' * (units != 1)} of "
            f"{unit_size} and strands {stranded} rank{'s' * (stranded != 1)} "
            "(units_within_domains: domain_size must be a multiple of unit_size)",
        )


def _milli(value: float, field: str, *, allow_zero: bool = True) -> int:
    """A factor as thousandths (replicated state holds no floats); 0 stays 0."""
    milli = round(value * 1000) if math.isfinite(value) else -1
    if milli < 0 or milli > 2**40 or (value > 0 and milli == 0):
        raise InvalidArgument(field, f"must be 0 or a finite number >= 0.001, got {value}")
    return milli


def participant_name(name: str, limits: RendezvousLimits, field: str = "name") -> str:
    if not 1 <= len(name) <= limits.max_name_chars:
        raise InvalidArgument(
            field, f"must be 1..{limits.max_name_chars} characters, got {len(name)}"
        )
    return name


def participant_metadata(metadata: bytes, limits: RendezvousLimits) -> bytes:
    if len(metadata) > limits.max_metadata_bytes:
        raise RequestFailed(LimitExceeded("participant metadata bytes", limits.max_metadata_bytes))
    return metadata


@dataclass(frozen=True, slots=True)
class Scope:
    """Whose request, in which round: a StoreScope or a CheckpointFence, checked."""

    job: str
    round: int
    participant_id: int = 0
    fencing_token: int = 0


def store_scope(present: bool, scope: rendezvous_pb2.StoreScope, field: str = "scope") -> Scope:
    if not present:
        raise InvalidArgument(field, "required: the (job, round, participant_id) of the request")
    return Scope(
        job_id(scope.job, f"{field}.job"),
        positive(scope.round, f"{field}.round"),
        positive(scope.participant_id, f"{field}.participant_id"),
    )


def checkpoint_fence(
    present: bool, fence: rendezvous_pb2.CheckpointFence, field: str = "fence"
) -> Scope:
    if not present:
        raise InvalidArgument(field, "required: the (job, round, fencing_token) of the round")
    return Scope(
        job_id(fence.job, f"{field}.job"),
        positive(fence.round, f"{field}.round"),
        fencing_token=positive(fence.fencing_token, f"{field}.fencing_token"),
    )


def store_key(data: bytes, limits: RendezvousLimits, field: str = "key") -> bytes:
    if not data:
        raise InvalidArgument(field, "must not be empty")
    if len(data) > limits.max_store_key_bytes:
        raise RequestFailed(KeyTooLarge(len(data), limits.max_store_key_bytes))
    return data


def store_value(data: bytes, limits: RendezvousLimits) -> bytes:
    if len(data) > limits.max_store_value_bytes:
        raise RequestFailed(ValueTooLarge(len(data), limits.max_store_value_bytes))
    return data


@dataclass(frozen=True, slots=True)
class CheckedMultiGet:
    """A MultiGet request past its checks."""

    scope: Scope
    groups: list[list[bytes]]
    timeout_ms: int
    partial: bool
    # The groups that ask for a cache lease (by position).
    cache: list[bool]
