"""The client's core: how every part of the client calls the cluster.

Theory of operation. A :class:`Client` owns one :class:`Caller` and hands it to the parts it
is made of: job administration (``jobs.py``), the checkpoint registry, the round store,
participants (``rendezvous.py``). The parts call the cluster through the caller, never
through the client, so the client's modules form a tree with no cycle, not even a private
one: ``aio.py`` on top, the parts under it, the caller under them, the session and the
transport under the caller (``tests/client/test_layering.py`` keeps it so).

The caller offers what every call needs:

- ``deadline(timeout_s)``: the call's deadline, the client's ``timeout_s`` unless the call
  gives its own;
- ``read``: a unary call, retried by the transport (leader hints, full-jitter backoff,
  ``attempt_timeout_s`` per attempt) until the deadline; linearizable unless the request
  asks to be served ``serializable``;
- ``write``: a mutating call, stamped by the session with (session, sequence) so that a
  retry applies at most once (``session.py``), with at most ``max_inflight_writes`` in
  flight (the server keeps a bounded number of unacknowledged answers per session);
- ``ask``: one member's own answer, one attempt, no redirect (status, snapshot);
- ``kv_read``, ``kv_write``: a KV get, put, delete or compare-and-set, through the client's
  batch stream (``kv_stream.py``) when the client batches (``kv_batching``: "always", or
  "concurrent" while another KV call is in flight), else as a unary read or write;
- ``retrier``: the one retry policy (``transport.Retrier``) for the loops the parts run
  themselves (streams, reads the server holds).

The caller also keeps the client's endpoints up with the cluster's membership: once every
``member_sync_s`` while the client is in use (a call was answered), it asks one member for the
member list in the background (``MemberList``, serializable) and learns every member's
client address. A client given three members' addresses then still reaches the cluster after
an operator replaced all three one at a time (remove, add, promote): it learned the new ones
while the old ones served. An idle client asks nothing; a failed ask is tried at the next
interval.

The session and the write slots are made on the running loop (``start``), never in
``__init__``, so a client may be built outside the loop that uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from rallypoint.proto.v1 import cluster_pb2, common_pb2
from rallypoint.proto.v1.defaults import MAX_SESSION_TTL_MS

from .arguments import count, positive_seconds
from .backoff import Backoff
from .errors import InvalidValueError, RallypointError
from .kv_stream import BatchStreams, KVStream
from .session import SessionKeeper
from .tasks import cancel_and_wait
from .transport import Deadline, Method, Retrier, Transport
from .values import Member, members_from_proto

Request = TypeVar("Request")
Response = TypeVar("Response")

# How a client sends KV puts, gets, deletes and compare-and-sets (Client's ``kv_batching``).
KV_BATCHING = ("off", "concurrent", "always")

# close() ends the session within this much, whatever the client's timeout: a client that
# cannot reach the cluster still closes promptly (the session then expires on its own).
CLOSE_TIMEOUT_S = 2.0


class Caller:
    """Session-stamped writes, reads, deadlines and retries over one transport; see the
    module docstring. Use it from one event loop."""

    def __init__(
        self,
        transport: Transport,
        *,
        timeout_s: float,
        session_ttl_s: float,
        max_inflight_writes: int,
        kv_batching: str = "off",
        member_sync_s: float = 5.0,
    ) -> None:
        if kv_batching not in KV_BATCHING:
            raise InvalidValueError(
                f"kv_batching must be one of {', '.join(KV_BATCHING)}, got {kv_batching!r}"
            )
        self.transport = transport
        self.kv_batching = kv_batching
        self._kv_stream = None if kv_batching == "off" else KVStream(transport)
        # The round-store batch streams (RoundStore/Batch), made by the first RoundStore read
        # that uses them (roundstore.py); closed with the client.
        self.store_streams: BatchStreams | None = None
        # KV calls (kv_read, kv_write) in progress, for kv_batching "concurrent".
        self._kv_calls = 0
        self.timeout_s = positive_seconds(timeout_s, "timeout_s")
        self._session_ttl_s = positive_seconds(
            session_ttl_s, "session_ttl_s", least_s=0.001, most_s=MAX_SESSION_TTL_MS / 1000
        )
        self._max_inflight_writes = count(max_inflight_writes, "max_inflight_writes")
        # 0: never learn the membership by itself (module docstring).
        if member_sync_s < 0 or not math.isfinite(member_sync_s):
            raise InvalidValueError(f"member_sync_s must be 0 or more, got {member_sync_s!r}")
        self._member_sync_s = member_sync_s
        # Loop time of the last membership ask (or of the first answer); its task meanwhile.
        self._synced_at: float | None = None
        self._sync_task: asyncio.Task[None] | None = None
        # Invariant: both None, or both made on the loop that uses them (start).
        self._sessions: SessionKeeper | None = None
        self._write_slots: asyncio.Semaphore | None = None

    @property
    def session_id(self) -> int:
        """The current session's id; 0 before the first write (or connect)."""
        session = self._sessions.current if self._sessions is not None else None
        return session.session_id if session is not None else 0

    def start(self) -> tuple[SessionKeeper, asyncio.Semaphore]:
        """The session keeper and the write slots, made on first use."""
        if self._sessions is None or self._write_slots is None:
            self._sessions = SessionKeeper(
                self.transport, self._session_ttl_s, open_timeout_s=self.timeout_s
            )
            self._write_slots = asyncio.Semaphore(self._max_inflight_writes)
        return self._sessions, self._write_slots

    async def open_session(self) -> None:
        sessions, _ = self.start()
        await sessions.ensure(self.deadline(None))

    async def close(self) -> None:
        """End the session (best effort) and close the streams and channels."""
        await cancel_and_wait(self._sync_task)
        if self._kv_stream is not None:
            await self._kv_stream.close()
        if self.store_streams is not None:
            await self.store_streams.close()
        if self._sessions is not None:
            await self._sessions.close(Deadline(min(self.timeout_s, CLOSE_TIMEOUT_S)))
        await self.transport.close()

    def deadline(self, timeout_s: float | None) -> Deadline:
        # Deadline refuses a timeout that is not a positive number of seconds.
        return Deadline(self.timeout_s if timeout_s is None else timeout_s)

    def retrier(self, backoff: Backoff | None = None) -> Retrier:
        """A fresh retry state for one loop (``backoff``: the client's unless given)."""
        return Retrier(self.transport, backoff)

    async def read(
        self, method: Method[Request, Response], request: Request, timeout_s: float | None
    ) -> Response:
        response = await self.transport.unary(method, request, self.deadline(timeout_s))
        self.answered()
        return response

    def answered(self) -> None:
        """A call was answered: the client is in use and reaches the cluster. Learn the
        membership if it was not learned for ``member_sync_s`` (module docstring)."""
        if not self._member_sync_s or (self._sync_task and not self._sync_task.done()):
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._synced_at is None:
            # A client used once (a command line) asks nothing; one that lives on does.
            self._synced_at = now
            return
        if now - self._synced_at < self._member_sync_s:
            return
        self._synced_at = now
        self._sync_task = loop.create_task(self._sync_members())

    async def _sync_members(self) -> None:
        # Expected to fail at times (no member reachable, no leader): asked again later.
        with contextlib.suppress(RallypointError):
            await self.member_list(serializable=True, timeout_s=min(self.timeout_s, 5.0))

    async def kv_read(
        self, method: Method[Request, Response], request: Request, timeout_s: float | None
    ) -> Response:
        """A KV get: batched (see the module docstring) or a unary read."""
        stream = self._batching()
        self._kv_calls += 1
        try:
            if stream is None:
                return await self.read(method, request, timeout_s)
            response = await stream.call("get", method, request, self.deadline(timeout_s))
            self.answered()
            return response
        finally:
            self._kv_calls -= 1

    async def kv_write(
        self,
        kind: str,
        method: Method[Request, Response],
        build: Callable[[common_pb2.RequestHeader], Request],
        timeout_s: float | None,
    ) -> Response:
        """A KV put, delete or compare-and-set (``kind``, its field in a batch operation):
        batched (see ``kv``) or a unary write; either way
        every retry carries the same sequence."""
        stream = self._batching()
        self._kv_calls += 1
        try:
            if stream is None:
                return await self.write(method, build, timeout_s)
            return await self.write_on(stream, kind, method, build, timeout_s)
        finally:
            self._kv_calls -= 1

    async def write_on(
        self,
        streams: BatchStreams,
        kind: str,
        method: Method[Request, Response],
        build: Callable[[common_pb2.RequestHeader], Request],
        timeout_s: float | None,
    ) -> Response:
        """A mutating call through ``streams`` (``kind``: its field in a batch operation),
        with ``write``'s session and retries: every retry carries the same sequence, and a
        member that does not know the stream gets the unary ``method`` call."""
        return await self._write(
            lambda header, deadline, on_retry: streams.call(
                kind, method, build(header), deadline, on_retry
            ),
            timeout_s,
        )

    def _batching(self) -> KVStream | None:
        """The batch stream for the next KV call, or None for a unary call."""
        if self.kv_batching == "concurrent" and self._kv_calls == 0:
            return None
        return self._kv_stream

    async def ask(
        self,
        address: str,
        method: Method[Request, Response],
        request: Request,
        timeout_s: float | None,
    ) -> Response:
        """The member at ``address``'s own answer: one attempt, no redirect."""
        return await self.transport.unary(
            method, request, self.deadline(timeout_s), address=address
        )

    async def write(
        self,
        method: Method[Request, Response],
        build: Callable[[common_pb2.RequestHeader], Request],
        timeout_s: float | None,
    ) -> Response:
        """A mutating call: ``build(header)`` makes the request for the session's header;
        every retry carries the same sequence."""

        def send(
            header: common_pb2.RequestHeader,
            deadline: Deadline,
            on_retry: Callable[[RallypointError], None],
        ) -> Awaitable[Response]:
            return self.transport.unary(method, build(header), deadline, on_retry=on_retry)

        return await self._write(send, timeout_s)

    async def _write(
        self,
        send: Callable[
            [common_pb2.RequestHeader, Deadline, Callable[[RallypointError], None]],
            Awaitable[Response],
        ],
        timeout_s: float | None,
    ) -> Response:
        sessions, write_slots = self.start()
        deadline = self.deadline(timeout_s)
        async with write_slots:
            response = await sessions.write(send, deadline)
        self.answered()
        return response

    def learn_members(self, members: Iterable[cluster_pb2.Member]) -> list[Member]:
        """The membership in an answer; every member's client address becomes an endpoint
        (members added since the client started included)."""
        found = list(members_from_proto(members))
        self.transport.learn([m.client_address for m in found])
        return found

    async def member_list(
        self, *, serializable: bool = False, timeout_s: float | None = None
    ) -> list[Member]:
        response = await self.read(
            lambda s: s.cluster.MemberList,
            cluster_pb2.MemberListRequest(serializable=serializable),
            timeout_s,
        )
        return self.learn_members(response.members)
