"""The client's session: what makes a retried write apply exactly once.

Theory of operation (Raft thesis section 6.3, proto/v1/session.proto). The client opens one
session and numbers its writes 1, 2, 3, ...; every write carries (session_id, sequence,
first_unacked). A retry of a write reuses its sequence, so the state machine applies it at
most once and answers the retry from its cache; the client retries until it gets an answer,
so a write that returns was applied exactly once. ``first_unacked`` is the lowest sequence
still waiting for an answer, which lets the server drop the answers below it.

A background task keeps the session alive every third of its TTL. If the session ends anyway
(the client was partitioned for longer than the TTL), requests naming it fail with
SESSION_EXPIRED and the client opens a new one. A write still in flight at that moment is
handled by :meth:`SessionKeeper.write`:

- if nothing of it can have been applied (its only attempt was answered SESSION_EXPIRED, which
  the state machine decides before applying anything), it is renumbered in the new session
  and retried: the caller sees nothing;
- if an earlier attempt ended without an answer (lost reply, timeout, member down), that
  attempt may have been applied under the old session, whose cached answer is gone: the
  client cannot know, and raises :class:`OutcomeUnknownError` rather than risk applying it
  twice. The caller must read the state to find out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rallypoint.proto.v1 import common_pb2, session_pb2
from rallypoint.proto.v1.defaults import MAX_SESSION_TTL_MS

from .arguments import positive_seconds
from .errors import (
    OutcomeUnknownError,
    RallypointError,
    SessionExpiredError,
)
from .tasks import cancel_and_wait
from .transport import Deadline, Transport

Response = TypeVar("Response")


class Session:
    """One server session and the client's numbering within it."""

    def __init__(self, session_id: int, ttl_s: float) -> None:
        self.session_id = session_id
        self.ttl_s = ttl_s
        # Invariant: every sequence handed out is < next_sequence; sequences start at 1.
        self.next_sequence = 1
        # Sequences handed out whose call has not finished. Invariant: each is < next_sequence.
        self.outstanding: set[int] = set()
        # Invariant: no sequence below it is outstanding (first_unacked moves it forward).
        self._low = 1

    def begin(self) -> int:
        sequence = self.next_sequence
        self.next_sequence += 1
        self.outstanding.add(sequence)
        return sequence

    def finish(self, sequence: int) -> None:
        self.outstanding.discard(sequence)

    @property
    def first_unacked(self) -> int:
        """The lowest outstanding sequence, else the next one. Amortised O(1): sequences
        are handed out in order and only ever finish, so the lowest only moves forward."""
        low, outstanding, end = self._low, self.outstanding, self.next_sequence
        while low < end and low not in outstanding:
            low += 1
        self._low = low
        return low

    def header(self, sequence: int) -> common_pb2.RequestHeader:
        return common_pb2.RequestHeader(
            session_id=self.session_id, sequence=sequence, first_unacked=self.first_unacked
        )


class SessionKeeper:
    """Opens the session on demand, keeps it alive, replaces it when it expires."""

    def __init__(self, transport: Transport, ttl_s: float, *, open_timeout_s: float) -> None:
        positive_seconds(ttl_s, "session ttl_s", least_s=0.001, most_s=MAX_SESSION_TTL_MS / 1000)
        self._transport = transport
        self._ttl_s = ttl_s
        self._open_timeout_s = open_timeout_s
        self.current: Session | None = None
        # Serialises opening, so concurrent writes that find no session open only one.
        self._lock = asyncio.Lock()
        self._keepalive: asyncio.Task[None] | None = None

    async def ensure(self, deadline: Deadline) -> Session:
        session = self.current
        if session is not None:
            return session
        return await self._open(None, deadline)

    async def replace(self, expired: Session, deadline: Deadline) -> Session:
        """A new session after ``expired`` ended (a no-op if another caller replaced it)."""
        return await self._open(expired, deadline)

    async def _open(self, expired: Session | None, deadline: Deadline) -> Session:
        async with self._lock:
            current = self.current
            if current is not None and current is not expired:
                return current
            self.current = None
            request = session_pb2.SessionOpenRequest(ttl_ms=max(1, round(self._ttl_s * 1000)))
            response = await self._transport.unary(lambda s: s.session.Open, request, deadline)
            session = Session(response.session_id, response.ttl_ms / 1000.0 or self._ttl_s)
            self.current = session
            if self._keepalive is None or self._keepalive.done():
                self._keepalive = asyncio.create_task(self._keep_alive(), name="session-keepalive")
            return session

    async def write(
        self,
        send: Callable[
            [common_pb2.RequestHeader, Deadline, Callable[[RallypointError], None]],
            Awaitable[Response],
        ],
        deadline: Deadline,
    ) -> Response:
        """Run one write under the session: ``send(header, deadline, on_retry)`` performs the
        RPC (with the transport's retries), see the module docstring for expiry."""
        session = await self.ensure(deadline)
        while True:
            owner = session
            sequence = owner.begin()
            maybe_applied = False

            def on_retry(_error: RallypointError) -> None:
                nonlocal maybe_applied
                maybe_applied = True

            try:
                return await send(owner.header(sequence), deadline, on_retry)
            except SessionExpiredError as expired:
                if maybe_applied:
                    # Open the next session now, so later writes do not pay for it.
                    with contextlib.suppress(RallypointError):
                        await self.replace(owner, deadline)
                    raise OutcomeUnknownError(
                        f"session {owner.session_id} expired while write {sequence} was in "
                        "flight after an attempt whose answer was lost; it may or may not have "
                        "been applied (read the state to find out)",
                        reason=expired.reason,
                    ) from None
                session = await self.replace(owner, deadline)
            finally:
                owner.finish(sequence)

    async def _keep_alive(self) -> None:
        while True:
            session = self.current
            if session is None:
                return
            await asyncio.sleep(session.ttl_s / 3)
            if self.current is not session:
                continue
            request = session_pb2.SessionKeepAliveRequest(
                session_id=session.session_id, first_unacked=session.first_unacked
            )
            try:
                await self._transport.unary(
                    lambda s: s.session.KeepAlive, request, Deadline(session.ttl_s / 3)
                )
            except SessionExpiredError:
                with contextlib.suppress(RallypointError):
                    await self.replace(session, Deadline(self._open_timeout_s))
            except RallypointError:
                # Unreachable cluster: try again next period; writes meanwhile carry their own
                # keep-alive (any request naming the session touches it).
                pass

    async def close(self, deadline: Deadline) -> None:
        """Stop the keep-alive and end the session on the server (best effort)."""
        keepalive, self._keepalive = self._keepalive, None
        await cancel_and_wait(keepalive)
        session, self.current = self.current, None
        if session is not None:
            with contextlib.suppress(RallypointError):
                await self._transport.unary(
                    lambda s: s.session.Close,
                    session_pb2.SessionCloseRequest(session_id=session.session_id),
                    deadline,
                )
