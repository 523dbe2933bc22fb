"""An in-memory stand-in for a rallypoint cluster, served over real gRPC on loopback.

Every fake member is a ``grpc.aio`` server on 127.0.0.1 (port 0) running the five public
services against one shared :class:`FakeStore`, so any member "forwards" to the one state. It
keeps the contract's observable behaviour the client depends on: sessions with at-most-once
application and cached answers (refusals included), revisions, watch history with compaction
and progress notifications, leases with fencing tokens, status codes and the
``rallypoint-error-reason`` / ``rallypoint-leader`` trailing metadata.

Each member has :class:`Switches` that inject the failures the client must survive.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from rallypoint.proto.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    common_pb2,
    kv_pb2,
    kv_pb2_grpc,
    lease_pb2,
    lease_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    watch_pb2,
    watch_pb2_grpc,
)

Context = Any  # grpc.aio.ServicerContext of any request/response pair


class Refusal(Exception):
    """An error answer: a status code, the ErrorReason name, a message."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message


async def abort(context: Context, refusal: Refusal, leader: str | None = None) -> None:
    metadata: list[tuple[str, str]] = []
    if refusal.reason:
        metadata.append(("rallypoint-error-reason", refusal.reason))
    if leader:
        metadata.append(("rallypoint-leader", leader))
    await context.abort(refusal.code, refusal.message, tuple(metadata))


@dataclass
class Switches:
    """Failures a member injects. Counters count down as calls consume them."""

    # Answer every call UNAVAILABLE / NOT_LEADER naming this address ("" : NO_LEADER, no hint).
    not_leader: str | None = None
    # Answer the next N calls UNAVAILABLE without doing anything.
    refuse_next: int = 0
    # Do the next N mutating calls, then answer UNAVAILABLE as if the reply was lost.
    drop_reply_next: int = 0
    # Called after each dropped reply (for example to expire the session meanwhile).
    after_drop: Callable[[], None] | None = None
    # Never answer (the client's deadline ends the call).
    hang: bool = False
    # Answer every call with this refusal.
    fail_with: Refusal | None = None
    # End every watch stream after this many responses with events (UNAVAILABLE, or a clean
    # end of stream when watch_break_cleanly).
    watch_break_after: int | None = None
    watch_break_cleanly: bool = False
    # Send a revision's events in responses of at most this many (``fragment`` on all but
    # the last), as a member does for a revision larger than its cap on one answer.
    watch_fragment_events: int | None = None


@dataclass
class FakeLease:
    lease_id: int
    token: int
    ttl_ms: int
    keys: set[bytes] = field(default_factory=set)


