"""The job administration calls of :class:`rallypoint.client.Client`: configure, inspect,
evict, close and prune jobs, read their checkpoints, and drain failure domains.

A mixin, so that the client's module stays one job (the client's lifecycle and the calls
that keep state: leases, watches, participants); these calls keep none. Each is a plain call
through the client's :class:`Caller` (``jobs.py`` holds the calls themselves).
"""

from __future__ import annotations

from collections.abc import Sequence

from . import arguments
from . import jobs as _jobs
from .caller import Caller
from .rendezvous_values import (
    CheckpointInfo,
    DrainedDomain,
    DrainResult,
    JobConfig,
    JobStatus,
    MemorySnapshotInfo,
    RoundInfo,
)


class JobAdmin:
    """Job administration over ``self._caller`` (set by the client)."""

    _caller: Caller

    async def configure(
        self, job: str, config: JobConfig, *, timeout_s: float | None = None
    ) -> tuple[bool, RoundInfo]:
        """Create, reconfigure or reopen ``job``; (created, current round)."""
        return await _jobs.configure(self._caller, job, config, timeout_s=timeout_s)

    async def get_job(
        self, job: str, *, serializable: bool = False, timeout_s: float | None = None
    ) -> JobStatus:
        return await _jobs.get_job(
            self._caller, job, serializable=serializable, timeout_s=timeout_s
        )

    async def list_jobs(
        self, *, serializable: bool = False, timeout_s: float | None = None
    ) -> list[RoundInfo]:
        """Every job's current round, in job-id order (members' phi reads 0 here)."""
        return await _jobs.list_jobs(self._caller, serializable=serializable, timeout_s=timeout_s)

    async def job_statuses(
        self, *, serializable: bool = False, timeout_s: float | None = None
    ) -> list[JobStatus]:
        """Every job's full status: each member's phi, history, latest checkpoint."""
        return await _jobs.job_statuses(
            self._caller, serializable=serializable, timeout_s=timeout_s
        )

    async def evict(self, job: str, participant_id: int, *, timeout_s: float | None = None) -> int:
        """Remove a participant; the round that ended because of it (0: none)."""
        arguments.count(participant_id, "participant_id")
        return await _jobs.evict(self._caller, job, participant_id, timeout_s=timeout_s)

    async def close_job(self, job: str, *, timeout_s: float | None = None) -> int:
        """End the job; the round that ended (0: it was already closed)."""
        return await _jobs.close_job(self._caller, job, timeout_s=timeout_s)

    async def prune_jobs(
        self,
        *,
        older_than_s: float = 0.0,
        keep: int = 0,
        jobs: Sequence[str] = (),
        timeout_s: float | None = None,
    ) -> list[str]:
        """Remove ended jobs (finished, failed, closed) that ended at least ``older_than_s``
        ago, keeping the ``keep`` that ended last (among ``jobs``, or every job); the jobs
        removed. An admin call."""
        return await _jobs.prune_jobs(
            self._caller, older_than_s=older_than_s, keep=keep, jobs=jobs, timeout_s=timeout_s
        )

    async def latest_checkpoint(
        self, job: str, *, serializable: bool = False, timeout_s: float | None = None
    ) -> CheckpointInfo | None:
        return await _jobs.latest_checkpoint(
            self._caller, job, serializable=serializable, timeout_s=timeout_s
        )

    async def latest_memory_snapshot(
        self, job: str, *, serializable: bool = False, timeout_s: float | None = None
    ) -> MemorySnapshotInfo | None:
        """The job's latest complete in-memory snapshot (any round); None when none."""
        return await _jobs.latest_memory_snapshot(
            self._caller, job, serializable=serializable, timeout_s=timeout_s
        )

    async def drain(
        self, domain: str, *, reason: str = "", timeout_s: float | None = None
    ) -> DrainResult:
        """Drain a failure domain (a host) in every job: each ACTIVE round with a member in
        it ends (reason DRAINED) and re-forms without the domain's participants, who wait
        until it is undrained. Admin; a job's worker may drain only a domain one of its own
        session's participants is in (a health check draining its own host)."""
        return await _jobs.drain(self._caller, domain, reason=reason, timeout_s=timeout_s)

    async def undrain(self, domain: str, *, timeout_s: float | None = None) -> bool:
        """Admit a drained domain's participants again; False when it was not drained.
        Admin only."""
        return await _jobs.undrain(self._caller, domain, timeout_s=timeout_s)

    async def drained(
        self, *, serializable: bool = False, timeout_s: float | None = None
    ) -> list[DrainedDomain]:
        """The drained failure domains, in domain order, with the reason and since when."""
        return await _jobs.drained(self._caller, serializable=serializable, timeout_s=timeout_s)
