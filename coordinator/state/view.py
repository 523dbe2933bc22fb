"""The read-only face of the replicated state, for everything but the apply path.

Theory of operation. Only the Ready loop mutates the ``StateMachine``: it applies committed
entries and installs snapshots, in log order, so every replica reaches the same state
(``machine.py``). Everyone else (the servicers answering reads, the leader's soft state,
status calls) only queries it. ``StateView`` states that rule in types: it lists the queries
and nothing else, and the node hands the servicers (``ServerNode.state``) and the leader's
supervisor the state through it, so one that called ``apply`` or ``restore``, assigned
``applied_index``, or stored into a job's participants would be rejected by
``mypy --strict`` rather than found in review. The records the queries return
(``KeyValue``, ``Round``, ``Participant``, ``RoundRecord``, ``CheckpointInfo``, ...) are
frozen dataclasses; the containers the views expose are ``Mapping``/``Sequence``, which
have no mutating methods.

The concrete ``StateMachine`` (and its ``Rendezvous``, ``Job``, ``RoundStore``,
``CheckpointRegistry``) satisfy these Protocols structurally: no wrapper is needed and reads
cost nothing extra. The view is a promise enforced by the type checker, not a copy: it shows
the state as of the latest apply (a snapshot encoded off the event loop uses a frozen copy,
``StateMachine.frozen_copy``, instead).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from .errors import Compacted, Failure, StaleRound
from .jobs import (
    CheckpointInfo,
    DrainedDomain,
    JobConfig,
    JobState,
    MemorySnapshotInfo,
    Participant,
    ParticipantAssignment,
    Round,
    RoundRecord,
)
from .leases import LeaseInfo
from .values import Event, KeyValue

if TYPE_CHECKING:
    from .limits import Limits
    from .sessions import SessionInfo

__all__ = ["CheckpointsView", "JobView", "RendezvousView", "RoundStoreView", "StateView"]


class CheckpointsView(Protocol):
    def latest(self) -> CheckpointInfo | None: ...

    def latest_memory_snapshot(self) -> MemorySnapshotInfo | None: ...


class RoundStoreView(Protocol):
    """The queries of one round's c10d store (``roundstore.RoundStore``, or an ended
    round's, read-only: ``roundstore.EndedRoundStore``)."""

    @property
    def ended(self) -> StaleRound | None:
        """None for a live store; for an ended round's, the refusal of a read of a key it
        lacks (no write will ever add one)."""
        ...

    def get(self, key: bytes) -> bytes | None: ...

    def num_keys(self) -> int: ...

    def check(self, keys: list[bytes]) -> bool: ...


class JobView(Protocol):
    """One rendezvous job, read-only (``rendezvous.Job``)."""

    @property
    def job_id(self) -> str: ...

    @property
    def config(self) -> JobConfig: ...

    @property
    def round(self) -> Round: ...

    @property
    def revision(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    @property
    def participants(self) -> Mapping[int, Participant]: ...

    @property
    def waiting(self) -> Sequence[int]: ...

    @property
    def history(self) -> Sequence[RoundRecord]: ...

    @property
    def checkpoints(self) -> CheckpointsView: ...

    @property
    def ended_ms(self) -> int: ...

    @property
    def end_detail(self) -> str: ...

    @property
    def outcome(self) -> JobState: ...

    @property
    def state(self) -> JobState: ...

    @property
    def ended(self) -> bool: ...

    def rank_of(self, participant_id: int) -> int | None:
        """The participant's rank in the current round (-1 while JOINING), None if it is
        not a member; O(1)."""
        ...


class RendezvousView(Protocol):
    """The rendezvous jobs, read-only (``rendezvous.Rendezvous``)."""

    @property
    def jobs(self) -> Mapping[str, JobView]: ...

    @property
    def revision(self) -> int:
        """The raft index of the last change to any job."""
        ...

    @property
    def cluster_version(self) -> int:
        """The cluster version as the state machine applied it (version.py)."""
        ...

    def participant_keys(self) -> list[tuple[str, int]]: ...

    def drained_domains(self) -> list[DrainedDomain]:
        """The drained failure domains, in name order."""
        ...

    def assignment(self, job_id: str, pid: int) -> ParticipantAssignment | None:
        """The participant's round, state, rank, world size, token and waiting flag, in O(1);
        None when the job is gone or ``pid`` is not one of its participants."""
        ...

    def participant_id_known(self, pid: int, applied_index: int) -> bool:
        """Whether a join at or below ``applied_index`` handed out ``pid`` (or none ever will)."""
        ...

    def closes_due(self, now_ms: int) -> list[tuple[str, int]]: ...

    def member_store(
        self, job_id: str, round_number: int, pid: int
    ) -> RoundStoreView | Failure: ...

    def readable_store(
        self, job_id: str, round_number: int, pid: int
    ) -> RoundStoreView | Failure: ...

    def job_changed_since(self, job_id: str, revision: int) -> bool | None: ...


class StateView(Protocol):
    """The replicated state's queries (``machine.StateMachine`` without its mutators)."""

    @property
    def limits(self) -> Limits: ...

    @property
    def applied_index(self) -> int: ...

    @property
    def revision(self) -> int: ...

    @property
    def rendezvous(self) -> RendezvousView: ...

    def get(self, key: bytes) -> KeyValue | None: ...

    def range(
        self,
        prefix: bytes,
        limit: int = 0,
        start_after: bytes = b"",
        *,
        max_bytes: int = 0,
        count_values: bool = True,
    ) -> tuple[tuple[KeyValue, ...], bool]: ...

    def count_prefix(self, prefix: bytes) -> int: ...

    def lease_key_count(self, lease_id: int) -> int: ...

    def lease_list(self) -> tuple[LeaseInfo, ...]: ...

    def lease_info(self, lease_id: int) -> LeaseInfo | None: ...

    def session_info(self, session_id: int) -> SessionInfo | None: ...

    def events_since(
        self, revision: int, key: bytes, prefix: bool = False
    ) -> tuple[Event, ...] | Compacted: ...

    def snapshot(self) -> bytes:
        """Canonical bytes of the whole state (for comparing replicas in tests and tools)."""
        ...