class FakeStore:
    """The replicated state every fake member serves."""

    def __init__(self, *, max_key_bytes: int = 64, max_value_bytes: int = 1024) -> None:
        self.max_key_bytes = max_key_bytes
        self.max_value_bytes = max_value_bytes
        # The raft index stand-in: every applied change (and session open, lease grant) bumps it.
        self.revision = 0
        self.kvs: dict[bytes, common_pb2.KeyValue] = {}
        self.history: list[tuple[int, list[watch_pb2.Event]]] = []
        # Revisions below this were compacted away.
        self.compacted_below = 0
        self.sessions: dict[int, dict[int, object]] = {}
        self.session_keepalives = 0
        self.first_unacked: dict[int, int] = {}
        self.leases: dict[int, FakeLease] = {}
        self.lease_keepalives: collections.Counter[int] = collections.Counter()
        # Applications (not answers from the cache) per method name.
        self.applies: collections.Counter[str] = collections.Counter()
        self.leader_id = 1
        self.term = 3
        self.members: list[cluster_pb2.Member] = []
        # The target_id of every TransferLeader request, in order.
        self.transfer_targets: list[int] = []
        self.changed = asyncio.Condition()
        # Bumped by break_watches; a watch stream opened under an older value ends.
        self.watch_generation = 0

    # -------------------------------------------------------------- test hooks

    def expire_session(self, session_id: int) -> None:
        del self.sessions[session_id]

    async def expire_lease(self, lease_id: int) -> None:
        await self._end_lease(lease_id)

    async def break_watches(self) -> None:
        """End every open watch stream with UNAVAILABLE."""
        self.watch_generation += 1
        async with self.changed:
            self.changed.notify_all()

    def compact(self, below_revision: int) -> None:
        self.compacted_below = below_revision
        self.history = [(rev, events) for rev, events in self.history if rev >= below_revision]

    # -------------------------------------------------------------- state

    def header(self, member_id: int) -> common_pb2.ResponseHeader:
        return common_pb2.ResponseHeader(
            revision=self.revision,
            raft_term=self.term,
            leader_id=self.leader_id,
            member_id=member_id,
        )

    async def commit(self, events: list[watch_pb2.Event]) -> None:
        if events:
            self.history.append((self.revision, events))
        async with self.changed:
            self.changed.notify_all()

    async def apply_once(
        self, header: common_pb2.RequestHeader, method: str, apply: Callable[[], Any]
    ) -> Any:
        """At-most-once application keyed by (session, sequence); refusals cached too."""
        if header.session_id == 0 or header.sequence == 0:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", "missing session")
        answers = self.sessions.get(header.session_id)
        if answers is None:
            raise Refusal(
                grpc.StatusCode.NOT_FOUND,
                "SESSION_EXPIRED",
                f"session {header.session_id} does not exist or has expired",
            )
        if header.first_unacked:
            self.first_unacked[header.session_id] = header.first_unacked
            for sequence in [s for s in answers if s < header.first_unacked]:
                del answers[sequence]
        if header.sequence < self.first_unacked.get(header.session_id, 0):
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION, "SEQUENCE_DISCARDED", "answer discarded"
            )
        if header.sequence not in answers:
            self.applies[method] += 1
            try:
                answers[header.sequence] = await apply()
            except Refusal as refusal:
                answers[header.sequence] = refusal
        answer = answers[header.sequence]
        if isinstance(answer, Refusal):
            raise answer
        return answer

    def check_write(self, key: bytes, value: bytes, lease_id: int, fence: common_pb2.Fence) -> None:
        if not key:
            raise Refusal(
                grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", "the key must not be empty"
            )
        if len(key) > self.max_key_bytes:
            raise Refusal(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "KEY_TOO_LARGE",
                f"key of {len(key)} bytes is above the limit of {self.max_key_bytes}",
            )
        if len(value) > self.max_value_bytes:
            raise Refusal(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "VALUE_TOO_LARGE",
                f"value of {len(value)} bytes is above the limit of {self.max_value_bytes}",
            )
        if lease_id and lease_id not in self.leases:
            raise Refusal(grpc.StatusCode.NOT_FOUND, "LEASE_NOT_FOUND", f"no lease {lease_id}")
        if fence.lease_id:
            lease = self.leases.get(fence.lease_id)
            if lease is None or lease.token != fence.token:
                raise Refusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "STALE_FENCE",
                    f"fencing token {fence.token} of lease {fence.lease_id} is stale",
                )

    async def put(
        self, key: bytes, value: bytes, lease_id: int
    ) -> tuple[common_pb2.KeyValue, common_pb2.KeyValue | None]:
        self.revision += 1
        previous = self.kvs.get(key)
        kv = common_pb2.KeyValue(
            key=key,
            value=value,
            create_revision=previous.create_revision if previous else self.revision,
            mod_revision=self.revision,
            version=previous.version + 1 if previous else 1,
            lease_id=lease_id,
        )
        self.kvs[key] = kv
        if previous is not None and previous.lease_id in self.leases:
            self.leases[previous.lease_id].keys.discard(key)
        if lease_id:
            self.leases[lease_id].keys.add(key)
        event = watch_pb2.Event(
            type=watch_pb2.PUT, kv=kv, prev_revision=previous.mod_revision if previous else 0
        )
        if previous is not None:
            event.prev_kv.CopyFrom(previous)
        await self.commit([event])
        return kv, previous

    async def delete(self, keys: list[bytes]) -> list[common_pb2.KeyValue]:
        self.revision += 1
        deleted = []
        events = []
        for key in sorted(keys):
            previous = self.kvs.pop(key)
            deleted.append(previous)
            if previous.lease_id in self.leases:
                self.leases[previous.lease_id].keys.discard(key)
            tombstone = common_pb2.KeyValue(key=key, mod_revision=self.revision)
            events.append(
                watch_pb2.Event(
                    type=watch_pb2.DELETE,
                    kv=tombstone,
                    prev_revision=previous.mod_revision,
                    prev_kv=previous,
                )
            )
        await self.commit(events)
        return deleted

    async def _end_lease(self, lease_id: int) -> list[bytes]:
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            raise Refusal(grpc.StatusCode.NOT_FOUND, "LEASE_NOT_FOUND", f"no lease {lease_id}")
        keys = sorted(lease.keys)
        await self.delete(keys)
        return keys

    def matching(self, key: bytes, prefix: bool) -> Callable[[bytes], bool]:
        return (lambda k: k.startswith(key)) if prefix else (lambda k: k == key)


