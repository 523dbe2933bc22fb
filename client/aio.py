"""The asyncio client of a rallypoint cluster.

    async with Client(["127.0.0.1:2379", "127.0.0.1:2381", "127.0.0.1:2383"]) as c:
        await c.put("job/config", b"...")
        async with c.lease(ttl_s=5) as lease:
            await c.put("job/owner", b"me", lease=lease, fence=lease.fence)
        async for event in c.watch("job/", prefix=True):
            ...

Every call has a deadline (``timeout_s`` on the client, overridable per call) within which it
finds the leader and retries (``transport.py``); writes are stamped by the session so a retry
applies at most once (``session.py``); every failure is a :class:`RallypointError`
(``errors.py``). Reads are linearizable unless ``serializable=True``.

The client owns one :class:`Caller` (``caller.py``: session-stamped writes, reads, deadlines,
retries) and hands it to the parts it is made of (jobs, round stores, checkpoint registries,
participants); they never call back into the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import weakref
from collections.abc import AsyncIterator, Sequence

from rallypoint.proto.v1 import common_pb2, defaults, kv_pb2, lease_pb2

from . import arguments
from . import backup as _backup
from . import cluster as _cluster
from . import jobs as _jobs
from .backoff import DEFAULT_BACKOFF, Backoff
from .backup import SavedSnapshot
from .caller import Caller
from .checkpoints import CheckpointRegistry
from .errors import TOKEN_OPTIONS, LeaseNotFoundError
from .heartbeats import AssignmentCallback, HeartbeatBatcher
from .job_admin import JobAdmin
from .job_watch import watch_job as _watch_job
from .lease import Lease, LeaseKeeper, keep_alive_once
from .rendezvous import Participant
from .rendezvous import join as _join
from .rendezvous_values import (
    JobConfig,
    JoinBatchResult,
    MembersPage,
    RoundInfo,
    RoundMember,
)
from .roundstore import RoundStore
from .transport import TlsConfig, Transport
from .values import (
    AddResult,
    CompareAndSetResult,
    DeleteResult,
    EndpointStatus,
    Fence,
    GetResult,
    Header,
    KeyValue,
    LeaseInfo,
    Member,
    MemberStatus,
    PutResult,
    RangeResult,
    SnapshotInfo,
    optional_kv,
)
from .watch import Watcher

Bytes = bytes | str
LeaseRef = Lease | int | None


def _bytes(data: Bytes) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


def _lease_id(lease: LeaseRef) -> int:
    if lease is None:
        return 0
    if isinstance(lease, Lease):
        return lease.lease_id
    return arguments.count(lease, "lease", least=0)


def _fence(fence: Fence | None) -> common_pb2.Fence | None:
    return fence.to_proto() if fence is not None else None


class Client(JobAdmin):
    """See the module docstring. Not thread-safe: use it from one event loop (or
    :class:`rallypoint.client.SyncClient` from threads).

    ``kv_batching`` says how ``put``, ``get``, ``delete`` and ``compare_and_set`` travel:
    ``"off"`` (the default) one unary call each; ``"concurrent"``: a call made while another
    of them is in flight shares the client's batch stream (``kv_stream.py``: one stream per
    member, many operations per message, each answered on its own; calls made while a message
    is unanswered leave together when it is answered), a lone call stays unary;
    ``"always"``: every one through the stream, a lone call too, which answers it sooner
    than a unary call (a lone read 0.40-0.54 ms against 0.54-0.57 at p50 on a 3-member
    cluster: bench/README "Lone calls on the stream"). Batched or not, each call has its
    own answer, errors, deadline and retries, and a write applies exactly once.

    ``member_sync_s``: while the client is in use, it learns the cluster's membership this
    often (one serializable ``MemberList``), so members added since it started become
    endpoints and it outlives the replacement of every member it was given (0: never).

    ``token_hint`` names how this program's user passes a token (default
    ``"Client(..., token=...) or $RALLYPOINT_TOKEN"``; the CLI says ``--token``, torchrun
    ``--rdzv-conf token=``): an UnauthenticatedError's message ends with it."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        timeout_s: float = 10.0,
        attempt_timeout_s: float = 5.0,
        token: str | None = None,
        tls: TlsConfig | None = None,
        session_ttl_s: float = 30.0,
        open_session_on_connect: bool = True,
        max_inflight_writes: int = 256,
        backoff: Backoff = DEFAULT_BACKOFF,
        rng: random.Random | None = None,
        kv_batching: str = "off",
        token_hint: str = TOKEN_OPTIONS,
        member_sync_s: float = 5.0,
    ) -> None:
        self._transport = Transport(
            endpoints,
            token=token,
            tls=tls,
            backoff=backoff,
            attempt_timeout_s=attempt_timeout_s,
            rng=rng,
            token_hint=token_hint,
        )
        self._caller = Caller(
            self._transport,
            timeout_s=timeout_s,
            session_ttl_s=session_ttl_s,
            max_inflight_writes=max_inflight_writes,
            kv_batching=kv_batching,
            member_sync_s=member_sync_s,
        )
        self._open_session_on_connect = open_session_on_connect
        # Created on the running loop, never in __init__, so a Client may be built outside
        # the loop that uses it.
        self._leases: LeaseKeeper | None = None
        self._watchers: weakref.WeakSet[Watcher] = weakref.WeakSet()
        self._participants: weakref.WeakSet[Participant] = weakref.WeakSet()
        self._batchers: weakref.WeakSet[HeartbeatBatcher] = weakref.WeakSet()

    # ------------------------------------------------------------------ lifecycle

    @property
    def timeout_s(self) -> float:
        """Every call's timeout unless the call gives its own."""
        return self._caller.timeout_s

    @property
    def endpoints(self) -> list[str]:
        return list(self._transport.endpoints)

    @property
    def session_id(self) -> int:
        """The current session's id; 0 before the first write (or connect)."""
        return self._caller.session_id

    async def connect(self) -> Client:
        self._caller.start()
        if self._open_session_on_connect:
            await self._caller.open_session()
        return self

    def _lease_keeper(self) -> LeaseKeeper:
        if self._leases is None:
            self._leases = LeaseKeeper(self._caller)
        return self._leases

    async def close(self) -> None:
        """Close watches, stop lease keep-alives (leases are left to expire) and participants'
        heartbeats, batched ones included (without leaving: they count as failed), end the
        session."""
        for participant in list(self._participants):
            await participant.close()
        for batcher in list(self._batchers):
            await batcher.close()
        for watcher in list(self._watchers):
            await watcher.aclose()
        if self._leases is not None:
            await self._leases.close()
        await self._caller.close()

    async def __aenter__(self) -> Client:
        try:
            return await self.connect()
        except BaseException:
            await self._transport.close()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ key-value

    async def put(
        self,
        key: Bytes,
        value: Bytes,
        *,
        lease: LeaseRef = None,
        fence: Fence | None = None,
        prev_kv: bool = False,
        keep_lease: bool = False,
        timeout_s: float | None = None,
    ) -> PutResult:
        """Set ``key``. ``keep_lease``: keep the key's current lease (``lease`` must be
        None); needs cluster version 2, else ClusterVersionError."""
        response = await self._caller.kv_write(
            "put",
            lambda s: s.kv.Put,
            lambda header: kv_pb2.PutRequest(
                header=header,
                key=_bytes(key),
                value=_bytes(value),
                lease_id=_lease_id(lease),
                fence=_fence(fence),
                prev_kv=prev_kv,
                keep_lease=keep_lease,
            ),
            timeout_s,
        )
        return PutResult(
            Header.from_proto(response.header),
            KeyValue.from_proto(response.kv),
            optional_kv(response, "prev_kv"),
        )

    async def get(
        self, key: Bytes, *, serializable: bool = False, timeout_s: float | None = None
    ) -> KeyValue | None:
        """The key, or None when it does not exist."""
        return (await self.get_with_header(key, serializable=serializable, timeout_s=timeout_s)).kv

    async def get_with_header(
        self, key: Bytes, *, serializable: bool = False, timeout_s: float | None = None
    ) -> GetResult:
        response = await self._caller.kv_read(
            lambda s: s.kv.Get,
            kv_pb2.GetRequest(key=_bytes(key), serializable=serializable),
            timeout_s,
        )
        return GetResult(Header.from_proto(response.header), optional_kv(response, "kv"))

    async def range(
        self,
        prefix: Bytes = b"",
        *,
        limit: int = 0,
        start_after: Bytes = b"",
        serializable: bool = False,
        keys_only: bool = False,
        timeout_s: float | None = None,
    ) -> RangeResult:
        """One page of keys under ``prefix`` in byte order: at most ``limit`` (0: as many as
        the member answers at once, by default 10,000 keys or 3 MiB); ``more`` says keys
        remain (continue with ``start_after`` = the last key, or use :meth:`range_pages`)."""
        arguments.count(limit, "limit", least=0)
        response = await self._caller.read(
            lambda s: s.kv.Range,
            kv_pb2.RangeRequest(
                prefix=_bytes(prefix),
                limit=limit,
                start_after=_bytes(start_after),
                serializable=serializable,
                keys_only=keys_only,
            ),
            timeout_s,
        )
        return RangeResult(
            Header.from_proto(response.header),
            tuple(KeyValue.from_proto(kv) for kv in response.kvs),
            response.more,
        )

    async def range_pages(
        self,
        prefix: Bytes = b"",
        *,
        page_size: int = 1000,
        serializable: bool = False,
        keys_only: bool = False,
        timeout_s: float | None = None,
    ) -> AsyncIterator[KeyValue]:
        """Every key under ``prefix``, fetched ``page_size`` at a time or fewer when the
        member caps an answer (each page is its own read: a key changed between pages may be
        seen at either side of the change)."""
        arguments.count(page_size, "page_size")
        start_after = b""
        while True:
            page = await self.range(
                prefix,
                limit=page_size,
                start_after=start_after,
                serializable=serializable,
                keys_only=keys_only,
                timeout_s=timeout_s,
            )
            for kv in page.kvs:
                yield kv
            if not page.more or not page.kvs:
                return
            start_after = page.kvs[-1].key

    async def delete(
        self,
        key: Bytes,
        *,
        prefix: bool = False,
        fence: Fence | None = None,
        prev_kv: bool = False,
        timeout_s: float | None = None,
    ) -> DeleteResult:
        response = await self._caller.kv_write(
            "delete",
            lambda s: s.kv.Delete,
            lambda header: kv_pb2.DeleteRequest(
                header=header, key=_bytes(key), prefix=prefix, fence=_fence(fence), prev_kv=prev_kv
            ),
            timeout_s,
        )
        return DeleteResult(
            Header.from_proto(response.header),
            response.deleted,
            tuple(KeyValue.from_proto(kv) for kv in response.prev_kvs),
        )

    async def compare_and_set(
        self,
        key: Bytes,
        value: Bytes,
        *,
        value_equals: Bytes | None = None,
        mod_revision_equals: int | None = None,
        must_not_exist: bool = False,
        lease: LeaseRef = None,
        fence: Fence | None = None,
        timeout_s: float | None = None,
    ) -> CompareAndSetResult:
        """Set ``key`` to ``value`` if exactly one given comparison holds. A false comparison
        is not an error: ``succeeded`` is False and ``kv`` is the current key."""
        given = (value_equals is not None) + (mod_revision_equals is not None) + must_not_exist
        if given != 1:
            raise ValueError(
                "give exactly one of value_equals, mod_revision_equals, must_not_exist"
            )

        def build(header: common_pb2.RequestHeader) -> kv_pb2.CompareAndSetRequest:
            request = kv_pb2.CompareAndSetRequest(
                header=header,
                key=_bytes(key),
                value=_bytes(value),
                lease_id=_lease_id(lease),
                fence=_fence(fence),
            )
            if value_equals is not None:
                request.value_equals = _bytes(value_equals)
            elif mod_revision_equals is not None:
                request.mod_revision_equals = mod_revision_equals
            else:
                request.must_not_exist = True
            return request

        response = await self._caller.kv_write(
            "compare_and_set", lambda s: s.kv.CompareAndSet, build, timeout_s
        )
        return CompareAndSetResult(
            Header.from_proto(response.header), response.succeeded, optional_kv(response, "kv")
        )

    async def add(
        self,
        key: Bytes,
        delta: int,
        *,
        lease: LeaseRef = None,
        fence: Fence | None = None,
        timeout_s: float | None = None,
    ) -> AddResult:
        """Add ``delta`` to the decimal counter at ``key`` (missing counts as 0)."""
        response = await self._caller.write(
            lambda s: s.kv.Add,
            lambda header: kv_pb2.AddRequest(
                header=header,
                key=_bytes(key),
                delta=delta,
                lease_id=_lease_id(lease),
                fence=_fence(fence),
            ),
            timeout_s,
        )
        return AddResult(
            Header.from_proto(response.header), response.value, optional_kv(response, "kv")
        )

    # ------------------------------------------------------------------ leases

    async def grant_lease(
        self, ttl_s: float, *, keep_alive: bool = True, timeout_s: float | None = None
    ) -> Lease:
        """A new lease, kept alive in the background until revoked or lost. ``ttl_s`` is at
        least 0.001 (the wire counts milliseconds)."""
        arguments.positive_seconds(
            ttl_s, "ttl_s", least_s=0.001, most_s=defaults.MAX_LEASE_TTL_MS / 1000
        )
        keeper = self._lease_keeper()
        loop = asyncio.get_running_loop()
        # The leader starts the TTL no earlier than this: measuring from here is pessimistic.
        sent_at = loop.time()
        response = await self._caller.write(
            lambda s: s.lease.Grant,
            lambda header: lease_pb2.LeaseGrantRequest(
                header=header, ttl_ms=max(1, round(ttl_s * 1000))
            ),
            timeout_s,
        )
        lease = Lease(
            response.lease_id, response.fencing_token, response.ttl_ms / 1000.0, self._revoke
        )
        if keep_alive:
            keeper.add(lease, sent_at)
        else:
            lease.expire_at(sent_at + lease.ttl_s)
        return lease

    async def keep_alive_lease(self, lease_id: int, *, timeout_s: float | None = None) -> Lease:
        """Take over keeping an existing lease alive (its token read from the leader)."""
        arguments.count(lease_id, "lease_id")
        keeper = self._lease_keeper()
        sent_at = asyncio.get_running_loop().time()
        info = await self.lease_time_to_live(lease_id, timeout_s=timeout_s)
        lease = Lease(info.lease_id, info.fencing_token, info.granted_ttl_s, self._revoke)
        keeper.add(lease, sent_at + (info.remaining_ttl_s or 0.0) - lease.ttl_s)
        return lease

    async def keep_alive_once(self, lease_id: int, *, timeout_s: float | None = None) -> float:
        """Extend a lease once (at the leader); its new TTL in seconds. Raises
        LeaseNotFoundError when it no longer exists."""
        arguments.count(lease_id, "lease_id")
        return await keep_alive_once(self._caller, lease_id, timeout_s)

    @contextlib.asynccontextmanager
    async def lease(self, ttl_s: float, *, timeout_s: float | None = None) -> AsyncIterator[Lease]:
        """``async with c.lease(ttl_s) as lease:`` grants, keeps alive, revokes on exit."""
        lease = await self.grant_lease(ttl_s, timeout_s=timeout_s)
        try:
            yield lease
        finally:
            if lease.alive:
                with contextlib.suppress(LeaseNotFoundError):
                    await lease.revoke()

    async def _revoke(self, lease: Lease) -> None:
        await self.revoke_lease(lease.lease_id)
        lease.mark_lost(f"lease {lease.lease_id} was revoked")

    async def revoke_lease(self, lease_id: int, *, timeout_s: float | None = None) -> list[bytes]:
        """Revoke a lease; the keys deleted with it."""
        arguments.count(lease_id, "lease_id")
        response = await self._caller.write(
            lambda s: s.lease.Revoke,
            lambda header: lease_pb2.LeaseRevokeRequest(header=header, lease_id=lease_id),
            timeout_s,
        )
        return list(response.deleted_keys)

    async def lease_list(
        self, *, serializable: bool = False, timeout_s: float | None = None
    ) -> list[LeaseInfo]:
        response = await self._caller.read(
            lambda s: s.lease.List, lease_pb2.LeaseListRequest(serializable=serializable), timeout_s
        )
        return [
            LeaseInfo(status.lease_id, status.fencing_token, status.granted_ttl_ms / 1000.0)
            for status in response.leases
        ]

    async def lease_time_to_live(
        self, lease_id: int, *, keys: bool = False, timeout_s: float | None = None
    ) -> LeaseInfo:
        response = await self._caller.read(
            lambda s: s.lease.TimeToLive,
            lease_pb2.LeaseTimeToLiveRequest(lease_id=lease_id, keys=keys),
            timeout_s,
        )
        return LeaseInfo(
            response.lease_id,
            response.fencing_token,
            response.granted_ttl_ms / 1000.0,
            response.remaining_ttl_ms / 1000.0,
            tuple(response.keys),
        )

    # ------------------------------------------------------------------ watch

    def watch(
        self,
        key: Bytes,
        *,
        prefix: bool = False,
        start_revision: int = 0,
        prev_kv: bool = False,
        progress_interval_s: float | None = 2.0,
    ) -> Watcher:
        """Changes to ``key`` (or every key under it with ``prefix``) from ``start_revision``
        (0: from now), resumed across reconnects with no gaps or duplicates; see watch.py."""
        watch_key = _bytes(key)
        arguments.count(start_revision, "start_revision", least=0)
        if progress_interval_s is not None:
            arguments.positive_seconds(progress_interval_s, "progress_interval_s")

        async def current_revision() -> int:
            page = await self.range(watch_key, limit=1, keys_only=True)
            return page.header.revision

        watcher = Watcher(
            self._transport,
            watch_key,
            prefix=prefix,
            start_revision=start_revision,
            prev_kv=prev_kv,
            progress_interval_s=progress_interval_s,
            current_revision=current_revision,
        )
        self._watchers.add(watcher)
        return watcher

    # ------------------------------------------------------------------ cluster

    async def member_list(
        self, *, serializable: bool = False, timeout_s: float | None = None
    ) -> list[Member]:
        return await self._caller.member_list(serializable=serializable, timeout_s=timeout_s)

    async def member_add(
        self,
        peer_address: str,
        client_address: str,
        *,
        member_id: int = 0,
        name: str = "",
        as_learner: bool = True,
        timeout_s: float | None = None,
    ) -> tuple[Member, list[Member]]:
        """Add a member (a learner by default: promote it once caught up); the new member and
        the resulting membership."""
        return await _cluster.member_add(
            self._caller,
            peer_address,
            client_address,
            member_id=member_id,
            name=name,
            as_learner=as_learner,
            timeout_s=timeout_s,
        )

    async def member_remove(
        self, member_id: int, *, timeout_s: float | None = None
    ) -> list[Member]:
        return await _cluster.member_remove(self._caller, member_id, timeout_s)

    async def member_promote(
        self, member_id: int, *, timeout_s: float | None = None
    ) -> list[Member]:
        return await _cluster.member_promote(self._caller, member_id, timeout_s)

    async def transfer_leader(self, target_id: int, *, timeout_s: float | None = None) -> Header:
        return await _cluster.transfer_leader(self._caller, target_id, timeout_s)

    async def snapshot(
        self, *, endpoint: str | None = None, timeout_s: float | None = None
    ) -> SnapshotInfo:
        """Have one member (``endpoint``, else whichever answers) write a snapshot now."""
        return await _cluster.snapshot(self._caller, endpoint, timeout_s)

    async def snapshot_save(self, *, timeout_s: float | None = None) -> SavedSnapshot:
        """A backup of the cluster's state, from the leader, after a linearizable read
        barrier: the bytes of a backup file (``rallypoint snapshot save FILE`` writes them;
        admin role only)."""
        return await _backup.snapshot_save(self._caller, timeout_s)

    async def member_status(self, endpoint: str, *, timeout_s: float | None = None) -> MemberStatus:
        """The Status of the member at ``endpoint`` (no redirect: its own view)."""
        return await _cluster.member_status(self._caller, endpoint, timeout_s)

    async def status(
        self, endpoints: Sequence[str] | None = None, *, timeout_s: float | None = None
    ) -> list[EndpointStatus]:
        """Every endpoint's own status, asked concurrently; an endpoint that fails is reported
        with its error instead."""
        targets = list(endpoints) if endpoints is not None else self.endpoints
        return await _cluster.status(self._caller, targets, timeout_s)

    # ------------------------------------------------------------------ rendezvous

    async def join(
        self,
        job: str,
        name: str,
        *,
        config: JobConfig | None = None,
        metadata: bytes = b"",
        resume: bool = False,
        replaces: int = 0,
        domain: str = "",
        timeout_s: float | None = None,
    ) -> Participant:
        """Join ``job`` as ``name``; the participant heartbeats and follows the rounds until
        it leaves (see rendezvous.py). ``config`` creates the job when absent. A join that
        starts an ended job again begins a new run: it sees the old run's checkpoints only
        with ``resume``. ``replaces``: a participant of this client that the new one takes
        the place of, in one round change (close the old handle after). ``domain``: the
        participant's failure domain, e.g. its host name (docs/client.md, "Domains and
        units"); "" for none."""
        participant = await _join(
            self._caller,
            job,
            name,
            config=config,
            metadata=metadata,
            resume=resume,
            replaces=replaces,
            domain=domain,
            timeout_s=timeout_s,
        )
        self._participants.add(participant)
        return participant

    async def join_batch(
        self,
        job: str,
        names: Sequence[str],
        *,
        metadata: Sequence[bytes] | None = None,
        domains: Sequence[str] | None = None,
        config: JobConfig | None = None,
        resume: bool = False,
        timeout_s: float | None = None,
    ) -> JoinBatchResult:
        """Join one participant per name in one replicated command (at most 10,000), all
        tied to this client's session, all or none; ids and waiting flags in name order.
        ``domains``: each one's failure domain, one per name (None: none declared).
        Unlike ``join`` nothing heartbeats them: the caller does (HeartbeatBatch)."""
        return await _jobs.join_batch(
            self._caller,
            job,
            names,
            metadata=metadata,
            domains=domains,
            config=config,
            resume=resume,
            timeout_s=timeout_s,
        )

    async def list_members(
        self,
        job: str,
        *,
        after: int = 0,
        limit: int = 0,
        waiting: bool = False,
        serializable: bool = False,
        timeout_s: float | None = None,
    ) -> MembersPage:
        """One page of the round's members (or its wait list) with ids above ``after``, at
        most ``limit`` (0: 1,000; at most 10,000), without phi or progress."""
        return await _jobs.list_members(
            self._caller,
            job,
            after=after,
            limit=limit,
            waiting=waiting,
            serializable=serializable,
            timeout_s=timeout_s,
        )

    def all_members(
        self,
        job: str,
        *,
        page_size: int = 0,
        waiting: bool = False,
        serializable: bool = False,
        timeout_s: float | None = None,
    ) -> AsyncIterator[RoundMember]:
        """Every member (or waiter) of the round, fetched a page at a time (list_members)."""
        return _jobs.all_members(
            self._caller,
            job,
            page_size=page_size,
            waiting=waiting,
            serializable=serializable,
            timeout_s=timeout_s,
        )

    def watch_job(self, job: str) -> AsyncIterator[RoundInfo]:
        """The job's current round now and after every change, until the job is gone
        (:class:`JobNotFoundError`); reconnects by itself (see job_watch.py)."""
        return _watch_job(self._caller, job)

    def round_store(self, job: str, round_number: int, participant_id: int) -> RoundStore:
        """The store of one round, used as ``participant_id`` (see roundstore.py)."""
        return RoundStore(self._caller, job, round_number, participant_id)

    def checkpoint_registry(self, info: RoundInfo) -> CheckpointRegistry:
        """The checkpoint registry fenced by ``info``'s round and token."""
        return CheckpointRegistry.for_round(self._caller, info)

    def heartbeat_batcher(
        self,
        job: str,
        *,
        heartbeat_interval_s: float,
        first_endpoint: int = 0,
        answer_patience_s: float | None = None,
        on_assignment: AssignmentCallback | None = None,
    ) -> HeartbeatBatcher:
        """One HeartbeatBatch stream for many participants of ``job`` (see heartbeats.py):
        ``add`` the participants this process carries, then ``start`` it (or use it as an
        async context manager). Closed with the client."""
        batcher = HeartbeatBatcher(
            self._caller,
            job,
            heartbeat_interval_s=heartbeat_interval_s,
            first_endpoint=first_endpoint,
            answer_patience_s=answer_patience_s,
            on_assignment=on_assignment,
        )
        self._batchers.add(batcher)
        return batcher
