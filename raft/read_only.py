"""Linearizable read-only queries without writing to the log (thesis 6.4, ReadIndex).

Theory of operation (etcd-io/raft ``read_only.go``): to serve a read, the leader records its
commit index as the read index, then confirms it is still the leader:

- ``SAFE``: by a round of heartbeats carrying the request's context; once a quorum has
  acknowledged that context, every read queued up to it is released with its read index.
- ``LEASE_BASED``: by its lease (check-quorum guarantees it stepped down otherwise within an
  election timeout), answering at once; safe only if clocks drift boundedly.

The application serves the read once it has applied up to the read index. A newly elected
leader first commits an entry of its own term (its no-op), since only then does its commit
index reflect every entry committed by earlier leaders (thesis 6.4 step 1).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .types import Index, Message, NodeId


class ReadOnlyOption(enum.Enum):
    SAFE = 0
    """Confirm leadership with a heartbeat round per batch of reads (the default)."""
    LEASE_BASED = 1
    """Rely on the leader lease; requires check_quorum."""


@dataclass(slots=True)
class ReadIndexStatus:
    """A pending read: the request, its read index and who acknowledged its context."""

    req: Message
    index: Index
    acks: dict[NodeId, bool] = field(default_factory=dict)


class ReadOnly:
    """Pending ReadIndex requests of a leader, keyed and ordered by request context.

    Invariant: ``read_index_queue`` holds exactly the keys of ``pending_read_index``, in
    the order the requests arrived.
    """

    def __init__(self, option: ReadOnlyOption) -> None:
        self.option = option
        self.pending_read_index: dict[bytes, ReadIndexStatus] = {}
        self.read_index_queue: list[bytes] = []

    def add_request(self, index: Index, m: Message) -> None:
        """Queue read request ``m`` (context in ``m.entries[0].data``) at read index ``index``."""
        ctx = m.entries[0].data
        if ctx in self.pending_read_index:
            return
        self.pending_read_index[ctx] = ReadIndexStatus(req=m, index=index)
        self.read_index_queue.append(ctx)

    def recv_ack(self, node_id: NodeId, ctx: bytes) -> dict[NodeId, bool]:
        """Record ``node_id``'s heartbeat ack of ``ctx``; returns the acks so far."""
        status = self.pending_read_index.get(ctx)
        if status is None:
            return {}
        status.acks[node_id] = True
        return status.acks

    def advance(self, ctx: bytes) -> list[ReadIndexStatus]:
        """Release every request queued up to and including ``ctx`` (quorum confirmed it)."""
        if ctx not in self.pending_read_index:
            return []
        released: list[ReadIndexStatus] = []
        for position, queued in enumerate(self.read_index_queue):
            status = self.pending_read_index.get(queued)
            if status is None:
                raise AssertionError("cannot find corresponding read state from pending map")
            released.append(status)
            if queued == ctx:
                del self.read_index_queue[: position + 1]
                break
        for status in released:
            del self.pending_read_index[status.req.entries[0].data]
        return released

    def last_pending_request_ctx(self) -> bytes:
        """The newest pending context (heartbeats carry it), or b"" if none."""
        return self.read_index_queue[-1] if self.read_index_queue else b""
