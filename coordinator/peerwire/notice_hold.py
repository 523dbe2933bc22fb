"""Holding a commit notice back for the next message to the same peer.

Theory of operation. After a write commits, the leader's Raft core sends each follower a
commit notice: an entry-less ``MsgApp`` marked ``COMMIT_NOTICE_CONTEXT``, which the follower
takes without answering (raft/raft.py). Alone on the wire it costs a frame, a ``write`` that
wakes the follower, and the follower's read, check and Ready turn. When writes come one
after another, the next write's append follows the notice a millisecond or two later,
so :class:`NoticeHold` keeps the notice back up to ``COMMIT_NOTICE_HOLD_S`` and lets
it travel in the same batch as the next message to that peer.

Rules (one ``NoticeHold`` per peer, fed every message the sender is given, in order):

- Only a commit notice is ever held, and at most one. A later notice at the same log
  position (same term, ``index`` and ``log_term``) with a commit at least as high replaces it:
  a follower takes from an accepted notice only ``min(commit, index)`` as its commit index,
  so the later one tells it everything the held one would have. Any other message, and a
  notice at another position, goes out behind the held notice, in order, in the same batch:
  nothing is reordered and nothing the leader sent is dropped or altered, so a follower's
  commit index still advances only with what its leader sent, as before.
- A held notice goes out when its deadline comes even if nothing else does (the sender's
  timer calls :meth:`NoticeHold.release`).
- No hold for a peer that waits on its own apply to answer a request it forwarded: a
  follower answers a write forwarded to the leader, and a ReadIndex read, only once it has
  applied that far (``coordinator/node/reads.py``, ``proposals.py``). ``awaited`` is the
  highest such index (the last entry the leader appended for a proposal the peer forwarded,
  noted by the member when it steps the proposal, and the index of every ReadIndex answer
  sent to it, noted here); while the commit index the peer has been sent, ``told``, is below
  it, notices go out at once, as they did before holding existed. A held notice would
  otherwise delay every forwarded write, rendezvous joins among them (a 5 ms hold without
  this rule kept a 1,024-worker round from closing, bench/README.md).
- No hold while holding does not pay: after ``COMMIT_NOTICE_HOLD_MISSES`` held notices in a
  row went alone at the deadline, notices go at once but for one in every
  ``COMMIT_NOTICE_HOLD_RETRY``, held to try again; one carried by a later message resumes.
- No hold for a notice that commits more than ``COMMIT_NOTICE_HOLD_MAX_ENTRIES`` entries
  beyond ``told``: the follower had better apply them before the next append comes.
- Leader leases and ReadIndex rounds ride heartbeats and their answers, which are never held
  (a heartbeat to the peer takes the held notice along).

``told`` is what the messages let go would tell the peer if it accepted them: an estimate,
high if one was rejected or lost. Then one notice may be held that should not have been,
and a forwarded request waits at most ``COMMIT_NOTICE_HOLD_S`` longer; the leader's next
heartbeat and probe repair the loss as before.
"""

from __future__ import annotations

from rallypoint.raft.raft import COMMIT_NOTICE_CONTEXT
from rallypoint.raft.types import Message, MessageType

__all__ = [
    "COMMIT_NOTICE_HOLD_MAX_ENTRIES",
    "COMMIT_NOTICE_HOLD_MISSES",
    "COMMIT_NOTICE_HOLD_RETRY",
    "COMMIT_NOTICE_HOLD_S",
    "NoticeHold",
    "is_commit_notice",
]

#: How long a commit notice may wait for the next message to its peer. Measured in
#: ``make bench-kv``'s put_1 (one client, writes one after another, 2 shared cores): the next
#: write's append followed its notice by 1.1 ms (p10), 1.4 ms (p50), 1.75 ms (p90), so a 1 ms
#: hold sent 97 % of the notices alone at the deadline and saved nothing; 2 ms carried most
#: of them. Longer only delays what followers show (watches, their applied state) by more,
#: and a burst of concurrent writes sends appends far more often than this.
COMMIT_NOTICE_HOLD_S = 0.002
#: A notice that commits more entries than this beyond what its peer was told goes at once.
#: A follower that waits on its own apply applies what a notice commits before it writes and
#: acknowledges an append that came with it (the Ready contract: what is durable applies
#: first; one nobody waits on acknowledges first, ``node/upkeep.applied_first``), so a notice
#: carried by the next append can put the apply of its entries in front of that append's
#: acknowledgement, where, sent alone, the follower applies them while it waits. For one entry
#: that costs little and saves a frame; for a burst's batch of entries it delayed the next
#: commit (measured before followers acked first: put_64 throughput lower in 3 of 4 pairs
#: with no bound). Since an idle follower acks first, 16 against 4 raised put_64 throughput
#: in 4 of 4 pairs (bench/README "The notice bound after followers ack first").
COMMIT_NOTICE_HOLD_MAX_ENTRIES = 16
#: After this many held notices in a row went alone at the deadline, notices go at once...
COMMIT_NOTICE_HOLD_MISSES = 4
#: ...except every this many, held again to see whether the traffic changed. A burst of
#: concurrent writes (put_64: an append of ~31 entries every ~6 ms) sent 85 % of its held
#: notices alone at the deadline: holding saved no frame there and cost a timer each.
COMMIT_NOTICE_HOLD_RETRY = 16


