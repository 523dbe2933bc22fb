"""The leader's soft-state lessor: lease deadlines, keep-alives, and expiry decisions.

Theory of operation. Lease deadlines are not replicated: only the leader tracks them, from
its own clock, and when a deadline passes it proposes ``LeaseExpire``; every replica deletes
the lease when that command is applied. Keep-alives therefore go to the leader only and change
nothing in the log. A new leader does not know how recently its predecessor heard from each
holder, so on ``promote`` it gives every lease a full TTL from now (etcd does the same): a
leader change can lengthen a lease, never cut it short. The clock is injected (a function
returning milliseconds), so tests drive it by hand.

The daemon keeps the lessor in step with the state machine: ``grant`` when a
``LeaseGrantResult`` is applied, ``forget`` on a ``LeaseEndResult``, ``sync`` after restoring
a snapshot. Followers keep a lessor too (so it is ready when they are promoted) but only the
leader asks it for expired leases.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..state.leases import LeaseInfo


class Lessor:
    def __init__(self, clock_ms: Callable[[], int], retry_ms: int = 1000) -> None:
        self._clock_ms = clock_ms
        # How long after proposing an expiry the lease is reported again, in case the
        # proposal was dropped (leader change, full queue).
        self.retry_ms = retry_ms
        # Invariant: the keys of _ttl_ms and _deadline_ms are the same lease ids.
        self._ttl_ms: dict[int, int] = {}
        self._deadline_ms: dict[int, int] = {}
        # Leases reported by expired() and when, so each is proposed once per retry_ms.
        self._reported_ms: dict[int, int] = {}
        self.is_leader = False

    def grant(self, lease_id: int, ttl_ms: int) -> None:
        self._ttl_ms[lease_id] = ttl_ms
        self._deadline_ms[lease_id] = self._clock_ms() + ttl_ms

    def forget(self, lease_id: int) -> None:
        self._ttl_ms.pop(lease_id, None)
        self._deadline_ms.pop(lease_id, None)
        self._reported_ms.pop(lease_id, None)

    def sync(self, leases: Iterable[LeaseInfo]) -> None:
        """Match the state machine's leases (after a restore): new ones get a full TTL."""
        live = {lease.lease_id: lease.ttl_ms for lease in leases}
        for lease_id in sorted(set(self._ttl_ms) - set(live)):
            self.forget(lease_id)
        for lease_id in sorted(live):
            if lease_id not in self._ttl_ms:
                self.grant(lease_id, live[lease_id])

    def keep_alive(self, lease_id: int) -> int | None:
        """Extend the lease to a full TTL from now; its TTL, or None if it is unknown."""
        ttl_ms = self._ttl_ms.get(lease_id)
        if ttl_ms is None:
            return None
        self._deadline_ms[lease_id] = self._clock_ms() + ttl_ms
        self._reported_ms.pop(lease_id, None)
        return ttl_ms

    def remaining_ms(self, lease_id: int) -> int | None:
        deadline_ms = self._deadline_ms.get(lease_id)
        if deadline_ms is None:
            return None
        return max(0, deadline_ms - self._clock_ms())

    def promote(self) -> None:
        """Became leader: every lease gets a full TTL from now."""
        now_ms = self._clock_ms()
        for lease_id, ttl_ms in self._ttl_ms.items():
            self._deadline_ms[lease_id] = now_ms + ttl_ms
        self._reported_ms.clear()
        self.is_leader = True

    def demote(self) -> None:
        self.is_leader = False
        self._reported_ms.clear()

    def expired(self) -> list[int]:
        """Leases whose deadline passed, in id order, to propose LeaseExpire for. Empty
        unless leader. A lease is reported again only after retry_ms."""
        if not self.is_leader:
            return []
        now_ms = self._clock_ms()
        due = []
        for lease_id in sorted(self._deadline_ms):
            if self._deadline_ms[lease_id] > now_ms:
                continue
            reported_ms = self._reported_ms.get(lease_id)
            if reported_ms is None or now_ms - reported_ms >= self.retry_ms:
                self._reported_ms[lease_id] = now_ms
                due.append(lease_id)
        return due
