"""Exponential backoff with full jitter (AWS Architecture Blog, "Exponential Backoff and
Jitter", 2015): before retry n (0-based) sleep uniform(0, min(cap, base * 2**n)). Full jitter
spreads the retries of many clients that failed together (a leader change fails every client at
once) instead of having them all return in synchronised waves."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    base_s: float = 0.05
    cap_s: float = 2.0

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.cap_s < self.base_s:
            raise ValueError(f"need 0 < base_s <= cap_s, got {self.base_s}, {self.cap_s}")

    def ceiling_s(self, retry: int) -> float:
        """The upper bound of the sleep before retry ``retry`` (0-based)."""
        # Cap the exponent so 2**retry never overflows a float on very long retry loops.
        return min(self.cap_s, self.base_s * 2.0 ** min(retry, 62))

    def delay_s(self, retry: int, rng: random.Random) -> float:
        return rng.uniform(0.0, self.ceiling_s(retry))


DEFAULT_BACKOFF = Backoff()
