"""The leader's rendezvous duties: close rounds on time and declare silent workers failed.

Theory of operation. The replicated state machine never reads a clock, so two decisions
that depend on time are the leader's to take and to propose:

- closing a JOINING round whose last call has passed (``CloseRound``; the apply re-checks
  the condition against the proposed time, so a stale or early proposal changes nothing);
- declaring a worker failed when its phi-accrual suspicion crosses the job's threshold, or
  when its heartbeat stream closed and no new one arrived in time (``MemberFailed``);
- declaring a worker hung, or evicting a straggler, from the training progress its
  heartbeats report (``progress.py``; ``MemberFailed`` with its cause);
- noting when an ACTIVE round trains: the first step a worker reports done in it
  (``RoundTrained``; ``rallypoint rounds`` shows it as "training again" after a recovery),
  with where the round's state came from as its workers reported it (``restore``).

The detectors are soft state (``phi.DetectorSet``): they live only on the leader and start
over with a grace period whenever this member becomes leader, so nobody is declared dead
because leadership moved and heartbeats took a moment to find the new leader. Detectors
run on the monotonic clock; the round-closing decision uses the wall clock, which is what
the state machine's time is made of (``Envelope.leader_time_ms``).

Metrics (``metrics.py``). Each heartbeat adds one to an unlabelled counter. Each verdict is
timed once from the worker's last sign of life (its last heartbeat, or for a hang its last
completed step) to the pass that proposes it. Each guard that holds suspicion back is
counted when it engages: a loop stall, the grace of a new leader, a mass suspicion, a
closed stream that came back in time. Phi is sampled, not computed for everyone: once a
second the next ``PHI_SAMPLE_SIZE`` participants in turn, so its cost does not grow with
the number of participants.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable

from ..metrics import NodeMetrics
from ..node_api import NodeError
from ..state.commands import CloseRound, Command, MemberFailed, RoundTrained
from ..state.jobs import EndReason, RoundState
from ..state.view import StateView
from .phi import DetectorSet, DetectorSettings
from .progress import ProgressReport, ProgressTracker

log = logging.getLogger("rallypoint.supervisor")

Key = tuple[str, int]

# The leader's own event loop running this much late means heartbeats sat unread: nobody is
# suspected for twice the stall (Cassandra's detector does the same after a GC pause).
LOOP_STALL_S = 0.05
# A loop this late is logged.
LOOP_STALL_REPORT_S = 0.5
# Suspecting more than half of a job's participants at once from phi alone is more likely the
# leader being slow than half the workers dying together: such a verdict must hold this long.
MASS_SUSPICION_HOLD_MS = 5000
# Phi sampling for the rallypoint_phi histogram: this many participants, this often.
PHI_SAMPLE_SIZE = 64
PHI_SAMPLE_EVERY_MS = 1000


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
    ) -> None:
        self._state = state
        self._propose = propose
        self._wall_clock_ms = wall_clock_ms
        self.grace_ms = grace_ms
        self.interval_s = interval_s
        self._metrics = metrics = metrics if metrics is not None else NodeMetrics(0)
        # Children looked up once: the heartbeat path only increments.
        self._heartbeats_received = metrics.heartbeats_received
        self._guards = {
            guard: metrics.suspicion_guards.labels(guard)
            for guard in ("loop_stall", "leader_grace", "mass_suspicion", "stream_reopened")
        }
        self._detection = {
            cause: metrics.detection_seconds.labels(cause)
            for cause in ("phi", "stream_closed", "hang")
        }
        # Key -> the last heartbeat (monotonic ms) of the verdict last timed for it, so a
        # verdict proposed again (once a second until applied) is timed once.
        self._timed_verdicts: dict[Key, float] = {}
        # The detectors' count of streams reopened in time, as far as exported.
        self._streams_reopened = 0
        # Phi sampling: the participants in key order (as of the last sync), where the next
        # sample starts, and when the last one was taken.
        self._sample_keys: list[Key] = []
        self._sample_cursor = 0
        self._sampled_ms = 0
        self.detectors = DetectorSet(retry_ms=1000)
        # Training progress of the workers that report it: hangs and stragglers.
        self.progress = ProgressTracker()
        # (job, participant, round) -> when a verdict from progress was last proposed.
        self._verdict_proposed_ms: dict[tuple[str, int, int], int] = {}
        self.is_leader = False
        # The rendezvous revision the detectors were last synced to (-1: never).
        self._synced_revision = -1
        # Close proposals in flight or recently made, so each is proposed once per second.
        self._close_proposed_ms: dict[Key, int] = {}
        # The same for RoundTrained, per (job, round).
        self._trained_proposed_ms: dict[Key, int] = {}
        # Proposals in flight (referenced so they are not collected before they finish).
        self._in_flight: set[asyncio.Task[None]] = set()
        # Per job, since when phi alone has suspected more than half of its participants.
        self._mass_suspicion_since_ms: dict[str, int] = {}

    # -------------------------------------------------------------- leadership

    def promote(self) -> None:
        self.is_leader = True
        self._synced_revision = -1
        self.progress.clear()
        self._sync()
        self.detectors.start_grace(monotonic_ms(), self.grace_ms)
        self._guards["leader_grace"].inc()

    def demote(self) -> None:
        self.is_leader = False
        self._close_proposed_ms.clear()

    # -------------------------------------------------------------- inputs

    def heartbeat(
        self, job: str, participant_id: int, progress: ProgressReport | None = None
    ) -> bool:
        """Record a heartbeat (and the progress it reports) on the leader; False if the
        participant is unknown."""
        key = (job, participant_id)
        now_ms = monotonic_ms()
        self._heartbeats_received.inc()
        known = self.detectors.heartbeat(key, now_ms)
        if not known:
            self._sync()  # it may have just joined
            known = self.detectors.heartbeat(key, now_ms)
        if known and progress is not None:
            self.progress.report(job, participant_id, progress, now_ms)
        return known

    def progress_of(self, job: str, participant_id: int) -> tuple[int, float, float] | None:
        """(last step, ms per step outside collectives, ratio to the job's median)."""
        return self.progress.view(job, participant_id)

    def stream_closed(self, job: str, participant_id: int) -> None:
        self.detectors.stream_closed((job, participant_id), monotonic_ms())

    def phi(self, job: str, participant_id: int) -> float | None:
        value = self.detectors.phi((job, participant_id), monotonic_ms())
        if value is None or math.isinf(value):
            return value
        return round(value, 3)

    def heartbeat_age_ms(self, job: str, participant_id: int) -> int | None:
        return self.detectors.heartbeat_age_ms((job, participant_id), monotonic_ms())

    # -------------------------------------------------------------- the loop

    def _sync(self) -> None:
        rendezvous = self._state.rendezvous
        revision = rendezvous.revision
        if revision == self._synced_revision:
            return
        self._synced_revision = revision
        keys = rendezvous.participant_keys()
        self.detectors.retain(keys)
        self.progress.retain(keys)
        self._sample_keys = keys
        for key in [k for k in self._timed_verdicts if k not in self.detectors]:
            del self._timed_verdicts[key]
        now_ms = monotonic_ms()
        for job_id, pid in keys:
            settings = DetectorSettings.of_job(rendezvous.jobs[job_id].config)
            self.detectors.track((job_id, pid), settings, now_ms)

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
                        "this member's event loop ran %.1f s late (CPU starved, or blocked)",
                        stall_s,
                    )
            if self.is_leader:
                self.step()

    def loop_stalled(self, stall_ms: int) -> None:
        """This process did not run for ``stall_ms``: heartbeats that arrived meanwhile are
        still queued, so hold suspicion until they have been read."""
        until_ms = monotonic_ms() + 2 * stall_ms
        self.detectors.grace_until_ms = max(self.detectors.grace_until_ms, until_ms)
        self._guards["loop_stall"].inc()

    def step(self) -> None:
        """One pass of the leader's duties (public for tests)."""
        self._sync()
        wall_ms = self._wall_clock_ms()
        rendezvous = self._state.rendezvous
        for key in rendezvous.closes_due(wall_ms):
            last = self._close_proposed_ms.get(key)
            if last is not None and wall_ms - last < 1000:
                continue
            self._close_proposed_ms[key] = wall_ms
            self._spawn(CloseRound(key[0], key[1]))
        if len(self._close_proposed_ms) > 1024:
            self._close_proposed_ms.clear()
        now_ms = monotonic_ms()
        for job_id, pid in self._credible(self.detectors.suspects(now_ms), now_ms):
            job = rendezvous.jobs.get(job_id)
            if job is None or pid not in job.participants:
                continue
            value = self.detectors.phi((job_id, pid), now_ms)
            threshold = job.config.phi_threshold_milli / 1000
            closed = value is not None and math.isinf(value)
            cause = (
                "heartbeat stream closed and not reopened"
                if closed
                else f"phi {value:.1f} crossed the threshold {threshold:g}"
            )
            log.info("job %s: participant %d suspected: %s", job_id, pid, cause)
            self._time_verdict((job_id, pid), "stream_closed" if closed else "phi", now_ms)
            self._spawn(MemberFailed(job_id, pid, job.round.number, cause))
        if now_ms >= self.detectors.grace_until_ms:
            self._judge_progress(now_ms)
            self._sample_phi(now_ms)
        self._note_training(wall_ms)
        reopened = self.detectors.streams_reopened
        if reopened != self._streams_reopened:
            self._guards["stream_reopened"].inc(reopened - self._streams_reopened)
            self._streams_reopened = reopened

    def _time_verdict(self, key: Key, cause: str, now_ms: int) -> None:
        """Observe the detection latency of a phi or closed-stream verdict, once per
        silence (from the last heartbeat the detector had)."""
        last_ms = self.detectors.last_heartbeat_ms(key)
        if last_ms is None or self._timed_verdicts.get(key) == last_ms:
            return
        self._timed_verdicts[key] = last_ms
        self._detection[cause].observe(max(0.0, now_ms - last_ms) / 1000)

    def _sample_phi(self, now_ms: int) -> None:
        """Every PHI_SAMPLE_EVERY_MS, the phi of the next PHI_SAMPLE_SIZE participants."""
        if now_ms - self._sampled_ms < PHI_SAMPLE_EVERY_MS or not self._sample_keys:
            return
        self._sampled_ms = now_ms
        keys = self._sample_keys
        start = self._sample_cursor % len(keys)
        chosen = keys[start : start + PHI_SAMPLE_SIZE]
        if len(chosen) < PHI_SAMPLE_SIZE and start:
            chosen += keys[: min(start, PHI_SAMPLE_SIZE - len(chosen))]
        self._sample_cursor = start + len(chosen)
        for key in chosen:
            value = self.detectors.phi(key, now_ms)
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
                    self._detection["hang"].observe(verdict.silent_ms / 1000)
                self._spawn(
                    MemberFailed(job_id, verdict.participant_id, number, verdict.cause, reason)
                )
        if len(self._verdict_proposed_ms) > 1024:
            self._verdict_proposed_ms.clear()
        for label, ratio in ratio_max.items():
            self._metrics.step_ratio_max.labels(label).set(ratio)

    def _credible(self, suspects: list[Key], now_ms: int) -> list[Key]:
        """Suspects minus phi-only verdicts on more than half of a job at once, until such a
        verdict has held for MASS_SUSPICION_HOLD_MS (a closed stream always counts)."""
        by_job: dict[str, list[Key]] = {}
        for key in suspects:
            by_job.setdefault(key[0], []).append(key)
        credible: list[Key] = []
        jobs = self._state.rendezvous.jobs
        for job_id in sorted(by_job):
            keys = by_job[job_id]
            job = jobs.get(job_id)
            closed = [k for k in keys if math.isinf(self.detectors.phi(k, now_ms) or 0.0)]
            by_phi = [k for k in keys if k not in closed]
            credible.extend(closed)
            participants = len(job.participants) if job is not None else 0
            if len(by_phi) <= max(1, participants // 2):
                self._mass_suspicion_since_ms.pop(job_id, None)
                credible.extend(by_phi)
                continue
            since = self._mass_suspicion_since_ms.get(job_id)
            if since is None:
                since = self._mass_suspicion_since_ms[job_id] = now_ms
                self._guards["mass_suspicion"].inc()
            if now_ms - since >= MASS_SUSPICION_HOLD_MS:
                credible.extend(by_phi)
            else:
                log.warning(
                    "job %s: phi suspects %d of %d participants at once; waiting before "
                    "believing it (the leader may be the slow one)",
                    job_id,
                    len(by_phi),
                    participants,
                )
        return sorted(credible)

    def _spawn(self, command: Command) -> None:
        task = asyncio.get_running_loop().create_task(self._submit(command))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _submit(self, command: Command) -> None:
        with contextlib.suppress(NodeError):
            await self._propose(command)
