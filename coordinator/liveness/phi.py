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

:class:`DetectorSet` is a member's soft state (``local.MemberDetection`` keeps one on every
member, for the heartbeat streams it serves): one detector per key (a stream's group, or a
participant left alone by its stream). Nothing here is replicated and nothing reads a clock:
every call takes ``now_ms`` from the caller. The member calls :meth:`DetectorSet.suspects`
periodically and reports each key to the leader, which proposes ``MemberFailed``; the state
machine ignores stale proposals.

- ``track`` starts monitoring a participant as if it had just sent a heartbeat, so a worker
  that joins and dies before its first heartbeat is detected too.
- A heartbeat stream that ends abnormally is evidence of a dead process, but a live worker
  may also reconnect (to a new leader, after a transient network error). ``stream_closed``
  therefore starts a confirmation window of two heartbeat intervals: if no heartbeat
  arrives within it the participant is suspected whatever its phi.
- ``start_grace`` restarts every detector from now, and nobody is suspected for
  ``grace_ms`` (a detector set whose history cannot be trusted starts over rather than
  declare anyone dead).
- A young detector (fewer than ``YOUNG_SAMPLES`` heartbeats since it was tracked) is not
  judged by phi before ``DetectorSettings.startup_ms``: two or three intervals, often the
  late first ones of a worker still busy joining, are no history to suspect anyone on.
- A suspect is reported once per ``retry_ms`` (its proposal may be dropped by a leader change
  or a full queue, so it is reported again later if still tracked).

Cost. A member asks for suspects every few tens of milliseconds, and it may carry tens of
thousands of keys, so :meth:`DetectorSet.suspects` must not look at each of them.
phi grows with the time since the last heartbeat, so the moment it will reach the threshold
is known when the heartbeat arrives: mean + pause + y * std after it, where y solves the
threshold equation (:func:`threshold_deviations`, a cubic, solved once per threshold). Each
participant therefore has a due time, kept in a heap (stale entries are skipped when popped);
``suspects`` pops only the due ones and confirms each with the exact phi, so it costs
O(log n) per heartbeat and per suspect instead of O(n) per call.
"""

from __future__ import annotations

import copy
import functools
import heapq
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from ..state.jobs import JobConfig

Key = tuple[str, int]
"""(job id, participant id)."""

# A detector is young until it has seen this many heartbeats: until then phi alone does not
# suspect it before ``DetectorSettings.startup_ms`` has passed since it was tracked (a closed
# stream still does).
YOUNG_SAMPLES = 5
YOUNG_FLOOR_MS = 3000
YOUNG_INTERVALS = 10


def phi_of(elapsed_ms: float, mean_ms: float, std_ms: float) -> float:
    """Suspicion for a heartbeat ``elapsed_ms`` late, given the arrival mean and deviation."""
    y = (elapsed_ms - mean_ms) / std_ms
    # Clamp the exponent: beyond |y| ~ 13 the answer saturates in float64 anyway.
    e = math.exp(max(-700.0, min(700.0, -y * (1.5976 + 0.070566 * y * y))))
    if elapsed_ms > mean_ms:
        # 1 - F = e / (1 + e); computed directly, it does not cancel to 0.
        return -math.log10(e / (1.0 + e))
    return -math.log10(1.0 - 1.0 / (1.0 + e))


_LOGISTIC_A = 0.070566
_LOGISTIC_B = 1.5976


@functools.lru_cache(maxsize=64)
def threshold_deviations(threshold: float) -> float:
    """The y (in standard deviations past the mean) at which :func:`phi_of` equals
    ``threshold``: phi = -log10(e / (1 + e)) with e = exp(-y (b + a y^2)), so
    a y^3 + b y = ln((1 - p) / p) with p = 10^-threshold; a > 0 and b > 0 make the cubic
    increasing, with one real root (Cardano)."""
    if threshold <= 0:
        raise ValueError(f"the phi threshold must be > 0, got {threshold}")
    # ln((1 - p) / p), computed without cancelling 1 - p to 1.
    log_odds = math.log(-math.expm1(-threshold * math.log(10))) + threshold * math.log(10)
    p_coef, q_coef = _LOGISTIC_B / _LOGISTIC_A, -log_odds / _LOGISTIC_A
    root = math.sqrt(q_coef * q_coef / 4 + p_coef**3 / 27)
    return math.cbrt(-q_coef / 2 + root) + math.cbrt(-q_coef / 2 - root)


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

    def copy(self) -> PhiAccrualDetector:
        """An independent detector with this one's history and last heartbeat."""
        twin = copy.copy(self)
        twin._intervals = deque(self._intervals)
        return twin

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

    def reaches_ms(self, threshold: float) -> float:
        """When phi will reach ``threshold`` if no heartbeat arrives (inf before the first
        heartbeat, whose phi is 0 for ever)."""
        if self.last_heartbeat_ms is None:
            return math.inf
        mean = self.mean_ms + self.acceptable_pause_ms
        return self.last_heartbeat_ms + mean + threshold_deviations(threshold) * self.std_ms


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
    def startup_ms(self) -> int:
        """How long a detector with fewer than ``YOUNG_SAMPLES`` heartbeats behind it is
        not judged by phi: a history of two or three intervals (the first ones after a join
        or a move, often late while the worker's process is busy joining) says little."""
        return max(YOUNG_FLOOR_MS, YOUNG_INTERVALS * self.heartbeat_interval_ms)

    @property
    def confirm_closed_ms(self) -> int:
        """How long after a stream closes without a new heartbeat the worker is suspected."""
        return 2 * self.heartbeat_interval_ms

    @property
    def std_floor_ms(self) -> float:
        """The least standard deviation phi assumes: the job's ``min_std_ms``, and at least
        half a heartbeat interval. Regular heartbeats make the window's deviation tiny, and
        a floor fixed in milliseconds then reads a sender's short stall as death at slow
        heartbeats (at 1 s heartbeats and a 50 ms floor, phi 8 is crossed 1.26 s after the
        last one: one busy second of the worker's process). At the default 100 ms interval
        the two agree (50 ms); at 1 s, phi 8 is crossed about 3.6 s after the last heartbeat
        (Akka pairs 1 s heartbeats with a 3 s acceptable pause for the same reason)."""
        return max(float(self.min_std_ms), self.heartbeat_interval_ms / 2)

    def new_detector(self) -> PhiAccrualDetector:
        return PhiAccrualDetector(
            self.window, self.std_floor_ms, self.acceptable_pause_ms, self.heartbeat_interval_ms
        )


