"""Phi-accrual failure detection (Hayashibara et al. 2004), as Akka formulates it.

Theory of operation. Instead of a fixed timeout, the detector learns how a worker's
heartbeats usually arrive: it keeps the last ``window`` inter-arrival times and, at any
moment, turns the time elapsed since the last heartbeat into a suspicion level

    phi(t) = -log10(1 - F(t)),

where F is the normal distribution's CDF with the window's mean (plus ``acceptable_pause_ms``,
which lets a worker stall that long, e.g. for garbage collection or a slow collective, before
suspicion rises) and its standard deviation (at least ``min_std_ms``, so perfectly regular
heartbeats do not make the detector hair-triggered). phi = 8 means a chance of about 1e-8
that a heartbeat this late is still coming. F is Akka's logistic approximation of the normal
CDF, 1 / (1 + exp(-y (1.5976 + 0.070566 y^2))), evaluated on the side that keeps precision.

Before the first heartbeat the window is seeded with two samples around
``first_heartbeat_estimate_ms`` (mean +- a quarter), as Akka does, so a worker that stops
right after its first heartbeat is still detected.

:class:`DetectorSet` is the leader's soft state: one detector per (job, participant id).
Nothing here is replicated and nothing reads a clock: every call takes ``now_ms`` from the
caller. The leader calls :meth:`DetectorSet.suspects` periodically and proposes
``MemberFailed`` for each key; the state machine ignores stale proposals.

- ``track`` starts monitoring a participant as if it had just sent a heartbeat, so a worker
  that joins and dies before its first heartbeat is detected too.
- A heartbeat stream that ends abnormally is evidence of a dead process, but a live worker
  may also reconnect (to a new leader, after a transient network error). ``stream_closed``
  therefore starts a confirmation window of two heartbeat intervals: if no heartbeat
  arrives within it the participant is suspected whatever its phi.
- After a leader change the new leader knows nothing of the old one's heartbeat history:
  ``start_grace`` restarts every detector from now, and nobody is suspected for ``grace_ms``,
  so no worker is declared dead because the leader moved.
- A suspect is reported once per ``retry_ms`` (its proposal may be dropped by a leader change
  or a full queue, so it is reported again later if still tracked).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from .state.jobs import JobConfig

Key = tuple[str, int]
"""(job id, participant id)."""


def phi_of(elapsed_ms: float, mean_ms: float, std_ms: float) -> float:
    """Suspicion for a heartbeat ``elapsed_ms`` late, given the arrival mean and deviation."""
    y = (elapsed_ms - mean_ms) / std_ms
    # Clamp the exponent: beyond |y| ~ 13 the answer saturates in float64 anyway.
    e = math.exp(max(-700.0, min(700.0, -y * (1.5976 + 0.070566 * y * y))))
    if elapsed_ms > mean_ms:
        # 1 - F = e / (1 + e); computed directly, it does not cancel to 0.
        return -math.log10(e / (1.0 + e))
    return -math.log10(1.0 - 1.0 / (1.0 + e))


class PhiAccrualDetector:
    """One monitored process. Times are the caller's milliseconds, never read here."""

    def __init__(
        self,
        window: int,
        min_std_ms: float,
        acceptable_pause_ms: float,
        first_heartbeat_estimate_ms: float,
    ) -> None:
        if window < 2:
            raise ValueError(f"window must be >= 2, got {window}")
        if min_std_ms <= 0 or first_heartbeat_estimate_ms <= 0 or acceptable_pause_ms < 0:
            raise ValueError("min_std_ms and first_heartbeat_estimate_ms must be positive")
        self.window = window
        self.min_std_ms = float(min_std_ms)
        self.acceptable_pause_ms = float(acceptable_pause_ms)
        self.first_heartbeat_estimate_ms = float(first_heartbeat_estimate_ms)
        # Invariant: len(_intervals) <= window; _sum and _squares are the sums of the
        # intervals and of their squares.
        self._intervals: deque[float] = deque()
        self._sum = 0.0
        self._squares = 0.0
        # The time of the last heartbeat; None before the first.
        self.last_heartbeat_ms: float | None = None

    def _record(self, interval_ms: float) -> None:
        if len(self._intervals) == self.window:
            dropped = self._intervals.popleft()
            self._sum -= dropped
            self._squares -= dropped * dropped
        self._intervals.append(interval_ms)
        self._sum += interval_ms
        self._squares += interval_ms * interval_ms

    def heartbeat(self, now_ms: float) -> None:
        if self.last_heartbeat_ms is None:
            estimate = self.first_heartbeat_estimate_ms
            self._record(estimate - estimate / 4)
            self._record(estimate + estimate / 4)
        else:
            # A heartbeat "from the past" (reordered clocks) counts as an interval of 0.
            self._record(max(0.0, now_ms - self.last_heartbeat_ms))
        self.last_heartbeat_ms = max(now_ms, self.last_heartbeat_ms or now_ms)

    @property
    def mean_ms(self) -> float:
        return self._sum / len(self._intervals)

    @property
    def std_ms(self) -> float:
        """The window's standard deviation, at least ``min_std_ms``."""
        mean = self.mean_ms
        variance = max(0.0, self._squares / len(self._intervals) - mean * mean)
        return max(math.sqrt(variance), self.min_std_ms)

    def phi(self, now_ms: float) -> float:
        """0 before the first heartbeat; grows while no heartbeat arrives."""
        if self.last_heartbeat_ms is None:
            return 0.0
        elapsed_ms = now_ms - self.last_heartbeat_ms
        return phi_of(elapsed_ms, self.mean_ms + self.acceptable_pause_ms, self.std_ms)


