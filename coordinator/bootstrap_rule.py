"""When a member with empty storage may create the cluster: the rule, with no IO.

Theory of operation. A member whose storage holds nothing beyond the cluster's creation
cannot tell from its own disk which of these it is:

- a member of a new cluster, started for the first time;
- a member that lost its data directory (a wiped or replaced disk), of a cluster that
  elected leaders and committed entries, some of which this member acknowledged;
- a member that never started, or started but never got past the creation, of a cluster
  that the others created and have used since.

A wiped data directory leaves nothing behind, so no mark on this member's disk can tell the
first case from the other two. Other members' disks are the only evidence; ``peer_hello``
asks each initial member, and each answers *established* (it holds an election or an entry
beyond the creation) or *fresh* (it holds nothing beyond the creation).

The rule (``decide``):

1. An *established* answer proves the cluster exists: this member rejoins without voting
   until it has caught up (or, when the answering member does not know it, is refused).
2. *Fresh* answers from **every** other initial member allow the creation.
3. Anything else is doubt: wait, and ask again.

Why every member, and why this member's own emptiness counts for nothing. A cluster that
did anything committed its first entry (the first leader's no-op) on a majority M of the
initial members, and from then on each of them holds an election on disk, whatever the
configuration became later, unless it lost its disk. A fresh answer from a member of M means
that member lost its disk too. So if at most ``L`` disks were lost (this member's included),
fresh answers from a set Q of the others prove that nothing exists only if every possible M
meets Q in more than ``L - 1`` members; the worst M takes this member and the members outside
Q first, which gives ``|Q| > N - majority + L - 1``. Raft tolerates losing a minority of the
disks (``L <= N - majority``) when each member that lost its data abstains until it has
caught up, so the rule must hold for ``L = N - majority``: ``|Q| > 2 * (N - majority) - 1``,
which is ``|Q| = N - 1``, every other member. (One lost disk alone already needs every
other member of a three-member cluster.) The old rule, a majority of fresh answers with this
member counted among them, lost acknowledged writes to one wiped disk: in a three-member
cluster whose member 2 never got past the creation, wiped member 3 and member 2 outvoted
member 1, the only one holding the data, created the cluster again and elected a leader at a
term the old cluster had already used.

What the rule cannot see, and why that is acceptable:

- Answers arrive at different times, and a member may start an election after answering
  fresh. That is a cluster being created *now*, alongside this member: it holds nothing this
  member ever acknowledged, and this member writes the same bootstrap snapshot its peers did.
  Only a majority of members with lost disks (more than Raft tolerates) can hide history.
- A new cluster cannot be created while any initial member is down. That is the price of
  the proof: the member says so every few seconds, naming the members it waits for. An
  operator who knows a member will never come creates the cluster without it in
  ``--initial-cluster`` and adds it later (``rallypoint member add``).
- The rule covers only the initial members named in the flags: a member removed from the
  configuration long ago still answers, and members added later are not asked.

A member whose storage holds the creation under an identity that votes (it got every fresh
answer once, and its disk is intact) does not ask again after a restart: Raft's own rules
cover an intact disk, and asking would make it wait for members that may be down
(``Node.start``). A member that rejoined and has not caught up yet asks again.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Answer", "Decision", "Verdict", "decide"]


class Decision(enum.Enum):
    CREATE = "create"  # every other initial member holds nothing beyond the creation
    REJOIN = "rejoin"  # the cluster exists: rejoin without voting until caught up
    REFUSED = "refused"  # the cluster exists and does not know this member
    WAIT = "wait"  # not proven either way: ask again


@dataclass(frozen=True, slots=True)
class Answer:
    """One initial member's authenticated answer to ``Hello``."""

    member_id: int
    # It holds an election or an entry beyond the creation.
    established: bool
    # With ``established``: its configuration includes the asking member.
    knows_asker: bool = False


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    # REJOIN / REFUSED: the member whose answer proved the cluster exists; else 0.
    answered_by: int = 0
    # WAIT: the initial members whose fresh answer is still missing, ascending.
    missing: tuple[int, ...] = ()


def decide(me: int, initial_members: frozenset[int], answers: Mapping[int, Answer]) -> Verdict:
    """The module docstring's rule. ``answers``: the latest answer of each other initial
    member that gave one (answers from anyone else, or from ``me``, are ignored)."""
    others = sorted(initial_members - {me})
    for member_id in others:
        answer = answers.get(member_id)
        if answer is not None and answer.established:
            decision = Decision.REJOIN if answer.knows_asker else Decision.REFUSED
            return Verdict(decision, answered_by=member_id)
    missing = tuple(i for i in others if i not in answers)
    if missing:
        return Verdict(Decision.WAIT, missing=missing)
    return Verdict(Decision.CREATE)
