"""Leases that keep themselves alive, over one multiplexed KeepAlive stream per client.

Theory of operation. Every live :class:`Lease` of a client is registered with the client's
:class:`LeaseKeeper`, whose task holds one ``Lease.KeepAlive`` stream to the leader (followers
end the stream with UNAVAILABLE and a leader hint, which the keeper follows). It sends a
keep-alive for each lease every third of its TTL and reads the answers in order.

The client's view of a lease is pessimistic: the lease counts as held until ``sent + ttl``,
where ``sent`` is when the client sent the keep-alive the latest answer replied to (the leader
extended it no earlier than that). When that local deadline passes without a newer answer
(the cluster is unreachable, the leader is paused), or an answer says ttl 0 (the lease expired
or was revoked on the server), the lease is *lost*: ``alive`` turns False, ``lost`` is set,
the callbacks run, and the keeper stops keeping it alive. Loss is final. The server may keep
the lease a little longer (a new leader grants a full TTL again), which is safe: its holder
has stopped acting, and the fencing token refuses any write it still has in flight.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable

import grpc
import grpc.aio

from rallypoint.proto.v1 import lease_pb2

from .caller import Caller
from .errors import LeaseNotFoundError, RallypointError, UnavailableError, map_rpc_error
from .tasks import cancel_and_wait
from .transport import Retrier
from .values import Fence


class Lease:
    """A granted lease. ``alive`` while the client believes it holds it; see the module
    docstring for when it is lost."""

    def __init__(
        self,
        lease_id: int,
        fencing_token: int,
        ttl_s: float,
        revoke: Callable[[Lease], Awaitable[None]],
    ) -> None:
        self.lease_id = lease_id
        self.fencing_token = fencing_token
        self.ttl_s = ttl_s
        self.lost = asyncio.Event()
        # Why the lease is no longer held; None while alive.
        self.lost_reason: str | None = None
        self._revoke = revoke
        self._callbacks: list[Callable[[Lease], object]] = []
        self._expiry: asyncio.TimerHandle | None = None
        # Send times of keep-alives not answered yet, oldest first (answers come in order).
        self.unanswered_sends: collections.deque[float] = collections.deque()

    @property
    def fence(self) -> Fence:
        return Fence(self.lease_id, self.fencing_token)

    @property
    def alive(self) -> bool:
        return not self.lost.is_set()

    def on_lost(self, callback: Callable[[Lease], object]) -> None:
        """Call ``callback(lease)`` on the event loop when the lease is lost (at once if it
        already is)."""
        if self.lost.is_set():
            asyncio.get_running_loop().call_soon(callback, self)
        else:
            self._callbacks.append(callback)

    async def wait_lost(self) -> str:
        await self.lost.wait()
        return self.lost_reason or ""

    async def revoke(self) -> None:
        """Revoke on the server (deleting its keys) and stop keeping it alive."""
        if self.alive:
            await self._revoke(self)

    def mark_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        if self._expiry is not None:
            self._expiry.cancel()
        loop = asyncio.get_running_loop()
        for callback in self._callbacks:
            # call_soon: a failing callback reaches the loop's exception handler instead of
            # stopping the keeper.
            loop.call_soon(callback, self)
        self._callbacks.clear()

    def expire_at(self, loop_time: float) -> None:
        """Reschedule the local deadline."""
        if self._expiry is not None:
            self._expiry.cancel()
        if self.alive:
            self._expiry = asyncio.get_running_loop().call_at(
                loop_time,
                self.mark_lost,
                f"no keep-alive for lease {self.lease_id} was answered within its "
                f"{self.ttl_s:g} s TTL",
            )

    def __repr__(self) -> str:
        state = "alive" if self.alive else f"lost: {self.lost_reason}"
        return f"Lease(id={self.lease_id}, token={self.fencing_token}, ttl_s={self.ttl_s}, {state})"


class LeaseKeeper:
    def __init__(self, caller: Caller) -> None:
        self._caller = caller
        self._transport = caller.transport
        # Invariant: every lease here is alive; a lost lease is removed at once.
        self._leases: dict[int, Lease] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closed = False

    def add(self, lease: Lease, granted_at: float) -> None:
        lease.expire_at(granted_at + lease.ttl_s)
        lease.on_lost(self._forget)
        self._leases[lease.lease_id] = lease
        self._wake.set()
        if not self._closed and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run(), name="lease-keepalive")

    def _forget(self, lease: Lease) -> None:
        self._leases.pop(lease.lease_id, None)

    async def _run(self) -> None:
        retrier = self._caller.retrier()
        while self._leases and not self._closed:
            address = self._transport.pick()
            error = await self._stream(address, retrier)
            if self._leases:
                await retrier.after_failure(address, error)

    async def _stream(self, address: str, retrier: Retrier) -> RallypointError:
        """Keep the leases alive over one stream until it fails; the failure."""
        call = self._transport.stubs(address).lease.KeepAlive(
            None, metadata=self._transport.metadata
        )
        for lease in self._leases.values():
            lease.unanswered_sends.clear()
        sender = asyncio.create_task(self._send(call), name="lease-keepalive-send")
        try:
            while self._leases:
                # An answer is due every third of the shortest TTL; twice that with none means
                # the member stopped answering (paused, partitioned): move on.
                patience_s = min(lease.ttl_s for lease in self._leases.values()) * 2 / 3
                try:
                    async with asyncio.timeout(patience_s):
                        response = await call.read()
                except TimeoutError:
                    return UnavailableError(
                        f"{address} answered no lease keep-alive within {patience_s:g} s"
                    )
                if not isinstance(response, lease_pb2.LeaseKeepAliveResponse):  # grpc.aio.EOF
                    return UnavailableError(f"{address} ended the lease keep-alive stream")
                retrier.answered()
                self._transport.note_success(address)
                self._on_answer(response)
            return UnavailableError("no lease left to keep alive")
        except grpc.aio.AioRpcError as rpc_error:
            return map_rpc_error(rpc_error, address)
        finally:
            try:
                await cancel_and_wait(sender)
            finally:
                call.cancel()

    def _on_answer(self, response: lease_pb2.LeaseKeepAliveResponse) -> None:
        lease = self._leases.get(response.lease_id)
        if lease is None:
            return
        sent_at = lease.unanswered_sends.popleft() if lease.unanswered_sends else None
        if response.ttl_ms <= 0 or response.HasField("error"):
            lease.mark_lost(f"lease {lease.lease_id} expired or was revoked on the server")
        elif sent_at is not None:
            lease.expire_at(sent_at + response.ttl_ms / 1000.0)

    async def _send(
        self,
        call: grpc.aio.StreamStreamCall[
            lease_pb2.LeaseKeepAliveRequest, lease_pb2.LeaseKeepAliveResponse
        ],
    ) -> None:
        loop = asyncio.get_running_loop()
        next_send: dict[int, float] = {}
        while self._leases:
            now = loop.time()
            for lease_id, lease in list(self._leases.items()):
                if next_send.get(lease_id, 0.0) <= now:
                    lease.unanswered_sends.append(now)
                    next_send[lease_id] = now + lease.ttl_s / 3
                    try:
                        await call.write(lease_pb2.LeaseKeepAliveRequest(lease_id=lease_id))
                    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                        # The stream ended; the reader reports why.
                        return
            for lease_id in [i for i in next_send if i not in self._leases]:
                del next_send[lease_id]
            self._wake.clear()
            wait_s = max(0.0, min(next_send.values(), default=now + 1.0) - loop.time())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._wake.wait()

    async def close(self) -> None:
        self._closed = True
        await cancel_and_wait(self._task)
        for lease in list(self._leases.values()):
            lease.mark_lost("the client was closed")
        self._leases.clear()


async def keep_alive_once(caller: Caller, lease_id: int, timeout_s: float | None) -> float:
    """One keep-alive over a short-lived stream, at the leader; the new TTL in seconds.

    Raises LeaseNotFoundError when the lease no longer exists.
    """
    transport = caller.transport
    deadline = caller.deadline(timeout_s)
    retrier = caller.retrier()
    while True:
        address = transport.pick()
        call = transport.stubs(address).lease.KeepAlive(
            None, timeout=max(0.001, deadline.remaining_s()), metadata=transport.metadata
        )
        try:
            # A stream that already ended refuses the write; the read then raises its status.
            with contextlib.suppress(asyncio.InvalidStateError):
                await call.write(lease_pb2.LeaseKeepAliveRequest(lease_id=lease_id))
            response = await call.read()
            if isinstance(response, lease_pb2.LeaseKeepAliveResponse):
                transport.note_success(address)
                if response.ttl_ms <= 0 or response.HasField("error"):
                    raise LeaseNotFoundError(
                        f"lease {lease_id} does not exist (expired or revoked)",
                        reason="LEASE_NOT_FOUND",
                    )
                return response.ttl_ms / 1000.0
            error: RallypointError = UnavailableError(f"{address} ended the keep-alive stream")
        except grpc.aio.AioRpcError as rpc_error:
            error = map_rpc_error(rpc_error, address)
        finally:
            call.cancel()
        if not isinstance(error, UnavailableError) or deadline.remaining_s() <= 0:
            raise error
        await retrier.after_failure(address, error, max_sleep_s=deadline.remaining_s())
