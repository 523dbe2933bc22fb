"""Linearizable reads: batching ReadIndex requests (Raft thesis 6.4).

Theory of operation. A read is linearizable if it is answered from a state that includes
every write committed before the read started. The leader learns such an index with one
round of heartbeats (ReadIndex): the commit index at the time of the request, confirmed
still to be the leader's. The read then waits until this member has applied up to it.

Reads arrive far more often than one heartbeat round takes, so they are batched: at most
one ReadIndex request is in flight; reads that arrive meanwhile queue, and when the answer
comes the next request covers all of them. Every read therefore waits for a confirmation
that *started after it did*, which is what linearizability needs (an answer to a request
issued before the read began could predate a write the reader already saw acknowledged).

A request can be lost (the leader changes, a message drops). When the leader changes the
batch in flight is re-queued in front of the newer reads and asked again of the new leader;
a request unanswered for an election timeout is asked again too. When no leader is known the
reads fail with the error the caller gives; with a new leader known they stay queued.

All of this runs on the event loop; ``read_index`` hands the request to the Raft core and
``wake`` nudges the Ready loop that carries it out.

Leader leases (``LeaderLease``; thesis 6.4.1). A leader holding a lease answers a
linearizable read from its applied state, once applied reaches its commit index, with no
round trip. It holds one while ``now < t + lease_s`` on its own monotonic clock, where ``t``
is a time, taken *before* the request was handed to the core, at which it issued a ReadIndex
request that a quorum then confirmed in the same term: every heartbeat carrying that request's
context was sent after ``t``, so each member of the confirming quorum, at some time
``t_f >= t``, was a follower of this leader in this term and reset its election timer. Renewal
is a ReadIndex round with no reads attached, asked every tick once half the lease is gone
(ordinary reads renew it too).

Why no other leader can commit anything while the lease holds, so a read served under it sees
every write completed before it began:

1. A new leader needs the votes of a quorum, which shares a member with the confirming quorum.
   If that member is this leader, it grants no vote while it leads (a leader's election timer
   never reaches the timeout, and a leader that steps down stops serving leased reads).
   Otherwise it is a follower that heard from us at ``t_f >= t``: with check_quorum it neither
   grants a vote nor a pre-vote, nor raises its term, for a higher-term candidate until its
   election timer reaches ``election_ticks`` again (leader stickiness, ``Raft.step``). Ticks
   come from ``asyncio.sleep`` on the monotonic clock, so they never come early, but the first
   may come right after ``t_f``: the earliest vote is at ``t_f + (election_ticks - 1) *
   tick_ms``. In the same term it has voted (or knows the leader) and grants nothing else.
2. ``lease_s = (election_ticks - 1) * tick_ms * (1 - CLOCK_RATE_MARGIN)``: shorter than that
   window even if the two clocks run at rates 10% apart (on one host they are the same).
3. A follower that restarts forgets whom it heard from: with leases on, the core refuses
   votes for an election timeout after it starts (``Config.leader_lease``), as if it had just
   heard from a leader. Every member must run with leases on for this to hold.
4. A leadership transfer's forced campaign overrides stickiness: the core ends the lease before
   it sends MsgTimeoutNow (``Raft.lease_fenced``) and grants none while a transfer is in
   progress, for the rest of the term.
5. A new leader's commit index may lag entries committed by earlier leaders: no lease read
   before it committed an entry of its own term (the ReadIndex rule, thesis 6.4 step 1).
6. The clock: ``CLOCK_BOOTTIME`` where there is one (it keeps counting while the machine
   sleeps; ``CLOCK_MONOTONIC`` does not). A leader that was paused (SIGSTOP, a long GC, a
   frozen VM) sees on resuming that its lease expired and falls back to ReadIndex, whose
   heartbeat round finds the newer term. The lease is checked and the state read in one
   synchronous step on the event loop, so a pause after the check delays the answer but does
   not change which state it holds.

Followers keep using ReadIndex (the leader's lease says nothing about their applied state).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from rallypoint.raft import RawNode, StateType
from rallypoint.raft.types import ReadState

__all__ = [
    "CLOCK_RATE_MARGIN",
    "LeaderLease",
    "ReadIndexBatcher",
    "lease_clock_s",
    "lease_duration_s",
]

# How far apart two members' clock rates may be (a fraction); see the docstring, point 2.
CLOCK_RATE_MARGIN = 0.1


def _boottime_s() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def lease_clock_s() -> Callable[[], float]:
    """The clock leases are timed on: CLOCK_BOOTTIME if the platform has it, else monotonic."""
    return _boottime_s if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic


def lease_duration_s(tick_ms: int, election_ticks: int) -> float:
    """How long a confirmed round keeps a leader's lease (the docstring, points 1-2)."""
    return (election_ticks - 1) * tick_ms / 1000 * (1 - CLOCK_RATE_MARGIN)


