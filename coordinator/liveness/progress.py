"""Training progress from heartbeats: hung ranks and stragglers.

Theory of operation. A heartbeat proves a process is alive, not that it trains: its client
thread keeps beating while the training thread is stuck in a data loader, a deadlock, or a
collective a peer never entered. Workers that report progress (the elastic loop) add to each
heartbeat the last step they completed (and how long ago), their recent time per step spent
outside collectives, how many collectives they entered in the round, and the one they wait
in (and for how long). Every member passes on the progress its heartbeat streams carry
(``ProgressReport``, in its liveness reports); the leader keeps it (``ProgressTracker``) as
soft state, restarted on every leader change (reports refill it within a heartbeat interval).

Hangs. In a synchronous job a hung rank stops everyone: the others finish their step and
wait in the next collective. So silence alone cannot name the culprit; the collective can.
For each rank R of the job's ACTIVE round that reports progress, with

    T = max(hang_factor x the job's median step time, hang_floor)
        (startup_timeout instead, until R completed a step in this round),
    W = max(the median step time, hang_floor / 2),

R is declared failed with cause ``hang`` when it completed no step for T (since the round
began, before its first) and either

- some other rank has waited at least W in a collective R never entered (the collective
  rule: the ranks that arrived name the one that did not), or
- some other rank is two or more steps ahead of R and completed one within the last T / 2
  (the progress rule, for jobs whose ranks do not all wait on each other: where they do, a
  healthy rank is never more than one step ahead of another, however its steps jitter).

W keeps a step that is long on every rank at once (a checkpoint save) from reading as a hang:
the ranks that finish first wait only as long as the others take to catch up. Ranks that
stop together with nobody waiting for anyone are not judged: nothing tells a culprit apart.

Stuck in formation. A worker reports a round only once it has formed it (its group is up
and its state restored), so a member stuck forming, say in a process-group init that waits
for a peer of a round that has since ended, keeps reporting the older round it last
trained in, its heartbeat alive, and the rules above never see it: every later round
includes it and waits for it. So a member of the ACTIVE round whose latest report is for an
older round is declared failed with cause ``hang`` once neither that report's progress nor
the round's start (when this leader first judged it ACTIVE) is within

    F = max(startup_timeout, T as above for a rank that stepped).

F is at least the startup timeout, which already bounds loading and warming up. Members that
never reported are not judged (a worker that reports no progress, or one that has formed no
round yet), nor all of the round's members at once (a restore slow on every rank).

The median step time is taken over the recent step durations of every rank of the job (a
window of ``DURATION_WINDOW``), measured between successive reports of a rank's step.

Stragglers. A rank's time per step outside collectives (what it spends computing, loading,
saving; not waiting for the others) over the median of the job's ranks is its *ratio*. With
the job's straggler policy on, each ``straggler_window`` the ratio of every rank is checked;
a rank over ``straggler_factor`` for ``straggler_windows`` windows in a row is evicted.

Restore. A report may also say where the round's state came from (keep, broadcast, disk,
fresh: decided for the whole world when the round formed). The first source reported for a
round is kept for the job and goes into the round's record with ``RoundTrained``; a later
report that disagrees is ignored (it should not happen, and is nothing to fail over).

Times: reports carry durations measured by the worker (``age`` before sending); the leader
turns them into its own monotonic clock at receipt, so worker and leader clocks never meet.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..state.jobs import JobConfig

# Recent step durations kept per job, across its ranks.
DURATION_WINDOW = 256


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """One heartbeat's progress fields (rendezvous.proto ``HeartbeatRequest``)."""

    round: int
    step: int
    step_age_ms: int
    step_ms: float
    collectives_entered: int
    waiting_in: int
    waiting_ms: int
    # Where the round's state came from (keep, broadcast, replicas, memory, disk, fresh);
    # "": not said.
    restore: str = ""


@dataclass
class RankProgress:
    """What the leader knows of one rank's progress, on its own monotonic clock (ms)."""

    round: int
    # Last completed step, and when (for the first report of a round: the report's time).
    step: int
    progress_ms: int
    # A step completed in this round (until then, the startup timeout applies).
    stepped_in_round: bool
    step_ms: float
    entered: int
    waiting_in: int
    waiting_since_ms: int
    # Straggler policy: consecutive windows over the factor, and the current window's start.
    slow_windows: int = 0


@dataclass(frozen=True, slots=True)
class Verdict:
    """``silent_ms``: for a hang, how long the rank has completed no step."""

    participant_id: int
    cause: str
    straggler: bool = False
    silent_ms: int = 0


