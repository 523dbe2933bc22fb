"""The phi-accrual detector: detection time from the formula, no false suspicion under jitter,
closed streams, grace after a leader change, reporting once per retry interval."""

from __future__ import annotations

import math
import random
from statistics import NormalDist

import pytest

from rallypoint.coordinator.liveness.phi import (
    YOUNG_SAMPLES,
    DetectorSet,
    DetectorSettings,
    PhiAccrualDetector,
    phi_of,
    threshold_deviations,
)
from rallypoint.coordinator.state.jobs import JobConfig

INTERVAL_MS = 100
SETTINGS = DetectorSettings(
    heartbeat_interval_ms=INTERVAL_MS,
    phi_threshold=8.0,
    window=100,
    min_std_ms=50,
    acceptable_pause_ms=0,
)


def logistic_quantile(phi: float) -> float:
    """The y (in standard deviations past the mean) where Akka's logistic approximation
    reaches ``phi``: solve y (1.5976 + 0.070566 y^2) = ln((1 - p) / p), p = 10^-phi."""
    p = 10.0**-phi
    target = math.log((1 - p) / p)
    low, high = 0.0, 50.0
    for _ in range(200):
        mid = (low + high) / 2
        if mid * (1.5976 + 0.070566 * mid * mid) < target:
            low = mid
        else:
            high = mid
    return low


def regular(detector: PhiAccrualDetector, count: int, start_ms: int = 0) -> int:
    """``count`` heartbeats exactly INTERVAL_MS apart; the time of the last."""
    now_ms = start_ms
    for _ in range(count):
        detector.heartbeat(now_ms)
        now_ms += INTERVAL_MS
    return now_ms - INTERVAL_MS


def first_time_at_or_above(detector: PhiAccrualDetector, after_ms: int, threshold: float) -> int:
    now_ms = after_ms
    while detector.phi(now_ms) < threshold:
        now_ms += 1
    return now_ms


def test_the_logistic_approximation_tracks_the_normal_tail() -> None:
    for phi in (1.0, 3.0):
        exact = NormalDist().inv_cdf(1 - 10.0**-phi)
        assert logistic_quantile(phi) == pytest.approx(exact, abs=0.05)
    # Far in the tail the approximation is a little eager: phi 8 is reached 5.23 deviations
    # past the mean instead of the normal's 5.61.
    assert NormalDist().inv_cdf(1 - 1e-8) - logistic_quantile(8.0) == pytest.approx(0.39, abs=0.01)
    assert phi_of(100.0, 100.0, 10.0) == pytest.approx(math.log10(2))
    assert phi_of(0.0, 100.0, 10.0) < 1e-6


def test_regular_heartbeats_keep_phi_low() -> None:
    detector = PhiAccrualDetector(100, 50, 0, INTERVAL_MS)
    last_ms = regular(detector, 300)
    assert detector.mean_ms == pytest.approx(INTERVAL_MS)
    assert detector.std_ms == pytest.approx(50)  # the minimum: regular arrivals vary by 0
    assert detector.phi(last_ms + INTERVAL_MS) == pytest.approx(math.log10(2))
    assert detector.phi(last_ms + 2 * INTERVAL_MS) < 2


@pytest.mark.parametrize(("min_std_ms", "pause_ms"), [(50, 0), (20, 0), (50, 300)])
def test_a_stop_is_detected_when_the_formula_says(min_std_ms: int, pause_ms: int) -> None:
    detector = PhiAccrualDetector(100, min_std_ms, pause_ms, INTERVAL_MS)
    last_ms = regular(detector, 300)
    expected_ms = last_ms + INTERVAL_MS + pause_ms + logistic_quantile(8.0) * min_std_ms
    detected_ms = first_time_at_or_above(detector, last_ms, 8.0)
    assert detected_ms == pytest.approx(expected_ms, abs=1.0)
    # In words: mean + acceptable pause + about 5.2 standard deviations (for 100 ms and a
    # 50 ms minimum deviation, a dead worker is suspected 362 ms after its last heartbeat).
    assert 5.1 * min_std_ms < detected_ms - last_ms - INTERVAL_MS - pause_ms < 5.35 * min_std_ms


