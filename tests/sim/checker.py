"""The simulator's invariant checker: Raft's safety properties, checked incrementally.

Theory of operation. The simulator reports to one :class:`Checker` everything it observes
(a node found in the leader state, a node's commit index moving, entries written to a node's
log, hard states reaching durable storage, entries applied, ReadIndex requests and results),
after every event. The checker keeps just enough global history to decide each property in
O(1) or O(log length) per observation, and raises :class:`Violation` the moment one fails:

- election safety (Raft paper 5.2): ``leaders`` maps every term ever seen with a leader to
  that leader; a second node leading the same term is a violation.
- log matching (5.3): every stored entry is identified by ``(index, term)`` and summarised by
  a hash chain over the log up to it, so "two logs holding the same (index, term) are
  identical up to there" becomes "every copy of (index, term) has the same chain value", one
  dictionary probe per written entry; snapshots carry the chain value at their index.
- leader completeness (5.4): ``committed`` maps each index known committed to its term and the
  term in which it was first seen committed; a node found leading term T must hold every
  entry first seen committed in a term below T.
- state machine safety (5.4.3): ``applied`` maps each applied index to its term and the chain
  value of the applying node's state machine; every application must agree.
- leader append-only, durable term/vote/commit monotonicity and the ReadIndex bound are
  checked by the simulator's nodes against their own history and reported here as
  violations of the same type.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from rallypoint.raft import ConfState, Entry, NodeId

#: The chain value of the log prefix ending at the cluster's bootstrap snapshot (index 1).
GENESIS_CHAIN = b"\x00" * 8
GENESIS_INDEX = 1
GENESIS_TERM = 1

#: The term a node's log holds at an index: None where compacted away, 0 where absent.
TermLookup = Callable[[int], int | None]


def chain_next(previous: bytes, entry: Entry) -> bytes:
    """The hash chain value of a log ending with ``entry`` after a prefix summarised by
    ``previous``: equal values mean equal logs (up to a 64-bit collision)."""
    h = hashlib.blake2b(previous, digest_size=8)
    h.update(b"%d/%d/%d/" % (entry.index, entry.term, entry.type))
    h.update(entry.data)
    return h.digest()


class Violation(Exception):
    """A broken Raft invariant: ``invariant`` names it, the message describes it."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


@dataclass(slots=True)
class CommittedEntry:
    """An index known committed. Invariant: no other term is ever committed at ``index``."""

    term: int
    seen_in_term: int  # the term of the node on which the commit was first observed
    seen_on: NodeId


@dataclass(slots=True)
class PendingRead:
    """A ReadIndex request in flight. ``required_index`` is the highest index known committed
    anywhere when the request was issued: a linearizable answer may not be below it."""

    node: NodeId
    required_index: int


