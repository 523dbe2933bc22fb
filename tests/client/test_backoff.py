from __future__ import annotations

import random

import pytest

from rallypoint.client import Backoff


def test_ceiling_doubles_up_to_the_cap() -> None:
    backoff = Backoff(base_s=0.1, cap_s=1.0)
    assert [backoff.ceiling_s(n) for n in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert backoff.ceiling_s(10_000) == 1.0


def test_full_jitter_spreads_over_the_whole_interval() -> None:
    backoff = Backoff(base_s=0.1, cap_s=1.0)
    rng = random.Random(1)
    delays = [backoff.delay_s(3, rng) for _ in range(2000)]
    assert all(0.0 <= d <= 0.8 for d in delays)
    # Full jitter, not "equal jitter": the lower half of the interval is used as much as the
    # upper half.
    low = sum(d < 0.4 for d in delays)
    assert 900 < low < 1100


def test_same_seed_same_delays() -> None:
    backoff = Backoff()
    first = [backoff.delay_s(n, random.Random(5)) for n in range(5)]
    second = [backoff.delay_s(n, random.Random(5)) for n in range(5)]
    assert first == second


def test_nonsense_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        Backoff(base_s=0)
    with pytest.raises(ValueError):
        Backoff(base_s=2, cap_s=1)


def test_without_jitter_the_delay_is_the_ceiling_and_needs_no_rng() -> None:
    pacing = Backoff(base_s=1.0, cap_s=1.0, jitter=False)
    assert [pacing.delay_s(n) for n in range(4)] == [1.0, 1.0, 1.0, 1.0]
    growing = Backoff(base_s=0.1, cap_s=0.3, jitter=False)
    assert [growing.delay_s(n) for n in range(3)] == pytest.approx([0.1, 0.2, 0.3])


def test_jitter_needs_the_callers_rng() -> None:
    with pytest.raises(TypeError, match="needs an rng"):
        Backoff().delay_s(0)
