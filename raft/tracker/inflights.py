"""Flow control for optimistic replication: the MsgApps sent to a follower and not yet acked.

Theory of operation (etcd-io/raft ``tracker/inflights.go``): while a follower is in
``REPLICATE`` state the leader pipelines MsgApps without waiting for each answer. Every sent
message records the index of its last entry and its payload size; an acknowledgement up to
index ``i`` frees every record ``<= i``. Once the count or the byte total reaches its limit
the leader stops sending entries to that follower until acks free room, which bounds the
data in flight (the bandwidth-delay product) per follower.
"""

from __future__ import annotations

from collections import deque

from ..types import Index


class Inflights:
    """The in-flight MsgApps to one follower, oldest first.

    Invariants: recorded indexes strictly increase from oldest to newest; ``count() <= size``;
    ``bytes`` is the sum of the recorded sizes.
    """

    __slots__ = ("_queue", "bytes", "max_bytes", "size")

    def __init__(self, size: int, max_bytes: int = 0) -> None:
        if size <= 0:
            raise ValueError(f"inflights size must be positive, got {size}")
        # Maximum number of in-flight messages.
        self.size = size
        # Maximum total payload bytes in flight; 0 means no byte limit.
        self.max_bytes = max_bytes
        # Total payload bytes of the recorded messages.
        self.bytes = 0
        # (last index, payload bytes) of each in-flight message, oldest first.
        self._queue: deque[tuple[Index, int]] = deque()

    def clone(self) -> Inflights:
        copy = Inflights(self.size, self.max_bytes)
        copy.bytes = self.bytes
        copy._queue = deque(self._queue)
        return copy

    def add(self, index: Index, size_bytes: int) -> None:
        """Record a MsgApp whose last entry is ``index``; the caller checked ``full()``."""
        if self.full():
            raise RuntimeError("cannot add into a full inflights")
        if self._queue and index <= self._queue[-1][0]:
            raise RuntimeError(
                f"inflight index {index} does not increase (last {self._queue[-1][0]})"
            )
        self._queue.append((index, size_bytes))
        self.bytes += size_bytes

    def free_le(self, to: Index) -> None:
        """Forget every message whose last index is ``<= to`` (acknowledged)."""
        queue = self._queue
        while queue and queue[0][0] <= to:
            self.bytes -= queue.popleft()[1]

    def full(self) -> bool:
        return len(self._queue) >= self.size or (
            self.max_bytes > 0 and self.bytes >= self.max_bytes
        )

    def count(self) -> int:
        return len(self._queue)

    def reset(self) -> None:
        self._queue.clear()
        self.bytes = 0

    def indexes(self) -> list[Index]:
        """The recorded last indexes, oldest first (for tests and status)."""
        return [index for index, _ in self._queue]