@dataclass
class JobProgress:
    ranks: dict[int, RankProgress] = field(default_factory=dict)
    durations_ms: deque[float] = field(default_factory=lambda: deque(maxlen=DURATION_WINDOW))
    # When the straggler policy last evaluated a window (0: not yet).
    window_start_ms: int = 0
    # The restore source first reported for the newest round any rank reported one for:
    # (round, source). Later reports for that round do not replace it.
    restore: tuple[int, str] = (0, "")
    # The ACTIVE round last judged, and when it was first judged (the leader's clock, ms):
    # the start of membership in it for members stuck forming it. (0, 0): none yet.
    judged_round: tuple[int, int] = (0, 0)

    def median_step_ms(self) -> float | None:
        return statistics.median(self.durations_ms) if self.durations_ms else None

    def median_compute_ms(self) -> float | None:
        values = [r.step_ms for r in self.ranks.values() if r.step_ms > 0]
        return statistics.median(values) if values else None


class ProgressTracker:
    """Per job, per participant progress and the verdicts drawn from it."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobProgress] = {}

    def clear(self) -> None:
        """A new leadership starts from nothing (reports refill it)."""
        self.jobs.clear()

    def retain(self, keys: Iterable[tuple[str, int]]) -> None:
        """Forget participants that are gone."""
        wanted: dict[str, set[int]] = {}
        for job_id, pid in keys:
            wanted.setdefault(job_id, set()).add(pid)
        for job_id in list(self.jobs):
            pids = wanted.get(job_id)
            if not pids:
                del self.jobs[job_id]
                continue
            ranks = self.jobs[job_id].ranks
            for pid in [p for p in ranks if p not in pids]:
                del ranks[pid]

    def report(self, job_id: str, pid: int, report: ProgressReport, now_ms: int) -> None:
        job = self.jobs.setdefault(job_id, JobProgress())
        done_ms = now_ms - max(0, report.step_age_ms)
        waiting_since = now_ms - max(0, report.waiting_ms) if report.waiting_in else 0
        if report.restore and report.round > job.restore[0]:
            job.restore = (report.round, report.restore)
        known = job.ranks.get(pid)
        if known is None or known.round != report.round:
            # A new round (or the first report): progress counts from now.
            job.ranks[pid] = RankProgress(
                round=report.round,
                step=report.step,
                progress_ms=now_ms,
                stepped_in_round=False,
                step_ms=report.step_ms,
                entered=report.collectives_entered,
                waiting_in=report.waiting_in,
                waiting_since_ms=waiting_since,
                slow_windows=known.slow_windows if known is not None else 0,
            )
            return
        if report.step > known.step:
            # The first step of a round also paid for forming it: not a step duration.
            if known.stepped_in_round:
                per_step = (done_ms - known.progress_ms) / (report.step - known.step)
                if per_step > 0:
                    job.durations_ms.append(per_step)
            known.step = report.step
            known.progress_ms = max(known.progress_ms, done_ms)
            known.stepped_in_round = True
        known.step_ms = report.step_ms
        known.entered = report.collectives_entered
        if report.waiting_in != known.waiting_in:
            known.waiting_in = report.waiting_in
            known.waiting_since_ms = waiting_since
        elif not report.waiting_in:
            known.waiting_since_ms = 0

    def trained(self, job_id: str, round_number: int) -> bool:
        """Some rank reported a step completed in ``round_number`` (the round trains)."""
        job = self.jobs.get(job_id)
        return job is not None and any(
            rank.round == round_number and rank.stepped_in_round for rank in job.ranks.values()
        )

    def restore_of(self, job_id: str, round_number: int) -> str:
        """Where ``round_number``'s state came from, as the first rank to say reported it
        ("": none said). Every rank of a round restores from the same source, so the first
        report is the round's; one that disagrees is ignored, not an error."""
        job = self.jobs.get(job_id)
        if job is None or job.restore[0] != round_number:
            return ""
        return job.restore[1]

    def view(self, job_id: str, pid: int) -> tuple[int, float, float] | None:
        """(last step, time per step outside collectives in ms, ratio to the job's median)."""
        job = self.jobs.get(job_id)
        rank = job.ranks.get(pid) if job is not None else None
        if job is None or rank is None:
            return None
        median = job.median_compute_ms()
        ratio = rank.step_ms / median if median and rank.step_ms > 0 else 0.0
        return rank.step, rank.step_ms, ratio

    def hangs(
        self, job_id: str, round_number: int, members: Sequence[int], config: JobConfig, now_ms: int
    ) -> list[Verdict]:
        """The members of the job's ACTIVE round ``round_number`` that hang (module
        docstring): those stuck forming it, then, among the members that reported for this
        round, those the others wait for."""
        job = self.jobs.get(job_id)
        if job is None:
            return []
        if job.judged_round[0] != round_number:
            job.judged_round = (round_number, now_ms)
        median = job.median_step_ms()
        floor_ms = config.hang_floor_ms
        bound_ms = max(config.hang_factor_milli * (median or 0.0) / 1000, floor_ms)
        forming = self._stuck_forming(job, round_number, members, config, bound_ms, now_ms)
        ranks = {
            pid: job.ranks[pid]
            for pid in members
            if pid in job.ranks and job.ranks[pid].round == round_number
        }
        if len(ranks) < 2:
            return forming
        wait_needed_ms = max(median or 0.0, floor_ms / 2)
        verdicts = []
        for pid, rank in sorted(ranks.items()):
            limit_ms = bound_ms if rank.stepped_in_round else config.startup_timeout_ms
            silent_ms = now_ms - rank.progress_ms
            if silent_ms < limit_ms:
                continue
            others = [r for p, r in ranks.items() if p != pid]
            waiting = [
                r
                for r in others
                if r.waiting_in > rank.entered and now_ms - r.waiting_since_ms >= wait_needed_ms
            ]
            if waiting:
                collective = min(r.waiting_in for r in waiting)
                waited_s = max(now_ms - r.waiting_since_ms for r in waiting) / 1000
                cause = (
                    f"hang: completed no step for {silent_ms / 1000:.1f} s (last step "
                    f"{rank.step}) and never entered collective #{collective} of round "
                    f"{round_number}, where {len(waiting)} other rank(s) waited up to "
                    f"{waited_s:.1f} s"
                )
                verdicts.append(Verdict(pid, cause, silent_ms=silent_ms))
                continue
            # Ahead by two steps or more: in a job whose ranks wait on each other every step,
            # a healthy rank is never more than one step ahead of another.
            moving = [
                r
                for r in others
                if r.step >= rank.step + 2 and now_ms - r.progress_ms < limit_ms / 2
            ]
            if moving and rank.waiting_in == 0:
                cause = (
                    f"hang: completed no step for {silent_ms / 1000:.1f} s (last step "
                    f"{rank.step}) while {len(moving)} other rank(s) kept stepping"
                )
                verdicts.append(Verdict(pid, cause, silent_ms=silent_ms))
        if len(verdicts) >= len(ranks):
            return forming  # everyone at once: nothing tells a culprit apart
        return forming + verdicts

    def _stuck_forming(
        self,
        job: JobProgress,
        round_number: int,
        members: Sequence[int],
        config: JobConfig,
        bound_ms: float,
        now_ms: int,
    ) -> list[Verdict]:
        """Members whose latest report is for a round before ``round_number`` and that
        made no progress for F (module docstring, "Stuck in formation")."""
        limit_ms = max(config.startup_timeout_ms, bound_ms)
        round_since_ms = job.judged_round[1]
        verdicts = []
        for pid in sorted(members):
            rank = job.ranks.get(pid)
            if rank is None or rank.round >= round_number:
                continue
            silent_ms = now_ms - max(rank.progress_ms, round_since_ms)
            if silent_ms < limit_ms:
                continue
            cause = (
                f"hang: stuck in formation: its last progress report is for round "
                f"{rank.round} (step {rank.step}), and round {round_number} has waited "
                f"{silent_ms / 1000:.1f} s for it to form (limit {limit_ms / 1000:g} s)"
            )
            verdicts.append(Verdict(pid, cause, silent_ms=silent_ms))
        if len(verdicts) >= len(members):
            return []  # the whole round at once: nothing tells a culprit apart
        return verdicts

    def stragglers(
        self, job_id: str, round_number: int, members: Sequence[int], config: JobConfig, now_ms: int
    ) -> list[Verdict]:
        """Ranks the straggler policy evicts now (module docstring); [] while it is off."""
        job = self.jobs.get(job_id)
        factor = config.straggler_factor_milli / 1000
        if job is None or factor <= 0:
            return []
        if job.window_start_ms == 0:
            job.window_start_ms = now_ms
            return []
        if now_ms - job.window_start_ms < config.straggler_window_ms:
            return []
        job.window_start_ms = now_ms
        ranks = {
            pid: job.ranks[pid]
            for pid in members
            if pid in job.ranks and job.ranks[pid].round == round_number
        }
        values = [r.step_ms for r in ranks.values() if r.step_ms > 0]
        if len(values) < 2:
            return []
        verdicts = []
        for pid, rank in sorted(ranks.items()):
            # Compared with the median of the *other* ranks: in a job of two, the slow
            # rank's own time would otherwise pull the median halfway to it.
            peers = [r.step_ms for p, r in ranks.items() if p != pid and r.step_ms > 0]
            median = statistics.median(peers) if peers else 0.0
            if median > 0 and rank.step_ms > factor * median:
                rank.slow_windows += 1
            else:
                rank.slow_windows = 0
            if rank.slow_windows >= config.straggler_windows:
                cause = (
                    f"straggler: {rank.step_ms:.0f} ms per step outside collectives, "
                    f"{rank.step_ms / median:.1f}x the others' median {median:.0f} ms, for "
                    f"{rank.slow_windows} windows of {config.straggler_window_ms / 1000:g} s"
                )
                verdicts.append(Verdict(pid, cause, straggler=True))
        return verdicts
