"""The member's plumbing, kept out of the driver (node/driver.py): opening its storage and
configuring its Raft core, which of a Ready's committed entries are already durable, what of
a Ready goes to the disk thread, its
status, a backup of its state, and its part in the cluster version (what each member
advertises, and stopping when the cluster has moved past this build). Each is a function of
what the driver passes in."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import random
import sys
from collections.abc import Awaitable, Callable

from rallypoint.raft import Config, RawNode, Ready
from rallypoint.raft.log_storage import CompactedError, Storage, UnavailableError
from rallypoint.raft.storage.disk_storage import DiskStorage, PersistRequest, SnapshotPolicy
from rallypoint.raft.types import Index, NodeId

from .. import identity as identity_file
from ..backup_file import BackupHeader
from ..identity import Identity
from ..peer_gate import remove_partial_snapshots
from ..peer_hello import ask as ask_hello
from ..role_log import ROLE_NAMES
from ..state.commands import ClusterVersion, Command
from ..state.versions import required_version
from ..transport import PeerTransport
from ..version import RECORD_VERSION, ClusterVersionError, startup_refusal
from .api import Member, NodeStatus, PeerProgress
from .config import NodeConfig
from .membership import Membership
from .peer_face import PeerFace
from .snapshots import Capture, Snapshots

log = logging.getLogger("rallypoint.node")


async def open_storage(
    config: NodeConfig, disk: concurrent.futures.Executor, cluster_id: int
) -> tuple[Identity | None, DiskStorage]:
    """The identity recorded in the data directory (checked against the flags: another
    member's or another cluster's directory is refused) and the opened Raft storage."""
    loop = asyncio.get_running_loop()
    found = await loop.run_in_executor(disk, identity_file.load, config.data_dir)
    if found is not None:
        identity_file.check(found, cluster_id, config.member_id, config.data_dir)
    storage = await loop.run_in_executor(
        disk,
        lambda: DiskStorage.open(
            os.path.join(config.data_dir, "raft"),
            segment_size_bytes=config.wal_segment_size_bytes,
            policy=SnapshotPolicy(entries_per_snapshot=config.snapshot_interval()),
        ),
    )
    return found, storage


async def remove_unfinished_transfers(
    member_id: int, incoming: str, disk: concurrent.futures.Executor
) -> None:
    loop = asyncio.get_running_loop()
    removed = await loop.run_in_executor(disk, remove_partial_snapshots, incoming)
    if removed:
        log.info("member %d removed %d unfinished snapshot transfers", member_id, removed)


def raft_config(
    config: NodeConfig, storage: Storage, rng: random.Random, applied: int, abstain: bool
) -> Config:
    return Config(
        id=NodeId(config.member_id),
        storage=storage,
        rng=rng,
        election_tick=config.election_ticks,
        heartbeat_tick=config.heartbeat_ticks,
        applied=Index(applied),
        check_quorum=config.check_quorum,
        pre_vote=config.pre_vote,
        leader_lease=config.lease_reads,
        max_inflight_msgs=256,
        max_uncommitted_entries_size=1 << 30,
        # Committed entries handed out per Ready, so applied per event-loop turn: a member
        # replaying or catching up on thousands of small entries still ticks and answers
        # between chunks (one 1 MiB Ready of small entries took seconds).
        max_committed_size_per_ready=64 * 1024,
        abstain=abstain,
        logger=logging.getLogger(f"rallypoint.raft.{config.member_id}"),
    )


def durable_prefix(storage: DiskStorage | None, rd: Ready) -> int:
    """How many of ``rd``'s committed entries are durable in this member's log before ``rd``
    is written: those at or below the persisted last index that ``rd``'s own entries do not
    overwrite. None with a snapshot (it replaces the state first)."""
    assert storage is not None
    if not rd.snapshot.is_empty() or not rd.committed_entries:
        return 0
    durable = int(storage.last_index())
    if rd.entries:
        durable = min(durable, int(rd.entries[0].index) - 1)
    count = 0
    for entry in rd.committed_entries:
        if entry.index > durable:
            break
        count += 1
    return count


def check_encodable(command: Command, cluster_version: int) -> None:
    """Raise ClusterVersionError if ``command`` needs a record version above the cluster
    version: nothing above it is encoded (version.py). ClusterVersion itself is gated where it
    is decided: the leader proposes it only once every member advertises the version it
    raises to (leader/versions.py)."""
    if cluster_version < RECORD_VERSION and not isinstance(command, ClusterVersion):
        needed, feature = required_version(command)
        if needed > cluster_version:
            raise ClusterVersionError(feature, needed, cluster_version)


def applied_first(storage: DiskStorage | None, rd: Ready, leading: bool, waited_on: bool) -> int:
    """How many of ``rd``'s committed entries apply before ``rd`` is written: its
    ``durable_prefix``, so that callers waiting on this member's apply (a leader's clients; a
    follower's forwarded writes and reads, ``waited_on``) are answered without waiting for
    the write. None on a follower that writes entries and that nobody waits on: it writes
    and acknowledges the new entries first, then applies, so the leader's next commit does
    not wait behind this member's apply (the entries are committed and durable either way;
    only the order of apply and ack changes)."""
    if not leading and rd.entries and not waited_on:
        return 0
    return durable_prefix(storage, rd)


def disk_request(storage: DiskStorage, rd: Ready, abstaining: bool) -> PersistRequest | None:
    """What of ``rd`` the disk thread must write, or None when nothing: no entries, no
    snapshot, and a hard state that is empty or moves only the commit index (``must_sync``
    false). Such a commit index is held in memory (``DiskStorage.hold_commit``) and reaches
    the WAL with the next write: a request with entries carries the newest hard state. So a
    commit notice costs no hand-off to the disk thread on the leader nor on a follower. A
    member that lost its data (``abstaining``) writes each commit index: it stops abstaining
    on the commit index it has made durable (``bootstrap.stop_abstaining``)."""
    hard_state = rd.hard_state
    if not rd.entries and rd.snapshot.is_empty():
        if hard_state.is_empty():
            return None
        if not rd.must_sync and not abstaining:
            storage.hold_commit(hard_state)
            return None
    if hard_state.is_empty():
        hard_state = storage.hard_state  # a held commit index, if any (WAL.save skips a repeat)
    return PersistRequest(hard_state, rd.entries, rd.snapshot, rd.must_sync)


def node_status(
    member_id: int,
    cluster_id: int,
    raw: RawNode,
    storage: DiskStorage,
    members: tuple[Member, ...],
    cluster_version: int,
) -> NodeStatus:
    raw_status = raw.status()
    progress = tuple(
        PeerProgress(
            member_id=int(peer_id),
            match_index=int(pr.match),
            next_index=int(pr.next),
            state=pr.state.name.lower(),
            recent_active=bool(pr.recent_active),
        )
        for peer_id, pr in sorted(raw_status.progress.items())
    )
    return NodeStatus(
        member_id=member_id,
        cluster_id=cluster_id,
        term=int(raw_status.hard_state.term),
        leader_id=int(raw_status.soft_state.lead),
        role=ROLE_NAMES[raw_status.soft_state.raft_state],
        commit_index=int(raw_status.hard_state.commit),
        applied_index=int(raw_status.applied),
        snapshot_index=int(storage.snapshot().metadata.index),
        members=members,
        progress=progress,
        abstaining=raw.abstaining,
        cluster_version=cluster_version,
    )


async def take_backup(
    member_id: int,
    cluster_id: int,
    snapshots: Snapshots,
    storage: DiskStorage,
    captured: Capture,
    current_term: int,
    created_ms: int,
) -> tuple[BackupHeader, bytes]:
    """The state ``captured`` on the loop between applies, for a backup file: encoded and
    hashed on the encoder thread (snapshots.py). The caller made the read linearizable
    first."""
    try:
        term = int(storage.term(captured.index))
    except (CompactedError, UnavailableError):
        # Compacted since the capture: the term is only the file's description.
        term = current_term
    payload, digest = await snapshots.encode_for_backup(captured)
    conf = captured.conf_state
    header = BackupHeader(
        index=int(captured.index),
        term=term,
        cluster_id=cluster_id,
        member_id=member_id,
        voters=tuple(int(i) for i in conf.voters),
        learners=tuple(int(i) for i in conf.learners),
        size_bytes=len(payload),
        sha256=digest,
        created_ms=created_ms,
    )
    return header, payload


def version_members(membership: Membership) -> dict[int, str]:
    """Every voter and learner of the configuration (the cluster version is their minimum),
    with its peer address ("" while the member table has none: unheard)."""
    conf = membership.conf_state
    ids = {*conf.voters, *conf.voters_outgoing, *conf.learners, *conf.learners_next}
    table = membership.table
    found = {int(m): table.get(int(m)) for m in ids}
    return {m: address.peer_address if address else "" for m, address in found.items()}


def version_asker(
    own_id: int, cluster_id: int, peers: PeerFace, transport: PeerTransport
) -> Callable[[int, str], Awaitable[int | None]]:
    """How the leader asks a member the record version it advertises in its hello (None: no
    answer), given the member's id and peer address."""

    async def ask(member_id: int, peer_address: str) -> int | None:
        if not peer_address:
            return None
        answered = await ask_hello(
            member_id,
            peer_address,
            own_id,
            cluster_id,
            peers.peer_key,
            transport.hello,
            probe=True,
        )
        return None if answered is None else answered[1]

    return ask


def stop_if_too_old(member_id: int, version: int, previous: int) -> None:
    """The cluster version rose from ``previous`` to ``version``: say so, and stop this member
    at once (exit 2) if this build is older than the new version: it cannot read what the
    others will write."""
    log.warning(
        "member %d: the cluster version is now %d (was %d); this build's record version is %d",
        member_id,
        version,
        previous,
        RECORD_VERSION,
    )
    refusal = startup_refusal(version)
    if refusal is not None:
        log.critical("member %d: %s", member_id, refusal)
        print(f"rallypoint serve: member {member_id}: {refusal}", file=sys.stderr)
        logging.shutdown()
        os._exit(2)
