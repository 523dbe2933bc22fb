"""A member's first start: creating the cluster, or finding out it must not vote yet.

Theory of operation. A member whose storage holds nothing beyond the cluster's creation
(``is_fresh``) cannot tell from its own disk whether the cluster is new or whether it lost
its data (or is joining). It asks the other initial members (``peer_hello.py``) and
follows ``bootstrap_rule.py``:

- every other initial member answers that it has no cluster yet: every initial member
  writes the same bootstrap snapshot at index 1, holding the configuration and the address
  book, so all start from one state (this member's own empty disk proves nothing: it may
  be the one that lost its data);
- the cluster exists and knows this member: it lost its data; it comes back as a new
  incarnation and abstains from voting until it has caught up (a member that forgot its
  vote could otherwise vote twice in a term, thesis 3.8);
- the cluster exists and does not know it: refused, with the commands that add it.

A member started with ``join_existing`` skips the question and abstains until caught up.
The identity that results is recorded by the caller (``identity.py``); the bootstrap write
runs on the disk thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging

from rallypoint.raft.log_storage import CompactedError, UnavailableError
from rallypoint.raft.storage.disk_storage import DiskStorage, PersistRequest
from rallypoint.raft.types import (
    NONE,
    ConfState,
    HardState,
    Index,
    NodeId,
    Snapshot,
    SnapshotMetadata,
    Term,
)

from .. import identity as identity_file
from ..bootstrap_rule import Decision
from ..identity import Identity
from ..member_table import MemberTable, encode_app_snapshot
from ..peer_auth import PeerKey
from ..peer_hello import HelloCall, ask_peers
from ..state.machine import StateMachine
from .api import NodeStartError
from .config import NodeConfig

__all__ = [
    "begin_from_empty_storage",
    "bootstrap",
    "has_caught_up",
    "is_blank",
    "is_fresh",
    "settle_identity",
    "stop_abstaining",
]

log = logging.getLogger("rallypoint.node")


def is_fresh(storage: DiskStorage) -> bool:
    """Nothing beyond the cluster's creation: no election, no entry after index 1."""
    return (
        storage.last_index() <= 1
        and storage.snapshot().metadata.index <= 1
        and storage.hard_state.term <= 1
    )


def is_blank(storage: DiskStorage) -> bool:
    return (
        storage.last_index() == 0
        and storage.snapshot().is_empty()
        and storage.hard_state.is_empty()
    )


async def settle_identity(
    config: NodeConfig,
    peer_key: PeerKey,
    hello: HelloCall,
    storage: DiskStorage,
    found: Identity | None,
    disk: concurrent.futures.Executor,
) -> Identity:
    """This start's identity (``found``: the one on disk, already checked against the
    flags), saved before the member serves Raft."""
    # Storage that holds the creation (not blank) under an identity that votes is an
    # intact disk: this member got every initial member's "fresh" once and has neither
    # voted nor appended since, which Raft handles like any other state; asking again
    # would only make it wait for members that may be down (bootstrap_rule.py).
    intact_creation = found is not None and not found.abstaining and not is_blank(storage)
    if is_fresh(storage) and not intact_creation:
        boots = 0 if found is None else found.boots
        identity, create = await begin_from_empty_storage(config, peer_key, hello, boots)
        if create and is_blank(storage):
            await bootstrap(config, storage, disk, rejoining=identity.abstaining)
    elif found is None:
        # A data directory from before identities were recorded: it is trusted as is.
        identity = Identity.new(config.cluster_id, config.member_id, abstaining=False)
    else:
        identity = found
    identity = identity.started()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(disk, identity_file.save, config.data_dir, identity)
    return identity


def has_caught_up(
    storage: DiskStorage,
    commit: Index,
    term: Term,
    leader: NodeId,
    lead_commit: Index,
    lead_commit_first: Index,
) -> bool:
    """Whether a member that lost its data may vote again (and have its acknowledgements
    counted): its durable ``commit`` reaches ``lead_commit``, the commit index the leader it
    follows reported in its appends of the current term, which rose above
    ``lead_commit_first``, the one in the first such append (``BasicStatus``, read with the
    Ready that persisted ``commit``), and its log holds an entry of the current term there.

    - The rise: the leader committed an entry of its term while this member abstained, so
      without it (the others do not count an abstaining member's acknowledgements): a
      majority of the others accepted an append of this term after the loss, so no majority
      had moved to a later term before it, with this member's forgotten vote. A deposed
      leader (which this member, having forgotten the newer term, follows as readily) cannot
      pass this.
    - The leader's own entry is committed, so every entry committed before it is in this
      log too (the Leader Completeness property, thesis 3.6.3), and so is everything the
      leader had committed, the entries this member acknowledged before the loss included.
      The member's own commit index is clipped to the entries it received: alone, it would
      pass after the first batch of a long log, and the member's vote could elect a member
      lacking entries committed with its lost acknowledgements."""
    if leader == NONE or commit == 0 or not lead_commit_first < lead_commit <= commit:
        return False
    try:
        return storage.term(commit) == term
    except (CompactedError, UnavailableError):
        return False


