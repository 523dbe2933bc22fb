"""Job administration (rendezvous.proto, service Rendezvous): configure, inspect, evict, close;
and the failure domains drained cluster-wide (drain, undrain, drained).

These are plain calls through the client's :class:`Caller` (leader following, retries,
deadlines; a retried command applies once); their failures are the typed errors of
``rendezvous_errors``. ``join`` and the participant it returns are in
``rendezvous.py``; the round store and the checkpoint registry in ``roundstore.py`` and
``checkpoints.py``.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import AsyncIterator, Sequence

from rallypoint.proto.v1 import rendezvous_pb2, rendezvous_pb2_grpc

from .arguments import count, non_negative_seconds
from .caller import Caller
from .errors import InvalidValueError, RallypointError
from .rendezvous_errors import JobNotFoundError, refined
from .rendezvous_values import (
    CheckpointInfo,
    DrainedDomain,
    DrainResult,
    JobConfig,
    JobStatus,
    JoinBatchResult,
    MembersPage,
    MemorySnapshotInfo,
    RoundInfo,
    RoundMember,
)
from .transport import Stubs


class RendezvousStubs:
    """The three rendezvous services' stubs over one member's channel, each made on first use
    (a stub makes a callable per method up front; a worker mostly needs one service)."""

    def __init__(self, stubs: Stubs) -> None:
        self._channel = stubs.channel

    @functools.cached_property
    def rendezvous(self) -> rendezvous_pb2_grpc.RendezvousStub:
        return rendezvous_pb2_grpc.RendezvousStub(self._channel)

    @functools.cached_property
    def store(self) -> rendezvous_pb2_grpc.RoundStoreStub:
        return rendezvous_pb2_grpc.RoundStoreStub(self._channel)

    @functools.cached_property
    def checkpoints(self) -> rendezvous_pb2_grpc.CheckpointRegistryStub:
        return rendezvous_pb2_grpc.CheckpointRegistryStub(self._channel)


# One set per channel, made on first use and dropped with the channel's stubs.
_BY_CHANNEL: weakref.WeakKeyDictionary[Stubs, RendezvousStubs] = weakref.WeakKeyDictionary()


def services(stubs: Stubs) -> RendezvousStubs:
    found = _BY_CHANNEL.get(stubs)
    if found is None:
        found = _BY_CHANNEL[stubs] = RendezvousStubs(stubs)
    return found


async def configure(
    caller: Caller, job: str, config: JobConfig, *, timeout_s: float | None = None
) -> tuple[bool, RoundInfo]:
    """Create the job, change its config, or reopen it when closed; (created, round)."""
    response = await refined(
        caller.write(
            lambda s: services(s).rendezvous.Configure,
            lambda header: rendezvous_pb2.ConfigureRequest(
                header=header, job=job, config=config.to_proto()
            ),
            timeout_s,
        )
    )
    return response.created, RoundInfo.from_proto(response.round)


async def join_batch(
    caller: Caller,
    job: str,
    names: Sequence[str],
    *,
    metadata: Sequence[bytes] | None = None,
    domains: Sequence[str] | None = None,
    config: JobConfig | None = None,
    resume: bool = False,
    timeout_s: float | None = None,
) -> JoinBatchResult:
    """Join many participants of ``job`` in one replicated command, all tied to this client's
    session, all or none (one refused name refuses the batch). ``metadata``: one per name,
    or None; ``domains``: each one's failure domain (its host), one per name, or None (none
    declared). Nothing heartbeats them: that is the caller's (a batched heartbeater's) work.
    ``resume``: as :func:`rallypoint.client.rendezvous.join`'s."""
    names = list(names)
    data = list(metadata) if metadata is not None else []
    if metadata is not None and len(data) != len(names):
        raise InvalidValueError(
            f"metadata must hold one entry per name: {len(data)} for {len(names)} names"
        )
    if isinstance(domains, str):
        raise InvalidValueError("domains must be a sequence of domain names, one per name")
    hosts = list(domains) if domains is not None else []
    if domains is not None and len(hosts) != len(names):
        raise InvalidValueError(
            f"domains must hold one entry per name: {len(hosts)} for {len(names)} names"
        )
    request_config = config.to_proto() if config is not None else None
    response = await refined(
        caller.write(
            lambda s: services(s).rendezvous.JoinBatch,
            lambda header: rendezvous_pb2.JoinBatchRequest(
                header=header,
                job=job,
                names=names,
                metadata=data,
                config=request_config,
                resume=resume,
                domains=hosts,
            ),
            timeout_s,
        )
    )
    return JoinBatchResult.from_proto(response)