@dataclass
class _ReadBatch:
    context: bytes
    futures: list[asyncio.Future[None]]
    issued_at_s: float
    # The term this member led when it issued the request, or 0 if it did not lead.
    leader_term: int


class LeaderLease:
    """A leader's lease: until when it may serve reads without a round trip (see the module
    docstring). Used on the event loop only.

    Invariant: ``expires_at_s`` is the issue time of a request a quorum confirmed while this
    member led in ``term``, plus ``duration_s``; it only grows within a term.
    """

    def __init__(self, duration_s: float, clock_s: Callable[[], float]) -> None:
        self.duration_s = duration_s
        self._clock_s = clock_s
        self.term = 0
        self.expires_at_s = 0.0

    def confirmed(self, issued_at_s: float, leader_term: int) -> None:
        """A quorum confirmed a request issued at ``issued_at_s`` while leading in
        ``leader_term`` (0: not leading, which extends nothing)."""
        if leader_term == 0:
            return
        expires = issued_at_s + self.duration_s
        if leader_term != self.term:
            self.term, self.expires_at_s = leader_term, expires
        else:
            self.expires_at_s = max(self.expires_at_s, expires)

    def held(self, term: int) -> bool:
        """True while the lease of ``term`` (the current one) has not expired."""
        return term == self.term and self._clock_s() < self.expires_at_s

    def wants_renewal(self, term: int) -> bool:
        """Less than half the lease of ``term`` remains (or there is none)."""
        return term != self.term or self.expires_at_s - self._clock_s() < self.duration_s / 2


