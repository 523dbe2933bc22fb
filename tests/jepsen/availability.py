"""Availability: how long the cluster could not take a write, and whether it should have.

Safety checkers ask whether anything wrong was returned; this one asks how long nothing was.

Unavailability windows. A write that did not succeed promptly (its outcome unknown: a timeout
or an unavailable cluster; or acknowledged, but only after ``slow_s``, by default an election
timeout: slower than that is an outage, not a slow call) opens a window at its
invocation; the window closes at the first acknowledgement of a write invoked at or after
that moment (by any client). Overlapping windows merge. A window no write closed is marked
open and ends when the last write stopped waiting for an answer (its timeout, or the end of
the history for one never answered): after the clients stop writing, nobody asks the cluster
for anything, so the time until the history ends (the nemesis's last heal, the final reads)
says nothing about whether it would have answered. (Counting it once judged a run unavailable
for the seconds after its clients had stopped, with a majority up the whole time.)

Was the cluster owed an answer? The nemesis records the cluster's health after every change
(``health`` events): the voters, which of them run and answer (not killed, not paused, not
yet starting), which pairs the network blocks, and which members it slows or makes lossy.
A *connected majority* is a majority of the voters that are up, unslowed, and can all reach
one another. Raft promises progress to such a group once an election completes, so a window
whose stretch with a connected majority up lasts longer than the bound is a violation. The
default bound is 4 election timeouts + 1 s: the old leader's loss noticed (up to two
randomised election timeouts), a pre-vote and a vote round (one more, to be generous to a
loaded machine), the new leader's no-op committed, plus a second for clients to find it.
Windows without a connected majority (a minority partition, two of three members down) are
reported, never judged.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .checkers import CheckResult, Outcome
from .history import NEMESIS_PROCESS, Event, EventType

# The operations that write (each workload's own): what availability is measured on.
WRITES = frozenset({"write", "cas", "add", "put"})
# Keys whose writes are not measured: a round-store write waits on purpose for the cache
# leases on its key (up to a second, coordinator/service/store_cache.py), and the store's
# round ends when its participant is cut off, so its writes are refused while others go on.
UNMEASURED_PREFIXES = ("store/",)


def bound_s(election_timeout_s: float) -> float:
    """The longest a connected majority may go without taking a write (module docstring)."""
    return 4 * election_timeout_s + 1.0


@dataclass(frozen=True, slots=True)
class Health:
    """The cluster as the nemesis left it at ``time_s``."""

    time_s: float
    voters: tuple[int, ...]
    up: tuple[int, ...]
    # Pairs of members that cannot reach each other, each as (smaller, larger).
    blocked: tuple[tuple[int, int], ...] = ()
    # Members whose traffic is slowed or partly dropped.
    degraded: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "voters": list(self.voters),
            "up": list(self.up),
            "blocked": [list(p) for p in self.blocked],
            "degraded": list(self.degraded),
        }

    @staticmethod
    def from_event(event: Event) -> Health:
        value = event.value
        return Health(
            event.time_s,
            tuple(value["voters"]),
            tuple(value["up"]),
            tuple((int(a), int(b)) for a, b in value["blocked"]),
            tuple(value["degraded"]),
        )

    def connected_majority(self) -> tuple[int, ...]:
        """A largest group of healthy voters that all reach one another, if it is a majority
        of the voters; () otherwise."""
        needed = len(self.voters) // 2 + 1
        healthy = sorted(set(self.up) & set(self.voters) - set(self.degraded))
        blocked = {tuple(sorted(p)) for p in self.blocked}
        for size in range(len(healthy), needed - 1, -1):
            for group in itertools.combinations(healthy, size):
                if not any(pair in blocked for pair in itertools.combinations(group, 2)):
                    return group
        return ()


@dataclass
class Window:
    start_s: float
    end_s: float
    # True when no write succeeded after it opened, until the history ended.
    open_at_end: bool = False
    # The longest continuous stretch of the window with a connected majority up.
    majority_s: float = 0.0
    # The faults in effect at some point of the window.
    faults: list[str] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class _Write:
    call_s: float
    return_s: float  # inf when the outcome is unknown
    ok: bool
    # When the client stopped waiting: its answer, its timeout, or (never answered) inf.
    done_s: float


def _writes(events: Iterable[Event]) -> list[_Write]:
    """Every write's invocation paired with its completion (failed ones too)."""
    pending: dict[int, Event] = {}
    writes = []
    for event in events:
        if (
            event.process == NEMESIS_PROCESS
            or event.f not in WRITES
            or event.key.startswith(UNMEASURED_PREFIXES)
        ):
            continue
        if event.type is EventType.INVOKE:
            pending[event.process] = event
            continue
        call = pending.pop(event.process, None)
        if call is None:
            continue
        if event.type is EventType.OK:
            writes.append(_Write(call.time_s, event.time_s, True, event.time_s))
        elif event.type is EventType.INFO:
            writes.append(_Write(call.time_s, math.inf, False, event.time_s))
        # FAIL: the cluster answered (a refused fence, say): it was available.
    writes.extend(_Write(call.time_s, math.inf, False, math.inf) for call in pending.values())
    return writes


