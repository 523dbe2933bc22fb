"""Client sessions: at-most-once application of requests (Raft thesis section 6.3).

Theory of operation. A client opens a session (its id is the raft index of the open) and
numbers its mutating requests 1, 2, 3, ... A request is applied the first time its
(session, sequence) is applied; the answer is kept in the session, and a retry of the same
sequence (after a timeout, a leader change, a lost reply) gets the kept answer without being
applied again. To bound memory, every request also carries ``first_unacked``, the lowest
sequence the client still waits for: kept answers below it are dropped, and a request below
it is refused (:class:`SequenceDiscarded`) because its answer can no longer be given. At most
``max_outstanding`` answers are kept per session.

A session expires when the state machine's time (the largest leader clock reading applied so
far) passes ``last_activity_ms + ttl_ms``; expiry is checked on every envelope, before the
envelope's own request, so every replica expires the same sessions at the same index.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .results import Result


@dataclass(slots=True)
class Session:
    session_id: int
    ttl_ms: int
    # Invariant: last_activity_ms <= the state machine's now_ms.
    last_activity_ms: int
    # Invariant: every key of `answers` is >= first_unacked; len(answers) <= max_outstanding.
    first_unacked: int = 1
    answers: dict[int, Result] = field(default_factory=dict)
    # The role of the client that opened it ("" when the cluster required no credentials).
    owner: str = ""

    @property
    def deadline_ms(self) -> int:
        return self.last_activity_ms + self.ttl_ms

    def acknowledge(self, first_unacked: int) -> None:
        """Drop answers the client no longer needs (it never lowers the mark)."""
        if first_unacked > self.first_unacked:
            self.first_unacked = first_unacked
            for sequence in sorted(self.answers):
                if sequence >= first_unacked:
                    break
                del self.answers[sequence]


class SessionTable:
    """Every live session, with a deadline queue for deterministic expiry."""

    def __init__(self) -> None:
        # Invariant: ids are raft indexes of SessionOpen entries, all still live.
        self.sessions: dict[int, Session] = {}
        # Min-heap of (deadline_ms, session_id). Entries go stale when a session is touched
        # or closed; a popped entry counts only if it matches the session's current deadline.
        # Invariant: every live session has an entry equal to its current deadline.
        self._deadlines: list[tuple[int, int]] = []

    def open(self, session_id: int, ttl_ms: int, now_ms: int, owner: str = "") -> Session:
        if session_id in self.sessions:
            raise AssertionError(f"session id {session_id} opened twice")
        session = Session(session_id, ttl_ms, now_ms, owner=owner)
        self.sessions[session_id] = session
        heapq.heappush(self._deadlines, (session.deadline_ms, session_id))
        return session

    def add_restored(self, session: Session) -> None:
        self.sessions[session.session_id] = session
        heapq.heappush(self._deadlines, (session.deadline_ms, session.session_id))

    def touch(self, session: Session, now_ms: int) -> None:
        if now_ms > session.last_activity_ms:
            session.last_activity_ms = now_ms
            heapq.heappush(self._deadlines, (session.deadline_ms, session.session_id))

    def close(self, session_id: int) -> None:
        del self.sessions[session_id]

    def expire(self, now_ms: int) -> list[int]:
        """Remove sessions idle for longer than their TTL; their ids, in expiry order."""
        expired = []
        while self._deadlines and self._deadlines[0][0] < now_ms:
            deadline_ms, session_id = heapq.heappop(self._deadlines)
            session = self.sessions.get(session_id)
            if session is not None and session.deadline_ms == deadline_ms:
                del self.sessions[session_id]
                expired.append(session_id)
        return expired

    def get(self, session_id: int) -> Session | None:
        return self.sessions.get(session_id)

    def in_order(self) -> list[Session]:
        return [self.sessions[sid] for sid in sorted(self.sessions)]


@dataclass(frozen=True, slots=True)
class SessionInfo:
    session_id: int
    ttl_ms: int
    last_activity_ms: int
    first_unacked: int
    outstanding_answers: int
    # The role that opened the session ("" when the cluster required no credentials).
    owner: str