class FakeMember:
    def __init__(self, member_id: int, store: FakeStore) -> None:
        self.member_id = member_id
        self.store = store
        self.switches = Switches()
        self.calls: collections.Counter[str] = collections.Counter()
        self.server = grpc.aio.server()
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        # Bearer token required on every call when set.
        self.token: str | None = None
        kv_pb2_grpc.add_KVServicer_to_server(KVServicer(self), self.server)
        watch_pb2_grpc.add_WatchServicer_to_server(WatchServicer(self), self.server)
        lease_pb2_grpc.add_LeaseServicer_to_server(LeaseServicer(self), self.server)
        session_pb2_grpc.add_SessionServicer_to_server(SessionServicer(self), self.server)
        cluster_pb2_grpc.add_ClusterServicer_to_server(ClusterServicer(self), self.server)

    def header(self) -> common_pb2.ResponseHeader:
        return self.store.header(self.member_id)

    async def gate(self, context: Context, method: str) -> None:
        """Apply the switches before a call does anything."""
        self.calls[method] += 1
        switches = self.switches
        if self.token is not None:
            sent = dict(context.invocation_metadata() or ()).get("authorization")
            if sent != f"Bearer {self.token}":
                await abort(context, Refusal(grpc.StatusCode.UNAUTHENTICATED, "", "bad token"))
        if switches.hang:
            await asyncio.Event().wait()
        if switches.fail_with is not None:
            await abort(context, switches.fail_with)
        if switches.not_leader is not None:
            reason = "NOT_LEADER" if switches.not_leader else "NO_LEADER"
            message = "not the leader" if switches.not_leader else "no leader"
            await abort(
                context,
                Refusal(grpc.StatusCode.UNAVAILABLE, reason, message),
                switches.not_leader,
            )
        if switches.refuse_next > 0:
            switches.refuse_next -= 1
            await abort(
                context, Refusal(grpc.StatusCode.UNAVAILABLE, "", "request timed out in cluster")
            )

    async def reply(self, context: Context, answer_or_refusal: Callable[[], Any]) -> Any:
        """Run a mutating call, turning a Refusal into its status and dropping the reply
        when the switch says so (after the state changed)."""
        try:
            answer = await answer_or_refusal()
        except Refusal as refusal:
            await abort(context, refusal)
        if self.switches.drop_reply_next > 0:
            self.switches.drop_reply_next -= 1
            if self.switches.after_drop is not None:
                self.switches.after_drop()
            await abort(context, Refusal(grpc.StatusCode.UNAVAILABLE, "", "reply lost"))
        return answer

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(grace=None)