def unavailability_windows(events: Sequence[Event], slow_s: float = 0.5) -> list[Window]:
    """The windows of ``events`` (module docstring), in time order, merged."""
    if not events:
        return []
    writes = sorted(_writes(events), key=lambda w: w.call_s)
    # The last moment a write waited for an answer: an open window ends there (module doc).
    end_of_history = min(
        max(e.time_s for e in events), max((w.done_s for w in writes), default=-math.inf)
    )
    successes = sorted((w for w in writes if w.ok), key=lambda w: w.call_s)
    # first_ack_after[i]: the earliest acknowledgement among successes[i:].
    first_ack_after = [math.inf] * (len(successes) + 1)
    for i in range(len(successes) - 1, -1, -1):
        first_ack_after[i] = min(successes[i].return_s, first_ack_after[i + 1])
    calls = [w.call_s for w in successes]
    raw: list[Window] = []
    for write in writes:
        if write.ok and write.return_s - write.call_s <= slow_s:
            continue
        index = bisect.bisect_left(calls, write.call_s)
        closes_at = first_ack_after[index]
        if closes_at == math.inf:
            raw.append(Window(write.call_s, end_of_history, open_at_end=True))
        else:
            raw.append(Window(write.call_s, closes_at))
    merged: list[Window] = []
    for window in sorted(raw, key=lambda w: w.start_s):
        if merged and window.start_s <= merged[-1].end_s:
            last = merged[-1]
            if window.end_s > last.end_s:
                last.end_s = window.end_s
                last.open_at_end = window.open_at_end
            continue
        merged.append(window)
    return merged


def health_timeline(events: Sequence[Event]) -> list[Health]:
    found = [
        Health.from_event(e)
        for e in events
        if e.process == NEMESIS_PROCESS and e.type is EventType.HEALTH
    ]
    return sorted(found, key=lambda h: h.time_s)


def longest_majority_stretch(window: Window, timeline: Sequence[Health]) -> float:
    """The longest part of ``window`` during which a connected majority was up. Before the
    first health record the cluster is taken as whole (runs start with every member up)."""
    # Segments [t_i, t_{i+1}) with the health in force from t_i.
    points: list[tuple[float, bool]] = [(-math.inf, True)]
    points += [(h.time_s, bool(h.connected_majority())) for h in timeline]
    longest = 0.0
    current = 0.0
    for i, (since, majority) in enumerate(points):
        until = points[i + 1][0] if i + 1 < len(points) else math.inf
        overlap = min(until, window.end_s) - max(since, window.start_s)
        if overlap <= 0:
            continue
        if majority:
            current += overlap
            longest = max(longest, current)
        else:
            current = 0.0
    return longest


def faults_during(window: Window, events: Sequence[Event]) -> list[str]:
    """The nemesis faults that started before the window ended and stopped after it began."""
    started: dict[str, tuple[float, str]] = {}
    found = []
    for event in events:
        if event.process != NEMESIS_PROCESS:
            continue
        if event.type is EventType.START:
            started[event.f] = (event.time_s, str(event.value))
        elif event.type is EventType.STOP and event.f in started:
            start_s, what = started.pop(event.f)
            if start_s <= window.end_s and event.time_s >= window.start_s:
                found.append(what)
    found += [what for start_s, what in started.values() if start_s <= window.end_s]
    return found


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def check_availability(
    events: Sequence[Event], limit_s: float, slow_s: float = 0.5
) -> tuple[CheckResult, list[Window]]:
    """The verdict, and every window with its majority stretch and faults filled in."""
    windows = unavailability_windows(events, slow_s)
    timeline = health_timeline(events)
    for window in windows:
        window.majority_s = longest_majority_stretch(window, timeline)
        window.faults = faults_during(window, events)
    durations = [w.duration_s for w in windows]
    violations = [w for w in windows if w.majority_s > limit_s]
    stats: dict[str, Any] = {
        "windows": len(windows),
        "p50_s": round(percentile(durations, 50), 3),
        "p99_s": round(percentile(durations, 99), 3),
        "max_s": round(max(durations, default=0.0), 3),
        "max_with_majority_s": round(max((w.majority_s for w in windows), default=0.0), 3),
        "bound_s": round(limit_s, 3),
    }
    if not any(e.f in WRITES and e.type is EventType.OK for e in events):
        return CheckResult(
            "availability", Outcome.UNKNOWN, "no write succeeded", stats=stats
        ), windows
    if violations:
        worst = max(violations, key=lambda w: w.majority_s)
        summary = (
            f"{len(violations)} window(s) without a write while a connected majority was up "
            f"for longer than {limit_s:.1f} s; the worst {worst.majority_s:.1f} s "
            f"(window of {worst.duration_s:.1f} s)"
        )
        return CheckResult("availability", Outcome.INVALID, summary, stats=stats), windows
    longest = (
        f"{statistics.median(durations):.2f} s median, {max(durations):.2f} s max"
        if durations
        else "none"
    )
    summary = f"{len(windows)} window(s) ({longest}); none over {limit_s:.1f} s with a majority up"
    return CheckResult("availability", Outcome.VALID, summary, stats=stats), windows