def test_a_stop_right_after_the_first_heartbeat_is_detected() -> None:
    detector = PhiAccrualDetector(100, 10, 0, INTERVAL_MS)
    assert detector.phi(5_000) == 0.0  # never heard from: not suspected (not yet tracked)
    detector.heartbeat(0)
    # Seeded with 75 and 125 ms: mean 100, deviation 25.
    assert detector.std_ms == pytest.approx(25)
    detected_ms = first_time_at_or_above(detector, 0, 8.0)
    assert detected_ms == pytest.approx(100 + logistic_quantile(8.0) * 25, abs=1.0)


def test_jittered_heartbeats_under_load_stay_below_the_threshold() -> None:
    rng = random.Random(2004)
    detector = PhiAccrualDetector(100, 50, 0, INTERVAL_MS)
    now_ms = 0
    detector.heartbeat(now_ms)
    highest = 0.0
    for _ in range(20_000):
        if rng.random() < 0.03:
            interval_ms = rng.randrange(INTERVAL_MS, 3 * INTERVAL_MS + 1)  # a loaded moment
        else:
            interval_ms = INTERVAL_MS + rng.randrange(-15, 16)
        now_ms += interval_ms
        highest = max(highest, detector.phi(now_ms))  # just before the late heartbeat lands
        detector.heartbeat(now_ms)
    assert 2.0 < highest < 8.0


def test_the_window_forgets_old_intervals() -> None:
    detector = PhiAccrualDetector(10, 1, 0, INTERVAL_MS)
    now_ms = regular(detector, 20)
    for _ in range(10):
        now_ms += 1_000
        detector.heartbeat(now_ms)
    assert detector.mean_ms == pytest.approx(1_000)
    with pytest.raises(ValueError):
        PhiAccrualDetector(1, 1, 0, INTERVAL_MS)


def test_the_set_suspects_by_each_jobs_threshold_in_key_order() -> None:
    detectors = DetectorSet(retry_ms=1_000)
    lenient = DetectorSettings(INTERVAL_MS, 1_000.0, 100, 50, 0)
    for key in [("b", 7), ("a", 9), ("a", 3)]:
        detectors.track(key, SETTINGS, 0)
    detectors.track(("c", 1), lenient, 0)
    for now_ms in range(0, 3_001, INTERVAL_MS):
        detectors.heartbeat(("a", 9), now_ms)
    assert detectors.suspects(3_000) == [("a", 3), ("b", 7)]
    assert detectors.suspects(3_050) == []  # reported already; again after retry_ms
    assert detectors.suspects(4_000) == [("a", 3), ("a", 9), ("b", 7)]
    assert [key for key, _ in detectors.phis(4_000)] == [("a", 3), ("a", 9), ("b", 7), ("c", 1)]
    assert detectors.heartbeat(("x", 1), 4_000) is False and detectors.phi(("x", 1), 0) is None
    detectors.retain([("a", 9), ("c", 1)])
    assert detectors.tracked() == [("a", 9), ("c", 1)]


def test_a_closed_stream_is_confirmed_after_two_intervals_unless_a_heartbeat_arrives() -> None:
    detectors = DetectorSet()
    detectors.track(("j", 1), SETTINGS, 0)
    detectors.track(("j", 2), SETTINGS, 0)
    for now_ms in range(0, 1_001, INTERVAL_MS):
        detectors.heartbeat(("j", 1), now_ms)
        detectors.heartbeat(("j", 2), now_ms)
    detectors.stream_closed(("j", 1), 1_000)
    detectors.stream_closed(("j", 2), 1_000)
    detectors.heartbeat(("j", 2), 1_100)  # reconnected to a new stream
    assert detectors.suspects(1_199) == []
    assert detectors.suspects(1_200) == [("j", 1)]
    assert detectors.phi(("j", 1), 1_200) == math.inf
    assert detectors.phi(("j", 2), 1_200) == pytest.approx(math.log10(2), abs=0.2)