async def begin_from_empty_storage(
    config: NodeConfig, peer_key: PeerKey, hello: HelloCall, boots: int
) -> tuple[Identity, bool]:
    """A new incarnation for a member whose storage holds nothing of a cluster yet: it
    creates the cluster with the other initial members, or (the cluster exists) it lost
    its data or is joining, and abstains until caught up. The second value: whether it
    writes the cluster's creation (not when it joins an existing cluster)."""
    cluster_id = config.cluster_id
    if config.join_existing:
        log.info(
            "member %d joins an existing cluster: it does not vote until it has caught up",
            config.member_id,
        )
        return Identity.new(cluster_id, config.member_id, abstaining=True, boots=boots), False
    if not config.initial_members:
        raise NodeStartError(
            f"{config.data_dir} holds no cluster state: give the initial members to "
            "create a cluster, or join an existing one"
        )
    peers = {i: a.peer_address for i, a in config.initial_members.items() if i != config.member_id}
    verdict = await ask_peers(config.member_id, cluster_id, peer_key, peers, hello)
    if verdict.decision is Decision.REFUSED:
        raise NodeStartError(
            f"member {config.member_id} is not in the configuration of the running "
            f"cluster (member {verdict.answered_by} says so): add it with `rallypoint "
            f"member add {config.peer_address} {config.client_address} --learner`, then "
            "start it with --join"
        )
    established = verdict.decision is Decision.REJOIN
    if established:
        log.warning(
            "member %d: its storage is empty but the cluster exists (member %d says so): "
            "it lost its data and rejoins as a new incarnation, without voting until it "
            "has caught up",
            config.member_id,
            verdict.answered_by,
        )
    return Identity.new(cluster_id, config.member_id, abstaining=established, boots=boots), True


async def bootstrap(
    config: NodeConfig,
    storage: DiskStorage,
    disk: concurrent.futures.Executor,
    *,
    rejoining: bool = False,
) -> None:
    """Create the cluster: every initial member writes the same snapshot at index 1,
    holding the configuration and the member table, so all start from one state. A member
    rejoining after losing its data writes it too (the same bytes its peers hold), so it
    knows the configuration before the leader reaches it."""
    voters = tuple(sorted(NodeId(i) for i in config.initial_members))
    sm = StateMachine(config.limits)
    data = encode_app_snapshot(MemberTable(dict(config.initial_members)), sm.snapshot())
    snapshot = Snapshot(data, SnapshotMetadata(ConfState(voters=voters), Index(1), Term(1)))
    request = PersistRequest(HardState(Term(1), NONE, Index(1)), (), snapshot)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(disk, storage.write_batch, [request])
    storage.apply_batch([request])
    if rejoining:
        log.info(
            "member %d wrote the cluster's creation (%s) to rejoin", config.member_id, list(voters)
        )
    else:
        log.info("member %d created a cluster of %s", config.member_id, list(voters))


async def stop_abstaining(
    config: NodeConfig,
    disk: concurrent.futures.Executor,
    storage: DiskStorage,
    identity: Identity,
    position: tuple[Index, Term, NodeId],
    lead_commits: tuple[Index, Index],
) -> Identity | None:
    """The identity of a member that lost its data and has now caught up (``has_caught_up``
    with its (commit, term, leader) ``position`` and its leader's reported commits), saved
    with the flag cleared before it votes again; None while it has not caught up."""
    commit, term, leader = position
    lead_commit, lead_commit_first = lead_commits
    if not has_caught_up(storage, commit, term, leader, lead_commit, lead_commit_first):
        return None
    caught_up = dataclasses.replace(identity, abstaining=False)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(disk, identity_file.save, config.data_dir, caught_up)
    log.warning(
        "member %d has caught up (commit %d of term %d from leader %d, whose commit was %d): "
        "it votes again",
        config.member_id,
        commit,
        term,
        leader,
        lead_commit,
    )
    return caught_up
