"""Proposals and their waiters: how a caller's request finds its answer in the applied log.

Theory of operation (etcd's ``pkg/wait`` and ``pkg/idutil``). A member that proposes an
entry frames it with its own member id and a proposal id (``wrap``) and registers a future
under that id (``Waiters``). The entry travels through Raft; when the Ready loop applies it,
on every member, the member named in the frame resolves its future with the state
machine's result (``Waiters.trigger``); the others find no waiter and do nothing. So the
answer a caller gets is exactly what the replicated apply produced.

Proposal ids must never repeat for one member, not even across restarts: a committed entry
of an earlier life, applied again after a restart, would otherwise answer a waiter of this
life with another request's result. ``ProposalIds`` puts the member's life in the high bits
(as etcd's idutil puts the boot time): the boot count, kept in the data directory, offset by
the incarnation, drawn at random whenever the member starts from empty storage. The boot
count alone is not enough: a member that lost its data directory lost its boot count with
it, and counted its lives from the start again, while the log it then replays holds the
entries of its first life. And because two random offsets can still meet, a waiter also
keeps the entry it proposed and is answered only by that very entry (``Waiters.trigger``):
an entry of another life with the same id is not its answer, whatever the odds.

A waiter ends in exactly one way: its entry applies (result), the caller's deadline passes
(``ProposalTimeoutError``: it may still apply), the core drops the proposal
(``ProposalDroppedError``), or the member loses its leader or stops (``fail_all``). The
registration is removed in every case, so the table holds only live waiters.

The leader's proposals reach the core together (``Proposals``): the callers of one loop turn
(and those that came while the Ready loop waited on the disk) queue their entries, and the
Ready loop proposes them as one message of many entries before it takes the next Ready. One
MsgProp of N entries makes one append per follower where N proposals made N (each stepped,
encoded, signed, appended and acknowledged on its own), which is what a burst of concurrent
writes (a barrier's adds, many clients' puts) costs most.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rallypoint.raft import ProposalDroppedError as RaftProposalDroppedError
from rallypoint.raft.codec import decode_conf_change
from rallypoint.raft.types import Entry, EntryType

from ..member_table import ConfChangeContext
from ..state.commands import Envelope, decode_envelope
from .api import ProposalDroppedError, ProposalTimeoutError

__all__ = [
    "ENTRY_HEADER",
    "DecodedEntries",
    "ProposalIds",
    "Waiters",
    "unwrap",
    "validate_entries",
    "wrap",
]

# Entry data written by this driver: a version byte, the proposing member, the proposal id,
# then the encoded Envelope. Empty data is the leader's no-op.
ENTRY_HEADER = struct.Struct(">BQQ")
ENTRY_VERSION = 1


def wrap(proposer_id: int, proposal_id: int, payload: bytes) -> bytes:
    return ENTRY_HEADER.pack(ENTRY_VERSION, proposer_id, proposal_id) + payload


def unwrap(data: bytes) -> tuple[int, int, bytes]:
    """(proposer id, proposal id, payload) of a committed entry; a malformed one is a broken
    invariant (``validate_entries`` keeps them out of the log)."""
    if len(data) < ENTRY_HEADER.size:
        raise AssertionError(f"committed entry too short for its header: {len(data)} bytes")
    version, proposer_id, proposal_id = ENTRY_HEADER.unpack_from(data)
    if version != ENTRY_VERSION:
        raise AssertionError(f"committed entry has unknown version {version}")
    return proposer_id, proposal_id, data[ENTRY_HEADER.size :]


def validate_entries(entries: tuple[Entry, ...]) -> list[Envelope | None]:
    """Raise ValueError unless every entry a peer sent would apply: a normal entry is the
    leader's no-op or a wrapped command this version decodes, a configuration change
    decodes with its context. (Applying a committed entry that does not decode stops every
    member that reaches it, so it must never be persisted.) Each entry's decoded envelope
    (None for a no-op or configuration change)."""
    envelopes: list[Envelope | None] = []
    for entry in entries:
        envelope = None
        if entry.type is EntryType.CONF_CHANGE:
            ConfChangeContext.decode(decode_conf_change(entry.data).context)
        elif entry.data:
            if len(entry.data) < ENTRY_HEADER.size:
                raise ValueError(f"entry {entry.index} is too short for its header")
            version = entry.data[0]
            if version != ENTRY_VERSION:
                raise ValueError(f"entry {entry.index} has unknown version {version}")
            envelope = decode_envelope(entry.data[ENTRY_HEADER.size :])
        envelopes.append(envelope)
    return envelopes


class DecodedEntries:
    """The envelopes a follower decoded to validate a leader's entries, kept until those
    entries apply, so each is decoded once, not twice (validating and applying each cost
    ~10 us a Put on every follower).

    Keyed by index, and used only for the very entry validated (the same ``data`` object):
    an entry that reached the log another way (a copy received earlier, a restart's replay)
    is decoded at apply, as before. Decoding is a pure function of the bytes and nothing
    else holds the object, so applying it is applying what decoding would give. Bounded:
    entries already applied are not kept, and the table is dropped whole past ``LIMIT``
    (entries validated but never appended: a leader's retransmissions, a truncated log)."""

    LIMIT = 65_536

    def __init__(self) -> None:
        self._by_index: dict[int, tuple[bytes, Envelope]] = {}

    def keep(
        self, entries: Sequence[Entry], envelopes: Sequence[Envelope | None], applied_index: int
    ) -> None:
        by_index = self._by_index
        if len(by_index) + len(entries) > self.LIMIT:
            by_index.clear()
        for entry, envelope in zip(entries, envelopes, strict=True):
            if envelope is not None and entry.index > applied_index:
                by_index[entry.index] = (entry.data, envelope)

    def take(self, entry: Entry) -> Envelope | None:
        kept = self._by_index.pop(entry.index, None)
        if kept is None or kept[0] is not entry.data:
            return None
        return kept[1]

    def clear(self) -> None:
        self._by_index.clear()


class ProposalIds:
    """Proposal ids unique across this member's lives: the life (the incarnation plus the
    boot count, mod 2**23) in the bits above 40, a counter below. Invariant: never hands out
    an id twice per boot; two boots of one incarnation never share an id."""

    def __init__(self, boots: int = 0, incarnation: int = 0) -> None:
        self._ids: Iterator[int] = itertools.count(1)
        self.start_boot(boots, incarnation)

    def start_boot(self, boots: int, incarnation: int = 0) -> None:
        life = (incarnation + boots) % (1 << 23)
        self._ids = itertools.count((life << 40) + 1)

    def next(self) -> int:
        return next(self._ids)


class Waiters:
    """Futures of callers waiting for their entry to apply, keyed by proposal id (etcd's
    ``wait.Wait``). Used on the event loop only. Invariant: keys are ids this member
    proposed and has not yet applied or given up on."""

    def __init__(self) -> None:
        self._futures: dict[int, asyncio.Future[Any]] = {}
        # What each waiter proposed (the entry's data, or its configuration change), when
        # given: only the entry carrying it answers the waiter.
        self._proposed: dict[int, object] = {}
        # The envelope each waiter encoded into its entry's data, for its apply (envelope).
        self._envelopes: dict[int, Envelope] = {}
        # The loop the waiters run on, taken at the first proposal (asking for the running
        # loop costs a getpid system call each time, per proposal on a busy leader).
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._futures)

    def register(
        self,
        proposal_id: int,
        submit: Callable[[], None],
        timeout_s: float,
        wake: Callable[[], None],
        proposed: object = None,
        envelope: Envelope | None = None,
        observe: Callable[[float], None] | None = None,
    ) -> asyncio.Future[Any]:
        """Register ``proposal_id``, ``submit`` the proposal to the core, ``wake`` the Ready
        loop: the future of its applied result. ``proposed``: what the entry carries (its
        data, or its configuration change); an applied entry with this id that carries
        anything else is not this proposal (see the module docstring). ``envelope``: the
        command ``proposed`` encodes, applied as is when this very entry applies here.
        ``observe``: told the seconds from proposing to applying, if it applied here.

        The deadline is a timer that fails the future with ProposalTimeoutError; however the
        future ends (answered, timed out, failed, cancelled by its caller) its registration
        and timer go with it. No task and no timeout scope per proposal: a caller awaiting
        the future resumes on the loop turn its entry applies, and a batch of callers
        (``service/kv_batch.py``) awaits its futures from one task."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._futures[proposal_id] = future
        if proposed is not None:
            self._proposed[proposal_id] = proposed
        if envelope is not None:
            self._envelopes[proposal_id] = envelope
        try:
            submit()
        except RaftProposalDroppedError as exc:
            self._forget(proposal_id)
            raise ProposalDroppedError(f"proposal dropped: {exc}") from None
        except BaseException:
            self._forget(proposal_id)
            raise
        wake()
        deadline = loop.call_later(timeout_s, _expire, future, timeout_s)
        started = loop.time()

        def finished(_: asyncio.Future[Any]) -> None:
            deadline.cancel()
            if self._futures.get(proposal_id) is future:
                self._forget(proposal_id)
            if observe is not None and not future.cancelled() and future.exception() is None:
                observe(loop.time() - started)

        future.add_done_callback(finished)
        return future

    def _forget(self, proposal_id: int) -> None:
        self._futures.pop(proposal_id, None)
        self._proposed.pop(proposal_id, None)
        self._envelopes.pop(proposal_id, None)

    def envelope(self, proposal_id: int, carried: bytes) -> Envelope | None:
        """The envelope the waiter of ``proposal_id`` encoded into ``carried``, if ``carried``
        is the very data object it proposed (the leader's own entry, as appended here; a
        copy received from a peer or read back after a restart is decoded as before), so the
        proposer does not decode its own command again at apply (~10 us a Put). Applying it
        is applying what decoding would give: decoding inverts encoding
        (tests/coordinator/test_state_codec.py), and commands are frozen and hold no
        mutable values."""
        if self._proposed.get(proposal_id) is not carried:
            return None
        return self._envelopes.get(proposal_id)

    def trigger(self, proposal_id: int, value: Any, carried: object = None) -> bool:
        """The entry ``proposal_id``, carrying ``carried``, applied with ``value``: answer its
        waiter. Returns False, answering nobody, when the waiter proposed something else
        (an entry of another life of this member with the same id); True otherwise, also
        when nobody waits."""
        proposed = self._proposed.get(proposal_id)
        if proposed is not None and carried is not None and proposed != carried:
            return False
        self._proposed.pop(proposal_id, None)
        self._envelopes.pop(proposal_id, None)
        future = self._futures.pop(proposal_id, None)
        if future is not None and not future.done():
            future.set_result(value)
        return True

    def fail(self, proposal_id: int, error: Exception) -> None:
        """The proposal ``proposal_id`` will not apply (no-op if nobody waits)."""
        self._proposed.pop(proposal_id, None)
        self._envelopes.pop(proposal_id, None)
        future = self._futures.pop(proposal_id, None)
        if future is not None and not future.done():
            future.set_exception(error)

    def fail_all(self, error: Exception) -> None:
        self._proposed = {}
        self._envelopes = {}
        futures, self._futures = self._futures, {}
        for future in futures.values():
            if not future.done():
                future.set_exception(error)


def _expire(future: asyncio.Future[Any], timeout_s: float) -> None:
    if not future.done():
        future.set_exception(
            ProposalTimeoutError(f"not applied within {timeout_s:.1f}s (it may still apply)")
        )


# The most entries one MsgProp carries (a larger queue goes as several): the core drops a
# proposal that would overflow its uncommitted-entries budget whole, so a bounded batch keeps
# one refusal from failing an unbounded number of callers.
MAX_ENTRIES_PER_PROPOSAL = 256


class Proposals:
    """The entries proposed since the Ready loop last ran, in arrival order, submitted to
    the core together by ``submit`` (see the module docstring)."""

    def __init__(self, waiters: Waiters) -> None:
        self._waiters = waiters
        self._queued: list[tuple[int, bytes]] = []
        # The queued entries bound to a leader's term, by proposal id.
        self._bound: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._queued)

    def queue(self, proposal_id: int, data: bytes, term: int | None = None) -> None:
        """Queue an entry; with ``term``, only for this member to append as that term's
        leader (see ``submit``)."""
        if term is not None:
            self._bound[proposal_id] = term
        self._queued.append((proposal_id, data))

    def submit(
        self, propose: Callable[[Sequence[bytes]], None], leader_term: int | None = None
    ) -> None:
        """``propose`` the queued entries, at most ``MAX_ENTRIES_PER_PROPOSAL`` per call; the
        callers of a batch the core refuses get ProposalDroppedError. An entry bound to a
        term other than ``leader_term`` (this member's term while it leads, None otherwise)
        is dropped instead: a follower's core would forward it to a leader that did not
        check it (``service/store_cache.py`` needs its writes appended by the leader that
        checked them)."""
        queued, self._queued = self._queued, []
        if self._bound:
            bound, self._bound = self._bound, {}
            kept = []
            for proposal_id, data in queued:
                term = bound.get(proposal_id)
                if term is None or term == leader_term:
                    kept.append((proposal_id, data))
                else:
                    self._waiters.fail(
                        proposal_id,
                        ProposalDroppedError(
                            f"proposal dropped: leadership of term {term} changed before it "
                            "was appended"
                        ),
                    )
            queued = kept
        for start in range(0, len(queued), MAX_ENTRIES_PER_PROPOSAL):
            batch = queued[start : start + MAX_ENTRIES_PER_PROPOSAL]
            try:
                propose([data for _, data in batch])
            except RaftProposalDroppedError as exc:
                for proposal_id, _ in batch:
                    self._waiters.fail(
                        proposal_id, ProposalDroppedError(f"proposal dropped: {exc}")
                    )

    def clear(self) -> None:
        """Forget the queue (its waiters are failed by the caller)."""
        self._queued = []
        self._bound = {}