def test_after_a_leader_change_nobody_is_suspected_during_the_grace() -> None:
    detectors = DetectorSet()
    detectors.track(("j", 1), SETTINGS, 0)
    detectors.track(("j", 2), SETTINGS, 0)
    # The new leader took over at 10 s, knowing nothing of the old leader's heartbeats.
    detectors.start_grace(10_000, grace_ms=2_000)
    assert detectors.suspects(10_000) == []
    assert detectors.suspects(11_999) == []
    for now_ms in range(10_000, 14_001, INTERVAL_MS):
        detectors.heartbeat(("j", 2), now_ms)  # worker 2 found the new leader
    # Worker 1 never did: its detector, started over at the leader change, is young (no
    # heartbeat since) until startup_ms has passed; then its phi counts from the change.
    assert detectors.suspects(12_000) == []
    assert detectors.suspects(10_000 + SETTINGS.startup_ms) == [("j", 1)]
    assert detectors.phi(("j", 2), 14_000) is not None
    assert detectors.phi(("j", 2), 14_000) < 1  # type: ignore[operator]


def test_heartbeat_age_counts_from_the_last_heartbeat_or_the_leader_change() -> None:
    detectors = DetectorSet()
    assert detectors.heartbeat_age_ms(("j", 1), 0) is None  # not tracked
    detectors.track(("j", 1), SETTINGS, 1_000)
    assert detectors.heartbeat_age_ms(("j", 1), 1_250) == 250  # watched since its join
    detectors.heartbeat(("j", 1), 2_000)
    assert detectors.heartbeat_age_ms(("j", 1), 2_040) == 40
    detectors.stream_closed(("j", 1), 2_100)
    assert detectors.heartbeat_age_ms(("j", 1), 5_000) == 3_000  # silence keeps ageing
    detectors.start_grace(6_000, grace_ms=2_000)
    assert detectors.heartbeat_age_ms(("j", 1), 6_500) == 500  # a new leader starts over
    detectors.forget(("j", 1))
    assert detectors.heartbeat_age_ms(("j", 1), 7_000) is None


def test_tracking_again_keeps_history_unless_the_settings_change() -> None:
    detectors = DetectorSet()
    detectors.track(("j", 1), SETTINGS, 0)
    detectors.track(("j", 1), SETTINGS, 5_000)  # no effect: still silent since 0
    assert detectors.suspects(5_000) == [("j", 1)]
    slower = DetectorSettings(1_000, 8.0, 100, 50, 0)
    detectors.track(("j", 1), slower, 5_000)
    assert detectors.suspects(6_000) == []


def test_settings_come_from_the_jobs_config() -> None:
    config = JobConfig(1, 2, heartbeat_interval_ms=100, phi_threshold_milli=8_000, min_std_ms=50)
    assert DetectorSettings.of_job(config) == SETTINGS


@pytest.mark.parametrize("threshold", [0.1, 0.5, 1.0, 3.0, 8.0, 12.5, 30.0])
def test_threshold_deviations_solve_the_logistic_equation(threshold: float) -> None:
    y = threshold_deviations(threshold)
    assert phi_of(100 + 10 * y, 100, 10) == pytest.approx(threshold, rel=1e-9)
    if threshold > math.log10(2):  # the bisection below searches y >= 0 only
        assert y == pytest.approx(logistic_quantile(threshold), abs=1e-9)


class ScanEverything:
    """The obvious detector set, for comparison: phi of every key on every call."""

    def __init__(self, retry_ms: int) -> None:
        self.retry_ms = retry_ms
        self.tracked: dict[tuple[str, int], list[object]] = {}
        self.grace_until_ms = 0

    def track(self, key: tuple[str, int], settings: DetectorSettings, now_ms: int) -> None:
        if key in self.tracked and self.tracked[key][0] == settings:
            return
        detector = settings.new_detector()
        detector.heartbeat(now_ms)
        # closed_ms, reported_ms, started_ms, heartbeats since
        self.tracked[key] = [settings, detector, None, None, now_ms, 0]

    def heartbeat(self, key: tuple[str, int], now_ms: int) -> None:
        if key in self.tracked:
            entry = self.tracked[key]
            entry[1].heartbeat(now_ms)  # type: ignore[attr-defined]
            entry[2] = entry[3] = None
            entry[5] += 1  # type: ignore[operator]

    def stream_closed(self, key: tuple[str, int], now_ms: int) -> None:
        if key in self.tracked and self.tracked[key][2] is None:
            self.tracked[key][2] = now_ms

    def suspects(self, now_ms: int) -> list[tuple[str, int]]:
        if now_ms < self.grace_until_ms:
            return []
        due = []
        for key in sorted(self.tracked):
            settings, detector, closed, reported, started, samples = self.tracked[key]
            assert isinstance(settings, DetectorSettings)
            assert isinstance(detector, PhiAccrualDetector)
            assert isinstance(started, int) and isinstance(samples, int)
            confirmed = closed is not None and now_ms - closed >= settings.confirm_closed_ms
            value = math.inf if confirmed else detector.phi(now_ms)
            young = samples < YOUNG_SAMPLES and now_ms < started + settings.startup_ms
            if young and not confirmed:
                continue
            if value >= settings.phi_threshold and (
                reported is None or now_ms - reported >= self.retry_ms  # type: ignore[operator]
            ):
                self.tracked[key][3] = now_ms
                due.append(key)
        return due


