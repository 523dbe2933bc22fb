"""Hang and straggler verdicts from progress reports, on a simulated clock.

A small simulator plays a synchronous data-parallel job: each rank computes for its own step
time, then enters the step's all-reduce and waits until every rank has entered it; every
rank heartbeats its progress every 100 ms. Faults: a rank that blocks inside its step, a rank
that never enters the all-reduce, jitter, a long checkpoint step on every rank, a slow rank.
Reports played by hand: a member stuck forming the round (its reports still of the round
before), one forming in time, a whole round forming slowly.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from rallypoint.coordinator.liveness.progress import ProgressReport, ProgressTracker, Verdict
from rallypoint.coordinator.state.jobs import JobConfig

JOB = "job"
ROUND = 3
HEARTBEAT_MS = 100


@dataclass
class Rank:
    pid: int
    step: int = 0
    step_done_ms: int = 0
    # Where it is: computing until compute_until_ms, then waiting in collective `waiting_in`.
    compute_until_ms: int = 0
    waiting_in: int = 0
    waiting_since_ms: int = 0
    entered: int = 0
    compute_ms: float = 0.0
    blocked: bool = False


class Job:
    def __init__(
        self,
        ranks: int,
        step_ms: Callable[[int, int], float],
        config: JobConfig | None = None,
    ) -> None:
        self.tracker = ProgressTracker()
        self.config = config or JobConfig(ranks, ranks)
        self.step_ms = step_ms
        self.ranks = [Rank(pid) for pid in range(1, ranks + 1)]
        self.now_ms = 0
        self.verdicts: list[tuple[int, Verdict]] = []
        for rank in self.ranks:
            self._start_step(rank)

    def _start_step(self, rank: Rank) -> None:
        duration = self.step_ms(rank.pid, rank.step + 1)
        rank.compute_until_ms = self.now_ms + int(duration)
        rank.compute_ms = (
            duration if rank.compute_ms == 0 else 0.8 * rank.compute_ms + 0.2 * duration
        )

    def run(self, until_ms: int, block: Callable[[Rank], bool] = lambda r: False) -> None:
        while self.now_ms < until_ms:
            self.now_ms += 10
            for rank in self.ranks:
                if block(rank):
                    rank.blocked = True
                if rank.blocked or rank.waiting_in:
                    continue
                if self.now_ms >= rank.compute_until_ms:
                    rank.entered += 1
                    rank.waiting_in = rank.entered
                    rank.waiting_since_ms = self.now_ms
            # The all-reduce completes when every rank entered it.
            if all(r.waiting_in and r.waiting_in == self.ranks[0].waiting_in for r in self.ranks):
                for rank in self.ranks:
                    rank.waiting_in = 0
                    rank.step += 1
                    rank.step_done_ms = self.now_ms
                    self._start_step(rank)
            if self.now_ms % HEARTBEAT_MS == 0:
                for rank in self.ranks:
                    self.tracker.report(JOB, rank.pid, self._report(rank), self.now_ms)
                pids = [r.pid for r in self.ranks]
                for verdict in self.tracker.hangs(JOB, ROUND, pids, self.config, self.now_ms):
                    self.verdicts.append((self.now_ms, verdict))
                for verdict in self.tracker.stragglers(JOB, ROUND, pids, self.config, self.now_ms):
                    self.verdicts.append((self.now_ms, verdict))

    def _report(self, rank: Rank) -> ProgressReport:
        return ProgressReport(
            round=ROUND,
            step=rank.step,
            step_age_ms=self.now_ms - rank.step_done_ms if rank.step else 0,
            step_ms=rank.compute_ms,
            collectives_entered=rank.entered,
            waiting_in=rank.waiting_in,
            waiting_ms=self.now_ms - rank.waiting_since_ms if rank.waiting_in else 0,
        )


def steady(ms: float) -> Callable[[int, int], float]:
    return lambda pid, step: ms


def test_a_rank_blocked_inside_its_step_is_named_within_the_bound() -> None:
    job = Job(3, steady(300))
    blocked_at: list[int] = []

    def block(rank: Rank) -> bool:
        if rank.pid == 2 and rank.step == 20 and not rank.blocked:
            blocked_at.append(job.now_ms)
            return True
        return False

    job.run(30_000, block)
    assert job.verdicts, "the hung rank was never named"
    at_ms, verdict = job.verdicts[0]
    assert verdict.participant_id == 2 and "hang" in verdict.cause
    assert "never entered collective #21" in verdict.cause
    # Within max(3 x median step, 2 s) of its last step (plus a heartbeat).
    assert at_ms - job.ranks[1].step_done_ms <= max(3 * 300, 2000) + HEARTBEAT_MS
    # The verdict says how long the rank has been silent (the detection latency metric).
    assert verdict.silent_ms == at_ms - job.ranks[1].step_done_ms
    assert {v.participant_id for _, v in job.verdicts} == {2}


def test_a_rank_that_never_enters_the_all_reduce_is_named_alone() -> None:
    job = Job(4, steady(150))

    def skip(rank: Rank) -> bool:
        # Rank 4 finishes computing step 31 and never enters its all-reduce.
        return rank.pid == 4 and rank.step == 30 and job.now_ms >= rank.compute_until_ms

    job.run(20_000, skip)
    assert job.verdicts and all(v.participant_id == 4 for _, v in job.verdicts)


def test_jittery_steps_give_no_hang_verdict() -> None:
    rng = random.Random(7)
    job = Job(4, lambda pid, step: 300 * rng.uniform(0.5, 1.5))
    job.run(10 * 60_000)  # ten simulated minutes
    assert job.verdicts == []


def test_a_checkpoint_step_ten_times_longer_on_every_rank_is_no_hang() -> None:
    rng = random.Random(3)

    def step_ms(pid: int, step: int) -> float:
        base = 300 * rng.uniform(0.9, 1.1)
        return base * 10 if step % 50 == 0 else base

    job = Job(4, step_ms)
    job.run(5 * 60_000)
    assert job.verdicts == []


def test_a_rank_stuck_before_its_first_step_waits_for_the_startup_timeout() -> None:
    config = JobConfig(3, 3, startup_timeout_ms=20_000)
    job = Job(3, steady(200), config)
    job.run(15_000, lambda r: r.pid == 1)
    assert job.verdicts == []  # others wait, but the startup timeout has not passed
    job.run(25_000, lambda r: r.pid == 1)
    assert job.verdicts and job.verdicts[0][1].participant_id == 1


def test_everyone_stopping_at_once_names_nobody() -> None:
    job = Job(3, steady(200))
    job.run(5_000)
    job.run(30_000, lambda r: True)
    assert job.verdicts == []


def test_a_slow_rank_is_evicted_only_with_the_policy_on() -> None:
    def step_ms(pid: int, step: int) -> float:
        return 600.0 if pid == 3 else 300.0

    off = Job(3, step_ms)
    off.run(60_000)
    assert off.verdicts == []
    assert off.tracker.view(JOB, 3) is not None
    step, ms, ratio = off.tracker.view(JOB, 3)  # type: ignore[misc]
    assert 1.5 < ratio < 2.5 and ms > 500 and step > 0
    on = Job(3, step_ms, JobConfig(3, 3, straggler_factor_milli=1500, straggler_window_ms=5000))
    on.run(60_000)
    assert on.verdicts, "the straggler was not evicted"
    at_ms, verdict = on.verdicts[0]
    assert verdict.participant_id == 3 and verdict.straggler
    assert "straggler" in verdict.cause
    assert 3 * 5000 <= at_ms <= 5 * 5000


def test_a_rank_finishing_a_long_step_later_than_the_others_is_no_hang() -> None:
    """After a long step on every rank (a checkpoint), one rank completes it a little before
    the others: it is one step ahead, which a synchronous job allows."""
    tracker = ProgressTracker()
    config = JobConfig(2, 2)

    def at(step: int) -> ProgressReport:
        return ProgressReport(ROUND, step, 0, 100.0, step, 0, 0)

    for step, now_ms in ((37, 0), (38, 100), (39, 200)):  # steady steps
        tracker.report(JOB, 1, at(step), now_ms)
        tracker.report(JOB, 2, at(step), now_ms)
    # Both sleep 2 s in step 40; rank 1 finishes it at 2300, rank 2 is still at it at 2400.
    tracker.report(JOB, 1, at(40), 2300)
    tracker.report(JOB, 2, at(39), 2400)
    assert tracker.hangs(JOB, ROUND, [1, 2], config, 2400) == []
    # Two steps ahead and still going: rank 2 no longer takes part.
    tracker.report(JOB, 1, at(42), 2600)
    verdicts = tracker.hangs(JOB, ROUND, [1, 2], config, 2600)
    assert [v.participant_id for v in verdicts] == [2] and "kept stepping" in verdicts[0].cause


def _stepping(round_number: int, step: int) -> ProgressReport:
    """A report of a rank that completed ``step`` in ``round_number`` just now."""
    return ProgressReport(round_number, step, 0, 100.0, step, 0, 0)


def test_a_member_stuck_forming_the_round_is_named_once_the_startup_timeout_passed() -> None:
    """Ranks 1 and 2 formed round 4 and train; rank 3 trained in round 3 and never reported
    round 4 (stuck forming it, its heartbeat alive)."""
    tracker = ProgressTracker()
    config = JobConfig(3, 3, startup_timeout_ms=20_000)
    tracker.report(JOB, 3, _stepping(3, 40), 0)
    judged: list[Verdict] = []
    for now_ms in range(1_000, 40_000, 100):
        step = 41 + now_ms // 100
        tracker.report(JOB, 1, _stepping(4, step), now_ms)
        tracker.report(JOB, 2, _stepping(4, step), now_ms)
        verdicts = tracker.hangs(JOB, 4, [1, 2, 3], config, now_ms)
        if verdicts:
            judged, at_ms = verdicts, now_ms
            break
    assert [v.participant_id for v in judged] == [3], judged
    # Judged from the round's start (the first judgement, at 1 s), not before the bound.
    assert 21_000 <= at_ms <= 21_100 + HEARTBEAT_MS
    cause = judged[0].cause
    assert cause.startswith("hang: stuck in formation") and "round 3" in cause, cause
    assert judged[0].silent_ms >= 20_000


def test_a_member_forming_within_the_bound_is_no_hang_whenever_it_last_stepped() -> None:
    """Rank 2's last step (in round 3) is long past, but round 4 began only now: it is judged
    from the round's start, and it reports round 4 in time."""
    tracker = ProgressTracker()
    config = JobConfig(2, 2, startup_timeout_ms=20_000)
    tracker.report(JOB, 1, _stepping(3, 10), 0)
    tracker.report(JOB, 2, _stepping(3, 10), 0)
    tracker.report(JOB, 1, _stepping(4, 11), 100_000)
    assert tracker.hangs(JOB, 4, [1, 2], config, 100_000) == []
    assert tracker.hangs(JOB, 4, [1, 2], config, 119_000) == []
    tracker.report(JOB, 2, _stepping(4, 11), 119_500)
    assert tracker.hangs(JOB, 4, [1, 2], config, 200_000) == []


def test_a_whole_round_stuck_forming_and_members_that_never_reported_name_nobody() -> None:
    """Every member still on older rounds (a restore slow everywhere): nothing tells a
    culprit apart. A member that never reported progress is not judged."""
    tracker = ProgressTracker()
    config = JobConfig(2, 3, startup_timeout_ms=20_000)
    tracker.report(JOB, 1, _stepping(3, 10), 0)
    tracker.report(JOB, 2, _stepping(3, 10), 0)
    assert tracker.hangs(JOB, 4, [1, 2], config, 1_000) == []
    assert tracker.hangs(JOB, 4, [1, 2], config, 60_000) == []
    # Rank 7 joined and reports nothing: only rank 2, still on round 3, is named.
    tracker.report(JOB, 1, _stepping(4, 11), 60_000)
    verdicts = tracker.hangs(JOB, 4, [1, 2, 7], config, 60_100)
    assert [v.participant_id for v in verdicts] == [2]
