"""How to run one member: its configuration and the peer port's credentials.

Theory of operation. ``NodeConfig`` is everything a member needs to start, fixed for its
life; ``validate`` refuses a configuration that could not run (or could run unsafely: no
peer secret) before anything is opened. Durations are counted in ticks of ``tick_ms``, the
unit of the Raft core's logical clock. The cluster id is derived from the peer secret and
the cluster name (``peer_auth.cluster_id_for``), so members of two clusters that share
addresses still refuse each other.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Protocol

from ..member_table import MemberAddress
from ..peer_auth import cluster_id_for
from ..state.machine import Limits

__all__ = ["PEER_TRANSPORTS", "NodeConfig", "PeerTls"]

# The peer transports this build speaks: the stream peer protocol only. The setting stays so
# that a configuration written for commit f771d74 (which also spoke grpc) still runs.
PEER_TRANSPORTS = ("stream",)


class PeerTls(Protocol):
    """Credentials for mutual TLS on the peer port (see ``daemon.TlsFiles``)."""

    def server_ssl_context(self) -> ssl.SSLContext: ...

    def client_ssl_context(self) -> ssl.SSLContext: ...


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """How to run one member. Durations in ticks are multiples of ``tick_ms``."""

    member_id: int
    data_dir: str
    peer_address: str  # host:port this member's peers reach it at (and it listens on)
    client_address: str  # host:port clients reach it at
    # The cluster's members when it was created (bootstrap) or, for a member joining an
    # existing cluster, the member table to reach the others until a snapshot arrives.
    initial_members: dict[int, MemberAddress] = field(default_factory=dict)
    join_existing: bool = False
    # The secret every member holds (peer_auth.py); at least 16 bytes. Required: the peer
    # port authenticates every request with it.
    peer_secret: bytes = b""
    # The cluster's name: with the secret it makes the cluster id (peer_auth.cluster_id_for).
    cluster_name: str = "rallypoint"
    tick_ms: int = 100
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    # etcd's default (--snapshot-count): a snapshot encodes the whole state, so its cost
    # per entry falls with the interval; a restart replays up to that many entries (a
    # follower restarted over 100,000 small ones had applied them all within 3.8 s here).
    snapshot_entries: int = 100_000
    # ... or sooner, once the entries applied since the last snapshot hold this many bytes.
    snapshot_log_bytes: int = 64 * 1024 * 1024
    # Entries kept behind a snapshot so a briefly lagging follower catches up from the log.
    snapshot_catchup_entries: int = 5_000
    # The largest snapshot this member accepts from a peer.
    max_snapshot_bytes: int = 8 * 1024**3
    limits: Limits = field(default_factory=Limits)
    wal_segment_size_bytes: int = 64 * 1024 * 1024
    pre_vote: bool = True
    check_quorum: bool = True
    # A leader answers linearizable reads under a lease, without a heartbeat round, while a
    # quorum confirmed it recently (node/reads.py). Needs check_quorum; every member of a
    # cluster must run with the same setting.
    lease_reads: bool = True
    # After becoming leader, no worker is declared failed for this long: heartbeats need a
    # moment to find the new leader.
    detector_grace_ms: int = 2000
    # How the peer port speaks: "stream", the stream peer protocol (coordinator/peerwire/,
    # docs/peer-protocol.md), the only one this build has.
    peer_transport: str = "stream"

    @property
    def cluster_id(self) -> int:
        return cluster_id_for(self.peer_secret, self.cluster_name)

    def snapshot_interval(self) -> int:
        """Entries between this member's snapshots: the configured count, stretched by up to
        30% depending on the member id, so members do not all pause to snapshot at once."""
        entries = self.snapshot_entries
        return entries + entries * ((self.member_id - 1) % 4) // 10

    def validate(self) -> None:
        if self.peer_transport == "grpc":
            raise ValueError(
                "peer transport 'grpc' is gone: members speak the stream peer protocol (set "
                "peer_transport = stream, or leave it out); a cluster on grpc moves as "
                "docs/operations.md, 'Upgrading', says"
            )
        if self.peer_transport not in PEER_TRANSPORTS:
            raise ValueError(
                f"peer transport {self.peer_transport!r} is not one of {', '.join(PEER_TRANSPORTS)}"
            )
        if len(self.peer_secret) < 16:
            raise ValueError(
                "a peer secret of at least 16 bytes is required (make one with "
                "`rallypoint secret > FILE` and give every member --peer-secret-file=FILE)"
            )
        if self.member_id <= 0:
            raise ValueError(f"member id must be a positive integer, got {self.member_id}")
        if self.tick_ms <= 0 or self.heartbeat_ticks <= 0:
            raise ValueError("tick_ms and heartbeat_ticks must be positive")
        if self.election_ticks <= self.heartbeat_ticks:
            raise ValueError("election_ticks must be greater than heartbeat_ticks")
        if self.snapshot_entries <= 0 or self.snapshot_log_bytes <= 0:
            raise ValueError("snapshot_entries and snapshot_log_bytes must be positive")
        if self.lease_reads and not self.check_quorum:
            raise ValueError("lease_reads needs check_quorum")
        if (
            not self.join_existing
            and self.initial_members
            and self.member_id not in self.initial_members
        ):
            raise ValueError(
                f"member {self.member_id} is not in the initial cluster "
                f"{sorted(self.initial_members)}"
            )
