"""Leases as replicated state: which exist, their TTL, and which keys they hold.

Deadlines are not replicated state: the leader's soft-state lessor (:mod:`.lessor`) tracks
them and proposes ``LeaseExpire``; here a lease simply exists until revoked or expired. A
lease's id is the raft index of its grant and is also its fencing token, so tokens strictly
increase across the cluster's history.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Lease:
    # Invariant: lease_id is the raft index of the grant, > every earlier lease's id.
    lease_id: int
    ttl_ms: int
    # Keys attached to the lease. Invariant: exactly the stored keys whose lease_id is this
    # lease. Iterated only through sorted() (bytes hash with the process's seed).
    keys: set[bytes] = field(default_factory=set)

    @property
    def fencing_token(self) -> int:
        return self.lease_id


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """A read-only view of a lease for queries."""

    lease_id: int
    fencing_token: int
    ttl_ms: int
    keys: tuple[bytes, ...]


class LeaseTable:
    def __init__(self) -> None:
        self.leases: dict[int, Lease] = {}

    def grant(self, lease_id: int, ttl_ms: int) -> Lease:
        if lease_id in self.leases:
            raise AssertionError(f"lease id {lease_id} granted twice")
        lease = Lease(lease_id, ttl_ms)
        self.leases[lease_id] = lease
        return lease

    def get(self, lease_id: int) -> Lease | None:
        return self.leases.get(lease_id)

    def remove(self, lease_id: int) -> Lease:
        return self.leases.pop(lease_id)

    def attach(self, lease_id: int, key: bytes) -> None:
        if lease_id:
            self.leases[lease_id].keys.add(key)

    def detach(self, lease_id: int, key: bytes) -> None:
        if lease_id:
            self.leases[lease_id].keys.remove(key)

    def info(self, lease: Lease, with_keys: bool = True) -> LeaseInfo:
        keys = tuple(sorted(lease.keys)) if with_keys else ()
        return LeaseInfo(lease.lease_id, lease.fencing_token, lease.ttl_ms, keys)

    def in_order(self) -> list[Lease]:
        return [self.leases[lease_id] for lease_id in sorted(self.leases)]