class KVServicer(kv_pb2_grpc.KVServicer):
    def __init__(self, member: FakeMember) -> None:
        self.m = member
        self.s = member.store

    async def Put(self, request: kv_pb2.PutRequest, context: Context) -> kv_pb2.PutResponse:
        await self.m.gate(context, "Put")

        async def apply() -> kv_pb2.PutResponse:
            self.s.check_write(request.key, request.value, request.lease_id, request.fence)
            kv, previous = await self.s.put(request.key, request.value, request.lease_id)
            response = kv_pb2.PutResponse(header=self.m.header(), kv=kv)
            if request.prev_kv and previous is not None:
                response.prev_kv.CopyFrom(previous)
            return response

        return await self.m.reply(context, lambda: self.s.apply_once(request.header, "Put", apply))

    async def Get(self, request: kv_pb2.GetRequest, context: Context) -> kv_pb2.GetResponse:
        await self.m.gate(context, "Get")
        if not request.key:
            await abort(
                context, Refusal(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", "empty key")
            )
        kv = self.s.kvs.get(request.key)
        return kv_pb2.GetResponse(header=self.m.header(), kv=kv)

    async def Range(self, request: kv_pb2.RangeRequest, context: Context) -> kv_pb2.RangeResponse:
        await self.m.gate(context, "Range")
        keys = sorted(
            k for k in self.s.kvs if k.startswith(request.prefix) and k > request.start_after
        )
        more = bool(request.limit) and len(keys) > request.limit
        if request.limit:
            keys = keys[: request.limit]
        kvs = []
        for key in keys:
            kv = common_pb2.KeyValue()
            kv.CopyFrom(self.s.kvs[key])
            if request.keys_only:
                kv.value = b""
            kvs.append(kv)
        return kv_pb2.RangeResponse(header=self.m.header(), kvs=kvs, more=more)

    async def Delete(
        self, request: kv_pb2.DeleteRequest, context: Context
    ) -> kv_pb2.DeleteResponse:
        await self.m.gate(context, "Delete")

        async def apply() -> kv_pb2.DeleteResponse:
            self.s.check_write(request.key or b"-", b"", 0, request.fence)
            match = self.s.matching(request.key, request.prefix)
            keys = [k for k in self.s.kvs if match(k)]
            deleted = await self.s.delete(keys) if keys else []
            return kv_pb2.DeleteResponse(
                header=self.m.header(),
                deleted=len(deleted),
                prev_kvs=deleted if request.prev_kv else [],
            )

        return await self.m.reply(
            context, lambda: self.s.apply_once(request.header, "Delete", apply)
        )

    async def CompareAndSet(
        self, request: kv_pb2.CompareAndSetRequest, context: Context
    ) -> kv_pb2.CompareAndSetResponse:
        await self.m.gate(context, "CompareAndSet")

        async def apply() -> kv_pb2.CompareAndSetResponse:
            self.s.check_write(request.key, request.value, request.lease_id, request.fence)
            current = self.s.kvs.get(request.key)
            which = request.WhichOneof("compare")
            if which == "value_equals":
                holds = current is not None and current.value == request.value_equals
            elif which == "mod_revision_equals":
                holds = current is not None and current.mod_revision == request.mod_revision_equals
            elif which == "must_not_exist":
                holds = current is None
            else:
                raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", "no comparison")
            if not holds:
                return kv_pb2.CompareAndSetResponse(
                    header=self.m.header(), succeeded=False, kv=current
                )
            kv, _ = await self.s.put(request.key, request.value, request.lease_id)
            return kv_pb2.CompareAndSetResponse(header=self.m.header(), succeeded=True, kv=kv)

        return await self.m.reply(
            context, lambda: self.s.apply_once(request.header, "CompareAndSet", apply)
        )

    async def Add(self, request: kv_pb2.AddRequest, context: Context) -> kv_pb2.AddResponse:
        await self.m.gate(context, "Add")

        async def apply() -> kv_pb2.AddResponse:
            self.s.check_write(request.key, b"", request.lease_id, request.fence)
            current = self.s.kvs.get(request.key)
            try:
                value = int(current.value) if current is not None else 0
            except ValueError:
                raise Refusal(
                    grpc.StatusCode.FAILED_PRECONDITION, "NOT_AN_INTEGER", "not an integer"
                ) from None
            value += request.delta
            if not -(2**63) <= value < 2**63:
                raise Refusal(grpc.StatusCode.OUT_OF_RANGE, "ADD_OVERFLOW", "overflow")
            kv, _ = await self.s.put(request.key, str(value).encode(), request.lease_id)
            return kv_pb2.AddResponse(header=self.m.header(), value=value, kv=kv)

        return await self.m.reply(context, lambda: self.s.apply_once(request.header, "Add", apply))


class WatchServicer(watch_pb2_grpc.WatchServicer):
    def __init__(self, member: FakeMember) -> None:
        self.m = member
        self.s = member.store

    async def Watch(
        self, request: watch_pb2.WatchRequest, context: Context
    ) -> AsyncIterator[watch_pb2.WatchResponse]:
        await self.m.gate(context, "Watch")
        store = self.s
        next_revision = request.start_revision or store.revision + 1
        if next_revision < store.compacted_below:
            yield watch_pb2.WatchResponse(
                header=self.m.header(), compact_revision=store.compacted_below
            )
            await abort(
                context,
                Refusal(grpc.StatusCode.OUT_OF_RANGE, "COMPACTED", "revision compacted"),
            )
        match = store.matching(request.key, request.prefix)
        generation = store.watch_generation
        sent_with_events = 0
        progress_s = request.progress_interval_ms / 1000 or None
        while True:
            pending = [(rev, events) for rev, events in store.history if rev >= next_revision]
            for revision, events in pending:
                chosen = [self._copy(e, request.prev_kv) for e in events if match(e.kv.key)]
                next_revision = revision + 1
                if not chosen:
                    continue
                size = self.m.switches.watch_fragment_events or len(chosen)
                for start in range(0, len(chosen), size):
                    yield watch_pb2.WatchResponse(
                        header=self.m.header(),
                        events=chosen[start : start + size],
                        fragment=start + size < len(chosen),
                    )
                    sent_with_events += 1
                    limit = self.m.switches.watch_break_after
                    if limit is not None and sent_with_events >= limit:
                        if self.m.switches.watch_break_cleanly:
                            return
                        await abort(
                            context,
                            Refusal(grpc.StatusCode.UNAVAILABLE, "", "watch stream broken"),
                        )
            if pending:
                # Changes may have landed while the responses above were sent: scan again.
                continue
            # Nothing was awaited since the scan found no pending change: every revision up to
            # store.revision is delivered.
            next_revision = max(next_revision, store.revision + 1)
            async with store.changed:
                try:
                    await asyncio.wait_for(store.changed.wait(), progress_s)
                except TimeoutError:
                    # Everything up to store.revision was delivered above: a true progress mark.
                    yield watch_pb2.WatchResponse(header=self.m.header())
            if store.watch_generation != generation:
                await abort(context, Refusal(grpc.StatusCode.UNAVAILABLE, "", "watch broken"))

    @staticmethod
    def _copy(event: watch_pb2.Event, prev_kv: bool) -> watch_pb2.Event:
        copy = watch_pb2.Event()
        copy.CopyFrom(event)
        if not prev_kv:
            copy.ClearField("prev_kv")
        return copy


class LeaseServicer(lease_pb2_grpc.LeaseServicer):
    def __init__(self, member: FakeMember) -> None:
        self.m = member
        self.s = member.store

    async def Grant(
        self, request: lease_pb2.LeaseGrantRequest, context: Context
    ) -> lease_pb2.LeaseGrantResponse:
        await self.m.gate(context, "Grant")

        async def apply() -> lease_pb2.LeaseGrantResponse:
            if request.ttl_ms <= 0:
                raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", "ttl_ms <= 0")
            self.s.revision += 1
            lease = FakeLease(self.s.revision, self.s.revision, request.ttl_ms)
            self.s.leases[lease.lease_id] = lease
            return lease_pb2.LeaseGrantResponse(
                header=self.m.header(),
                lease_id=lease.lease_id,
                fencing_token=lease.token,
                ttl_ms=lease.ttl_ms,
            )

        return await self.m.reply(
            context, lambda: self.s.apply_once(request.header, "Grant", apply)
        )

    async def KeepAlive(
        self, request_iterator: AsyncIterator[lease_pb2.LeaseKeepAliveRequest], context: Context
    ) -> AsyncIterator[lease_pb2.LeaseKeepAliveResponse]:
        await self.m.gate(context, "KeepAlive")
        async for request in request_iterator:
            if self.m.switches.hang:
                await asyncio.Event().wait()
            if self.m.switches.not_leader is not None:
                await self.m.gate(context, "KeepAlive")
            lease = self.s.leases.get(request.lease_id)
            self.s.lease_keepalives[request.lease_id] += 1
            yield lease_pb2.LeaseKeepAliveResponse(
                header=self.m.header(),
                lease_id=request.lease_id,
                ttl_ms=lease.ttl_ms if lease is not None else 0,
            )

    async def Revoke(
        self, request: lease_pb2.LeaseRevokeRequest, context: Context
    ) -> lease_pb2.LeaseRevokeResponse:
        await self.m.gate(context, "Revoke")

        async def apply() -> lease_pb2.LeaseRevokeResponse:
            keys = await self.s._end_lease(request.lease_id)
            return lease_pb2.LeaseRevokeResponse(header=self.m.header(), deleted_keys=keys)

        return await self.m.reply(
            context, lambda: self.s.apply_once(request.header, "Revoke", apply)
        )

    async def List(
        self, request: lease_pb2.LeaseListRequest, context: Context
    ) -> lease_pb2.LeaseListResponse:
        await self.m.gate(context, "List")
        return lease_pb2.LeaseListResponse(
            header=self.m.header(),
            leases=[
                lease_pb2.LeaseStatus(
                    lease_id=lease.lease_id, fencing_token=lease.token, granted_ttl_ms=lease.ttl_ms
                )
                for _, lease in sorted(self.s.leases.items())
            ],
        )

    async def TimeToLive(
        self, request: lease_pb2.LeaseTimeToLiveRequest, context: Context
    ) -> lease_pb2.LeaseTimeToLiveResponse:
        await self.m.gate(context, "TimeToLive")
        lease = self.s.leases.get(request.lease_id)
        if lease is None:
            await abort(
                context,
                Refusal(
                    grpc.StatusCode.NOT_FOUND, "LEASE_NOT_FOUND", f"no lease {request.lease_id}"
                ),
            )
            raise AssertionError("abort returned")
        return lease_pb2.LeaseTimeToLiveResponse(
            header=self.m.header(),
            lease_id=lease.lease_id,
            fencing_token=lease.token,
            granted_ttl_ms=lease.ttl_ms,
            remaining_ttl_ms=lease.ttl_ms,
            keys=sorted(lease.keys) if request.keys else [],
        )


class SessionServicer(session_pb2_grpc.SessionServicer):
    def __init__(self, member: FakeMember) -> None:
        self.m = member
        self.s = member.store

    async def Open(
        self, request: session_pb2.SessionOpenRequest, context: Context
    ) -> session_pb2.SessionOpenResponse:
        await self.m.gate(context, "Open")
        if request.ttl_ms <= 0:
            await abort(
                context, Refusal(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", "ttl")
            )
        self.s.revision += 1
        self.s.sessions[self.s.revision] = {}
        return session_pb2.SessionOpenResponse(
            header=self.m.header(), session_id=self.s.revision, ttl_ms=request.ttl_ms
        )

    async def KeepAlive(
        self, request: session_pb2.SessionKeepAliveRequest, context: Context
    ) -> session_pb2.SessionKeepAliveResponse:
        await self.m.gate(context, "SessionKeepAlive")
        if request.session_id not in self.s.sessions:
            await abort(
                context, Refusal(grpc.StatusCode.NOT_FOUND, "SESSION_EXPIRED", "session expired")
            )
        self.s.session_keepalives += 1
        return session_pb2.SessionKeepAliveResponse(header=self.m.header(), ttl_ms=1)

    async def Close(
        self, request: session_pb2.SessionCloseRequest, context: Context
    ) -> session_pb2.SessionCloseResponse:
        await self.m.gate(context, "Close")
        if self.s.sessions.pop(request.session_id, None) is None:
            await abort(
                context, Refusal(grpc.StatusCode.NOT_FOUND, "SESSION_EXPIRED", "session expired")
            )
        return session_pb2.SessionCloseResponse(header=self.m.header())


class ClusterServicer(cluster_pb2_grpc.ClusterServicer):
    def __init__(self, member: FakeMember) -> None:
        self.m = member
        self.s = member.store

    def _find(self, member_id: int) -> cluster_pb2.Member | None:
        return next((m for m in self.s.members if m.id == member_id), None)

    async def _missing(self, context: Context, member_id: int) -> None:
        await abort(
            context,
            Refusal(grpc.StatusCode.NOT_FOUND, "MEMBER_NOT_FOUND", f"no member {member_id}"),
        )

    async def MemberList(
        self, request: cluster_pb2.MemberListRequest, context: Context
    ) -> cluster_pb2.MemberListResponse:
        await self.m.gate(context, "MemberList")
        return cluster_pb2.MemberListResponse(header=self.m.header(), members=self.s.members)

    async def MemberAdd(
        self, request: cluster_pb2.MemberAddRequest, context: Context
    ) -> cluster_pb2.MemberAddResponse:
        await self.m.gate(context, "MemberAdd")
        member = cluster_pb2.Member(
            id=request.id or max(m.id for m in self.s.members) + 1,
            name=request.name,
            peer_address=request.peer_address,
            client_address=request.client_address,
            is_learner=request.as_learner,
        )
        self.s.members.append(member)
        return cluster_pb2.MemberAddResponse(
            header=self.m.header(), member=member, members=self.s.members
        )

    async def MemberRemove(
        self, request: cluster_pb2.MemberRemoveRequest, context: Context
    ) -> cluster_pb2.MemberRemoveResponse:
        await self.m.gate(context, "MemberRemove")
        member = self._find(request.id)
        if member is None:
            await self._missing(context, request.id)
        self.s.members.remove(member)
        return cluster_pb2.MemberRemoveResponse(header=self.m.header(), members=self.s.members)

    async def MemberPromote(
        self, request: cluster_pb2.MemberPromoteRequest, context: Context
    ) -> cluster_pb2.MemberPromoteResponse:
        await self.m.gate(context, "MemberPromote")
        member = self._find(request.id)
        if member is None:
            await self._missing(context, request.id)
            raise AssertionError("abort returned")
        member.is_learner = False
        return cluster_pb2.MemberPromoteResponse(header=self.m.header(), members=self.s.members)

    async def TransferLeader(
        self, request: cluster_pb2.TransferLeaderRequest, context: Context
    ) -> cluster_pb2.TransferLeaderResponse:
        await self.m.gate(context, "TransferLeader")
        self.s.transfer_targets.append(request.target_id)
        target = request.target_id
        if target == 0:
            # The member's choice; this fake has no logs to compare: the highest other voter.
            voters = [m.id for m in self.s.members if not m.is_learner and m.id != self.s.leader_id]
            if not voters:
                await abort(context, Refusal(grpc.StatusCode.UNAVAILABLE, "", "no other voter"))
            target = max(voters)
        elif self._find(target) is None:
            await self._missing(context, target)
        self.s.leader_id = target
        self.s.term += 1
        return cluster_pb2.TransferLeaderResponse(header=self.m.header())

    async def Snapshot(
        self, request: cluster_pb2.SnapshotRequest, context: Context
    ) -> cluster_pb2.SnapshotResponse:
        await self.m.gate(context, "Snapshot")
        return cluster_pb2.SnapshotResponse(
            header=self.m.header(), index=self.s.revision, term=self.s.term, size_bytes=1234
        )

    async def Status(
        self, request: cluster_pb2.StatusRequest, context: Context
    ) -> cluster_pb2.StatusResponse:
        await self.m.gate(context, "Status")
        leader = self.s.leader_id == self.m.member_id
        return cluster_pb2.StatusResponse(
            header=self.m.header(),
            member_id=self.m.member_id,
            leader_id=self.s.leader_id,
            term=self.s.term,
            role=cluster_pb2.LEADER if leader else cluster_pb2.FOLLOWER,
            commit_index=self.s.revision,
            applied_index=self.s.revision,
            version="fake",
        )


class FakeCluster:
    def __init__(self, size: int = 3, **store_options: Any) -> None:
        self.store = FakeStore(**store_options)
        self.members = [FakeMember(i + 1, self.store) for i in range(size)]
        self.store.members = [
            cluster_pb2.Member(
                id=m.member_id,
                name=f"m{m.member_id}",
                peer_address=f"127.0.0.1:{7000 + m.member_id}",
                client_address=m.address,
            )
            for m in self.members
        ]

    @property
    def addresses(self) -> list[str]:
        return [m.address for m in self.members]

    async def start(self) -> None:
        for member in self.members:
            await member.start()

    async def stop(self) -> None:
        for member in self.members:
            await member.stop()


@contextlib.asynccontextmanager
async def fake_cluster(size: int = 3, **store_options: Any) -> AsyncIterator[FakeCluster]:
    cluster = FakeCluster(size, **store_options)
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.stop()
