"""The Raft log: stable storage followed by the unstable tail, with commit and apply marks.

Theory of operation (etcd-io/raft ``log.go``): the log is ``storage`` (persisted entries
after a snapshot) followed by ``unstable`` (entries accepted but not yet persisted). The
marks satisfy ``applied <= applying <= committed <= last_index()``: ``committed`` is the
highest index known committed, ``applying`` the highest handed to the application, and
``applied`` the highest the application confirmed applied.

The paper's safety rule for commitment (section 5.4.2, Figure 8: a leader never commits an
entry of an earlier term by counting replicas) is enforced in exactly one place,
``maybe_commit``. Committed entries are only handed out once persisted locally, so a crash
never loses an applied entry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from .log_storage import (
    CompactedError,
    Storage,
    UnavailableError,
    entries_size,
    limit_size,
)
from .log_unstable import Unstable
from .types import Entry, EntryType, Index, Snapshot, Term


class Logger(Protocol):
    """What the core needs of a logger: the stdlib ``logging.Logger`` methods it calls."""

    def debug(self, msg: object, *args: object) -> None: ...

    def info(self, msg: object, *args: object) -> None: ...

    def warning(self, msg: object, *args: object) -> None: ...

    def error(self, msg: object, *args: object) -> None: ...


class RaftLog:
    """The log of one node.

    Invariants: ``applied <= applying <= committed <= last_index()``; the entry at every
    index in ``[first_index() - 1, last_index()]`` has a known term.
    """

    def __init__(
        self,
        storage: Storage,
        logger: Logger | None = None,
        max_applying_ents_size: int = 0,
    ) -> None:
        # The persisted part of the log.
        self.storage = storage
        first_index = storage.first_index()
        last_index = storage.last_index()
        # Entries (and a snapshot) not yet persisted; starts right after storage.
        self.unstable = Unstable(Index(last_index + 1))
        # Highest index known to be committed (replicated on a quorum, section 5.3).
        self.committed = Index(first_index - 1)
        # Highest index handed to the application for applying (applied <= applying).
        self.applying = Index(first_index - 1)
        # Highest index the application has applied.
        self.applied = Index(first_index - 1)
        # Byte limit of committed entries being applied at once; 0 = no limit.
        self.max_applying_ents_size = max_applying_ents_size
        # Bytes of entries handed out for applying and not yet confirmed applied.
        self.applying_ents_size = 0
        # True when no more committed entries are handed out until applies are confirmed.
        self.applying_ents_paused = False
        self.logger: Logger = logger or logging.getLogger("rallypoint.raft")

    def __str__(self) -> str:
        return (
            f"committed={self.committed}, applied={self.applied}, applying={self.applying}, "
            f"unstable.offset={self.unstable.offset}, "
            f"unstable.offset_in_progress={self.unstable.offset_in_progress}, "
            f"len(unstable.entries)={len(self.unstable.entries)}"
        )

    # -- appending ----------------------------------------------------------------------

    def maybe_append(
        self, index: Index, log_term: Term, committed: Index, ents: tuple[Entry, ...] | list[Entry]
    ) -> tuple[Index, bool]:
        """Append a leader's entries following ``(index, log_term)`` (the MsgApp rule, 5.3).

        Returns ``(last new index, True)`` if the log contains ``(index, log_term)``, after
        overwriting any conflicting suffix and advancing commit to ``min(committed, last
        new index)``; ``(0, False)`` if it does not.
        """
        if not self.match_term(index, log_term):
            return Index(0), False
        last_new = Index(index + len(ents))
        conflict = self.find_conflict(ents)
        if conflict:
            if conflict <= self.committed:
                raise AssertionError(
                    f"entry {conflict} conflicts with committed entry [committed({self.committed})]"
                )
            offset = index + 1
            if conflict - offset > len(ents):
                raise AssertionError(f"conflict index {conflict} beyond the appended entries")
            self.append(ents[conflict - offset :])
        self.commit_to(Index(min(committed, last_new)))
        return last_new, True

    def append(self, ents: tuple[Entry, ...] | list[Entry]) -> Index:
        """Append entries (truncating any conflicting unstable suffix); returns last index."""
        if not ents:
            return self.last_index()
        after = ents[0].index - 1
        if after < self.committed:
            raise AssertionError(f"after({after}) is out of range [committed({self.committed})]")
        self.unstable.truncate_and_append(ents)
        return self.last_index()

    def find_conflict(self, ents: tuple[Entry, ...] | list[Entry]) -> Index:
        """The first index of ``ents`` whose term differs from ours (or is new); 0 if none.

        Entries must be contiguous. A returned index beyond ``last_index()`` means the entries
        are simply new.
        """
        for entry in ents:
            if not self.match_term(entry.index, entry.term):
                if entry.index <= self.last_index():
                    self.logger.info(
                        "found conflict at index %d [existing term: %d, conflicting term: %d]",
                        entry.index,
                        self.zero_term_on_out_of_bounds(entry.index),
                        entry.term,
                    )
                return entry.index
        return Index(0)

    def find_conflict_by_term(self, index: Index, term: Term) -> tuple[Index, Term]:
        """The largest ``(i, term(i))`` with ``i <= index`` and ``term(i) <= term``.

        Fast log backtracking (thesis 5.3 optimisation): every entry after the returned
        index has a term above ``term``, so cannot match an entry whose predecessor has term
        ``term``. An unknown term (compacted) is returned as ``(i, 0)``: a possible match.
        """
        while index > 0:
            try:
                our_term = self.term(index)
            except (CompactedError, UnavailableError):
                return index, Term(0)
            if our_term <= term:
                return index, our_term
            index = Index(index - 1)
        return Index(0), Term(0)

    # -- reading ------------------------------------------------------------------------

    def first_index(self) -> Index:
        first = self.unstable.maybe_first_index()
        if first is not None:
            return first
        return self.storage.first_index()

    def last_index(self) -> Index:
        last = self.unstable.maybe_last_index()
        if last is not None:
            return last
        return self.storage.last_index()

    def last_term(self) -> Term:
        return self.term(self.last_index())

    def term(self, index: Index) -> Term:
        """The term of entry ``index``; raises CompactedError / UnavailableError outside
        ``[first_index() - 1, last_index()]``."""
        term = self.unstable.maybe_term(index)
        if term is not None:
            return term
        # The entry before first_index is compacted but its term is kept for matching.
        if index + 1 < self.first_index():
            raise CompactedError(index)
        if index > self.last_index():
            raise UnavailableError(index)
        return self.storage.term(index)

    def zero_term_on_out_of_bounds(self, index: Index) -> Term:
        try:
            return self.term(index)
        except (CompactedError, UnavailableError):
            return Term(0)

    def match_term(self, index: Index, term: Term) -> bool:
        try:
            return self.term(index) == term
        except (CompactedError, UnavailableError):
            return False

    def is_up_to_date(self, last_index: Index, term: Term) -> bool:
        """True if a log ending at ``(last_index, term)`` is at least as up to date (5.4.1)."""
        our_term = self.last_term()
        return term > our_term or (term == our_term and last_index >= self.last_index())

    def entries(self, index: Index, max_size: int | None = None) -> list[Entry]:
        """Entries from ``index`` to the end, at most ``max_size`` bytes (at least one)."""
        last = self.last_index()
        if index > last:
            return []
        return self.slice(index, Index(last + 1), max_size)

    def all_entries(self) -> list[Entry]:
        """Every entry still in the log (tests and debugging)."""
        return self.entries(self.first_index())

    def snapshot(self) -> Snapshot:
        """The latest snapshot (the unstable one if any); may raise
        SnapshotTemporarilyUnavailableError."""
        if self.unstable.snapshot is not None:
            return self.unstable.snapshot
        return self.storage.snapshot()

    def slice(self, lo: Index, hi: Index, max_size: int | None = None) -> list[Entry]:
        """Entries in ``[lo, hi)``, at most ``max_size`` bytes but at least one entry.

        Raises CompactedError if ``lo`` was compacted.
        """
        self._check_out_of_bounds(lo, hi)
        if lo == hi:
            return []
        offset = self.unstable.offset
        if lo >= offset:
            return limit_size(self.unstable.slice(lo, hi), max_size)
        cut = min(hi, offset)
        try:
            ents = self.storage.entries(lo, Index(cut), max_size)
        except UnavailableError as exc:
            raise AssertionError(f"entries[{lo}:{cut}) is unavailable from storage: {exc}") from exc
        if hi <= offset:
            return ents
        # Storage returned fewer entries than asked: the size limit was reached.
        if len(ents) < cut - lo:
            return ents
        size = entries_size(ents)
        if max_size is not None and size >= max_size:
            return ents
        rest = self.unstable.slice(offset, hi)
        if max_size is not None:
            rest = limit_size(rest, max_size - size)
            # limit_size keeps at least one entry; drop it if it does not fit.
            if len(rest) == 1 and size + entries_size(rest) > max_size:
                return ents
        return [*ents, *rest]

    def _check_out_of_bounds(self, lo: Index, hi: Index) -> None:
        if lo > hi:
            raise AssertionError(f"invalid slice {lo} > {hi}")
        first = self.first_index()
        if lo < first:
            raise CompactedError(lo)
        last = self.last_index()
        if hi > last + 1:
            raise AssertionError(f"slice[{lo},{hi}) out of bound [{first},{last}]")

    def scan(
        self, lo: Index, hi: Index, page_size: int | None, visit: Callable[[list[Entry]], bool]
    ) -> None:
        """Visit the entries in ``[lo, hi)`` page by page until ``visit`` returns False."""
        while lo < hi:
            page = self.slice(lo, hi, page_size)
            if not page:
                raise AssertionError(f"got empty slice of [{lo},{hi})")
            if not visit(page):
                return
            lo = Index(lo + len(page))

    def has_conf_change_between(self, lo: Index, hi: Index) -> bool:
        """True if an entry in ``[lo, hi)`` is a configuration change."""
        found = False

        def visit(page: list[Entry]) -> bool:
            nonlocal found
            found = any(e.type is EntryType.CONF_CHANGE for e in page)
            return not found

        self.scan(lo, hi, self.max_applying_ents_size or None, visit)
        return found

    # -- unstable -> stable ----------------------------------------------------------------

    def next_unstable_ents(self) -> list[Entry]:
        """Unstable entries not yet handed out for persisting."""
        return self.unstable.next_entries()

    def has_next_unstable_ents(self) -> bool:
        return bool(self.unstable.next_entries())

    def has_next_or_in_progress_unstable_ents(self) -> bool:
        return bool(self.unstable.entries)

    def next_unstable_snapshot(self) -> Snapshot | None:
        return self.unstable.next_snapshot()

    def has_next_unstable_snapshot(self) -> bool:
        return self.unstable.next_snapshot() is not None

    def has_next_or_in_progress_snapshot(self) -> bool:
        return self.unstable.snapshot is not None

    def accept_unstable(self) -> None:
        self.unstable.accept_in_progress()

    def stable_to(self, index: Index, term: Term) -> None:
        self.unstable.stable_to(index, term)

    def stable_snap_to(self, index: Index) -> None:
        self.unstable.stable_snap_to(index)

    # -- commit and apply ----------------------------------------------------------------

    def commit_to(self, to_commit: Index) -> None:
        """Advance commit to ``to_commit`` (never backwards)."""
        if self.committed < to_commit:
            if self.last_index() < to_commit:
                raise AssertionError(
                    f"to_commit({to_commit}) is out of range [last_index({self.last_index()})]. "
                    "Was the raft log corrupted, truncated, or lost?"
                )
            self.committed = to_commit

    def maybe_commit(self, max_index: Index, term: Term) -> bool:
        """Commit up to ``max_index`` iff it is newer and its entry is of ``term``.

        This is the Raft paper's rule of section 5.4.2 (Figure 8): a leader only commits an
        entry by counting replicas if the entry is from its current term; earlier entries
        are committed indirectly, by the Log Matching Property. ``term`` is never 0 for a
        leader, so an unknown (compacted) term never matches.
        """
        if (
            max_index > self.committed
            and term != 0
            and self.zero_term_on_out_of_bounds(max_index) == term
        ):
            self.commit_to(max_index)
            return True
        return False

    def _max_appliable_index(self) -> Index:
        # Only entries already persisted locally are handed out for applying.
        return Index(min(self.committed, self.unstable.offset - 1))

    def has_next_committed_ents(self) -> bool:
        if self.applying_ents_paused or self.has_next_or_in_progress_snapshot():
            return False
        return self.applying < self._max_appliable_index()

    def next_committed_ents(self) -> list[Entry]:
        """Committed, persisted entries not yet handed out for applying (size-limited)."""
        if self.applying_ents_paused or self.has_next_or_in_progress_snapshot():
            # Entries after a pending snapshot cannot be applied before the snapshot is.
            return []
        lo, hi = Index(self.applying + 1), Index(self._max_appliable_index() + 1)
        if lo >= hi:
            return []
        max_size: int | None = None
        if self.max_applying_ents_size:
            max_size = self.max_applying_ents_size - self.applying_ents_size
            if max_size <= 0:
                raise AssertionError(
                    f"applying entry size ({self.applying_ents_size}-"
                    f"{self.max_applying_ents_size})={max_size} not positive"
                )
        return self.slice(lo, hi, max_size)

    def accept_applying(self, index: Index, size_bytes: int) -> None:
        """Entries up to ``index`` (``size_bytes`` in total) were handed out for applying."""
        if self.committed < index:
            raise AssertionError(f"applying({index}) is out of range [committed({self.committed})]")
        self.applying = index
        self.applying_ents_size += size_bytes
        # Pause when over the limit, or when the handed-out batch was cut short by it (the
        # next entry would not fit either).
        limit = self.max_applying_ents_size
        self.applying_ents_paused = (
            limit > 0 and self.applying_ents_size >= limit
        ) or index < self._max_appliable_index()

    def applied_to(self, index: Index, size_bytes: int = 0) -> None:
        """The application applied entries up to ``index``."""
        if self.committed < index or index < self.applied:
            raise AssertionError(
                f"applied({index}) is out of range [prev_applied({self.applied}), "
                f"committed({self.committed})]"
            )
        self.applied = index
        self.applying = Index(max(self.applying, index))
        self.applying_ents_size = max(0, self.applying_ents_size - size_bytes)
        limit = self.max_applying_ents_size
        self.applying_ents_paused = limit > 0 and self.applying_ents_size >= limit

    def restore(self, snap: Snapshot) -> None:
        """Replace the log with ``snap`` (a follower installing a leader's snapshot)."""
        self.logger.info(
            "log [%s] starts to restore snapshot [index: %d, term: %d]",
            self,
            snap.metadata.index,
            snap.metadata.term,
        )
        self.committed = snap.metadata.index
        self.unstable.restore(snap)
