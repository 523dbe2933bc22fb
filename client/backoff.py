"""The one backoff policy: how long to wait before retry n, for every retry loop in rallypoint.

Exponential backoff with full jitter (AWS Architecture Blog, "Exponential Backoff and
Jitter", 2015): before retry n (0-based) sleep uniform(0, min(cap, base * 2**n)). Full jitter
spreads the retries of many clients that failed together (a leader change fails every client at
once) instead of having them all return in synchronised waves.

Every retry loop takes a :class:`Backoff` with its own base and cap: the client's calls and
streams (``transport.Retrier``, ``DEFAULT_BACKOFF``), the members' peer streams and snapshot
sends (``coordinator/transport.py``), a worker waiting for its coordinator
(``worker/patience.py``: attempts a fixed interval apart, ``jitter=False``, since each
attempt is itself a client call that backs off with jitter inside it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    base_s: float = 0.05
    cap_s: float = 2.0
    # Full jitter (uniform below the ceiling); False: the ceiling itself.
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.cap_s < self.base_s:
            raise ValueError(f"need 0 < base_s <= cap_s, got {self.base_s}, {self.cap_s}")

    def ceiling_s(self, retry: int) -> float:
        """The upper bound of the sleep before retry ``retry`` (0-based)."""
        # Cap the exponent so 2**retry never overflows a float on very long retry loops.
        return min(self.cap_s, self.base_s * 2.0 ** min(retry, 62))

    def delay_s(self, retry: int, rng: random.Random | None = None) -> float:
        """The sleep before retry ``retry`` (0-based); ``rng`` draws the jitter (it is
        required with ``jitter``: the caller owns its randomness, seeded in tests)."""
        if not self.jitter:
            return self.ceiling_s(retry)
        if rng is None:
            raise TypeError("Backoff.delay_s needs an rng when jitter is on")
        return rng.uniform(0.0, self.ceiling_s(retry))


DEFAULT_BACKOFF = Backoff()