@dataclass(slots=True)
class _Tracked:
    settings: DetectorSettings
    detector: PhiAccrualDetector
    # When the heartbeat stream ended abnormally with no heartbeat since; None otherwise.
    stream_closed_ms: int | None = None
    # When this key was last returned by suspects(); None if never (or since a heartbeat).
    reported_ms: int | None = None
    # When suspects() must look at this key next (its heap entry with this time is current).
    due_ms: float = math.inf
    # When tracking (re)started, and the heartbeats seen since (see YOUNG_SAMPLES).
    started_ms: int = 0
    samples: int = 0

    def young_until_ms(self) -> float:
        """Phi alone cannot suspect this key before this time."""
        if self.samples >= YOUNG_SAMPLES:
            return -math.inf
        return self.started_ms + self.settings.startup_ms


class DetectorSet:
    """One member's detectors, keyed by (job, participant id) or a group's key. Soft state,
    never replicated."""

    def __init__(self, retry_ms: int = 1000) -> None:
        self.retry_ms = retry_ms
        self._tracked: dict[Key, _Tracked] = {}
        # (due_ms, key) per scheduling; an entry whose time is not its key's due_ms (or
        # whose key is gone) is stale and skipped. Invariant: every tracked key with a
        # finite due_ms has an entry with exactly that time.
        self._due: list[tuple[float, int, Key]] = []
        # A tie-breaker for heap entries, so equal times never compare keys (batched
        # heartbeats give many keys the same due time, and tuples of strings compare slowly).
        self._pushes = 0
        # Nobody is suspected before this time (see start_grace).
        self.grace_until_ms = 0
        # Heartbeats that came before a closed stream was confirmed: suspicions averted
        # (only ever grows; the supervisor exports it).
        self.streams_reopened = 0

    def _schedule(self, key: Key, tracked: _Tracked, not_before_ms: float = -math.inf) -> None:
        """Work out when ``key`` may next be a suspect and queue it for then."""
        settings = tracked.settings
        # A millisecond early: the exact phi decides when the time comes.
        due = max(
            tracked.detector.reaches_ms(settings.phi_threshold) - 1.0, tracked.young_until_ms()
        )
        if tracked.stream_closed_ms is not None:
            due = min(due, tracked.stream_closed_ms + settings.confirm_closed_ms)
        if tracked.reported_ms is not None:
            due = max(due, tracked.reported_ms + self.retry_ms)
        due = max(due, not_before_ms)
        tracked.due_ms = due
        if due != math.inf:
            self._pushes += 1
            heapq.heappush(self._due, (due, self._pushes, key))
        if len(self._due) > 4 * len(self._tracked) + 1024:
            # Mostly stale entries (heartbeats reschedule often): rebuild from the live ones.
            self._due = [
                (t.due_ms, n, k)
                for n, (k, t) in enumerate(self._tracked.items())
                if t.due_ms != math.inf
            ]
            heapq.heapify(self._due)

    def __contains__(self, key: Key) -> bool:
        return key in self._tracked

    def tracked(self) -> list[Key]:
        """The tracked keys, in key order."""
        return sorted(self._tracked)

    def track(self, key: Key, settings: DetectorSettings, now_ms: int) -> None:
        """Monitor ``key`` as if it had just sent a heartbeat. Tracking an already tracked key
        with the same settings changes nothing; new settings start its detector over."""
        tracked = self._tracked.get(key)
        if tracked is not None and tracked.settings == settings:
            return
        detector = settings.new_detector()
        detector.heartbeat(now_ms)
        tracked = self._tracked[key] = _Tracked(settings, detector, started_ms=now_ms)
        self._schedule(key, tracked)

    def adopt(self, key: Key, source: Key, now_ms: int, *, closed: bool) -> None:
        """Track ``key`` with a copy of ``source``'s detector (its history and last
        heartbeat): a participant that leaves a group detector (``liveness/local.py``) goes
        on from where the group was. ``closed``: its stream ended at ``now_ms``."""
        origin = self._tracked.get(source)
        if origin is None:
            return
        detector = origin.detector.copy()
        tracked = self._tracked[key] = _Tracked(
            origin.settings, detector, started_ms=origin.started_ms, samples=origin.samples
        )
        if closed:
            tracked.stream_closed_ms = now_ms
        self._schedule(key, tracked)

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
        closed_ms = tracked.stream_closed_ms
        if closed_ms is not None and now_ms - closed_ms < tracked.settings.confirm_closed_ms:
            self.streams_reopened += 1
        tracked.detector.heartbeat(now_ms)
        tracked.samples += 1
        tracked.stream_closed_ms = None
        tracked.reported_ms = None
        self._schedule(key, tracked)
        return True

    def stream_closed(self, key: Key, now_ms: int) -> None:
        """The heartbeat stream of ``key`` ended abnormally (see the module docstring)."""
        tracked = self._tracked.get(key)
        if tracked is not None and tracked.stream_closed_ms is None:
            tracked.stream_closed_ms = now_ms
            self._schedule(key, tracked)

    def confirm_closed(self, key: Key, now_ms: int) -> bool:
        """Confirm the closed stream of ``key`` now, without waiting out the window (another
        participant's collective failed: ``local.MemberDetection.collective_failed``);
        False if its stream is not closed (a heartbeat came since, or it is not tracked)."""
        tracked = self._tracked.get(key)
        if tracked is None or tracked.stream_closed_ms is None:
            return False
        tracked.stream_closed_ms = min(
            tracked.stream_closed_ms, now_ms - tracked.settings.confirm_closed_ms
        )
        self._schedule(key, tracked)
        return True

    def reopen(self, key: Key, now_ms: int) -> None:
        """A new stream carries ``key`` (it joins a group, which feeds it from now): counted
        in ``streams_reopened`` if its stream had closed within the confirmation window."""
        tracked = self._tracked.get(key)
        if tracked is None or tracked.stream_closed_ms is None:
            return
        if now_ms - tracked.stream_closed_ms < tracked.settings.confirm_closed_ms:
            self.streams_reopened += 1

    def start_grace(self, now_ms: int, grace_ms: int) -> None:
        """Every detector starts over from now; no suspicion for grace_ms."""
        self._due = []
        for key, tracked in self._tracked.items():
            tracked.detector = tracked.settings.new_detector()
            tracked.detector.heartbeat(now_ms)
            tracked.started_ms = now_ms
            tracked.samples = 0
            tracked.stream_closed_ms = None
            tracked.reported_ms = None
            self._schedule(key, tracked)
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

    def settings(self, key: Key) -> DetectorSettings | None:
        tracked = self._tracked.get(key)
        return None if tracked is None else tracked.settings

    def stream_closed_ms(self, key: Key) -> int | None:
        """When the stream of ``key`` closed with no heartbeat since; None otherwise."""
        tracked = self._tracked.get(key)
        return None if tracked is None else tracked.stream_closed_ms

    def __len__(self) -> int:
        return len(self._tracked)

    def last_heartbeat_ms(self, key: Key) -> float | None:
        """When ``key`` last sent a heartbeat (or its detector last started over); None if
        it is not tracked."""
        tracked = self._tracked.get(key)
        return None if tracked is None else tracked.detector.last_heartbeat_ms

    def heartbeat_age_ms(self, key: Key, now_ms: int) -> int | None:
        """Milliseconds since ``key``'s last heartbeat (or since it was tracked, or since the
        grace began); None if it is not tracked."""
        last = self.last_heartbeat_ms(key)
        return None if last is None else max(0, int(now_ms - last))

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
        due: list[Key] = []
        heap = self._due
        while heap and heap[0][0] <= now_ms:
            when, _, key = heapq.heappop(heap)
            tracked = self._tracked.get(key)
            if tracked is None or tracked.due_ms != when:
                continue  # stale: forgotten, or rescheduled since
            value = self.phi(key, now_ms)
            assert value is not None
            reported_ms = tracked.reported_ms
            retry_ok = reported_ms is None or now_ms - reported_ms >= self.retry_ms
            grown = math.isinf(value) or now_ms >= tracked.young_until_ms()
            if value >= tracked.settings.phi_threshold and retry_ok and grown:
                tracked.reported_ms = now_ms
                due.append(key)
            # Not yet (the due time was a little early) or reported: look again later, never
            # in this same call.
            self._schedule(key, tracked, not_before_ms=now_ms + 1)
        return sorted(due)