@pytest.mark.parametrize("seed", range(12))
def test_due_times_find_exactly_the_suspects_a_full_scan_finds(seed: int) -> None:
    rng = random.Random(seed)
    settings = [
        SETTINGS,
        DetectorSettings(250, 3.0, 20, 20, 100),
        DetectorSettings(50, 12, 8, 5, 0),
    ]
    fast, scan = DetectorSet(retry_ms=300), ScanEverything(retry_ms=300)
    keys = [("a", i) for i in range(6)] + [("b", i) for i in range(6)]
    now_ms = 0
    for _ in range(3_000):
        now_ms += rng.choice([0, 1, 1, 3, 10, 40, 120])
        action = rng.random()
        key = rng.choice(keys)
        if action < 0.05:
            chosen = rng.choice(settings)
            fast.track(key, chosen, now_ms)
            scan.track(key, chosen, now_ms)
        elif action < 0.55:
            fast.heartbeat(key, now_ms)
            scan.heartbeat(key, now_ms)
        elif action < 0.6:
            fast.stream_closed(key, now_ms)
            scan.stream_closed(key, now_ms)
        elif action < 0.62:
            kept = [k for k in keys if rng.random() < 0.8]
            fast.retain(kept)
            scan.tracked = {k: v for k, v in scan.tracked.items() if k in kept}
        else:
            assert fast.suspects(now_ms) == scan.suspects(now_ms), now_ms


def test_suspects_does_not_look_at_participants_that_are_not_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    detectors = DetectorSet()
    keys = [("big", i) for i in range(1, 2_001)]
    for key in keys:
        detectors.track(key, SETTINGS, 0)
    looked = 0
    real_phi = DetectorSet.phi

    def counting_phi(self: DetectorSet, key: tuple[str, int], now_ms: int) -> float | None:
        nonlocal looked
        looked += 1
        return real_phi(self, key, now_ms)

    monkeypatch.setattr(DetectorSet, "phi", counting_phi)
    for now_ms in range(0, 3_000, 20):  # the leader's step every 20 ms, for 3 s
        if now_ms % INTERVAL_MS == 0:
            for key in keys:
                detectors.heartbeat(key, now_ms)
        assert detectors.suspects(now_ms) == []
    assert looked == 0  # everyone is healthy: nobody was due, nobody was looked at
    assert detectors.suspects(10_000) == keys  # then everyone stops
    assert looked == len(keys)


def test_the_deviation_phi_assumes_is_at_least_half_an_interval() -> None:
    """At 1 s heartbeats a regular history makes the window's deviation tiny; with only the
    50 ms floor a sender busy for one second would be declared dead. Half an interval keeps
    phi 8 about 3.6 s after the last heartbeat; at 100 ms the configured 50 ms still rules."""
    slow = DetectorSettings(1000, 8.0, 100, 50, 0)
    assert slow.std_floor_ms == 500
    assert SETTINGS.std_floor_ms == 50
    detectors = DetectorSet()
    detectors.track(("j", 1), slow, 0)
    for now_ms in range(1000, 20_001, 1000):
        detectors.heartbeat(("j", 1), now_ms)
    # The worker's process stalls for 2 s: its next heartbeat is 3 s after the last.
    assert detectors.suspects(20_000 + 2_900) == []
    assert detectors.suspects(20_000 + 3_700) == [("j", 1)]