async def list_members(
    caller: Caller,
    job: str,
    *,
    after: int = 0,
    limit: int = 0,
    waiting: bool = False,
    serializable: bool = False,
    timeout_s: float | None = None,
) -> MembersPage:
    """One page of the job's current round's members (or, with ``waiting``, its wait list)
    with participant ids above ``after``: at most ``limit`` (0: the member's default, 1,000;
    at most 10,000)."""
    count(after, "after", least=0)
    count(limit, "limit", least=0)
    request = rendezvous_pb2.ListMembersRequest(
        job=job, after=after, limit=limit, waiting=waiting, serializable=serializable
    )
    response = await refined(
        caller.read(lambda s: services(s).rendezvous.ListMembers, request, timeout_s)
    )
    return MembersPage.from_proto(response)


async def all_members(
    caller: Caller,
    job: str,
    *,
    page_size: int = 0,
    waiting: bool = False,
    serializable: bool = False,
    timeout_s: float | None = None,
) -> AsyncIterator[RoundMember]:
    """Every member (or waiter) of the job's round, a page at a time. Each page is its own
    read: when the round changes between pages, the pages after the change show the new one
    (compare each page's round with the first's if that matters)."""
    after = 0
    while True:
        page = await list_members(
            caller,
            job,
            after=after,
            limit=page_size,
            waiting=waiting,
            serializable=serializable,
            timeout_s=timeout_s,
        )
        for member in page.members:
            yield member
        if not page.more or not page.members:
            return
        after = page.members[-1].participant_id


async def get_job(
    caller: Caller, job: str, *, serializable: bool = False, timeout_s: float | None = None
) -> JobStatus:
    """The job's config, current round, history and latest committed checkpoint. Members'
    phi is the leader's soft state: a follower that answered is asked for the leader, which
    is then asked itself (if it cannot answer, the follower's answer stands, phi 0)."""
    request = rendezvous_pb2.GetJobRequest(job=job, serializable=serializable)
    response = await refined(
        caller.read(lambda s: services(s).rendezvous.GetJob, request, timeout_s)
    )
    header = response.header
    if header.leader_id and header.member_id != header.leader_id:
        leader = await _leader_address(caller, header.leader_id, timeout_s)
        if leader is not None:
            with contextlib.suppress(RallypointError):
                response = await refined(
                    caller.ask(leader, lambda s: services(s).rendezvous.GetJob, request, timeout_s)
                )
    return JobStatus.from_proto(response)


async def _leader_address(caller: Caller, leader_id: int, timeout_s: float | None) -> str | None:
    try:
        members = await caller.member_list(serializable=True, timeout_s=timeout_s)
    except RallypointError:
        return None
    return next((m.client_address for m in members if m.member_id == leader_id), None)


async def list_jobs(
    caller: Caller, *, serializable: bool = False, timeout_s: float | None = None
) -> list[RoundInfo]:
    """Every job's current round, in job-id order (no phi: see ``job_statuses``)."""
    response = await refined(
        caller.read(
            lambda s: services(s).rendezvous.ListJobs,
            rendezvous_pb2.ListJobsRequest(serializable=serializable),
            timeout_s,
        )
    )
    return [RoundInfo.from_proto(info) for info in response.jobs]


async def job_statuses(
    caller: Caller, *, serializable: bool = False, timeout_s: float | None = None
) -> list[JobStatus]:
    """Every job's full status, with each member's phi: ListJobs, then GetJob per job (a job
    dropped in between is left out)."""
    statuses = []
    for info in await list_jobs(caller, serializable=serializable, timeout_s=timeout_s):
        try:
            statuses.append(
                await get_job(caller, info.job, serializable=serializable, timeout_s=timeout_s)
            )
        except JobNotFoundError:
            continue
    return statuses


async def evict(
    caller: Caller, job: str, participant_id: int, *, timeout_s: float | None = None
) -> int:
    """Remove a participant; the round that ended because of it (0: none did)."""
    response = await refined(
        caller.write(
            lambda s: services(s).rendezvous.Evict,
            lambda header: rendezvous_pb2.EvictRequest(
                header=header, job=job, participant_id=participant_id
            ),
            timeout_s,
        )
    )
    return response.ended_round


