"""What a memory snapshot is called and where its blobs live: the placement rules of
replication (:func:`protectors`) and erasure coding (:func:`erasure_protectors`, the rule in
worker/snapshots/erasure.py), the placement's encoding in the coordinator's registry, and the
one error every snapshot failure raises. Pure: no IO, no process group."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import WorkerError
from .erasure import MAX_SHARES, erasure_groups, parity_holders


class SnapshotError(WorkerError):
    """A snapshot could not be taken, protected or restored (the message says why)."""


@dataclass(frozen=True, slots=True, order=True)
class SnapshotId:
    """A snapshot of the world of round ``round`` at ``step``."""

    round: int
    step: int

    def __str__(self) -> str:
        return f"round {self.round} step {self.step}"


class RegisteredInfo(Protocol):
    """The registry's record of a memory snapshot, as the client returns it."""

    @property
    def round(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def placement(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class RegisteredSnapshot:
    """A memory snapshot the coordinator registered as complete: the one to restore.
    ``world``: the name of the world that took it (``SnapshotPlacement.world``; "" when its
    registration does not say), which its files in host memory carry (hostfiles.py)."""

    round: int
    step: int
    world_size: int
    world: str = ""

    @property
    def snapshot(self) -> SnapshotId:
        return SnapshotId(self.round, self.step)

    @classmethod
    def of(cls, info: RegisteredInfo) -> RegisteredSnapshot:
        """From the registry's record (its placement names the world, when it does)."""
        try:
            world = SnapshotPlacement.from_bytes(info.placement).world
        except (ValueError, KeyError, TypeError, AttributeError):
            world = ""  # not a placement this version reads: its files are never taken up
        return cls(int(info.round), int(info.step), int(info.world_size), world)


# The placement's encoding in the coordinator's registry. Version 1 (replication only) had
# no "version" key; it is still read.
PLACEMENT_VERSION = 2


@dataclass(frozen=True, slots=True)
class SnapshotPlacement:
    """Where a snapshot's blobs live: ``holders[r]`` are the ranks of its world that hold
    rank r's blob (r itself first), ``hosts[r]`` the host rank r declared.

    Erasure-coded (``erasure`` is (k, m); None under replication): every rank holds its own
    blob only (``holders[r] == (r,)``); ``groups[g]`` are the data ranks of group g (in share
    order; at most k of them, the last group perhaps fewer, coding with its own size as k);
    ``parity_holders[g][j]`` holds parity share j of group g (share number
    ``len(groups[g]) + j``). ``lengths[r]`` is rank r's blob length, known once the snapshot
    is taken (empty before): what a rebuilt blob is trimmed to. ``world`` names the world
    that took the snapshot (hostfiles.world_of its token; "" for placements written before
    it was kept: the "world" key, which readers of version 2 without it ignore)."""

    hosts: tuple[str, ...]
    holders: tuple[tuple[int, ...], ...]
    erasure: tuple[int, int] | None = None
    groups: tuple[tuple[int, ...], ...] = ()
    parity_holders: tuple[tuple[int, ...], ...] = ()
    lengths: tuple[int, ...] = ()
    world: str = ""

    @property
    def world_size(self) -> int:
        return len(self.hosts)

    @property
    def parity_shares(self) -> int:
        return self.erasure[1] if self.erasure is not None else 0

    @property
    def cross_host(self) -> bool:
        """Whether the loss of any one host loses no blob: every blob has a replica on a
        host other than its rank's, or every group keeps at most m of its shares on one
        host."""
        if self.erasure is not None:
            return all(
                max(Counter(self.hosts[r] for r in (*group, *parity)).values())
                <= self.parity_shares
                for group, parity in zip(self.groups, self.parity_holders, strict=True)
            )
        return all(
            any(self.hosts[h] != self.hosts[rank] for h in holders[1:])
            for rank, holders in enumerate(self.holders)
        )

    def parity_held_by(self, rank: int) -> dict[int, list[int]]:
        """The parity shares ``rank`` holds: group -> parity indices."""
        held: dict[int, list[int]] = {}
        for group, holders in enumerate(self.parity_holders):
            for parity, holder in enumerate(holders):
                if holder == rank:
                    held.setdefault(group, []).append(parity)
        return held

    def to_bytes(self) -> bytes:
        """As the coordinator's registry keeps it."""
        obj: dict[str, Any] = {
            "version": PLACEMENT_VERSION,
            "hosts": list(self.hosts),
            "holders": [list(h) for h in self.holders],
        }
        if self.world:
            obj["world"] = self.world
        if self.erasure is not None:
            obj["erasure"] = list(self.erasure)
            obj["groups"] = [list(g) for g in self.groups]
            obj["parity_holders"] = [list(p) for p in self.parity_holders]
            obj["lengths"] = list(self.lengths)
        return json.dumps(obj, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> SnapshotPlacement:
        obj = json.loads(data)
        version = obj.get("version", 1)
        if version not in (1, PLACEMENT_VERSION):
            raise ValueError(
                f"a snapshot placement of version {version}: this rallypoint reads versions "
                f"1 to {PLACEMENT_VERSION}"
            )
        hosts, holders = tuple(obj["hosts"]), tuple(tuple(h) for h in obj["holders"])
        world = str(obj.get("world", ""))
        if "erasure" not in obj:
            return cls(hosts, holders, world=world)
        k, m = obj["erasure"]
        return cls(
            hosts,
            holders,
            erasure=(int(k), int(m)),
            groups=tuple(tuple(g) for g in obj["groups"]),
            parity_holders=tuple(tuple(p) for p in obj["parity_holders"]),
            lengths=tuple(obj["lengths"]),
            world=world,
        )


def protectors(hosts: Sequence[str], copies: int) -> SnapshotPlacement:
    """The placement of a world whose rank r runs on ``hosts[r]``, each blob kept ``copies``
    times (its own rank's included).

    With at least ``copies`` hosts, the k-th rank of host h is protected by the k-th rank
    (modulo their counts) of hosts h+1, ..., h+copies-1 (hosts in order of their lowest
    rank): every copy on another host, and each rank holds about ``copies - 1`` replicas.
    With fewer hosts the replicas go to the next ranks in rank order (a lost process is
    survived, a lost host is not: ``SnapshotSnapshotPlacement.cross_host`` says so)."""
    world = len(hosts)
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    order: list[str] = []
    members: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        if host not in members:
            order.append(host)
            members[host] = []
        members[host].append(rank)
    holders: list[tuple[int, ...]] = []
    for rank, host in enumerate(hosts):
        chosen = [rank]
        if len(order) >= copies:
            h = order.index(host)
            k = members[host].index(rank)
            for j in range(1, copies):
                other = members[order[(h + j) % len(order)]]
                chosen.append(other[k % len(other)])
        else:
            for j in range(1, min(copies, world)):
                chosen.append((rank + j) % world)
        holders.append(tuple(chosen))
    return SnapshotPlacement(tuple(hosts), tuple(holders))


def erasure_protectors(
    hosts: Sequence[str], data_shares: int, parity_shares: int
) -> SnapshotPlacement:
    """The erasure-coded placement of a world whose rank r runs on ``hosts[r]``: groups of
    ``data_shares`` ranks, each with ``parity_shares`` parity shares (the rule:
    worker/snapshots/erasure.py)."""
    validate_erasure((data_shares, parity_shares))
    groups = erasure_groups(hosts, data_shares)
    return SnapshotPlacement(
        tuple(hosts),
        tuple((rank,) for rank in range(len(hosts))),
        erasure=(data_shares, parity_shares),
        groups=groups,
        parity_holders=parity_holders(hosts, groups, parity_shares),
    )


def validate_erasure(erasure: tuple[int, int]) -> None:
    k, m = erasure
    if k < 1 or m < 1:
        raise ValueError(f"erasure needs k >= 1 data and m >= 1 parity shares, got {k}+{m}")
    if k + m > MAX_SHARES:
        raise ValueError(f"erasure {k}+{m}: zfec codes at most {MAX_SHARES} shares per group")
