"""The store's keys in byte order, kept in chunks so a write costs O(log n), not O(n).

Theory of operation. The keys are split, in order, into lists ("chunks") of between
``_LOAD // 2`` and ``2 * _LOAD`` keys (an only chunk may hold fewer), with the
largest key of each chunk in ``_maxes``. Finding a key's place is a bisect of ``_maxes`` and
one of its chunk; adding or removing it moves at most one chunk's tail (``2 * _LOAD``
pointers). One sorted list moved the tail of the whole index on every new key: 140 us a put
at a million keys, 10 us at 100,000, and the leader of a busy cluster paid it on every
write. A chunk that grows past ``2 * _LOAD`` splits in two; one that shrinks below
``_LOAD // 2`` merges with a neighbour, so the number of chunks stays within ``n / (_LOAD /
2)`` whatever the order of writes and deletes. Ranges are read chunk by chunk with
slices (C-speed, no Python step per key). It is the structure B-trees and
``sortedcontainers`` use, kept to what the store asks of it.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator

# A chunk splits above twice this many keys and merges below half of it.
_LOAD = 1_000
# Up to this many keys of one chunk are removed one bisect at a time; more, and one pass
# rebuilding the chunk costs less.
_ONE_BY_ONE = 32


class SortedKeys:
    """A sorted set of byte keys: ``add``, ``remove_many``, ordered reads from a position."""

    __slots__ = ("_chunks", "_len", "_maxes")

    def __init__(self) -> None:
        # Invariant: chunks non-empty, each ascending, every key of chunk i below every key of
        # chunk i + 1, at most 2 * _LOAD keys each and, when there are several, at least
        # _LOAD // 2; _maxes[i] == _chunks[i][-1]; _len the sum of their lengths.
        self._chunks: list[list[bytes]] = []
        self._maxes: list[bytes] = []
        self._len = 0

    @classmethod
    def from_sorted(cls, keys: list[bytes]) -> SortedKeys:
        """The index of ``keys``, which must be ascending with no repeats."""
        index = cls()
        for start in range(0, len(keys), _LOAD):
            chunk = keys[start : start + _LOAD]
            if len(chunk) < _LOAD // 2 and index._chunks:
                # A short remainder joins the chunk before it (at most 1.5 x _LOAD keys).
                index._chunks[-1].extend(chunk)
                index._maxes[-1] = chunk[-1]
                continue
            index._chunks.append(chunk)
            index._maxes.append(chunk[-1])
        index._len = len(keys)
        return index

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[bytes]:
        return itertools.chain.from_iterable(self._chunks)

    def chunk_lengths(self) -> list[int]:
        """How many keys each chunk holds, in order (what one add or remove may move)."""
        return [len(chunk) for chunk in self._chunks]

    def copy(self) -> SortedKeys:
        clone = SortedKeys()
        clone._chunks = [chunk.copy() for chunk in self._chunks]
        clone._maxes = self._maxes.copy()
        clone._len = self._len
        return clone

    def add(self, key: bytes) -> None:
        """Insert ``key``, which must not be in the index (the store checks its map first)."""
        chunks, maxes = self._chunks, self._maxes
        self._len += 1
        if not maxes:
            chunks.append([key])
            maxes.append(key)
            return
        i = bisect.bisect_left(maxes, key)
        if i == len(maxes):
            # Above every key: the common case of ascending keys appends at the end.
            i -= 1
            chunk = chunks[i]
            chunk.append(key)
            maxes[i] = key
        else:
            chunk = chunks[i]
            bisect.insort(chunk, key)
        if len(chunk) > 2 * _LOAD:
            self._split(i)

    def remove_many(self, keys: list[bytes]) -> None:
        """Remove ``keys`` (ascending, no repeats, all present).

        O(k log n) for k keys: each chunk they fall in loses its run of them in one slice
        deletion when the run is contiguous (a prefix), else one bisect per key when few, else
        one pass rebuilding the chunk. A key not present is an AssertionError (the store's map
        and this index disagree).
        """
        chunks, maxes = self._chunks, self._maxes
        touched: list[int] = []
        position = 0
        while position < len(keys):
            key = keys[position]
            i = bisect.bisect_left(maxes, key)
            if i == len(maxes):
                raise AssertionError(f"key {key!r} missing from the sorted index")
            chunk = chunks[i]
            # The keys of this run fall in chunk i: up to its largest key. A chunk emptied
            # earlier in this call keeps its old largest key until the end, which still
            # routes every later key past it.
            end = bisect.bisect_right(keys, maxes[i], position)
            run = keys[position:end]
            first = bisect.bisect_left(chunk, run[0])
            if chunk[first : first + len(run)] == run:
                del chunk[first : first + len(run)]
            elif len(run) <= _ONE_BY_ONE:
                for each in run:
                    at = bisect.bisect_left(chunk, each)
                    if at == len(chunk) or chunk[at] != each:
                        raise AssertionError(f"key {each!r} missing from the sorted index")
                    del chunk[at]
            else:
                gone = set(run)
                kept = [each for each in chunk if each not in gone]
                if len(kept) != len(chunk) - len(run):
                    raise AssertionError("keys to remove missing from the sorted index")
                chunk[:] = kept
            touched.append(i)
            position = end
        self._len -= len(keys)
        # From the last touched chunk down, so the indexes still to visit do not move.
        for i in reversed(touched):
            chunk = chunks[i]
            if not chunk:
                del chunks[i]
                del maxes[i]
                continue
            maxes[i] = chunk[-1]
            if len(chunk) < _LOAD // 2 and len(chunks) > 1:
                self._merge(i)

    def iter_from(self, key: bytes, inclusive: bool = True) -> Iterator[bytes]:
        """The keys from ``key`` on (or strictly after it), ascending; each chunk is read as a
        slice when the iteration reaches it."""
        chunks, maxes = self._chunks, self._maxes
        find = bisect.bisect_left if inclusive else bisect.bisect_right
        i = find(maxes, key)
        if i == len(maxes):
            return
        yield from chunks[i][find(chunks[i], key) :]
        for chunk in chunks[i + 1 :]:
            yield from chunk

    def between(self, low: bytes, high: bytes | None, limit: int = 0) -> list[bytes]:
        """The keys ``k`` with ``low <= k < high`` (no upper bound if ``high`` is None),
        ascending, at most ``limit`` of them (0: all)."""
        found: list[bytes] = []
        for chunk, start, stop in self._spans(low, high):
            found.extend(chunk[start:stop])
            if limit and len(found) >= limit:
                del found[limit:]
                break
        return found

    def count_between(self, low: bytes, high: bytes | None) -> int:
        """How many keys ``k`` have ``low <= k < high``: O(log n + chunks spanned)."""
        return sum(stop - start for _, start, stop in self._spans(low, high))

    def _spans(self, low: bytes, high: bytes | None) -> Iterator[tuple[list[bytes], int, int]]:
        """Each chunk holding keys in ``[low, high)`` with the bounds of those keys in it."""
        chunks, maxes = self._chunks, self._maxes
        i = bisect.bisect_left(maxes, low)
        start = bisect.bisect_left(chunks[i], low) if i < len(chunks) else 0
        while i < len(chunks):
            chunk = chunks[i]
            if high is not None and maxes[i] >= high:
                yield chunk, start, bisect.bisect_left(chunk, high, start)
                return
            yield chunk, start, len(chunk)
            start = 0
            i += 1

    def _split(self, i: int) -> None:
        chunk = self._chunks[i]
        upper = chunk[_LOAD:]
        del chunk[_LOAD:]
        self._maxes[i] = chunk[-1]
        self._chunks.insert(i + 1, upper)
        self._maxes.insert(i + 1, upper[-1])

    def _merge(self, i: int) -> None:
        """Chunk ``i`` (too small) joins its next neighbour, or its previous if it is last."""
        chunks, maxes = self._chunks, self._maxes
        lower = i if i + 1 < len(chunks) else i - 1
        merged = chunks[lower] + chunks[lower + 1]
        chunks[lower] = merged
        maxes[lower] = merged[-1]
        del chunks[lower + 1]
        del maxes[lower + 1]
        if len(merged) > 2 * _LOAD:
            self._split(lower)
