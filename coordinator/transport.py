"""What a member needs of its peer transport, and the bounds every transport keeps.

Theory of operation. Members talk to each other over the stream peer protocol
(``peerwire/``, docs/peer-protocol.md); this module holds the interface the member uses
(:class:`PeerTransport`, :class:`PeerServer`), what the transport needs of its member
(:class:`PeerEnd`, :class:`PeerHost`), and the bounds and backoffs of the sending side.
Raft tolerates loss but must hear of it: whenever messages may have been lost the transport
reports the peer unreachable (``PeerHost.report_unreachable``), and every snapshot transfer
reports its outcome (``report_snapshot``).
"""

from __future__ import annotations

from typing import Protocol

from rallypoint.client.backoff import Backoff
from rallypoint.proto.peer.v1 import peer_pb2
from rallypoint.raft.types import Message

from .peer_auth import PeerKey

SNAPSHOT_CHUNK_BYTES = 1024 * 1024
# Connections one snapshot transfer may open (resuming where the last stopped) before it
# gives up, and the wait before each after an unreachable peer.
SNAPSHOT_ATTEMPTS = 8
SNAPSHOT_BACKOFF = Backoff(base_s=0.1, cap_s=1.0)
OUTBOX_LIMIT = 4096
# The longest wait between attempts to reach a peer that is down: a restarted member is
# reached within about this.
RECONNECT_CAP_S = 0.5
RECONNECT_BACKOFF = Backoff(base_s=0.05, cap_s=RECONNECT_CAP_S)


class PeerEnd(Protocol):
    """A member as either end of the peer port sees it."""

    @property
    def member_id(self) -> int: ...

    @property
    def cluster_id(self) -> int: ...

    @property
    def peer_key(self) -> PeerKey: ...

    @property
    def incarnation(self) -> int: ...


class PeerHost(PeerEnd, Protocol):
    """What the sending side needs from its member."""

    @property
    def abstaining(self) -> bool: ...

    def peer_address(self, member_id: int) -> str | None: ...

    def peer_addresses(self) -> dict[int, str]:
        """Every member whose peer address this member knows (the member table's, and
        those learned from other members): id -> address."""
        ...

    def learn_peer_address(self, member_id: int, address: str) -> None:
        """Another member says ``member_id`` is at ``address`` (peer_lookup.py): dial it
        there until the member table has its own entry for it."""
        ...

    def report_unreachable(self, member_id: int) -> None: ...

    def report_snapshot(self, member_id: int, ok: bool) -> None: ...


class PeerTransport(Protocol):
    """What the member needs of its peer transport (``peerwire.transport.StreamTransport``)."""

    def send(self, messages: tuple[Message, ...] | list[Message]) -> None: ...

    def sent_all(self) -> bool: ...

    async def hello(
        self, address: str, request: peer_pb2.HelloRequest, timeout_s: float
    ) -> peer_pb2.HelloAnswer | None: ...

    async def liveness(self, member_id: int, payload: bytes, timeout_s: float = 2.0) -> bool: ...

    async def remove_peer(self, member_id: int) -> None: ...

    async def stop(self) -> None: ...


class PeerServer(Protocol):
    """A running peer port (``peerwire.server.PeerListener``)."""

    async def stop(self, grace: float | None) -> None: ...
