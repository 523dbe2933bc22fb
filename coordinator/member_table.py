"""The member table: where each member is reached, replicated with the log and in snapshots.

Raft's configuration says which ids vote; it does not say where they live. The addresses of
each member travel in the ``context`` of the configuration change that added it and are kept
in a :class:`MemberTable`, which is replicated the same way as the state machine: rebuilt by
applying committed configuration changes and saved inside every snapshot. The table is
deterministic (sorted by id) so a snapshot's bytes do not depend on the process.

Member ids are never reused. The table remembers the highest id the cluster ever gave
(``highest_id``, kept after that member's removal and saved in snapshots), and a new member
gets the next one. A reused id would let a removed member's process, still running somewhere,
speak and vote as the new member (two processes, one id, two vote records).

A snapshot's data is :func:`encode_app_snapshot`: a format number, the member table, the
highest id given and the state machine's own snapshot bytes (format 1, from before ids were
remembered, has no highest id: the largest id in its table stands in).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from rallypoint.raft.types import ConfChange, ConfChangeType

APP_SNAPSHOT_FORMAT = 2


class MemberTableError(ValueError):
    """Malformed member addresses (in a snapshot or a configuration change)."""


@dataclass(frozen=True, slots=True)
class MemberAddress:
    peer_address: str
    client_address: str


@dataclass(frozen=True, slots=True)
class ConfChangeContext:
    """What a configuration change carries besides the ids: the new member's addresses and
    which request on which member proposed it (so that member can answer the caller)."""

    peer_address: str = ""
    client_address: str = ""
    proposer_id: int = 0
    proposal_id: int = 0

    def encode(self) -> bytes:
        out = msgpack.packb(
            [self.peer_address, self.client_address, self.proposer_id, self.proposal_id]
        )
        assert isinstance(out, bytes)
        return out

    @classmethod
    def decode(cls, data: bytes) -> ConfChangeContext:
        if not data:
            return cls()
        try:
            peer, client, proposer, proposal = msgpack.unpackb(data)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise MemberTableError(f"malformed configuration change context: {exc}") from exc
        if not (isinstance(peer, str) and isinstance(client, str)):
            raise MemberTableError("malformed configuration change context: addresses")
        if not all(type(value) is int for value in (proposer, proposal)):
            raise MemberTableError(
                f"malformed configuration change context: proposal {proposer!r}, {proposal!r}"[:300]
            )
        return cls(peer, client, proposer, proposal)


class MemberTable:
    """Member id -> addresses, and the highest id ever given. Invariant: ids are positive."""

    def __init__(
        self, members: dict[int, MemberAddress] | None = None, highest_id: int = 0
    ) -> None:
        self._members: dict[int, MemberAddress] = dict(members or {})
        self.highest_id = max([highest_id, *self._members])

    def note_id(self, member_id: int) -> None:
        """A configuration change named ``member_id``: it is never given out again."""
        self.highest_id = max(self.highest_id, member_id)

    def next_id(self) -> int:
        """The id for a new member: above every id the cluster has ever used."""
        return self.highest_id + 1

    def get(self, member_id: int) -> MemberAddress | None:
        return self._members.get(member_id)

    def set(self, member_id: int, address: MemberAddress) -> None:
        if member_id <= 0:
            raise MemberTableError(f"member id must be positive, got {member_id}")
        self._members[member_id] = address
        self.note_id(member_id)

    def remove(self, member_id: int) -> None:
        self._members.pop(member_id, None)

    def ids(self) -> list[int]:
        return sorted(self._members)

    def items(self) -> list[tuple[int, MemberAddress]]:
        return [(i, self._members[i]) for i in sorted(self._members)]

    def to_obj(self) -> list[Any]:
        return [[i, a.peer_address, a.client_address] for i, a in self.items()]

    @classmethod
    def from_obj(cls, obj: Any, highest_id: int = 0) -> MemberTable:
        if not isinstance(obj, list):
            raise MemberTableError("member table is not an array")
        table = cls(highest_id=highest_id)
        for item in obj:
            if not (isinstance(item, list) and len(item) == 3):
                raise MemberTableError(f"malformed member entry {item!r}")
            member_id, peer, client = item
            if not (isinstance(member_id, int) and isinstance(peer, str)):
                raise MemberTableError(f"malformed member entry {item!r}")
            table.set(member_id, MemberAddress(peer, str(client)))
        return table


def apply_conf_change(table: MemberTable, cc: ConfChange) -> tuple[ConfChangeContext, list[int]]:
    """A committed configuration change, applied to ``table``: the ids it names are never
    given again, removed members leave, an added member's addresses (its context) are set.
    The change's context and the ids it removed. The one rule for every path that applies a
    change: a running member (``node/membership.py``) and a log replayed offline
    (``node/recovery.py``)."""
    context = ConfChangeContext.decode(cc.context)
    removed = []
    for change in cc.changes:
        table.note_id(change.node_id)
        if change.type is ConfChangeType.REMOVE_NODE:
            table.remove(change.node_id)
            removed.append(int(change.node_id))
        elif context.peer_address:
            table.set(change.node_id, MemberAddress(context.peer_address, context.client_address))
    return context, removed


def _bin_header(size: int) -> bytes:
    """msgpack's header of a byte string of ``size`` bytes (bin 8, 16 or 32)."""
    if size < 1 << 8:
        return struct.pack(">BB", 0xC4, size)
    if size < 1 << 16:
        return struct.pack(">BH", 0xC5, size)
    return struct.pack(">BI", 0xC6, size)


def encode_app_snapshot(members: MemberTable, state_machine_snapshot: bytes) -> bytes:
    """msgpack of [format, member table, highest id, state bytes], assembled around the
    state's bytes (megabytes) rather than packed with them: one copy, by ``join``."""
    packer = msgpack.Packer(use_bin_type=True)
    return b"".join(
        [
            packer.pack_array_header(4),
            packer.pack(APP_SNAPSHOT_FORMAT),
            packer.pack(members.to_obj()),
            packer.pack(members.highest_id),
            _bin_header(len(state_machine_snapshot)),
            state_machine_snapshot,
        ]
    )


def decode_app_snapshot(data: bytes) -> tuple[MemberTable, bytes]:
    try:
        obj = msgpack.unpackb(data, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise MemberTableError(f"malformed snapshot data: {exc}") from exc
    if isinstance(obj, list) and len(obj) == 3 and obj[0] == 1:
        table_obj, highest_id, state = obj[1], 0, obj[2]
    elif isinstance(obj, list) and len(obj) == 4 and obj[0] == APP_SNAPSHOT_FORMAT:
        table_obj, highest_id, state = obj[1], obj[2], obj[3]
        if not (isinstance(highest_id, int) and highest_id >= 0):
            raise MemberTableError(f"malformed snapshot data: highest id {highest_id!r}")
    else:
        raise MemberTableError("malformed snapshot data: unknown format")
    if not isinstance(state, bytes):
        raise MemberTableError("malformed snapshot data: state is not bytes")
    return MemberTable.from_obj(table_obj, highest_id), state
