"""Which network lanes ``python -m tests.jepsen`` cleans when it ends (netns.py): a run in
lanes 1-N must leave lane 0 alone, which a plain ``make jepsen`` on the same machine uses."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.jepsen import __main__ as jepsen_main
from tests.jepsen import netns
from tests.jepsen.report import RunSummary
from tests.jepsen.runner import RunSpec, blank_summary


@pytest.fixture
def cleaned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lanes ``netns.cleanup`` was called for; runs only summarised, nothing started."""
    lanes: list[int] = []
    monkeypatch.setattr(jepsen_main.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns, "cleanup", lambda: lanes.append(netns._lane))
    monkeypatch.setattr(jepsen_main, "run_one", lambda spec, directory: blank_summary(spec))

    def run_parallel(
        specs: Sequence[RunSpec], out: Path, lanes_count: int
    ) -> Iterator[tuple[int, RunSummary]]:
        try:
            for index, spec in enumerate(specs):
                yield index, blank_summary(spec)
        finally:  # as runner.run_parallel does
            for lane in range(1, lanes_count + 1):
                netns.set_lane(lane)
                netns.cleanup()
            netns.set_lane(0)

    monkeypatch.setattr(jepsen_main, "run_parallel", run_parallel)
    return lanes


def test_a_run_in_lanes_leaves_lane_0_alone(cleaned: list[int], tmp_path: Path) -> None:
    jepsen_main.main(["--mix=kill", "--no-controls", "--lanes=2", f"--out={tmp_path}"])
    assert cleaned == [1, 2]


def test_a_run_in_lane_0_cleans_it(cleaned: list[int], tmp_path: Path) -> None:
    jepsen_main.main(["--mix=kill", "--no-controls", f"--out={tmp_path}"])
    assert cleaned == [0]
