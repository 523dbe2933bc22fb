"""The failure detectors of one member: for the participants whose heartbeat streams it serves.

Theory of operation. Every member, leader or not, runs one :class:`MemberDetection`. A
heartbeat stream that names a participant makes this member *carry* it, in a *group*: the
participants one stream carries for one job arrive in the same requests, so they share one
detector (young at first: see ``phi.YOUNG_SAMPLES``), fed once per request however many it
names. A ``HeartbeatBatch`` stream opens one group per job; the older per-participant
``Heartbeat`` stream one per participant. The leader hears of a newly carried participant in
the next report. A stream that ends abnormally leaves each of its participants alone with a
copy of the group's history, marked closed (confirmed unless it is heard again within two
heartbeat intervals, or at once when a member of its round reports that a collective of
that round failed: ``collective_failed``, the closed stream and the broken collective being
two observations of one death); a stream that releases a participant, or a participant that
left its job, is forgotten quietly.

``suspects`` turns the detectors' verdicts into :class:`~.report.Suspicion` s, unless this
member cannot trust its own view:

- **loop stall**: its event loop ran late, so heartbeats sat unread: nobody is suspected for
  twice the stall (as Cassandra does after a GC pause);
- **intake lag**: requests reach it later than they used to. Each batch request carries the
  sender's clock; per stream the member keeps the least arrival delay seen (clock offset plus
  the fastest path) and measures each request against it. The median over the last requests
  of all streams is this member's intake lag: a slow receiver sees it grow on every stream
  at once, while a silent worker sends nothing to measure. Past ``INTAKE_LAG_GUARD_MS``
  nobody is suspected for twice the lag (Lifeguard's local health awareness, applied to the
  receiver's own queue);
- **mass suspicion**: phi against more than half of the participants of a job this member
  carries, at once, is more likely this member being slow than half of them dying together:
  it must hold for ``MASS_SUSPICION_HOLD_MS`` (a confirmed closed stream always counts).

Suspected participants that no open stream carries any more are forgotten once reported:
the leader decides (``coverage.py``), and if the report is lost the leader's backstop finds
a participant nobody carries.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from ..metrics import NodeMetrics
from .phi import DetectorSet, DetectorSettings
from .progress import ProgressReport
from .report import (
    MAX_READINGS,
    PHI_INFINITE_MILLI,
    Key,
    LivenessReport,
    Suspicion,
)

# Intake lag above this holds suspicion (ms); the median is taken over this many requests.
INTAKE_LAG_GUARD_MS = 100
INTAKE_SAMPLES = 64
# The own event loop running this much late holds suspicion (ms).
LOOP_STALL_MS = 50
MASS_SUSPICION_HOLD_MS = 5000
# The job id of group detectors' keys (not a valid job id, so never a participant's).
GROUP_JOB = "\x00group"


class _Group:
    """The participants one batch stream carries for one job, beating together."""

    __slots__ = ("key", "members", "readings")

    def __init__(self, key: Key, readings: bool) -> None:
        self.key = key
        self.members: set[Key] = set()
        # Whether the leader is sent its members' readings (see ``readings``).
        self.readings = readings


class StreamClock:
    """One stream's arrival delays: the least seen, and how far a request is above it."""

    __slots__ = ("base_ms",)

    def __init__(self) -> None:
        self.base_ms: int | None = None

    def lag_ms(self, now_ms: int, sent_ms: int) -> int:
        offset = now_ms - sent_ms
        if self.base_ms is None or offset < self.base_ms:
            self.base_ms = offset
        return offset - self.base_ms