def is_commit_notice(m: Message) -> bool:
    """An entry-less append the leader sent only because its commit index advanced."""
    return m.type is MessageType.MsgApp and not m.entries and m.context == COMMIT_NOTICE_CONTEXT


def _tells(m: Message) -> int:
    """The commit index ``m`` gives its receiver if accepted (0: none)."""
    if m.type is MessageType.MsgApp:
        return min(m.commit, m.index + len(m.entries))
    if m.type is MessageType.MsgHeartbeat:
        return m.commit
    return 0


def _same_position(a: Message, b: Message) -> bool:
    return a.term == b.term and a.index == b.index and a.log_term == b.log_term


class NoticeHold:
    """The commit notice held back for one peer, and what decides whether to hold one.

    Invariant: ``held`` is None or a commit notice (``is_commit_notice``); ``told`` and
    ``awaited`` never decrease."""

    def __init__(self) -> None:
        self.held: Message | None = None
        # The highest commit index the messages let go would give the peer.
        self.told = 0
        # The highest index the peer waits to see committed to answer a forwarded request.
        self.awaited = 0
        # Counters: notices held; of those, sent with (or replaced by) a later message
        # (``merged``), or alone (``released``: at the deadline, or before a notice at
        # another position).
        self.notices_held = 0
        self.merged = 0
        self.released = 0
        # Held notices in a row that went alone at the deadline; notices sent at once since
        # that reached COMMIT_NOTICE_HOLD_MISSES.
        self._misses = 0
        self._skipped = 0

    def await_commit(self, index: int) -> None:
        """The peer waits to see ``index`` committed (a request it forwarded)."""
        self.awaited = max(self.awaited, index)

    def offer(self, m: Message) -> tuple[list[Message], bool]:
        """Messages to send now, in order, for ``m`` given to the sender, and whether a new
        hold began (the caller arms its deadline then; a notice that replaces a held one
        keeps the held one's deadline)."""
        held = self.held
        if is_commit_notice(m):
            replaces = held is not None and _same_position(held, m) and m.commit >= held.commit
            if self._urgent(m) or self._not_worth_holding():
                if replaces:
                    self.held = None
                    self.merged += 1
                return self._let_go(m), False
            if replaces:
                self.held = m
                self.merged += 1
                self._misses = 0
                self.notices_held += 1
                return [], False
            out = self._let_go()
            self.held = m
            self.notices_held += 1
            return out, True
        if m.type is MessageType.MsgReadIndexResp:
            self.await_commit(m.index)
        return self._let_go(m), False

    def _urgent(self, notice: Message) -> bool:
        """The peer waits on its apply for a request it forwarded, or ``notice`` commits a
        batch of entries it had better apply before the next append comes."""
        told = self.told
        return told < self.awaited or notice.commit - told > COMMIT_NOTICE_HOLD_MAX_ENTRIES

    def _not_worth_holding(self) -> bool:
        """Recent holds all ended at the deadline: send this one at once, unless it is
        the one in COMMIT_NOTICE_HOLD_RETRY that tries holding again."""
        if self._misses < COMMIT_NOTICE_HOLD_MISSES:
            return False
        self._skipped += 1
        if self._skipped < COMMIT_NOTICE_HOLD_RETRY:
            return True
        self._skipped = 0
        return False

    def release(self) -> Message | None:
        """The held notice at its deadline (None if it already went)."""
        out = self._let_go()
        if not out:
            return None
        self._misses += 1
        return out[0]

    def _let_go(self, m: Message | None = None) -> list[Message]:
        """The held notice (if any), then ``m`` (if given), recorded as sent."""
        out: list[Message] = []
        if self.held is not None:
            out.append(self.held)
            self.held = None
            if m is None:
                self.released += 1
            else:
                self.merged += 1
                self._misses = 0
        if m is not None:
            out.append(m)
        for sent in out:
            self.told = max(self.told, _tells(sent))
        return out
