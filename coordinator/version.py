"""Record versions: what a build writes and reads, and the cluster version that gates it.

Theory of operation. Members of two releases replicate one log during a rolling upgrade, so
a leader must never write bytes a follower cannot read (an older follower refuses an entry
it cannot decode; with a majority of older members, commits stall). etcd answers this with a
*cluster version*; so does rallypoint:

- Every build has one integer, its **record version** (``RECORD_VERSION``): the highest
  version of the replicated formats it writes and reads - state-machine command tags and
  their ``since(n)`` fields (``state/codec.py``), snapshot formats (``state/machine.py``) and
  peer messages. ``VERSIONS`` below says what each version added; a change to any of those
  formats that an older build cannot read takes the next version and a line in that table.
- Members advertise their record version in the peer hello (``peer_hello.advertisement``,
  the one place that says it on the wire) and in ``Status``. A member that advertises
  nothing runs ``BASELINE_RECORD_VERSION``: every release up to and including the one that
  introduced this table's first entry (commit 21ef0cc).
- The leader proposes the **cluster version**, the minimum over every voter and learner,
  through Raft (the ``ClusterVersion`` command, itself new in version 2: it is proposed only
  once every member advertises at least 2, so no member ever receives a command it cannot
  decode). It only rises: a member older than it refuses to start, and nothing lowers it.
- Nothing above the cluster version is encoded: a proposal needing a newer record version
  (``state/versions.required_version``) is refused where it is proposed, with one line naming
  the version it needs (``ClusterVersionError``); the snapshot format follows the cluster
  version (format 8, which carries it, is written only from cluster version 2).

This module is plain data, imported by the state machine, the node and the peer code alike.
"""

from __future__ import annotations

from typing import Final

# The version every member that advertises none runs: rallypoint up to commit 21ef0cc
# (command tags up to 348 with their since() fields as of then, snapshot format 7, peer
# format 2). A cluster that never proposed a cluster version is at this version.
BASELINE_RECORD_VERSION: Final = 1

# This build's record version: the highest version it writes and reads.
RECORD_VERSION: Final = 5

# What each version added (docs/operations.md, "Upgrading", prints this table).
VERSIONS: Final[dict[int, str]] = {
    1: (
        "baseline (commit 21ef0cc): command tags 1-348 with their since() fields, snapshot "
        "formats 2-7, peer message format 2"
    ),
    2: (
        "the ClusterVersion command (tag 349); snapshot format 8 (carries the cluster "
        "version); Put's keep_lease field (a put that keeps the key's lease); "
        "MemorySnapshotCommit's planned_end field (a sharded job's final snapshot of a round "
        "ended by plan); the peer hello and Status advertise the record version"
    ),
    3: (
        "Round's hold_domains field (format 4): a round held for a failed member's failure "
        "domain ends its hold as soon as the last participant of that domain is removed"
    ),
    4: (
        "CloseRound's hold_over field (format 2): the leader ends a held round's hold once "
        "every remaining participant of the failed domains was heard from since the failure"
    ),
    5: (
        "JobConfig's straggler_hold_windows field (format 3) and the HeldOut failure (tag "
        "250): a participant the straggler policy evicted is held out of its job for that "
        "many straggler windows (a join by its name is refused until then)"
    ),
}


class ClusterVersionError(Exception):
    """A proposal that needs a newer record version than the cluster version allows: some
    member may not read it yet. The message names the feature and both versions."""

    def __init__(self, feature: str, needed: int, cluster_version: int) -> None:
        super().__init__(
            f"{feature} needs cluster version {needed}; the cluster is at version "
            f"{cluster_version} (some member runs an older release): upgrade every member first"
        )
        self.feature = feature
        self.needed = needed
        self.cluster_version = cluster_version


def startup_refusal(cluster_version: int, own: int | None = None) -> str | None:
    """The one line a member whose build is older than the persisted cluster version exits
    with, or None when it may run (``own``: this build's record version by default). A
    cluster version never goes down, so this member would write or misread records the
    others rely on."""
    own = RECORD_VERSION if own is None else own
    if cluster_version <= own:
        return None
    return (
        f"the cluster version is {cluster_version}, but this build of rallypoint reads and "
        f"writes record versions up to {own}: it is older than the cluster and cannot be "
        "downgraded to; start this member with a release of record version "
        f"{cluster_version} or later"
    )


def cluster_version_to_propose(advertised: dict[int, int], members: frozenset[int]) -> int | None:
    """The cluster version the leader should propose: the minimum record version over
    ``members`` (every voter and learner), or None while some member has not been heard
    (its version is unknown) or the minimum is below 2 (the ``ClusterVersion`` command does
    not exist before version 2, so a member of the baseline could not decode it)."""
    if not members or any(m not in advertised for m in members):
        return None
    lowest = min(advertised[m] for m in members)
    return lowest if lowest > BASELINE_RECORD_VERSION else None
