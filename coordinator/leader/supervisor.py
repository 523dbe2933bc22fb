"""Rendezvous duties that depend on time: every member's detection pass, and the leader's.

It sits in ``leader/`` for its leader half (verdicts, closing rounds, progress judgement);
its member half, run on every member, drives ``coordinator/liveness`` and is what the
heartbeat servicers reach through ``liveness.port.LivenessPort``, which it implements.

Theory of operation. The replicated state machine never reads a clock, so decisions that
depend on time are proposed:

- closing a JOINING round whose last call has passed (``CloseRound``, the leader's; the
  apply re-checks the condition against the proposed time, so a stale or early proposal
  changes nothing);
- declaring a worker failed (``MemberFailed``). Detection is spread over the members
  (``coordinator/liveness``): each member runs the detectors of the participants whose
  heartbeat streams it serves (``MemberDetection``) and reports to the leader; the leader's
  ``Coverage`` turns suspicions into verdicts unless the participant moved to another member,
  and declares those no member hears. The leader is a member too: its own streams are
  reported in-process;
- declaring a worker hung, or evicting a straggler, from the training progress its
  heartbeats report (``liveness/progress.py``, the leader's; members forward the progress their
  streams carry);
- noting when an ACTIVE round trains: the first step a worker reports done in it
  (``RoundTrained``), with where the round's state came from as its workers reported it.

Every member runs :meth:`RendezvousSupervisor.run`: a pass every ``interval_s`` that probes its
own event loop (a late loop holds its suspicions), collects its suspicions, and sends the
leader a ``LivenessReport`` every ``REPORT_EVERY_MS``, or sooner when it suspects someone,
starts carrying someone, or hears a worker report a new step or collective wait
(``coverage.ATTACH_REPORT_MS``: the hang rules compare ranks' steps, and ranks the leader
carries itself must not look ahead of the ones a follower carries), or, while a round is
held, hears a participant name a newer round (``held.py``). A member that is leader
hands its report to its own coverage and runs the leader's duties. After a leader change the
members' detectors carry on; the new leader's coverage and progress start over with a grace period.

Metrics (``metrics.py``). Each heartbeat adds one to an unlabelled counter. Each verdict is
timed once from the worker's last sign of life to the pass that suspects it. Each guard that
holds suspicion back is counted when it engages: a loop stall, intake lag, the grace of a new
leader, a mass suspicion, a closed stream that came back in time. Phi is sampled, not
computed for everyone: once a second the next ``PHI_SAMPLE_SIZE`` carried participants.

A failed collective (``collective_failed``) confirms at once the round's members whose
heartbeat stream closed on the member it is reported to (``local.py``). On the leader it also
confirms those whose stream closed on another member, by that member's word: its latest
report lists them as closed and not heard since (``LivenessReport.closed``) and it still
carries them (no other member attached them since), within the same confirmation window
after the report (``_corroborate``).
The report goes to every member, and a member confirms the streams it saw close before the
report, or within the window after it while the report's round or the successor its first
verdict opened is current. A host-mate whose stream end reached its member after that
(a loaded member, measured up to 0.3 s after the kill) would wait out its two heartbeat
intervals, and each such late removal would push the held round's close two intervals
further (rendezvous.py, "Failure domains"). The leader keeps the report through the held
successor too, for the word of a member that did not get the report in time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Sequence

from ..liveness.coverage import ATTACH_REPORT_MS, Coverage, Verdict
from ..liveness.local import MemberDetection, StreamClock
from ..liveness.phi import DetectorSettings
from ..liveness.progress import ProgressReport, ProgressTracker
from ..liveness.report import (
    MAX_READINGS,
    PHI_INFINITE_MILLI,
    BadReport,
    LivenessReport,
    Suspicion,
)
from ..liveness.report import decode as decode_report
from ..liveness.report import encode as encode_report
from ..metrics import NodeMetrics
from ..state.commands import CloseRound, Command, MemberFailed, RoundTrained
from ..state.jobs import EndReason, JobConfig, RoundState
from ..state.versions import HOLD_OVER_VERSION
from ..state.view import JobView, StateView
from .held import Word, all_known_alive, seats_to_check

log = logging.getLogger("rallypoint.supervisor")

Key = tuple[str, int]

# This member's own event loop running this much late means heartbeats sat unread: nobody is
# suspected for twice the stall (Cassandra's detector does the same after a GC pause).
LOOP_STALL_S = 0.05
# A loop this late is logged.
LOOP_STALL_REPORT_S = 0.5
# Phi sampling for the rallypoint_phi histogram: this many participants, this often.
PHI_SAMPLE_SIZE = 64
PHI_SAMPLE_EVERY_MS = 1000
# Per pass, how many suspicions and verdicts are logged one by one (the rest are counted).
LOG_EACH = 8
# A member reports to the leader at least this often (also its sign of life to the leader).
REPORT_EVERY_MS = 250
# A member none of whose reports a leader took for this long ends its batch streams (below
# the leader's MEMBER_SILENT_MS, so participants move before they count as unheard).
UNREPORTED_MS = 2000
# How often a member drops the detectors of participants that left their job.
RETAIN_EVERY_MS = 200

SendReport = Callable[[int, bytes], Awaitable[bool]]


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class RendezvousSupervisor:
    def __init__(
        self,
        state: StateView,
        propose: Callable[[Command], Awaitable[object]],
        wall_clock_ms: Callable[[], int],
        *,
        grace_ms: int = 2000,
        interval_s: float = 0.02,
        metrics: NodeMetrics | None = None,
        member_id: int = 0,
        leader_id: Callable[[], int] | None = None,
        send_report: SendReport | None = None,
    ) -> None:
        self._state = state
        self._propose = propose
        self._wall_clock_ms = wall_clock_ms
        self.grace_ms = grace_ms
        self.interval_s = interval_s
        self.member_id = member_id
        self._leader_id = leader_id or (lambda: 0)
        self._send_report = send_report
        self._metrics = metrics = metrics if metrics is not None else NodeMetrics(0)
        self._leader_grace = metrics.suspicion_guards.labels("leader_grace")
        self._detection_hang = metrics.detection_seconds.labels("hang")
        # This member's detectors (every member), and the leader's view of all members'.
        self.local = MemberDetection(metrics, round_of=self._round_of)
        self.coverage = Coverage(member_id, report_every_ms=REPORT_EVERY_MS)
        # Phi sampling: where the next sample starts, and when the last one was taken.
        self._sample_cursor = 0
        self._sampled_ms = 0
        # Training progress of the workers that report it: hangs and stragglers.
        self.progress = ProgressTracker()
        # (job, participant, round) -> when a verdict from progress was last proposed.
        self._verdict_proposed_ms: dict[tuple[str, int, int], int] = {}
        self.is_leader = False
        # Close proposals in flight or recently made, so each is proposed once per second.
        self._close_proposed_ms: dict[Key, int] = {}
        # The same for RoundTrained, per (job, round).
        self._trained_proposed_ms: dict[Key, int] = {}
        # Proposals in flight (referenced so they are not collected before they finish).
        self._in_flight: set[asyncio.Task[None]] = set()
        # Reporting to the leader (members that are not it): suspicions not yet delivered,
        # when the last report went, the leader it went to, the send in flight.
        self._unsent: list[Suspicion] = []
        self._reported_ms = 0
        self._reported_to = 0
        self._sending: asyncio.Task[None] | None = None
        self._retained_revision = -1
        self._retained_ms = -RETAIN_EVERY_MS
        # Replay protection (report.py): this process's id and report count, and per member
        # the last (process, count) taken.
        self._boot = int.from_bytes(os.urandom(8), "big") >> 1 | 1
        # When a report was last taken by a leader (a new member gets a start's worth).
        self._taken_ms = monotonic_ms()
        self._seq = 0
        self._report_seen: dict[int, tuple[int, int]] = {}
        # Leader: other members' readings of the participants they watch one by one:
        # key -> (phi in thousandths, heartbeat age ms, when received).
        self._readings: dict[Key, tuple[int, int, int]] = {}
        # The jobs whose JOINING round is held for a failed member's domain, within the hold
        # and the confirmation window after it (every member: its reports say whom it hears
        # in them; ``_in_doubt``), and per job the wall time that window ends, as of the
        # state revision ``_held_revision``.
        self._held: frozenset[str] = frozenset()
        self._held_until: dict[str, int] = {}
        self._held_revision = -1
        # Leader: when each participant of a held job was last heard on an open stream, by
        # any member's word (this member's monotonic ms): ``_in_doubt``.
        self._heard: dict[Key, int] = {}
        # Leader: the highest round each participant of a held job named in a heartbeat on an
        # open stream, by any member's word (``LivenessReport.named``; ``_all_known_alive``).
        self._named: dict[Key, int] = {}
        # Leader: per (job, its revision, round, held domains) the participants whose word
        # ends a hold (``held.seats_to_check``).
        self._seats: dict[tuple[str, int, int, tuple[str, ...]], tuple[int, ...]] = {}
        # Leader: the participants that reported a failed collective here: (job, participant)
        # -> (the round it failed in, when): alive after the failure that ended that round
        # (``_known_alive``).
        self._reported: dict[Key, tuple[int, int]] = {}
        # Leader: (job, round) -> when the first failed collective of that round was reported
        # here: no later than the death that failed it (``_all_known_alive``).
        self._first_report: dict[tuple[str, int], int] = {}
        # Leader: the failed collective reported here last, per job, for the confirmation
        # window after it: (round, its members not yet confirmed, the report, when).
        self._collective: dict[str, tuple[int, frozenset[int], str, int]] = {}
        # Leader: per other member, the participants whose stream closed on it (not heard
        # since, not confirmed yet) as its latest report said, and when that report came.
        self._closed_on: dict[int, tuple[frozenset[Key], int]] = {}

    # -------------------------------------------------------------- leadership

    def promote(self) -> None:
        self.is_leader = True
        now_ms = monotonic_ms()
        self.progress.clear()
        self.coverage.reset(now_ms, self.grace_ms)
        # Its own carriage goes to its fresh coverage in full.
        self.local.report_lost()
        self._unsent.clear()
        self._collective.clear()
        self._closed_on.clear()
        self._reported.clear()
        self._first_report.clear()
        self._leader_grace.inc()

    def demote(self) -> None:
        self.is_leader = False
        self._close_proposed_ms.clear()
        self.local.report_lost()

    # -------------------------------------------------------------- inputs (liveness.port)

    def open_group(self, job: str, now_ms: int, *, readings: bool = False) -> int:
        found = self._state.rendezvous.jobs.get(job)
        config = found.config if found is not None else JobConfig(1, 1)
        return self.local.open_group(DetectorSettings.of_job(config), now_ms, readings=readings)

    def group_update(self, group: int, members: set[Key], now_ms: int) -> None:
        self.local.group_update(group, members, now_ms)

    def group_beat(self, group: int, now_ms: int) -> None:
        self.local.group_beat(group, now_ms)

    def group_release(self, group: int, job: str, participant_id: int) -> None:
        self.local.group_release(group, (job, participant_id))

    def close_group(self, group: int, now_ms: int, *, closed: bool) -> None:
        self.local.close_group(group, now_ms, closed=closed)

    def rounds_named(self, job: str, named: Sequence[tuple[int, int]]) -> None:
        if not self.local.rounds_named(job, named):
            return
        self._note_held()  # the round may have been held since this member's last pass
        if job not in self._held:
            return
        # A newer round named may end the hold: said now, not at the next pass.
        now_ms = monotonic_ms()
        if not self.is_leader:
            self._maybe_report(now_ms)
            return
        # Only what these heartbeats named (they came on an open stream here): not a walk
        # of every participant, since a round change makes each of them name it at once.
        for pid, round_number in named:
            key = (job, pid)
            if round_number > self._named.get(key, 0):
                self._named[key] = round_number
        self._end_hold_early(frozenset((job,)), now_ms)

    def request_lag(self, clock: StreamClock, now_ms: int, sent_ms: int) -> None:
        self.local.request_lag(clock, now_ms, sent_ms)

    def collective_failed(
        self, job: str, round_number: int, peers: Sequence[int], report: str, now_ms: int
    ) -> list[int]:
        # The supervisor's next pass reports the verdicts confirmed here at once.
        confirmed = self.local.collective_failed(job, round_number, peers, report, now_ms)
        if self.is_leader:
            rest = frozenset(peers).difference(confirmed)
            self._collective[job] = (round_number, rest, report, now_ms)
            found = self._state.rendezvous.jobs.get(job)
            if found is not None and found.round.number == round_number:
                if len(self._reported) > 4096:
                    self._reported.clear()
                    self._first_report.clear()
                self._first_report.setdefault((job, round_number), now_ms)
                for seat in found.round.members:
                    if seat.participant_id not in peers:  # the reporter
                        self._reported[(job, seat.participant_id)] = (round_number, now_ms)
            confirmed += self._corroborate(job, now_ms)
        return confirmed

    def _corroborate(self, job_id: str, now_ms: int) -> list[int]:
        """The leader: the members of a round whose failed collective was reported here
        within the confirmation window, and whose stream another member says closed, are
        confirmed failed now (module docstring), as ``local.collective_failed`` confirms
        the ones whose stream closed here: two observations of one death. Proposed at
        once; a verdict that does not commit is made again by that member's own window."""
        held = self._collective.get(job_id)
        if held is None:
            return []
        round_number, peers, report, reported_ms = held
        job = self._state.rendezvous.jobs.get(job_id)
        window_ms = 2 * job.config.heartbeat_interval_ms if job is not None else 0
        # The report's round, or the successor its end opened (a verdict on a host-mate
        # lands while that one is held).
        if (
            job is None
            or now_ms - reported_ms > window_ms
            or job.round.number not in (round_number, round_number + 1)
        ):
            del self._collective[job_id]
            return []
        confirmed = []
        for pid in sorted(peers):
            key = (job_id, pid)
            member = self.coverage.carrier.get(key)
            if member is None or member == self.member_id or pid not in job.participants:
                continue
            closed, said_ms = self._closed_on.get(member, (frozenset(), 0))
            if key not in closed or reported_ms - said_ms > window_ms:
                continue  # open, moved to another member since, or that word is old
            confirmed.append(pid)
            cause = f"heartbeat stream closed on member {member}, confirmed at once: {report}"
            log.info("job %s: participant %d suspected: %s", job_id, pid, cause)
            self._spawn(MemberFailed(job_id, pid, round_number, cause))
        if confirmed:
            self._collective[job_id] = (
                round_number,
                peers.difference(confirmed),
                report,
                reported_ms,
            )
        return confirmed

    def _round_of(self, job: str) -> int:
        found = self._state.rendezvous.jobs.get(job)
        return found.round.number if found is not None else 0

    def report_progress(
        self, job: str, participant_id: int, progress: ProgressReport, now_ms: int
    ) -> None:
        if self.is_leader:
            self.progress.report(job, participant_id, progress, now_ms)
        else:
            self.local.progress((job, participant_id), progress, now_ms)

    def progress_of(self, job: str, participant_id: int) -> tuple[int, float, float] | None:
        """(last step, ms per step outside collectives, ratio to the job's median), on the
        leader; None on a follower (its tracker is not fed)."""
        return self.progress.view(job, participant_id) if self.is_leader else None

    def _reading(self, key: Key, now_ms: int) -> tuple[int, int, int] | None:
        """The latest reading another member reported of ``key`` (leader only, and only
        while fresh: within two report periods)."""
        if not self.is_leader or self.coverage.carrier.get(key) in (None, self.member_id):
            return None
        reading = self._readings.get(key)
        if reading is None or now_ms - reading[2] > 2 * REPORT_EVERY_MS:
            return None
        return reading

    def phi(self, job: str, participant_id: int) -> float | None:
        """This member's reading, or on the leader the member's that serves the stream."""
        key = (job, participant_id)
        now_ms = monotonic_ms()
        value = self.local.phi(key, now_ms)
        if value is None:
            reading = self._reading(key, now_ms)
            if reading is not None:
                value = math.inf if reading[0] >= PHI_INFINITE_MILLI else reading[0] / 1000
        if value is None or math.isinf(value):
            return value
        return round(value, 3)

    def heartbeat_age_ms(self, job: str, participant_id: int) -> int | None:
        key = (job, participant_id)
        now_ms = monotonic_ms()
        age = self.local.heartbeat_age_ms(key, now_ms)
        if age is None:
            reading = self._reading(key, now_ms)
            if reading is not None:
                age = reading[1] + (now_ms - reading[2])
        return age

    def take_report(self, member: int, payload: bytes) -> bool:
        """A member's liveness report (the peer service hands it over); False if this member
        is not the leader. Raises ``report.BadReport`` for a report that cannot be read."""
        report = decode_report(payload)
        if not self.is_leader:
            return False
        last = self._report_seen.get(member)
        if last is not None and last[0] == report.boot and report.seq <= last[1]:
            raise BadReport(
                f"report {report.seq} of this process was already taken (last {last[1]}): "
                "a replay, or out of order"
            )
        self._report_seen[member] = (report.boot, report.seq)
        self._take(member, report, monotonic_ms())
        return True

    def _take(self, member: int, report: LivenessReport, now_ms: int) -> None:
        # A report can come before this member's next pass has seen a round held.
        self._note_held()
        for key, age_ms in report.heard:
            if key[0] in self._held:
                self._heard[key] = max(self._heard.get(key, 0), now_ms - age_ms)
        for key, round_number in report.named:
            if key[0] in self._held:
                self._named[key] = max(self._named.get(key, 0), round_number)
        if member != self.member_id and report.named:
            self._end_hold_early(frozenset(key[0] for key, _ in report.named), now_ms)
        if member != self.member_id:
            for key, phi_milli, age_ms in report.readings:
                self._readings[key] = (phi_milli, age_ms, now_ms)
            if len(self._readings) > 4 * MAX_READINGS:
                self._readings.clear()
            self._closed_on[member] = (frozenset(report.closed), now_ms)
            for job_id in list(self._collective):
                self._corroborate(job_id, now_ms)
        self._propose_all(self.coverage.take(member, report, self._state, now_ms))
        for (job, pid), progress in report.progress:
            self.progress.report(job, pid, progress, now_ms)

    # -------------------------------------------------------------- the loop

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(self.interval_s)
            now = loop.time()
            stall_s = now - last - self.interval_s
            last = now
            if stall_s > LOOP_STALL_S:
                self.loop_stalled(int(stall_s * 1000))
                if stall_s > LOOP_STALL_REPORT_S:
                    # Ticks, heartbeats and peers' messages waited as long: a member that
                    # seems slow to elect or to answer often shows this first.
                    log.warning(
                        "member %d: this member's event loop ran %.1f s late (CPU starved, "
                        "or blocked)",
                        self.member_id,
                        stall_s,
                    )
            self.step()

    def loop_stalled(self, stall_ms: int) -> None:
        """This process did not run for ``stall_ms``: heartbeats that arrived meanwhile are
        still queued, so hold suspicion until they have been read."""
        self.local.loop_stalled(stall_ms, monotonic_ms())

    def step(self) -> None:
        """One pass: this member's detection and reporting, then the leader's duties if it
        leads (public for tests)."""
        now_ms = monotonic_ms()
        self._retain(now_ms)
        self._note_held()
        suspicions = self.local.suspects(now_ms)
        for suspicion in suspicions[:LOG_EACH]:
            log.info(
                "job %s: participant %d suspected: %s",
                suspicion.job,
                suspicion.participant_id,
                suspicion.cause,
            )
        if len(suspicions) > LOG_EACH:
            log.info("and %d more suspected in this pass", len(suspicions) - LOG_EACH)
        self._sample_phi(now_ms)
        if self.is_leader:
            self._unsent.clear()
            report = self.local.take_report(suspicions)
            if self._held:
                report.heard = self.local.heard(self._held, now_ms)
                report.named = self.local.named(self._held)
            self._take(self.member_id, report, now_ms)
            self._lead(now_ms)
        else:
            self._unsent.extend(suspicions)
            self._maybe_report(now_ms)

    def _retain(self, now_ms: int) -> None:
        """Forget detectors of participants that left their jobs (on a state change, at
        most every RETAIN_EVERY_MS)."""
        rendezvous = self._state.rendezvous
        if rendezvous.revision == self._retained_revision:
            return
        if now_ms - self._retained_ms < RETAIN_EVERY_MS:
            return
        self._retained_revision = rendezvous.revision
        self._retained_ms = now_ms
        jobs = rendezvous.jobs

        def present(key: Key) -> bool:
            job = jobs.get(key[0])
            return job is not None and key[1] in job.participants

        self.local.retain(present)
        tracked = self.progress.jobs
        self.progress.retain(
            [(j, pid) for j in tracked for pid in tracked[j].ranks if present((j, pid))]
        )

    def _note_held(self) -> None:
        """Find the jobs whose JOINING round is held (on a state change), and keep those
        whose hold, with the confirmation window after it, is not over: a round that stays
        JOINING long after its hold (below min_nodes) is no longer reported on."""
        rendezvous = self._state.rendezvous
        if rendezvous.revision != self._held_revision:
            self._held_revision = rendezvous.revision
            self._held_until = {
                job_id: job.round.hold_until_ms + 2 * job.config.heartbeat_interval_ms
                for job_id, job in rendezvous.jobs.items()
                if job.round.state is RoundState.JOINING and job.round.hold_until_ms
            }
        if not self._held_until and not self._held:
            return
        wall_ms = self._wall_clock_ms()
        held = frozenset(job for job, until in self._held_until.items() if wall_ms < until)
        if held != self._held:
            self._held = held
            self._heard = {key: ms for key, ms in self._heard.items() if key[0] in held}
            self._named = {key: n for key, n in self._named.items() if key[0] in held}

    def _maybe_report(self, now_ms: int) -> None:
        """Send the leader a report when one is due (and none is in flight)."""
        if self._send_report is None or (self._sending and not self._sending.done()):
            return
        leader = self._leader_id()
        if not leader or leader == self.member_id:
            return
        if leader != self._reported_to:
            self.local.report_lost()  # a new leader hears everything
        since = now_ms - self._reported_ms
        # While a round is held, the leader waits for word of its members (``_in_doubt``).
        news = self.local.has_news() or bool(self._held)
        # A stream that closed goes at once too: the leader may confirm it with a failed
        # collective reported to it (``_corroborate``), and a host-mate's late removal
        # pushes a held round's close on.
        # So does a held job's participant naming a newer round: it may end the hold
        # (``_all_known_alive``).
        urgent = (
            bool(self._unsent)
            or self.local.closed_news
            or (self.local.named_news and bool(self._held))
            or (news and since >= ATTACH_REPORT_MS)
        )
        if not urgent and since < REPORT_EVERY_MS and not self.local.full_needed:
            return
        suspicions = list(self._unsent)
        self._unsent.clear()
        report = self.local.take_report(suspicions, now_ms, self._held)
        self._seq += 1
        report.boot, report.seq = self._boot, self._seq
        self._reported_ms = now_ms
        self._sending = asyncio.get_running_loop().create_task(
            self._deliver(leader, report, suspicions)
        )

    async def _deliver(
        self, leader: int, report: LivenessReport, suspicions: list[Suspicion]
    ) -> None:
        assert self._send_report is not None
        try:
            taken = await self._send_report(leader, encode_report(report))
        except Exception as exc:
            log.debug("liveness report to member %d failed: %s", leader, exc)
            taken = False
        if taken:
            self._reported_to = leader
            self._taken_ms = monotonic_ms()
        else:
            # Said again in full to whichever leader comes; the suspicions are not: once this
            # member stops reporting the leader treats what it carried as unheard (its
            # backstop), and a stale suspicion could land after the participant had moved.
            self._reported_to = 0
            self.local.report_lost()

    def serves_heartbeats(self) -> bool:
        """Whether this member's view of its streams reaches the leader: it is the leader,
        or a report was taken within ``UNREPORTED_MS``. A member that is cut off from the
        leader ends its batch streams, so their participants move to a member that is not
        (the leader would otherwise find them unheard)."""
        if self.is_leader:
            return True
        return monotonic_ms() - self._taken_ms < UNREPORTED_MS

    def _lead(self, now_ms: int) -> None:
        """The leader's duties."""
        wall_ms = self._wall_clock_ms()
        rendezvous = self._state.rendezvous
        for key in rendezvous.closes_due(wall_ms):
            if self._in_doubt(key[0], wall_ms, now_ms):
                continue
            last = self._close_proposed_ms.get(key)
            if last is not None and wall_ms - last < 1000:
                continue
            self._close_proposed_ms[key] = wall_ms
            self._spawn(CloseRound(key[0], key[1]))
        self._end_hold_early(self._held, now_ms, wall_ms)
        if len(self._close_proposed_ms) > 1024:
            self._close_proposed_ms.clear()
        self._propose_all(self.coverage.step(self._state, now_ms))
        if now_ms >= self.coverage.grace_until_ms:
            self._judge_progress(now_ms)
        self._note_training(wall_ms)

    def _in_doubt(self, job_id: str, wall_ms: int, now_ms: int) -> bool:
        """Whether a held round whose hold ran out must not close yet: a member of a domain
        is not known alive since the failure that held it. A failed member's host-mates
        fail with it, but their streams' ends may be noticed later than its own (a peer's
        failed collective confirms one at once, or one member's queue is behind): each one
        is only confirmed two heartbeat intervals after its end. Closing at the end of the
        hold would seat one of them, and its verdict would end the round just formed, a
        second round for one host loss (rendezvous.py, "Failure domains"). So the round
        waits until every member with a domain has been heard on an open stream at least a
        heartbeat interval after the failure (a heartbeat read right after the failure may
        have been sent before a death: it waited in a queue with the stream's end), by the
        word of the member carrying it (``LivenessReport.heard``), or was removed; for at
        most the confirmation window (two heartbeat intervals) past the hold, after which
        the round closes as before."""
        job = self._state.rendezvous.jobs.get(job_id)
        if job is None or not job.round.hold_until_ms:
            return False
        r, interval_ms = job.round, job.config.heartbeat_interval_ms
        if wall_ms >= r.hold_until_ms + 2 * interval_ms:
            return False
        return not self._all_known_alive(job_id, job, (), wall_ms, now_ms)

    def _end_hold_early(self, jobs: frozenset[str], now_ms: int, wall_ms: int = 0) -> None:
        """``_end_hold`` for those of ``jobs`` that are held (the leader, cluster version 4)."""
        if self._state.rendezvous.cluster_version >= HOLD_OVER_VERSION:
            wall_ms = wall_ms or self._wall_clock_ms()
            for job_id in sorted(jobs & self._held):
                self._end_hold(job_id, wall_ms, now_ms)

    def _end_hold(self, job_id: str, wall_ms: int, now_ms: int) -> None:
        """End a held round's hold before its time (``CloseRound.hold_over``, cluster version
        4) once every remaining participant of the domains holding it is known alive since
        the failure (``_all_known_alive``): its host did not fail with the failed member, so
        nothing is left to wait for. Proposed once per second at most, like a close."""
        job = self._state.rendezvous.jobs.get(job_id)
        if job is None or job.round.state is not RoundState.JOINING:
            return
        r = job.round
        if wall_ms >= r.hold_until_ms:
            return  # over: closes_due proposes the close
        if not self._all_known_alive(job_id, job, r.hold_domains, wall_ms, now_ms):
            return
        key = (job_id, r.number)
        last = self._close_proposed_ms.get(key)
        if last is not None and wall_ms - last < 1000:
            return
        self._close_proposed_ms[key] = wall_ms
        log.info(
            "job %s: round %d: every participant of the held domains was heard from since "
            "the failure: its hold ends",
            job_id,
            r.number,
        )
        self._spawn(CloseRound(job_id, r.number, hold_over=True))

    def _all_known_alive(
        self, job_id: str, job: JobView, domains: Sequence[str], wall_ms: int, now_ms: int
    ) -> bool:
        """``held.all_known_alive`` by this leader's word of the participants (the seats it
        judges kept per job revision and domains: ``held.seats_to_check``)."""
        key = (job_id, job.revision, job.round.number, tuple(domains))
        seats = self._seats.get(key)
        if seats is None:
            if len(self._seats) >= 64:
                self._seats.clear()
            seats = self._seats[key] = seats_to_check(job, domains)
        word = Word(self._heard, self._named, self._reported, self._first_report)
        return all_known_alive(job_id, job, seats, word, wall_ms, now_ms)

    def _propose_all(self, verdicts: list[Verdict]) -> None:
        """Propose MemberFailed for each verdict (the backstop's are logged, LOG_EACH of them
        one by one and the rest counted: a member's death can orphan thousands at once)."""
        unheard = 0
        for verdict in verdicts:
            job = self._state.rendezvous.jobs.get(verdict.job)
            if job is None or verdict.participant_id not in job.participants:
                continue
            if verdict.kind == "unheard":
                unheard += 1
                if unheard <= LOG_EACH:
                    log.info(
                        "job %s: participant %d: %s",
                        verdict.job,
                        verdict.participant_id,
                        verdict.cause,
                    )
            self._spawn(
                MemberFailed(verdict.job, verdict.participant_id, job.round.number, verdict.cause)
            )
        if unheard > LOG_EACH:
            log.info("and %d more participants no member hears", unheard - LOG_EACH)

    def _sample_phi(self, now_ms: int) -> None:
        """Every PHI_SAMPLE_EVERY_MS, the phi of the next PHI_SAMPLE_SIZE of this member's
        detectors (one per per-participant stream, one per batch stream: its participants
        share it, and their phi is one value)."""
        if now_ms - self._sampled_ms < PHI_SAMPLE_EVERY_MS:
            return
        self._sampled_ms = now_ms
        keys = self.local.detectors.tracked()
        if not keys:
            return
        start = self._sample_cursor % len(keys)
        chosen = keys[start : start + PHI_SAMPLE_SIZE]
        if len(chosen) < PHI_SAMPLE_SIZE and start:
            chosen += keys[: min(start, PHI_SAMPLE_SIZE - len(chosen))]
        self._sample_cursor = start + len(chosen)
        for key in chosen:
            value = self.local.detectors.phi(key, now_ms)
            if value is not None and math.isfinite(value):
                self._metrics.phi.observe(value)

    def _note_training(self, wall_ms: int) -> None:
        """Propose RoundTrained for ACTIVE rounds a worker reported a step done in (once a
        second at most per round, until applied)."""
        rendezvous = self._state.rendezvous
        for job_id in sorted(self.progress.jobs):
            job = rendezvous.jobs.get(job_id)
            if job is None or job.round.state is not RoundState.ACTIVE or job.round.trained_ms:
                continue
            number = job.round.number
            if not self.progress.trained(job_id, number):
                continue
            key = (job_id, number)
            last = self._trained_proposed_ms.get(key)
            if last is not None and wall_ms - last < 1000:
                continue
            self._trained_proposed_ms[key] = wall_ms
            self._spawn(RoundTrained(job_id, number, self.progress.restore_of(job_id, number)))
        if len(self._trained_proposed_ms) > 1024:
            self._trained_proposed_ms.clear()

    def _judge_progress(self, now_ms: int) -> None:
        """Hang and straggler verdicts for every ACTIVE round (progress.py), each proposed
        at most once a second."""
        rendezvous = self._state.rendezvous
        # Per job label (jobs past the label cap share one), the highest step ratio.
        ratio_max: dict[str, float] = {}
        for job_id in sorted(self.progress.jobs):
            job = rendezvous.jobs.get(job_id)
            if job is None or job.round.state is not RoundState.ACTIVE:
                continue
            number = job.round.number
            members = [m.participant_id for m in job.round.members]
            views = [self.progress.view(job_id, pid) for pid in members]
            label = self._metrics.job_label(job_id)
            ratios = [v[2] for v in views if v is not None]
            ratio_max[label] = max([*ratios, ratio_max.get(label, 0.0)])
            verdicts = self.progress.hangs(job_id, number, members, job.config, now_ms)
            verdicts += self.progress.stragglers(job_id, number, members, job.config, now_ms)
            for verdict in verdicts:
                key = (job_id, verdict.participant_id, number)
                last = self._verdict_proposed_ms.get(key)
                if last is not None and now_ms - last < 1000:
                    continue
                self._verdict_proposed_ms[key] = now_ms
                log.warning(
                    "job %s: participant %d: %s", job_id, verdict.participant_id, verdict.cause
                )
                reason = EndReason.STRAGGLER if verdict.straggler else EndReason.MEMBER_FAILED
                cause = "straggler" if verdict.straggler else "hang"
                self._metrics.progress_verdicts.labels(cause).inc()
                if not verdict.straggler and last is None:
                    self._detection_hang.observe(verdict.silent_ms / 1000)
                self._spawn(
                    MemberFailed(job_id, verdict.participant_id, number, verdict.cause, reason)
                )
        if len(self._verdict_proposed_ms) > 1024:
            self._verdict_proposed_ms.clear()
        for label, ratio in ratio_max.items():
            self._metrics.step_ratio_max.labels(label).set(ratio)

    def _spawn(self, command: Command) -> None:
        task = asyncio.get_running_loop().create_task(self._submit(command))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _submit(self, command: Command) -> None:
        # ``propose`` answers the expected failures (no leader, dropped, timed out) itself:
        # a verdict that did not commit is proposed again by a later pass if still due.
        await self._propose(command)
