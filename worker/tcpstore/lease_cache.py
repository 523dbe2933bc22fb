"""The values the leader leased to the bridge, and which keys to read ahead with leases.

Theory of operation. A coordinator read may ask the leader for a lease on the values it
returns (``coordinator/service/store_cache.py``): until the lease ends, counted from before
the call was sent, the leader changes none of those keys. So while one runs, a read of those
keys is answered from :class:`LeaseCache` without a call, as linearizably as a call would
answer it. gloo's full mesh reads every key once per rank of the node and each get three
times; with leases a node's bridge calls once per key.

:class:`Prefetch` cuts that further: a read missing a key that ends in a number
(``<prefix><n>``: gloo's full mesh reads ``0//cpu//0/0``, ``.../1``, ... in order, every rank
of a node in step), right after a leased read of ``<prefix><n-1>``, also asks with leases for
the keys that follow (``<prefix><n+1>``, ...): up to ``PREFETCH_KEYS``, fewer once the
prefix's values are known to be large, so at most about ``PREFETCH_BYTES``. A prefetched
value is a leased read like any other, answering only reads that arrive while its lease
runs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

PREFETCH_KEYS = 32
PREFETCH_BYTES = 256 * 1024
# Leased values are swept of ended leases once this many are held (and at twice what was
# left after the last sweep).
_SWEEP_LEASED = 4096


def numbered(key: bytes) -> tuple[bytes, int] | None:
    """``key`` as ``<prefix><n>`` (a decimal number without leading zeros at its end), or
    None."""
    end = len(key)
    start = end
    while start > 0 and 0x30 <= key[start - 1] <= 0x39:
        start -= 1
    if start == end or (key[start] == 0x30 and end - start > 1) or end - start > 18:
        return None
    return key[:start], int(key[start:])


class LeaseCache:
    """Leased values by key, each with the time its lease ends on ``time.monotonic()``."""

    def __init__(self) -> None:
        self._leased: dict[bytes, tuple[bytes, float]] = {}
        self._sweep_at = _SWEEP_LEASED

    def __bool__(self) -> bool:
        """Whether any value is held (its lease may have ended)."""
        return bool(self._leased)

    def __contains__(self, key: bytes) -> bool:
        """Whether a value of ``key`` is held, its lease running or not."""
        return key in self._leased

    def leased(self, keys: Sequence[bytes]) -> list[bytes] | None:
        """The keys' values if a lease on each still runs, else None."""
        leased = self._leased
        if not leased:
            return None
        now = time.monotonic()
        values = []
        for key in keys:
            held = leased.get(key)
            if held is None or held[1] <= now:
                return None
            values.append(held[0])
        return values

    def keep(
        self, keys: Sequence[bytes], values: Sequence[bytes], started: float, lease_s: float
    ) -> None:
        """Hold ``values`` for ``lease_s`` (0: no lease) from ``started``, before their call."""
        if lease_s <= 0:
            return
        ends = started + lease_s
        leased = self._leased
        for key, value in zip(keys, values, strict=True):
            leased[key] = (value, ends)
        if len(leased) >= self._sweep_at:
            now = time.monotonic()
            for key in [key for key, (_, until) in leased.items() if until <= now]:
                del leased[key]
            self._sweep_at = max(_SWEEP_LEASED, 2 * len(leased))

    def clear(self) -> None:
        self._leased = {}


class Prefetch:
    """Which keys to read ahead, learnt per prefix from the sizes of its values."""

    def __init__(self, cache: LeaseCache) -> None:
        self._cache = cache
        # How many keys to prefetch after a numbered key, by prefix (0: never again).
        self._count: dict[bytes, int] = {}

    def _ahead(self, keys: Sequence[bytes]) -> tuple[bytes, int, int] | None:
        """(prefix, n, how many keys to read after it) when ``keys`` is one numbered key
        ``<prefix><n>`` whose predecessor ``<prefix><n-1>`` this bridge read with a lease
        (keys read in sequence, as gloo's are) and its prefix's prefetch is not off; else
        None."""
        if len(keys) != 1 or (parts := numbered(keys[0])) is None:
            return None
        prefix, number = parts
        count = self._count.get(prefix, PREFETCH_KEYS)
        if not count or prefix + b"%d" % (number - 1) not in self._cache:
            return None
        return prefix, number, count

    def in_sequence(self, keys: Sequence[bytes]) -> bool:
        """Whether a read of ``keys`` would read ahead (see :meth:`following`)."""
        return self._ahead(keys) is not None

    def following(
        self, groups: dict[tuple[bytes, ...], int], lease: list[bool]
    ) -> dict[bytes, bytes]:
        """The keys to prefetch with these groups, each with its prefix: after each leased
        read of one numbered key ``<prefix><n>`` whose predecessor ``<prefix><n-1>`` this
        bridge read with a lease (keys read in sequence, as gloo's are), the keys
        ``<prefix><n+1>``, ... that no lease holds, up to the prefix's count."""
        cache = self._cache
        following: dict[bytes, bytes] = {}
        for keys, at in groups.items():
            ahead = self._ahead(keys) if lease[at] else None
            if ahead is None:
                continue  # not read in sequence (or not leased): no prefetch
            prefix, number, count = ahead
            for n in range(number + 1, number + 1 + count):
                key = prefix + b"%d" % n
                if (key,) not in groups and key not in following and cache.leased((key,)) is None:
                    following[key] = prefix
        return following

    def refused(self, prefixes: set[bytes]) -> None:
        """The coordinator refused a prefetch of these prefixes (too large, a key too long):
        none for them, for good."""
        for prefix in prefixes:
            self._count[prefix] = 0

    def learn(
        self,
        groups: dict[tuple[bytes, ...], int],
        answer: Sequence[tuple[list[bytes] | None, float]],
    ) -> None:
        """Set how many keys to prefetch after each numbered key read: about
        ``PREFETCH_BYTES`` of values of the size its prefix's keys hold (none, for good,
        after a prefix whose prefetch the coordinator refused)."""
        sizes: dict[bytes, int] = {}
        for keys, at in groups.items():
            values = answer[at][0]
            if values is None or len(keys) != 1:
                continue
            parts = numbered(keys[0])
            if parts is not None:
                prefix = parts[0]
                sizes[prefix] = max(sizes.get(prefix, 0), len(values[0]))
        for prefix, size in sizes.items():
            if self._count.get(prefix) != 0:
                self._count[prefix] = max(1, min(PREFETCH_KEYS, PREFETCH_BYTES // max(1, size)))