class Checker:
    """Global history of the run, and the checks over it (see the module docstring)."""

    def __init__(self) -> None:
        # term -> the one node that led it (election safety: a second leader raises).
        self.leaders: dict[int, NodeId] = {}
        # (index, term) -> chain value of the log up to that entry, over every copy ever stored.
        self.entry_chains: dict[tuple[int, int], bytes] = {
            (GENESIS_INDEX, GENESIS_TERM): GENESIS_CHAIN
        }
        # index -> the committed entry; grows as commit indexes are observed, never changes.
        self.committed: dict[int, CommittedEntry] = {
            GENESIS_INDEX: CommittedEntry(GENESIS_TERM, GENESIS_TERM, NodeId(0))
        }
        # The highest index known committed anywhere (what a linearizable read must reflect).
        self.commit_max = GENESIS_INDEX
        # index -> (term, state machine chain value) of every application so far.
        self.applied: dict[int, tuple[int, bytes]] = {GENESIS_INDEX: (GENESIS_TERM, GENESIS_CHAIN)}
        # The configuration at the highest applied conf change (or snapshot), by index.
        self.latest_conf_index = 0
        self.latest_conf: ConfState | None = None
        self.ever_members: set[NodeId] = set()  # every id in any applied configuration
        self.configs: dict[int, ConfState] = {}  # index -> configuration applied there
        self.reads: dict[bytes, PendingRead] = {}
        self.reads_checked = 0

    # -- election safety and leader completeness ----------------------------------------

    def observe_leader(self, node: NodeId, term: int, term_at: TermLookup) -> None:
        """``node`` is leader of ``term``; called once per leadership (term) of a node."""
        other = self.leaders.setdefault(term, node)
        if other != node:
            raise Violation(
                "election safety", f"nodes {other} and {node} were both leader in term {term}"
            )
        for index in sorted(self.committed):
            committed = self.committed[index]
            if committed.seen_in_term >= term:
                continue
            held = term_at(index)
            if held is None:  # compacted into the leader's snapshot: checked via its boundary
                continue
            if held != committed.term:
                raise Violation(
                    "leader completeness",
                    f"node {node} became leader of term {term} holding term {held or 'none'} "
                    f"at index {index}, where term {committed.term} was committed "
                    f"(first seen committed on node {committed.seen_on} in term "
                    f"{committed.seen_in_term})",
                )

    # -- commitment ----------------------------------------------------------------------

    def observe_committed(self, node: NodeId, node_term: int, index: int, term: int) -> None:
        """``node`` (currently in ``node_term``) holds ``index`` committed with ``term``."""
        known = self.committed.get(index)
        if known is None:
            self.committed[index] = CommittedEntry(term, node_term, node)
            if index > self.commit_max:
                self.commit_max = index
        elif known.term != term:
            raise Violation(
                "state machine safety",
                f"index {index} committed with term {known.term} (seen on node "
                f"{known.seen_on} in term {known.seen_in_term}) and with term {term} "
                f"(node {node} in term {node_term})",
            )

    # -- log matching --------------------------------------------------------------------

    def observe_stored(self, node: NodeId, index: int, term: int, chain: bytes) -> None:
        """``node`` stored the entry ``index``/``term``; its log up to it hashes to ``chain``."""
        known = self.entry_chains.setdefault((index, term), chain)
        if known != chain:
            raise Violation(
                "log matching",
                f"node {node} stored entry {index}/{term} but its log up to there differs "
                f"from another log holding {index}/{term}",
            )

    # -- state machine safety ------------------------------------------------------------

    def observe_applied(self, node: NodeId, index: int, term: int, chain: bytes) -> None:
        """``node``'s state machine now reflects the log up to ``index`` (hash ``chain``)."""
        known = self.applied.setdefault(index, (term, chain))
        if known != (term, chain):
            raise Violation(
                "state machine safety",
                f"node {node} applied index {index} (term {term}) reaching a state that "
                f"differs from another node's at the same index (term {known[0]})",
            )
        committed = self.committed.get(index)
        if committed is not None and committed.term != term:
            raise Violation(
                "state machine safety",
                f"node {node} applied index {index} with term {term}, but term "
                f"{committed.term} is committed there",
            )

    def observe_conf(self, index: int, conf: ConfState) -> None:
        self.configs[index] = conf
        self.ever_members.update(conf.voters, conf.learners)
        if index >= self.latest_conf_index:
            self.latest_conf_index = index
            self.latest_conf = conf

    # -- linearizable reads --------------------------------------------------------------

    def read_issued(self, node: NodeId, ctx: bytes) -> None:
        self.reads[ctx] = PendingRead(node, self.commit_max)

    def read_answered(self, node: NodeId, ctx: bytes, index: int) -> None:
        # Not popped: a duplicated MsgReadIndexResp legitimately answers a read twice.
        pending = self.reads.get(ctx)
        if pending is None:
            raise Violation(
                "linearizable read", f"node {node} answered read {ctx!r} that was never issued"
            )
        if pending.node != node:
            raise Violation(
                "linearizable read",
                f"read {ctx!r} issued on node {pending.node} was answered on node {node}",
            )
        if index < pending.required_index:
            raise Violation(
                "linearizable read",
                f"read {ctx!r} on node {node} got read index {index}, below index "
                f"{pending.required_index} known committed when it was issued",
            )
        self.reads_checked += 1