class IntakeLag:
    """The median lag of the last ``INTAKE_SAMPLES`` requests, of every stream."""

    def __init__(self, samples: int = INTAKE_SAMPLES) -> None:
        self._recent: deque[int] = deque(maxlen=samples)

    def observe(self, lag_ms: int) -> None:
        self._recent.append(lag_ms)

    def current_ms(self) -> int:
        if not self._recent:
            return 0
        ordered = sorted(self._recent)
        return ordered[len(ordered) // 2]


class MemberDetection:
    """This member's detectors, what it tells the leader, and its guards against itself."""

    def __init__(
        self,
        metrics: NodeMetrics | None = None,
        *,
        retry_ms: int = 1000,
        round_of: Callable[[str], int] | None = None,
    ) -> None:
        # The job's current round as this member applied it (0: none); a held collective
        # failure report counts only while its round is current.
        self._round_of = round_of if round_of is not None else (lambda job: 0)
        self._metrics = metrics if metrics is not None else NodeMetrics(0)
        self._heartbeats_received = self._metrics.heartbeats_received
        self._guards = {
            guard: self._metrics.suspicion_guards.labels(guard)
            for guard in ("loop_stall", "intake_lag", "mass_suspicion", "stream_reopened")
        }
        self._detection = {
            cause: self._metrics.detection_seconds.labels(cause)
            for cause in ("phi", "stream_closed")
        }
        self.detectors = DetectorSet(retry_ms=retry_ms)
        # What the next report says (see report.py); keys in insertion order.
        self._attach: dict[Key, None] = {}
        self._detach: dict[Key, None] = {}
        self._progress: dict[Key, ProgressReport] = {}
        # When each progress in _progress was heard (this member's ms; 0: not said).
        self._progress_ms: dict[Key, int] = {}
        # Per carried key, the (round, step, collective waited in) last heard: a change is
        # news the leader's hang rules need at once (see has_news).
        self._progress_seen: dict[Key, tuple[int, int, int]] = {}
        self._progress_news = False
        # A stream closed since the last report: the next report goes at once (supervisor).
        self.closed_news = False
        # Per carried key, the highest round its heartbeats named (``rounds_named``), and
        # whether one named a higher round since the last report (it goes at once while a
        # round is held: leader/held.py).
        self._named: dict[Key, int] = {}
        self.named_news = False
        # The next report must list everything carried (new leader, or a report was lost).
        self.full_needed = True
        self.intake = IntakeLag()
        # Per job, since when phi alone suspects more than half of what this member carries.
        self._mass_since_ms: dict[str, int] = {}
        self._streams_reopened = 0
        # The last heartbeat of each verdict timed (a verdict reported again is timed once).
        self._timed: dict[Key, float] = {}
        # Closed streams confirmed early by a peer's failed collective: what it said.
        self._corroborated: dict[Key, str] = {}
        # Per job, the last collective failure reported here: (its round, the reporter's
        # peers, what it said, when): a peer's stream that closes within its confirmation
        # window after the report, while that round is current (the report won the race),
        # is confirmed as it closes.
        self._reports: dict[str, tuple[int, frozenset[int], str, int]] = {}
        # Batch streams' group detectors, and the group each of their participants is in.
        self._groups: dict[int, _Group] = {}
        self._group_of: dict[Key, int] = {}
        self._next_group = 0

    # ---------------------------------------------------------------- streams

    def open_group(self, settings: DetectorSettings, now_ms: int, *, readings: bool = False) -> int:
        """A stream starts carrying participants of one job: one detector for all of them
        (they arrive in the same requests, so they share arrival times), fed once per request
        however many it names. ``readings``: report its members' phi and heartbeat age to
        the leader (a per-participant stream's group of one)."""
        self._next_group += 1
        gid = self._next_group
        group = self._groups[gid] = _Group((GROUP_JOB, gid), readings)
        self.detectors.track(group.key, settings, now_ms)
        return gid

    def group_beat(self, gid: int, now_ms: int) -> None:
        """One request of the group's stream: a heartbeat for each of its participants."""
        group = self._groups.get(gid)
        if group is None:
            return
        self.detectors.heartbeat(group.key, now_ms)
        self._heartbeats_received.inc(len(group.members))

    def group_update(self, gid: int, members: set[Key], now_ms: int) -> None:
        """The group's participants are now ``members``. One that is no longer named (and
        was not released) goes on alone from the group's history: its silence counts. One
        that joins leaves its own detector or another group (it moved here); a new group's
        first and only participant brings its own detector's history along (a worker's
        per-participant stream reconnecting here), and one whose stream had closed within
        the confirmation window counts as a stream reopened."""
        group = self._groups.get(gid)
        if group is None or members == group.members:
            return
        for key in group.members - members:
            self._leave_group(key, group, now_ms, closed=False, evidence=True)
        # A group's settings are its job's now: a history taken under others is not kept.
        inherit = not group.members and len(members) == 1
        for key in members - group.members:
            other = self._group_of.get(key)
            if other is not None and other in self._groups:
                self._groups[other].members.discard(key)
            elif key in self.detectors:
                self.detectors.reopen(key, now_ms)
                if inherit and self.detectors.settings(key) == self.detectors.settings(group.key):
                    self.detectors.adopt(group.key, key, now_ms, closed=False)
                self.detectors.forget(key)
            else:
                self._attach[key] = None
                self._detach.pop(key, None)
            self._group_of[key] = gid
        group.members = set(members)

    def group_release(self, gid: int, key: Key) -> None:
        """The group's stream lets ``key`` go without evidence."""
        group = self._groups.get(gid)
        if group is not None and key in group.members:
            self._leave_group(key, group, 0, closed=False, evidence=False)

    def close_group(self, gid: int, now_ms: int, *, closed: bool) -> None:
        """The group's stream ended: abnormally (``closed``: evidence for each participant,
        confirmed unless it is heard again in time) or not (let go)."""
        group = self._groups.pop(gid, None)
        if group is None:
            return
        for key in sorted(group.members):
            self._leave_group(key, group, now_ms, closed=closed, evidence=closed)
        self.detectors.forget(group.key)

    def _leave_group(
        self, key: Key, group: _Group, now_ms: int, *, closed: bool, evidence: bool
    ) -> None:
        group.members.discard(key)
        if self._group_of.get(key) != int(group.key[1]):
            return
        del self._group_of[key]
        if evidence:
            self.detectors.adopt(key, group.key, now_ms, closed=closed)
            if closed:
                self.closed_news = True
                self._reported_before(key, now_ms)
            return
        if self._attach.pop(key, False) is False:
            self._detach[key] = None
        self._progress.pop(key, None)
        self._progress_ms.pop(key, None)
        self._progress_seen.pop(key, None)
        self._timed.pop(key, None)

    def collective_failed(
        self, job: str, round_number: int, peers: Sequence[int], report: str, now_ms: int
    ) -> list[int]:
        """A member of a job's current round ``round_number`` reports that a collective of
        that round failed (the servicer checked who may say so: ``ReportCollectiveFailure``);
        ``peers`` are the round's other members. Each of them whose heartbeat stream this member saw
        close, and that no heartbeat reached since, is confirmed failed now instead of at
        the end of its confirmation window (two heartbeat intervals): the closed stream and
        the broken collective are two observations of one death. The report is held for
        that window too: a peer's stream that closes after it (the gloo error reached the
        survivor before the stream's end reached this member) is confirmed as it closes,
        also once the round the report's first verdict opened is current here: a host's
        other processes' stream ends often arrive after that verdict, and each one left to
        its own window pushed the held round's close two intervals on. The participants
        confirmed now; nobody else is touched, so a report alone ends no round."""
        self._reports[job] = (round_number, frozenset(peers), report, now_ms)
        return [pid for pid in peers if self._corroborate((job, pid), report, now_ms)]

    def _corroborate(self, key: Key, report: str, now_ms: int) -> bool:
        """Confirm ``key``'s closed stream now, on the strength of ``report``."""
        if key in self._group_of:
            return False  # carried by an open stream here: alive as far as we know
        if not self.detectors.confirm_closed(key, now_ms):
            return False
        self._corroborated.setdefault(key, report)
        return True

    def _reported_before(self, key: Key, now_ms: int) -> None:
        """``key``'s stream just closed: if a peer of its round reported a failed
        collective within the confirmation window before, confirm it now."""
        held = self._reports.get(key[0])
        settings = self.detectors.settings(key)
        if held is None or settings is None:
            return
        round_number, peers, report, reported_ms = held
        # The report's round, or the successor its first verdict opened (held for the host).
        stale = self._round_of(key[0]) not in (round_number, round_number + 1)
        if stale or now_ms - reported_ms >= settings.confirm_closed_ms:
            del self._reports[key[0]]
        elif key[1] in peers:
            self._corroborate(key, report, now_ms)

    def progress(self, key: Key, report: ProgressReport, now_ms: int = 0) -> None:
        """The latest progress ``key`` reported, heard at ``now_ms`` (goes to the leader with
        the next report, its ages grown by the time it waited here)."""
        self._progress[key] = report
        self._progress_ms[key] = now_ms
        position = (report.round, report.step, report.waiting_in)
        if self._progress_seen.get(key) != position:
            self._progress_seen[key] = position
            self._progress_news = True

    def rounds_named(self, job: str, named: Iterable[tuple[int, int]]) -> bool:
        """Heartbeats of ``job``'s participants named these rounds ((participant, round)):
        the round each believed current when it sent them. A worker can only name a round
        that existed when it sent the heartbeat, so one naming a round opened by a failure's
        verdict was sent after that failure (leader/held.py). Whether
        one named a higher round than before."""
        higher = False
        for pid, round_number in named:
            key = (job, pid)
            if round_number > self._named.get(key, 0):
                self._named[key] = round_number
                higher = True
        self.named_news |= higher
        return higher

    def forget(self, key: Key) -> None:
        """Stop watching ``key`` without suspicion (released, or no longer a participant)."""
        self._named.pop(key, None)
        gid = self._group_of.pop(key, None)
        if gid is not None and gid in self._groups:
            self._groups[gid].members.discard(key)
        if key in self.detectors or gid is not None:
            self.detectors.forget(key)
            if self._attach.pop(key, False) is False:
                self._detach[key] = None
        self._progress.pop(key, None)
        self._progress_ms.pop(key, None)
        self._progress_seen.pop(key, None)
        self._timed.pop(key, None)
        self._corroborated.pop(key, None)

    def retain(self, is_participant: Callable[[Key], bool]) -> None:
        """Forget every key for which ``is_participant(key)`` is false (they left their
        job)."""
        alone = [k for k in self.detectors.tracked() if k[0] != GROUP_JOB]
        for key in [k for k in (*alone, *self._group_of) if not is_participant(k)]:
            self.forget(key)

    def carried(self) -> list[Key]:
        """Every participant this member watches, in key order."""
        alone = [k for k in self.detectors.tracked() if k[0] != GROUP_JOB]
        return sorted([*alone, *self._group_of])

    def carries(self, key: Key) -> bool:
        return key in self._group_of or key in self.detectors

    # ---------------------------------------------------------------- guards

    def loop_stalled(self, stall_ms: int, now_ms: int) -> None:
        """This process did not run for ``stall_ms``: hold suspicion until what arrived
        meanwhile has been read."""
        self.detectors.grace_until_ms = max(self.detectors.grace_until_ms, now_ms + 2 * stall_ms)
        self._guards["loop_stall"].inc()

    def request_lag(self, clock: StreamClock, now_ms: int, sent_ms: int) -> None:
        """A batch request sent at the sender's ``sent_ms`` arrived now."""
        if sent_ms <= 0:
            return
        self.intake.observe(clock.lag_ms(now_ms, sent_ms))

    def _intake_guard(self, now_ms: int) -> None:
        lag = self.intake.current_ms()
        if lag > INTAKE_LAG_GUARD_MS:
            until = now_ms + 2 * lag
            if until > self.detectors.grace_until_ms:
                if self.detectors.grace_until_ms <= now_ms:
                    self._guards["intake_lag"].inc()
                self.detectors.grace_until_ms = until

    # ---------------------------------------------------------------- verdicts

    def suspects(self, now_ms: int) -> list[Suspicion]:
        """New suspicions (each key at most once per retry period), past every guard."""
        self._intake_guard(now_ms)
        reopened = self.detectors.streams_reopened
        if reopened != self._streams_reopened:
            self._guards["stream_reopened"].inc(reopened - self._streams_reopened)
            self._streams_reopened = reopened
        found = self.detectors.suspects(now_ms)
        if not found:
            return []
        keys: list[Key] = []
        for key in found:
            if key[0] == GROUP_JOB:
                group = self._groups.get(key[1])
                keys.extend(sorted(group.members) if group is not None else ())
            else:
                keys.append(key)
        closed = [k for k in keys if math.isinf(self.phi(k, now_ms) or 0.0)]
        closed_set = set(closed)
        by_phi: dict[str, list[Key]] = {}
        for key in keys:
            if key not in closed_set:
                by_phi.setdefault(key[0], []).append(key)
        credible = list(closed)
        carried_per_job: dict[str, int] = {}
        if by_phi:
            for job, _ in self.carried():
                carried_per_job[job] = carried_per_job.get(job, 0) + 1
        for job, suspected in sorted(by_phi.items()):
            carried = carried_per_job.get(job, 0)
            if len(suspected) <= max(1, carried // 2):
                self._mass_since_ms.pop(job, None)
                credible.extend(suspected)
                continue
            since = self._mass_since_ms.get(job)
            if since is None:
                since = self._mass_since_ms[job] = now_ms
                self._guards["mass_suspicion"].inc()
            if now_ms - since >= MASS_SUSPICION_HOLD_MS:
                credible.extend(suspected)
        out = []
        for key in sorted(credible):
            detector_key = self._detector_key(key)
            value = self.detectors.phi(detector_key, now_ms)
            last_ms = self.detectors.last_heartbeat_ms(detector_key)
            silent_ms = 0 if last_ms is None else max(0, int(now_ms - last_ms))
            tracked_settings = self.detectors.settings(detector_key)
            if value is not None and math.isinf(value):
                kind, cause = "stream_closed", "heartbeat stream closed and not reopened"
                corroboration = self._corroborated.pop(key, None)
                if corroboration is not None:
                    cause = f"heartbeat stream closed, confirmed at once: {corroboration}"
            else:
                threshold = tracked_settings.phi_threshold if tracked_settings else 0.0
                kind = "phi"
                cause = f"phi {value or 0.0:.1f} crossed the threshold {threshold:g}"
            if last_ms is not None and self._timed.get(key) != last_ms:
                self._timed[key] = last_ms
                self._detection[kind].observe(silent_ms / 1000)
            out.append(Suspicion(key[0], key[1], kind, cause, silent_ms))
            if key not in self._group_of:
                # Nobody carries it here any more: the leader decides from this report.
                self.detectors.forget(key)
                self._attach.pop(key, None)
                self._progress.pop(key, None)
                self._progress_ms.pop(key, None)
                self._progress_seen.pop(key, None)
        return out

    # ---------------------------------------------------------------- reports

    def readings(self, now_ms: int) -> list[tuple[Key, int, int]]:
        """(key, phi in thousandths, heartbeat age ms) of the participants watched one by
        one (per-participant streams' groups, and those left alone by a stream), at most
        MAX_READINGS, in key order."""
        alone = [k for k in self.detectors.tracked() if k[0] != GROUP_JOB]
        one_by_one = [
            key
            for group in self._groups.values()
            if group.readings
            for key in group.members
            if self._group_of.get(key) == group.key[1]
        ]
        out = []
        for key in sorted([*alone, *one_by_one]):
            phi = self.phi(key, now_ms)
            age = self.heartbeat_age_ms(key, now_ms)
            if phi is None or age is None:
                continue
            milli = PHI_INFINITE_MILLI if math.isinf(phi) else int(phi * 1000)
            out.append((key, min(milli, PHI_INFINITE_MILLI), age))
            if len(out) >= MAX_READINGS:
                break
        return out

    def take_report(
        self,
        suspicions: list[Suspicion],
        now_ms: int | None = None,
        held: frozenset[str] = frozenset(),
    ) -> LivenessReport:
        """What the leader has not heard yet, with ``suspicions``; a full one if needed.
        ``held``: the jobs whose JOINING round is held for a failed member's domain; the
        report says how recently each of their participants carried on an open stream here
        was heard (``heard``: the leader's word that they are alive, see report.py)."""
        full = self.full_needed
        self.full_needed = False
        report = LivenessReport(
            full=full,
            attach=self.carried() if full else list(self._attach),
            detach=[] if full else list(self._detach),
            suspicions=suspicions,
            progress=[
                (key, _aged(report, now_ms, self._progress_ms.get(key, 0)))
                for key, report in self._progress.items()
            ],
            intake_lag_ms=self.intake.current_ms(),
            readings=self.readings(now_ms) if now_ms is not None else [],
            heard=self.heard(held, now_ms) if held and now_ms is not None else [],
            named=self.named(held) if held else [],
            closed=self.closed_streams(),
        )
        self._attach.clear()
        self._detach.clear()
        self._progress.clear()
        self._progress_ms.clear()
        self._progress_news = False
        self.closed_news = False
        self.named_news = False
        return report

    def has_news(self) -> bool:
        """Participants started or stopped being carried since the last report, or one
        reported a step, round or collective wait it had not: the leader judges hangs by
        comparing ranks' steps, and a rank whose news waited here for the report period
        would look behind the ranks the leader carries itself. Or a stream closed: the
        leader confirms its participants at once when a peer of theirs reported a failed
        collective to it (supervisor.py, ``_corroborate``), from the report's ``closed``."""
        return bool(self._attach or self._detach or self._progress_news or self.closed_news)

    def report_lost(self) -> None:
        """A report did not reach a leader: the next one says everything again."""
        self.full_needed = True

    # ---------------------------------------------------------------- readings

    def heard(self, jobs: frozenset[str], now_ms: int) -> list[tuple[Key, int]]:
        """(key, ms since its stream's last request) of the participants of ``jobs`` that an
        open stream carries here, in key order. One whose stream closed is not listed: its
        last heartbeat may have been read after the failure that held the round, though it
        was sent before its process died (both waited in this member's queue)."""
        out = []
        for key in sorted(k for k in self._group_of if k[0] in jobs):
            age = self.detectors.heartbeat_age_ms((GROUP_JOB, self._group_of[key]), now_ms)
            if age is not None:
                out.append((key, age))
        return out

    def named(self, jobs: frozenset[str]) -> list[tuple[Key, int]]:
        """(key, the highest round its heartbeats named) of the participants of ``jobs`` that
        an open stream carries here, in key order (as ``heard``: one whose stream closed is
        not vouched for)."""
        return [
            (key, self._named[key])
            for key in sorted(k for k in self._group_of if k[0] in jobs)
            if key in self._named
        ]

    def closed_streams(self) -> list[Key]:
        """The participants left alone by a stream that closed, neither heard since nor
        confirmed yet (at most MAX_READINGS), in key order."""
        out = []
        for key in sorted(k for k in self.detectors.tracked() if k[0] != GROUP_JOB):
            if self.detectors.stream_closed_ms(key) is not None:
                out.append(key)
                if len(out) >= MAX_READINGS:
                    break
        return out

    def _detector_key(self, key: Key) -> Key:
        gid = self._group_of.get(key)
        return key if gid is None else (GROUP_JOB, gid)

    def phi(self, key: Key, now_ms: int) -> float | None:
        return self.detectors.phi(self._detector_key(key), now_ms)

    def heartbeat_age_ms(self, key: Key, now_ms: int) -> int | None:
        return self.detectors.heartbeat_age_ms(self._detector_key(key), now_ms)


def _aged(report: ProgressReport, now_ms: int | None, heard_ms: int) -> ProgressReport:
    """``report`` as of ``now_ms``: its ages (the worker's durations at sending) grown by
    the time it was held here since ``heard_ms``. The leader dates a report by its receipt,
    and a member forwards only every report period: unaged, a rank carried by a follower
    would look up to a period behind the ranks the leader carries itself, and a healthy one
    two short steps behind (the progress rule's hang)."""
    if now_ms is None or not heard_ms or now_ms <= heard_ms:
        return report
    held_ms = now_ms - heard_ms
    return dataclasses.replace(
        report,
        step_age_ms=report.step_age_ms + held_ms if report.step else report.step_age_ms,
        waiting_ms=report.waiting_ms + held_ms if report.waiting_in else report.waiting_ms,
    )
