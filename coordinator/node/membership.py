"""Membership changes: the Raft configuration, and the changes an operator asks for.

Theory of operation (Raft thesis 4.1, 4.2.1, 4.3; etcd's ``server.go`` AddMember, RemoveMember,
PromoteMember, TransferLeadership). The configuration (``ConfState``: voters, learners) is
Raft's; the addresses at which members are reached are ours (``MemberTable``, in
``coordinator/member_table.py``, kept in step with the configuration here). Both change only
when a configuration-change entry applies, on every member in log order, and both are
restored together from a snapshot, so every member agrees on them at every index.

A change is proposed on the leader with a ``ConfChangeContext`` that carries the new
member's addresses and the proposal id of the caller's waiter (``proposals``). Raft
accepts one change at a time: the leader first waits, bounded by the caller's deadline, for
the previous change (or a new leader's no-op) to be applied, rather than refuse a caller who
made two changes in a row. New members join as learners and are promoted to voters only once
their log has caught up (``PROMOTE_READY_PERCENT``), so a lagging new voter never weakens the
quorum. Member ids are never reused, not even ids of removed members (``MemberTable``).

A leadership transfer (thesis 3.10) is asked of the core and awaited until the target leads.
Everything here runs on the event loop; ``MembershipHost`` is what this module needs of the
running member.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Protocol

from rallypoint.raft import RawNode
from rallypoint.raft.types import (
    NONE,
    ConfChange,
    ConfChangeSingle,
    ConfChangeType,
    ConfState,
    NodeId,
)

from ..member_table import ConfChangeContext, MemberAddress, MemberTable, apply_conf_change
from .api import (
    PROMOTE_READY_PERCENT,
    LearnerNotReadyError,
    Member,
    MemberNotFoundError,
    ProposalDroppedError,
    ProposalTimeoutError,
)
from .proposals import ProposalIds, Waiters

__all__ = ["Membership", "MembershipHost"]

# How often a hand-over that gives up on a lost stream looks whether it was lost.
_LOST_CHECK_S = 0.05


class MembershipHost(Protocol):
    """What membership changes need of the running member (``node.Node``)."""

    @property
    def member_id(self) -> int: ...

    @property
    def leader_id(self) -> int: ...

    @property
    def raw(self) -> RawNode: ...

    def require_leader(self) -> None:
        """Raise NotLeaderError unless this member leads."""
        ...

    def wake(self) -> None:
        """Let the Ready loop run: the core has work."""
        ...

    async def wait_for_apply(self, timeout_s: float) -> bool: ...

    async def wait_for_leader_change(self, timeout_s: float) -> None:
        """Return when the known leader changes, or after ``timeout_s``."""
        ...


class Membership:
    """The configuration and its changes, on ``host``; callers of the changes (``add``,
    ``remove``, ``promote``, ``transfer_leader``) reach this object directly
    (``api.ServerNode.membership``)."""

    def __init__(
        self,
        host: MembershipHost,
        proposal_ids: ProposalIds,
        waiters: Waiters,
        initial_members: dict[int, MemberAddress],
        join_existing: bool,
    ) -> None:
        self._host = host
        self._proposal_ids = proposal_ids
        self._waiters = waiters
        self._initial_members = dict(initial_members)
        self._join_existing = join_existing
        self.table = MemberTable(dict(initial_members))
        # Peer addresses other members gave for members not (yet) in the table: id -> peer
        # address (peer_lookup.py). Only dialled; the table's own entry wins.
        self.learned: dict[int, str] = {}
        # The configuration as of the last applied change or restored snapshot.
        self.conf_state = ConfState()
        # The member this leader is handing leadership to, if it started a transfer.
        self.transfer_target = NONE
        # The transport lost its stream to the transfer's target since the transfer started
        # (``target_unreachable``): a stopping leader gives its hand-over up.
        self.transfer_target_lost = False

    # ------------------------------------------------------------------- queries

    def learners(self) -> set[int]:
        return set(self.conf_state.learners) | set(self.conf_state.learners_next)

    def member(self, member_id: int) -> Member:
        address = self.table.get(member_id)
        if address is None:
            raise MemberNotFoundError(member_id)
        return Member(
            member_id, address.peer_address, address.client_address, member_id in self.learners()
        )

    def members(self) -> tuple[Member, ...]:
        learners = self.learners()
        return tuple(
            Member(member_id, address.peer_address, address.client_address, member_id in learners)
            for member_id, address in self.table.items()
        )

    def peer_address(self, member_id: int) -> str | None:
        """Where to dial ``member_id``: the table's address, else one learned from another
        member (``learn``), else None."""
        address = self.table.get(member_id)
        if address is not None:
            return address.peer_address
        return self.learned.get(member_id)

    def peer_addresses(self) -> dict[int, str]:
        """Every member with a known peer address (``peer_address``): id -> address."""
        known = dict(self.learned)
        known.update((i, a.peer_address) for i, a in self.table.items())
        return known

    def learn(self, member_id: int, peer_address: str) -> None:
        """Another member says ``member_id`` is at ``peer_address`` (peer_lookup.py): kept
        until the table has an entry for it or it is removed."""
        if self.table.get(member_id) is None:
            self.learned[member_id] = peer_address

    def knows(self, member_id: int) -> bool:
        """In the configuration or the member table (for peer_hello.py)."""
        conf = self.conf_state
        in_conf = member_id in set(conf.voters) | set(conf.learners) | set(conf.voters_outgoing)
        return in_conf or self.table.get(member_id) is not None

    # ------------------------------------------------------------------- the apply path

    def apply(self, cc: ConfChange, conf_state: ConfState) -> tuple[ConfChangeContext, list[int]]:
        """A committed change applied by Raft, giving ``conf_state``: update the address
        book. Returns the change's context and the ids it removed."""
        self.conf_state = conf_state
        applied = apply_conf_change(self.table, cc)
        self._forget_learned(applied[1])
        return applied

    def restore(self, table: MemberTable, conf_state: ConfState) -> None:
        """A snapshot was installed: its member table and configuration replace ours."""
        table.note_id(self.table.highest_id)  # a snapshot never lowers it
        self.table = table
        if self._join_existing:
            # Until the snapshot names them, reach the others at the addresses given.
            for member_id, address in self._initial_members.items():
                if self.table.get(member_id) is None:
                    self.table.set(member_id, address)
        self.conf_state = conf_state
        self._forget_learned(())

    def _forget_learned(self, removed: Iterable[int]) -> None:
        """Drop learned addresses the table now has its own entry for, and those of
        ``removed`` members."""
        gone = set(removed)
        for member_id in list(self.learned):
            if member_id in gone or self.table.get(member_id) is not None:
                del self.learned[member_id]

    # ------------------------------------------------------------------- changes

    async def _propose(
        self,
        changes: tuple[ConfChangeSingle, ...],
        context: ConfChangeContext,
        timeout_s: float,
    ) -> ConfState:
        host = self._host
        host.require_leader()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        # Raft takes one change at a time. The previous one may be committed and even
        # answered but not yet marked applied (that happens when its Ready is advanced), or
        # a new leader's no-op may not be applied yet: wait for that rather than refuse a
        # caller who made two changes in a row.
        while host.raw.basic_status().conf_change_pending():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ProposalDroppedError("another membership change is still in progress")
            await host.wait_for_apply(min(remaining, 0.05))
            host.require_leader()
        cc = ConfChange(changes, context=context.encode())
        state: ConfState = await self._waiters.register(
            context.proposal_id,
            lambda: host.raw.propose_conf_change(cc),
            max(0.0, deadline - loop.time()),
            host.wake,
            cc,
        )
        return state

    async def add(
        self, peer_address: str, client_address: str, as_learner: bool, timeout_s: float = 10.0
    ) -> Member:
        host = self._host
        host.require_leader()
        for member_id, address in self.table.items():
            if address.peer_address == peer_address:
                # A retried add (its answer was lost): the member is already there.
                if address.client_address != client_address:
                    raise ProposalDroppedError(
                        f"member {member_id} already uses peer address {peer_address}"
                    )
                return self.member(member_id)
        known = set(self.table.ids()) | set(self.conf_state.voters)
        known |= set(self.conf_state.learners)
        # Never an id used before, even one since removed (see member_table.py).
        new_id = max(max(known, default=0) + 1, self.table.next_id())
        kind = ConfChangeType.ADD_LEARNER_NODE if as_learner else ConfChangeType.ADD_NODE
        context = ConfChangeContext(
            peer_address, client_address, host.member_id, self._proposal_ids.next()
        )
        await self._propose((ConfChangeSingle(kind, NodeId(new_id)),), context, timeout_s)
        return self.member(new_id)

    async def remove(self, member_id: int, timeout_s: float = 10.0) -> None:
        self.member(member_id)
        context = self._context()
        await self._propose(
            (ConfChangeSingle(ConfChangeType.REMOVE_NODE, NodeId(member_id)),),
            context,
            timeout_s,
        )

    async def promote(self, member_id: int, timeout_s: float = 10.0) -> Member:
        """Learner to voter, on the leader, once the learner's log has caught up (a lagging
        new voter would weaken the quorum until it did) and, if it started without data, the
        leader has heard that it no longer abstains."""
        host = self._host
        host.require_leader()
        member = self.member(member_id)
        if not member.is_learner:
            raise ProposalDroppedError(f"member {member_id} is already a voter")
        progress = host.raw.status().progress
        leader_last = int(progress[NodeId(host.member_id)].match)
        learner = progress.get(NodeId(member_id))
        match = int(learner.match) if learner is not None else 0
        if match * 100 < leader_last * PROMOTE_READY_PERCENT:
            raise LearnerNotReadyError(member_id, match, leader_last)
        if host.raw.peer_abstaining(NodeId(member_id)):
            # A voter whose acknowledgements count toward no quorum: promoted now, it could
            # stall commits and make this leader step down at its next check-quorum, until
            # it says it caught up (at its next message, within a heartbeat of catching up).
            raise LearnerNotReadyError(member_id, match, leader_last, abstaining=True)
        context = self._context()
        await self._propose(
            (ConfChangeSingle(ConfChangeType.ADD_NODE, NodeId(member_id)),),
            context,
            timeout_s,
        )
        return self.member(member_id)

    def _context(self) -> ConfChangeContext:
        """The context of a change that adds no addresses: who proposed it, for its waiter."""
        return ConfChangeContext(
            proposer_id=self._host.member_id, proposal_id=self._proposal_ids.next()
        )

    def target_unreachable(self, member_id: int) -> None:
        """The transport lost its stream to ``member_id`` (or dropped messages for it)."""
        if member_id == self.transfer_target:
            self.transfer_target_lost = True

    async def transfer_leader(
        self, target_id: int, timeout_s: float = 10.0, *, give_up_if_lost: bool = False
    ) -> int:
        """Hand leadership to ``target_id`` (0: the most up-to-date other voter); return the
        new leader's id. ``give_up_if_lost``: raise ProposalDroppedError as soon as the
        transport loses its stream to the target (a stopping leader: the target may be
        stopping too, as every member of a cluster stopped at once is, and would not take
        leadership before the deadline)."""
        host = self._host
        host.require_leader()
        voters = self.conf_state.voters
        if target_id == 0:
            progress = host.raw.status().progress
            candidates = [
                (int(pr.match), int(peer))
                for peer, pr in progress.items()
                if peer != host.member_id and peer in voters
            ]
            if not candidates:
                raise ProposalDroppedError("no other voter to hand leadership to")
            target_id = max(candidates)[1]
        elif target_id not in voters:
            raise MemberNotFoundError(target_id)
        if target_id == host.member_id:
            return target_id
        self.transfer_target = NodeId(target_id)
        self.transfer_target_lost = False
        host.raw.transfer_leader(NodeId(target_id))
        host.wake()
        deadline = time.monotonic() + timeout_s
        while host.leader_id != target_id:
            if give_up_if_lost and self.transfer_target_lost:
                raise ProposalDroppedError(
                    f"the stream to member {target_id} was lost during the hand-over"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProposalTimeoutError(
                    f"leadership did not move to member {target_id} within {timeout_s:.1f}s"
                )
            # In slices: a lost stream does not change the leader, and is looked at between.
            await host.wait_for_leader_change(
                min(remaining, _LOST_CHECK_S) if give_up_if_lost else remaining
            )
        return target_id
