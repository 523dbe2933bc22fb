"""Data directories of a new cluster: restored from a backup, or forced from a survivor.

Theory of operation. Both disaster procedures end the same way: a data directory whose Raft
storage holds one snapshot (the application state at index N, a configuration naming the new
cluster's voters, their addresses in the member table) and a hard state committed at N, and
whose identity names a **new** cluster id (the peer secret and ``--cluster-token`` make it;
``peer_auth.cluster_id_for``), so members of the old cluster, which still hold its id, are
refused by every member of the new one (peer_gate.py) and cannot join or vote in it.
A member starting on such a directory is not fresh (``bootstrap.is_fresh``): it starts from
the snapshot, as after any restart, and elects a leader with the others.

- ``restore``: every member of the new cluster is built from the same backup file with the
  same ``--initial-cluster``, so all write the same snapshot bytes at the same index and term
  (Log Matching holds from the start); none has voted in any term of the new cluster.
- ``force_new_cluster``: a surviving member of a cluster that lost its majority for good
  (etcd's ``--force-new-cluster``). Its whole durable log is replayed offline onto its last
  snapshot, as a leader elected by a quorum of one would commit it: entries above its commit
  index were never known to be committed and are kept (a leader never drops its own
  entries), entries the lost members had and this one never received are gone. Both ranges
  are logged loudly before anything changes. The old storage is kept beside the new one
  (``raft.before-force-new-cluster-<n>``), so nothing is destroyed.

Everything here runs before the member serves, with blocking file IO (the caller runs it off
any event loop it has).
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass

from rallypoint.raft.codec import decode_conf_change
from rallypoint.raft.storage.disk_storage import DiskStorage, PersistRequest
from rallypoint.raft.storage.fileutil import default_fsync, fsync_dir
from rallypoint.raft.types import (
    NONE,
    ConfState,
    EntryType,
    HardState,
    Index,
    NodeId,
    Snapshot,
    SnapshotMetadata,
    Term,
)

from .. import identity as identity_file
from ..backup_file import Backup, decode
from ..identity import Identity
from ..member_table import (
    MemberAddress,
    MemberTable,
    apply_conf_change,
    decode_app_snapshot,
    encode_app_snapshot,
)
from ..state.machine import Limits, StateMachine
from .proposals import unwrap

__all__ = ["ForcedCluster", "RecoveryError", "force_new_cluster", "replay", "restore"]

log = logging.getLogger("rallypoint.node")

RAFT_DIR = "raft"


class RecoveryError(ValueError):
    """A restore or a forced new cluster that cannot be done: one line says why; nothing
    was changed."""


def _write_storage(
    raft_dir: str,
    index: Index,
    term: Term,
    conf_state: ConfState,
    members: MemberTable,
    state: bytes,
    segment_size_bytes: int,
) -> None:
    """A Raft storage in the empty ``raft_dir`` holding one snapshot at ``index``."""
    data = encode_app_snapshot(members, state)
    snapshot = Snapshot(data, SnapshotMetadata(conf_state, index, term))
    storage = DiskStorage.open(raft_dir, segment_size_bytes=segment_size_bytes)
    try:
        storage.write_batch([PersistRequest(HardState(term, NONE, index), (), snapshot)])
    finally:
        storage.close()


def restore(
    backup: Backup,
    data_dir: str,
    member_id: int,
    initial_members: dict[int, MemberAddress],
    cluster_id: int,
    *,
    segment_size_bytes: int = 64 * 1024 * 1024,
) -> Identity:
    """Build ``data_dir`` (absent or empty) for member ``member_id`` of a new cluster of
    ``initial_members`` holding the backup's state; its identity."""
    if member_id not in initial_members:
        raise RecoveryError(
            f"member {member_id} is not in --initial-cluster {sorted(initial_members)}"
        )
    if cluster_id == backup.header.cluster_id:
        raise RecoveryError(
            f"the backup was taken from cluster {cluster_id:016x}, which this peer secret and "
            "--cluster-token make too: give the restored cluster a new --cluster-token, so "
            "members of the old cluster cannot join it"
        )
    if os.path.exists(data_dir) and (not os.path.isdir(data_dir) or os.listdir(data_dir)):
        raise RecoveryError(
            f"data dir {data_dir} is not empty: restore builds a new member's data dir "
            "(give an empty or new directory)"
        )
    old_members, machine = decode(backup)
    del machine  # decoded only to prove the state reads before anything is written
    table = MemberTable(dict(initial_members), old_members.highest_id)
    conf_state = ConfState(voters=tuple(sorted(NodeId(i) for i in initial_members)))
    _, state = decode_app_snapshot(backup.payload)
    index = Index(backup.header.index)
    term = Term(max(1, backup.header.term))
    os.makedirs(data_dir, exist_ok=True)
    _write_storage(
        os.path.join(data_dir, RAFT_DIR), index, term, conf_state, table, state, segment_size_bytes
    )
    identity = Identity.new(cluster_id, member_id, abstaining=False)
    identity_file.save(data_dir, identity)
    return identity


@dataclass(frozen=True, slots=True)
class ForcedCluster:
    """What ``force_new_cluster`` did."""

    index: Index  # the state of the new cluster is as of this index
    term: Term
    commit: Index  # the commit index the survivor had recorded
    kept_uncommitted: tuple[Index, Index] | None  # entries above commit it kept (lo, hi)
    previous_cluster_id: int
    previous_members: tuple[int, ...]
    kept_old_storage: str


