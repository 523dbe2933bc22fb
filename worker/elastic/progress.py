"""A round's progress, reported with every heartbeat (hang and straggler detection).

Every heartbeat carries this rank's progress (``TrainingProgress``): the step it completed
last and when, its time per step outside collectives (a moving average), the collectives it
entered in the round and the one it waits in, and the round's restore source (the leader
keeps it in the round's record: ``rallypoint rounds`` shows each recovery's). The leader
names a rank that stops while the others wait for it (cause ``hang``) and, with the job's
straggler policy on, evicts a rank consistently slower than the others
(coordinator/leader/progress.py). Nothing here waits on it: a hung training thread cannot
report, which is the point.
"""

from __future__ import annotations

import time

from rallypoint.client import TrainingProgress

from .state import RunView


class Progress:
    """The progress counters of one round, and their report to the heartbeat."""

    def __init__(self, run: RunView, round_number: int) -> None:
        self._run = run
        self._round_number = round_number
        # The round's restore source ("" until it formed).
        self.restore = ""
        # Collectives entered in this round, the one waited in and since when, the time
        # the current step has spent waiting in collectives, when the last step ended (or
        # the round formed), and a moving average of the time per step outside collectives.
        self.collectives = 0
        self.waiting_in = 0
        self.waiting_since_s = 0.0
        self.waited_in_step_s = 0.0
        self.step_started_s = time.monotonic()
        self.step_done_s = 0.0
        self.compute_ms = 0.0

    def report(self) -> None:
        """Hand the heartbeat this rank's progress as of now (see TrainingProgress)."""
        self._run.participant.report_progress(
            TrainingProgress(
                round=self._round_number,
                step=self._run.state.step,
                step_done_s=self.step_done_s or self.step_started_s,
                step_ms=self.compute_ms,
                collectives_entered=self.collectives,
                waiting_in=self.waiting_in,
                waiting_since_s=self.waiting_since_s,
                restore=self.restore,
            )
        )

    def formed(self, restore: str) -> None:
        """The round formed, its state restored from ``restore``: its first step starts."""
        self.restore = restore
        self.step_started_s = time.monotonic()
        self.report()

    def step_counted(self) -> None:
        now = time.monotonic()
        compute_ms = max(0.0, now - self.step_started_s - self.waited_in_step_s) * 1000
        # A short moving average: a straggler shows within a few steps, one odd step fades.
        self.compute_ms = (
            compute_ms if self.compute_ms == 0 else 0.7 * self.compute_ms + 0.3 * compute_ms
        )
        self.step_started_s = self.step_done_s = now
        self.waited_in_step_s = 0.0
        self.report()

    def entered_collective(self, started: float) -> None:
        self.collectives += 1
        self.waiting_in, self.waiting_since_s = self.collectives, started
        self.report()

    def left_collective(self, started: float) -> None:
        self.waited_in_step_s += time.monotonic() - started
        self.waiting_in = 0
        self.report()