async def close_job(caller: Caller, job: str, *, timeout_s: float | None = None) -> int:
    """End the job's current round and remove every participant; the round that ended (0:
    the job was already closed)."""
    response = await refined(
        caller.write(
            lambda s: services(s).rendezvous.CloseJob,
            lambda header: rendezvous_pb2.CloseJobRequest(header=header, job=job),
            timeout_s,
        )
    )
    return response.ended_round


async def prune_jobs(
    caller: Caller,
    *,
    older_than_s: float = 0.0,
    keep: int = 0,
    jobs: Sequence[str] = (),
    timeout_s: float | None = None,
) -> list[str]:
    """Remove ended jobs (finished, failed, closed) and their history: those in ``jobs``
    (every job when empty) that ended at least ``older_than_s`` ago, keeping the ``keep`` that
    ended last. Open jobs are never removed. The jobs removed, in id order."""
    older_than_ms = round(non_negative_seconds(older_than_s, "older_than_s") * 1000)
    count(keep, "keep", least=0)
    response = await refined(
        caller.write(
            lambda s: services(s).rendezvous.PruneJobs,
            lambda header: rendezvous_pb2.PruneJobsRequest(
                header=header, older_than_ms=older_than_ms, keep=keep, jobs=list(jobs)
            ),
            timeout_s,
        )
    )
    return list(response.pruned)


async def latest_checkpoint(
    caller: Caller, job: str, *, serializable: bool = False, timeout_s: float | None = None
) -> CheckpointInfo | None:
    """The job's most recently committed checkpoint (linearizable unless ``serializable``);
    None when there is none."""
    response = await refined(
        caller.read(
            lambda s: services(s).checkpoints.Latest,
            rendezvous_pb2.CheckpointLatestRequest(job=job, serializable=serializable),
            timeout_s,
        )
    )
    if not response.HasField("checkpoint"):
        return None
    return CheckpointInfo.from_proto(response.checkpoint)


async def latest_memory_snapshot(
    caller: Caller, job: str, *, serializable: bool = False, timeout_s: float | None = None
) -> MemorySnapshotInfo | None:
    """The job's latest complete in-memory snapshot, of any round (linearizable unless
    ``serializable``); None when there is none."""
    response = await refined(
        caller.read(
            lambda s: services(s).checkpoints.LatestMemorySnapshot,
            rendezvous_pb2.MemorySnapshotLatestRequest(job=job, serializable=serializable),
            timeout_s,
        )
    )
    if not response.HasField("snapshot"):
        return None
    return MemorySnapshotInfo.from_proto(response.snapshot)


# ---------------------------------------------------------------- failure domains


def _domain(domain: str) -> str:
    if not isinstance(domain, str) or not domain:
        raise InvalidValueError(f"domain must be a non-empty string, got {domain!r}")
    return domain


async def drain(
    caller: Caller, domain: str, *, reason: str = "", timeout_s: float | None = None
) -> DrainResult:
    """Drain a failure domain cluster-wide: every ACTIVE round with a member in it ends
    (reason DRAINED) and re-forms without the domain's participants, who wait until it is
    undrained. Admin, or a job's worker for a domain its own session has a participant in."""
    _domain(domain)
    response = await refined(
        caller.write(
            lambda s: services(s).rendezvous.Drain,
            lambda header: rendezvous_pb2.DrainRequest(header=header, domain=domain, reason=reason),
            timeout_s,
        )
    )
    return DrainResult.from_proto(domain, response)


async def undrain(caller: Caller, domain: str, *, timeout_s: float | None = None) -> bool:
    """Admit a drained domain's participants again; False when it was not drained. Admin."""
    _domain(domain)
    response = await refined(
        caller.write(
            lambda s: services(s).rendezvous.Undrain,
            lambda header: rendezvous_pb2.UndrainRequest(header=header, domain=domain),
            timeout_s,
        )
    )
    return bool(response.changed)


async def drained(
    caller: Caller, *, serializable: bool = False, timeout_s: float | None = None
) -> list[DrainedDomain]:
    """The drained failure domains, in domain order."""
    response = await refined(
        caller.read(
            lambda s: services(s).rendezvous.ListDrained,
            rendezvous_pb2.ListDrainedRequest(serializable=serializable),
            timeout_s,
        )
    )
    return [DrainedDomain.from_proto(d) for d in response.domains]
