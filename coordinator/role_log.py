"""One log line per change of a member's role or leader, with the term and the reason.

The Raft core logs every vote it sends and receives (as etcd-io/raft does), which at INFO
buries the few lines an operator needs after a stall: when this member started an election
and why, who won, when a leader stepped down and why, and for how long no leader was known.
The driver hands each new ``SoftState`` to :class:`RoleLog`, which infers the reason from
the transition (the core's own lines stay available at DEBUG):

- follower to pre-candidate or candidate: no word from the leader for an election timeout,
  or, straight to candidate with pre-vote on, a leadership transfer aimed at this member;
- leader to follower: a higher term seen (another member campaigned or won), the transfer
  this leader started, or at the same term with no leader, check-quorum (no quorum heard
  from within an election timeout);
- a leader known again after none was: who, at which term, and after how long.

While no leader is known, a line every ``leaderless_report_s`` says so, so a stall that
lasts is visible as it happens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rallypoint.raft import SoftState, StateType
from rallypoint.raft.types import NONE

ROLE_NAMES = {
    StateType.LEADER: "leader",
    StateType.FOLLOWER: "follower",
    StateType.CANDIDATE: "candidate",
    StateType.PRE_CANDIDATE: "pre-candidate",
}


class RoleLog:
    """Turns role and leader changes into log lines; see the module docstring."""

    def __init__(
        self,
        member_id: int,
        clock: Callable[[], float],
        logger: logging.Logger,
        *,
        pre_vote: bool = True,
        leaderless_report_s: float = 5.0,
    ) -> None:
        self._member_id = member_id
        self._clock = clock
        self._log = logger
        self._pre_vote = pre_vote
        self._report_s = leaderless_report_s
        self._soft = SoftState(NONE, StateType.FOLLOWER)
        self._term = 0
        # When this member last knew no leader (None while one is known), and when that was
        # last reported.
        self._leaderless_since: float | None = clock()
        self._reported_at = self._leaderless_since
        self._last_leader = NONE

    def observe(self, soft: SoftState, term: int, lead_transferee: int = NONE) -> None:
        """Log what changed from the previous soft state. ``lead_transferee`` is the
        transfer this member had under way as leader before this change, if any."""
        old, old_term = self._soft, self._term
        self._soft, self._term = soft, term
        me = self._member_id
        if old.raft_state is StateType.LEADER and soft.raft_state is not StateType.LEADER:
            if lead_transferee != NONE and soft.lead == lead_transferee:
                reason = f"handed leadership to member {lead_transferee}"
            elif term > old_term:
                reason = f"a member is at a higher term ({term} > {old_term})"
            else:
                reason = "no quorum answered within an election timeout (check-quorum)"
            self._log.warning("member %d stepped down as leader at term %d: %s", me, term, reason)
        campaigning = (StateType.PRE_CANDIDATE, StateType.CANDIDATE)
        if soft.raft_state in campaigning and old.raft_state is StateType.FOLLOWER:
            if soft.raft_state is StateType.CANDIDATE and self._pre_vote:
                why = "leadership is being transferred to it"
            elif old.lead != NONE:
                why = f"no word from leader {old.lead} for an election timeout"
            else:
                why = "no leader known for an election timeout"
            self._log.info(
                "member %d started an election at term %d (%s): %s",
                me,
                term,
                ROLE_NAMES[soft.raft_state],
                why,
            )
        if soft.lead == old.lead:
            return
        now = self._clock()
        if soft.lead == NONE:
            self._leaderless_since = now
            self._reported_at = now
            return
        after = ""
        if self._leaderless_since is not None and now - self._leaderless_since >= 0.05:
            after = f" after {now - self._leaderless_since:.1f} s without one"
        self._leaderless_since = None
        if soft.lead == me:
            self._log.info("member %d became leader at term %d%s", me, term, after)
        else:
            self._log.info(
                "member %d: leader is member %d at term %d%s", me, soft.lead, term, after
            )
        self._last_leader = soft.lead

    def check_leaderless(self) -> None:
        """Call often (every tick): reports a lasting absence of a leader."""
        if self._leaderless_since is None:
            return
        now = self._clock()
        if now - self._reported_at < self._report_s:
            return
        self._reported_at = now
        last = f"; the last leader was member {self._last_leader}" if self._last_leader else ""
        self._log.warning(
            "member %d has known no leader for %.1f s (term %d, %s)%s",
            self._member_id,
            now - self._leaderless_since,
            self._term,
            ROLE_NAMES[self._soft.raft_state],
            last,
        )