def replay(
    storage: DiskStorage, limits: Limits, up_to: Index | None = None
) -> tuple[MemberTable, StateMachine]:
    """The member table and state machine after every entry of ``storage``'s log (or up
    to ``up_to``), applied as a running member applies them (``driver.Node._apply``: a
    configuration change moves the member table, not the state machine's applied index)."""
    snapshot = storage.snapshot()
    machine = StateMachine(limits)
    table = MemberTable()
    if not snapshot.is_empty():
        table, state = decode_app_snapshot(snapshot.data)
        machine.restore(state)
        machine.applied_index = max(machine.applied_index, int(snapshot.metadata.index))
    first = Index(int(snapshot.metadata.index) + 1)
    last = storage.last_index() if up_to is None else min(up_to, storage.last_index())
    if last >= first:
        for entry in storage.entries(first, Index(last + 1)):
            if entry.type is EntryType.CONF_CHANGE:
                apply_conf_change(table, decode_conf_change(entry.data))
            elif entry.data:
                machine.apply(int(entry.index), unwrap(entry.data)[2])
            else:
                machine.apply(int(entry.index), b"")
    return table, machine


def force_new_cluster(
    data_dir: str,
    member_id: int,
    address: MemberAddress,
    cluster_id: int,
    limits: Limits,
    *,
    segment_size_bytes: int = 64 * 1024 * 1024,
) -> ForcedCluster:
    """Make ``data_dir`` (a surviving member's) the only member of a new cluster
    ``cluster_id`` holding everything in its log; the old storage is kept beside it."""
    found = identity_file.load(data_dir)
    if found is not None and found.member_id != member_id:
        raise RecoveryError(
            f"data dir {data_dir} belongs to member {found.member_id}, but this member was "
            f"started as member {member_id}: check --member-id and --data-dir"
        )
    if found is not None and found.cluster_id == cluster_id:
        raise RecoveryError(
            f"--force-new-cluster needs a new cluster id, but this peer secret and "
            f"--cluster-token make {cluster_id:016x}, the cluster data dir {data_dir} already "
            "belongs to: give a new --cluster-token (if this member was already forced into "
            "that cluster, start it without --force-new-cluster)"
        )
    raft_dir = os.path.join(data_dir, RAFT_DIR)
    if not os.path.isdir(raft_dir):
        raise RecoveryError(f"data dir {data_dir} holds no Raft storage: nothing to recover")
    storage = DiskStorage.open(raft_dir, segment_size_bytes=segment_size_bytes)
    try:
        hard_state = storage.hard_state
        if storage.last_index() == 0 and storage.snapshot().is_empty():
            raise RecoveryError(f"data dir {data_dir} holds no cluster state: nothing to recover")
        previous = storage.snapshot().metadata.conf_state
        table, machine = replay(storage, limits)
        index = Index(machine.applied_index)
        term = Term(max(hard_state.term, storage.term(index), 1))
    finally:
        storage.close()
    commit = hard_state.commit
    kept = (Index(commit + 1), index) if index > commit else None
    members = sorted({*table.ids(), *previous.voters, *previous.learners} - {member_id})
    log.critical(
        "member %d: FORCING A NEW CLUSTER from its own data (cluster %016x -> %016x): it "
        "becomes the only member, with the state at index %d (term %d). Writes the lost "
        "members committed after index %d never reached this member and are LOST.",
        member_id,
        0 if found is None else found.cluster_id,
        cluster_id,
        index,
        term,
        index,
    )
    if kept is not None:
        log.critical(
            "member %d: entries %d..%d were in its log but not known to be committed (its "
            "commit index was %d): they are KEPT and committed now, as a leader elected by "
            "this member alone would; the old cluster may never have committed them",
            member_id,
            kept[0],
            kept[1],
            commit,
        )
    new_table = MemberTable({member_id: address}, table.highest_id)
    for attempt in range(1, 1000):
        kept_dir = os.path.join(data_dir, f"{RAFT_DIR}.before-force-new-cluster-{attempt}")
        if not os.path.exists(kept_dir):
            break
    else:
        raise RecoveryError(f"data dir {data_dir} holds too many kept storages")
    building = os.path.join(data_dir, f"{RAFT_DIR}.forcing")
    shutil.rmtree(building, ignore_errors=True)  # an earlier attempt that did not finish
    _write_storage(
        building,
        index,
        term,
        ConfState(voters=(NodeId(member_id),)),
        new_table,
        machine.snapshot(),
        segment_size_bytes,
    )
    os.replace(raft_dir, kept_dir)
    os.replace(building, raft_dir)
    fsync_dir(data_dir, default_fsync)
    boots = 0 if found is None else found.boots
    identity_file.save(data_dir, Identity.new(cluster_id, member_id, abstaining=False, boots=boots))
    log.warning(
        "member %d: now the only member of cluster %016x (the others were %s; add members "
        "with `rallypoint member add`); its old storage is kept in %s",
        member_id,
        cluster_id,
        members,
        kept_dir,
    )
    return ForcedCluster(
        index=index,
        term=term,
        commit=commit,
        kept_uncommitted=kept,
        previous_cluster_id=0 if found is None else found.cluster_id,
        previous_members=tuple(members),
        kept_old_storage=kept_dir,
    )
