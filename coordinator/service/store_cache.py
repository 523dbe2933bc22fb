"""Cache leases on round-store values: a TCPStore bridge answers repeated reads of a key
without a call, and every answer stays linearizable.

Theory of operation (leases as Gray and Cheriton define them; Chubby's clients cache the same
way, with writes held until the caches are invalid). Process-group bootstrap reads each key
many times (gloo's full mesh: every rank of a node reads every rank's key, and each c10d get
is a WAIT, a WAIT and a GET), and each read was a round trip to the leader. A MultiGet group
that asks for ``cache`` is granted a lease on its values by the leader: for ``LEASE_S`` from
the moment it read them, none of those keys changes. The bridge keeps the values until
``LEASE_S x (1 - DRIFT)`` after it *sent* its request (earlier than the leader's read, so with
clocks whose rates differ by less than ``DRIFT`` its lease ends first) and meanwhile answers
reads of them itself.

The writes keep that promise:

- A round-store write (set, add, compare_set, delete) is served by the leader only; another
  member refuses it with NOT_LEADER and the client goes to the leader, so every write sees
  every lease granted in the leader's term.
- Before proposing, a write marks its key as being written (no lease is granted on it until
  the write applied) and waits until the key's latest lease ended. Its entry is proposed
  bound to the leader's term (``Node.propose(term=)``): if leadership changed meanwhile it is
  dropped, never forwarded, and the client retries at the new leader.
- A new leader does not know the leases its predecessor granted. It serves no round-store
  write until ``LEASE_S x (1 + DRIFT)`` after it saw itself elected (``leader_since``, a
  little after the election itself): every lease of the predecessor was asked for before
  this leader's election (a lease-read leader serves only while no other can be elected; a
  ReadIndex read is confirmed by a quorum of the old term) and so has ended by then.
- A write whose proposal timed out (or was cancelled, or failed) may still apply later in
  the term: its key stays marked (uncacheable) until the term ends. Entries of an earlier
  term are applied before any read of this term, so they need no mark.

A write that leaves its key's applied value as it is (a set of the value the key holds, as
every rank of c10d's store-based barrier that sees the full count sets the last-worker key;
an add of 0; a compare-and-set that does not swap) does not wait: the leased value stays
right, even with other writes of the key in flight. While a lease on a key runs, every write
of it proposed and not yet applied is such a write (a lease is granted only while no write
of the key is in flight other than sets of the leased value, and a write that changes the
value proposes only once the leases ended), so the value it was checked against is the one
it applies to; a write that changes the value and waits for the lease is proposed after it,
and applies after it.

A key being written is not leased; its group is answered as usual, without a lease (a group's
lease is all of its keys or none), unless every write of it in flight is a set of the very
value being leased: each of those leaves the value as it is when it applies (the writes
before it in the log are the others, all sets of that value, and any write that changes the
value proposes only once the lease ended), so the promise holds as if none were in flight.
So a write's answer can carry a lease too (``StoreSetRequest.cache``): once a set applied, if
the key still holds its value and the writes of it in flight all set that value, the writer
is leased the value it wrote. c10d's store-based barrier has every node that sees the full
count set the last-worker key and then wait for it; with the lease, its bridge answers that
wait itself, where it was one more call per node.

The cost: a write to a key a bridge holds waits up to ``LEASE_S``. c10d's bootstrap keys are
written once and then read (gloo's addresses, NCCL's id, a barrier's last-worker key);
counters read with ADD 0 are never asked to be cached.

When a round ends its store is gone, but a bridge may still answer a read of the old round
from its cache until the lease ends or its agent closes that round's port (at the next
round), whichever comes first. Such answers are the round's final values: no write to an
ended round is accepted, so nothing answered is older than a write that completed.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ..node.api import ProposalDroppedError, ServerNode
from . import validate

T = TypeVar("T")

# How long a granted cache lease lasts, from the leader's read of the values.
LEASE_S = 1.0
# The clock-rate difference a lease tolerates: the bridge ends its lease this fraction
# early, and a new leader waits this fraction longer before its first round-store write.
DRIFT = 0.05
# Expired leases are swept once this many leases were granted since the last sweep.
_SWEEP_EVERY = 4096

# Test-only: breaks linearizability on purpose, for the negative control of
# tests/integration/test_store_cache.py. With RALLYPOINT_UNSAFE_STORE_CACHE=1 in a member's
# environment when it starts, round-store writes no longer wait for the leases on their keys,
# so a bridge may answer a read with a value overwritten before the read began. Never set it
# outside that test.
UNSAFE_STORE_CACHE = os.environ.get("RALLYPOINT_UNSAFE_STORE_CACHE") == "1"


class StoreCacheLeases:
    """The leader's cache leases on round-store keys, and the gate of round-store writes
    (see the module docstring). One per member; only its leader's calls grant or write."""

    def __init__(
        self,
        node: ServerNode,
        *,
        lease_s: float = LEASE_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.node = node
        self.lease_s = lease_s
        self._clock = clock
        self._sleep = sleep
        # When each leased key's latest lease ends (this member's clock), by (job, round).
        self._leased: dict[tuple[str, int], dict[bytes, float]] = {}
        # Writes of this term between their check and their apply (or for good, for a write
        # whose proposal timed out), by (job, round, key); and of those, the sets, by value.
        self._writing: dict[tuple[str, int, bytes], int] = {}
        self._setting: dict[tuple[str, int, bytes], dict[bytes, int]] = {}
        # The term the counts above belong to, and when its round-store writes may start.
        self._term: int | None = None
        self._writes_open_at = 0.0
        self._granted = 0

    def _leading(self) -> int | None:
        """This member's term while it leads, else None; starts the bookkeeping of a term
        it just began to lead."""
        term = self.node.leader_term()
        if term is not None and term != self._term:
            self._term = term
            self._writing.clear()
            self._setting.clear()
            # The predecessor's leases (see the module docstring), counted from when this
            # member saw itself elected (or from now, if it has not seen that yet).
            since = self.node.leader_since(term)
            start = since if since is not None else self._clock()
            self._writes_open_at = start + self.lease_s * (1 + DRIFT)
        return term

    def grant(
        self, scope: validate.Scope, keys: Sequence[bytes], values: Sequence[bytes] | None = None
    ) -> int:
        """A lease on ``keys``' ``values`` just read (no await since), in ms; 0 when none is
        granted (not the leader, or a key being written other than by sets of the value it
        holds; with ``values`` None, any write in flight refuses it)."""
        if self._leading() is None:
            return 0
        job, round_number = scope.job, scope.round
        writing = self._writing
        if writing:
            for i, key in enumerate(keys):
                slot = (job, round_number, key)
                count = writing.get(slot)
                if count and (
                    values is None or self._setting.get(slot, {}).get(values[i], 0) != count
                ):
                    return 0
        now = self._clock()
        ends = now + self.lease_s
        leased = self._leased.setdefault((job, round_number), {})
        for key in keys:
            leased[key] = ends
        self._granted += 1
        if self._granted >= _SWEEP_EVERY:
            self._sweep(now)
        return int(self.lease_s * 1000)

    async def write(
        self,
        scope: validate.Scope,
        key: bytes,
        propose: Callable[[int], Awaitable[T]],
        unchanged: Callable[[], bool] = lambda: False,
        sets: bytes | None = None,
    ) -> T:
        """``propose(term)``'s result, proposed once no lease on ``key`` is left, or at once
        if ``unchanged()`` says the write leaves the key's applied value as it is (raises
        NotLeaderError on a member that does not lead). ``sets``: the value the write sets
        the key to, if it is a set (a lease on that value may be granted meanwhile)."""
        term = self._leading()
        if term is None:
            self.node.require_leader()
            raise AssertionError("require_leader let a member that does not lead pass")
        slot = (scope.job, scope.round, key)
        self._writing[slot] = self._writing.get(slot, 0) + 1
        if sets is not None:
            by_value = self._setting.setdefault(slot, {})
            by_value[sets] = by_value.get(sets, 0) + 1
        settled = True
        try:
            while True:
                leased = self._leased.get((scope.job, scope.round))
                lease_ends = leased.get(key, 0.0) if leased else 0.0
                if lease_ends and unchanged():
                    lease_ends = 0.0  # the leased value stays right (module docstring)
                until = max(self._writes_open_at, lease_ends)
                left_s = until - self._clock() if not UNSAFE_STORE_CACHE else 0.0
                if left_s <= 0:
                    break
                await self._sleep(left_s)
                if self._leading() != term:
                    self.node.require_leader()  # raises unless it leads a new term
                    raise ProposalDroppedError(
                        f"leadership of term {term} changed while a write waited"
                    )
            try:
                return await propose(term)
            except ProposalDroppedError:
                raise  # never appended
            except BaseException:
                # Timed out, cancelled, refused: it may have applied or still apply in this
                # term, so the key stays marked (a refusal keeps it uncached, no harm).
                settled = False
                raise
        finally:
            if settled and self._term == term:
                count = self._writing.get(slot, 0) - 1
                if count > 0:
                    self._writing[slot] = count
                else:
                    self._writing.pop(slot, None)
                if sets is not None:
                    by_value = self._setting.get(slot, {})
                    left = by_value.get(sets, 0) - 1
                    if left > 0:
                        by_value[sets] = left
                    else:
                        by_value.pop(sets, None)
                        if not by_value:
                            self._setting.pop(slot, None)

    def _sweep(self, now: float) -> None:
        self._granted = 0
        for scope in list(self._leased):
            leased = self._leased[scope]
            for key in [key for key, ends in leased.items() if ends <= now]:
                del leased[key]
            if not leased:
                del self._leased[scope]