@dataclass(frozen=True, slots=True)
class DetectorSettings:
    """A job's failure-detector configuration (from its JobConfig)."""

    heartbeat_interval_ms: int
    phi_threshold: float
    window: int
    min_std_ms: int
    acceptable_pause_ms: int

    @classmethod
    def of_job(cls, config: JobConfig) -> DetectorSettings:
        return cls(
            config.heartbeat_interval_ms,
            config.phi_threshold_milli / 1000,
            config.phi_window,
            config.min_std_ms,
            config.acceptable_pause_ms,
        )

    @property
    def confirm_closed_ms(self) -> int:
        """How long after a stream closes without a new heartbeat the worker is suspected."""
        return 2 * self.heartbeat_interval_ms

    def new_detector(self) -> PhiAccrualDetector:
        return PhiAccrualDetector(
            self.window, self.min_std_ms, self.acceptable_pause_ms, self.heartbeat_interval_ms
        )


@dataclass(slots=True)
class _Tracked:
    settings: DetectorSettings
    detector: PhiAccrualDetector
    # When the heartbeat stream ended abnormally with no heartbeat since; None otherwise.
    stream_closed_ms: int | None = None
    # When this key was last returned by suspects(); None if never (or since a heartbeat).
    reported_ms: int | None = None


class DetectorSet:
    """The leader's detectors, keyed by (job, participant id). Soft state, never replicated."""

    def __init__(self, retry_ms: int = 1000) -> None:
        self.retry_ms = retry_ms
        self._tracked: dict[Key, _Tracked] = {}
        # Nobody is suspected before this time (see start_grace).
        self.grace_until_ms = 0

    def __contains__(self, key: Key) -> bool:
        return key in self._tracked

    def keys(self) -> list[Key]:
        return sorted(self._tracked)

    def track(self, key: Key, settings: DetectorSettings, now_ms: int) -> None:
        """Monitor ``key`` as if it had just sent a heartbeat. Tracking an already tracked key
        with the same settings changes nothing; new settings start its detector over."""
        tracked = self._tracked.get(key)
        if tracked is not None and tracked.settings == settings:
            return
        detector = settings.new_detector()
        detector.heartbeat(now_ms)
        self._tracked[key] = _Tracked(settings, detector)

    def forget(self, key: Key) -> None:
        self._tracked.pop(key, None)

    def retain(self, keys: Iterable[Key]) -> None:
        """Forget every key not in ``keys`` (the participants the state machine still has)."""
        live = set(keys)
        for key in sorted(self._tracked):
            if key not in live:
                del self._tracked[key]

    def heartbeat(self, key: Key, now_ms: int) -> bool:
        """Record a heartbeat; False if ``key`` is not tracked."""
        tracked = self._tracked.get(key)
        if tracked is None:
            return False
        tracked.detector.heartbeat(now_ms)
        tracked.stream_closed_ms = None
        tracked.reported_ms = None
        return True

    def stream_closed(self, key: Key, now_ms: int) -> None:
        """The heartbeat stream of ``key`` ended abnormally (see the module docstring)."""
        tracked = self._tracked.get(key)
        if tracked is not None and tracked.stream_closed_ms is None:
            tracked.stream_closed_ms = now_ms

    def start_grace(self, now_ms: int, grace_ms: int) -> None:
        """Became leader: every detector starts over from now; no suspicion for grace_ms."""
        for tracked in self._tracked.values():
            tracked.detector = tracked.settings.new_detector()
            tracked.detector.heartbeat(now_ms)
            tracked.stream_closed_ms = None
            tracked.reported_ms = None
        self.grace_until_ms = now_ms + grace_ms

    def phi(self, key: Key, now_ms: int) -> float | None:
        """The current suspicion of ``key`` (infinite once a closed stream is confirmed);
        None if it is not tracked."""
        tracked = self._tracked.get(key)
        if tracked is None:
            return None
        closed_ms = tracked.stream_closed_ms
        if closed_ms is not None and now_ms - closed_ms >= tracked.settings.confirm_closed_ms:
            return math.inf
        return tracked.detector.phi(now_ms)

    def phis(self, now_ms: int) -> list[tuple[Key, float]]:
        """Every tracked key with its phi, in key order (for the API and the CLI)."""
        out = []
        for key in sorted(self._tracked):
            value = self.phi(key, now_ms)
            assert value is not None
            out.append((key, value))
        return out

    def suspects(self, now_ms: int) -> list[Key]:
        """Keys whose phi reached their job's threshold, in key order, each reported at most
        once per retry_ms. Empty during the grace period."""
        if now_ms < self.grace_until_ms:
            return []
        due = []
        for key, value in self.phis(now_ms):
            tracked = self._tracked[key]
            if value < tracked.settings.phi_threshold:
                continue
            reported_ms = tracked.reported_ms
            if reported_ms is None or now_ms - reported_ms >= self.retry_ms:
                tracked.reported_ms = now_ms
                due.append(key)
        return due