class ReadIndexBatcher:
    def __init__(
        self,
        read_index: Callable[[bytes], None],
        wake: Callable[[], None],
        clock_s: Callable[[], float] = time.monotonic,
        *,
        leader_term: Callable[[], int] = lambda: 0,
        on_confirmed: Callable[[float, int], None] | None = None,
    ) -> None:
        self._read_index = read_index
        self._wake = wake
        self._clock_s = clock_s
        # The term this member leads now (0 if it does not), recorded with each request, and
        # who hears of each confirmed request's (issue time, leader term): the lease.
        self._leader_term = leader_term
        self._on_confirmed = on_confirmed
        # Reads not yet covered by a request. A caller that gave up leaves its future here
        # (it waits on a shield of it); a done future is skipped when resolving.
        self._queue: list[asyncio.Future[None]] = []
        # The one request in flight and the reads it covers, if any.
        self._inflight: _ReadBatch | None = None
        # Confirmed batches waiting for the applied index to reach theirs.
        self._waiting_apply: list[tuple[int, list[asyncio.Future[None]]]] = []
        self._contexts = itertools.count(1)

    def enqueue(self) -> asyncio.Future[None]:
        """A new read: its future resolves once the state it may be answered from is
        applied."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(future)
        self.issue()
        return future

    def wait_applied(self, index: int, applied_index: int) -> asyncio.Future[None]:
        """A future that resolves once ``index`` is applied (a leased read's wait)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if index <= applied_index:
            future.set_result(None)
        else:
            self._waiting_apply.append((index, [future]))
        return future

    @property
    def waiting(self) -> bool:
        """Some read waits: queued, asked or confirmed, not yet answered (at the latest by
        ``on_applied``)."""
        return bool(self._queue or self._inflight is not None or self._waiting_apply)

    def renew(self) -> None:
        """Ask for a ReadIndex even with no read queued (it renews the leader's lease),
        unless one is in flight already (its answer renews it)."""
        self.issue(even_if_empty=True)

    def issue(self, *, even_if_empty: bool = False) -> None:
        """Ask for one ReadIndex covering every read queued since the last one was asked:
        each read waits for a confirmation that started after it did."""
        if self._inflight is not None or not (self._queue or even_if_empty):
            return
        context = next(self._contexts).to_bytes(8, "big")
        # The issue time is taken before the core sees the request, hence before any
        # heartbeat carrying its context is sent (the lease starts no later than that).
        self._inflight = _ReadBatch(context, self._queue, self._clock_s(), self._leader_term())
        self._queue = []
        self._read_index(context)
        self._wake()

    def requeue(self, leader_known: bool) -> None:
        """The request in flight may be lost (the leader changed): ask again, first."""
        batch, self._inflight = self._inflight, None
        if batch is not None:
            self._queue = batch.futures + self._queue
        if leader_known:
            self.issue()

    def retry_if_lost(self, timeout_s: float, leader_known: bool) -> None:
        """Called every tick: a request unanswered for ``timeout_s`` is asked again."""
        batch = self._inflight
        if batch is not None and self._clock_s() - batch.issued_at_s > timeout_s:
            self.requeue(leader_known)

    def on_read_state(self, read_state: ReadState, applied_index: int) -> None:
        batch = self._inflight
        if batch is None or read_state.request_ctx != batch.context:
            return  # the answer to a request given up on
        self._inflight = None
        if self._on_confirmed is not None:
            self._on_confirmed(batch.issued_at_s, batch.leader_term)
        if read_state.index <= applied_index:
            _resolve(batch.futures)
        else:
            self._waiting_apply.append((read_state.index, batch.futures))
        self.issue()

    def on_applied(self, applied_index: int) -> None:
        still_waiting = []
        for index, futures in self._waiting_apply:
            if index <= applied_index:
                _resolve(futures)
            else:
                still_waiting.append((index, futures))
        self._waiting_apply = still_waiting

    def fail_queued(self, error: Exception, keep: bool) -> None:
        """The leader changed or the member stops: fail the queued reads with ``error``, or
        ``keep`` them to ask the new leader."""
        if keep:
            return
        reads, self._queue = self._queue, []
        for future in reads:
            if not future.done():
                future.set_exception(error)
                # A caller still waiting gets the error through its shield; one that gave
                # up never reads it, and the loop would log it as never retrieved.
                future.exception()


def _resolve(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)


class LinearizableReads(ReadIndexBatcher):
    """The ReadIndex batcher of a running member, with its leader lease: what a linearizable
    read waits on (``wait``), and the lease renewal the tick loop asks for."""

    def __init__(
        self,
        raw: Callable[[], RawNode],
        wake: Callable[[], None],
        *,
        lease_reads: bool,
        tick_ms: int,
        election_ticks: int,
    ) -> None:
        clock_s = lease_clock_s()
        self.lease = LeaderLease(lease_duration_s(tick_ms, election_ticks), clock_s)
        self._raw = raw
        self._lease_reads = lease_reads
        super().__init__(
            lambda context: raw().read_index(context),
            wake,
            clock_s,
            leader_term=self._leading_term,
            on_confirmed=self.lease.confirmed,
        )

    def _leading_term(self) -> int:
        """The term this member's core leads in, or 0 (a ReadIndex request is issued under
        it: only a request issued while leading renews the lease)."""
        status = self._raw().basic_status()
        leading = status.soft_state.raft_state is StateType.LEADER
        return int(status.hard_state.term) if leading else 0

    def wait(self, applied_index: int) -> asyncio.Future[None]:
        """A read's wait: under this leader's lease, for the state applied up to its commit
        index (done at once if applied); otherwise a ReadIndex request's."""
        if self._lease_reads:
            found = self._raw().lease_read_index()
            if found is not None and self.lease.held(int(found[0])):
                return self.wait_applied(int(found[1]), applied_index)
        return self.enqueue()

    def renew_lease(self) -> None:
        """A leader whose lease is half gone asks a quorum again."""
        if not self._lease_reads:
            return
        found = self._raw().lease_read_index()
        if found is not None and self.lease.wants_renewal(int(found[0])):
            self.renew()
