"""The shaped recovery's phases (bench/shaped_recovery.py ``_phases``) split the formation and
the first step: when the slowest rank heard of the round (``noticed_s``), the slowest rank's
time between its group's init and its restore (``between_s``: the gate, the mesh's build,
the registry reads), and when the slowest rank's first step was done, before its snapshot
(``stepped_s``). Computed from the workers' events, without a cluster."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
if str(REPOSITORY) not in sys.path:
    sys.path.insert(0, str(REPOSITORY))

from bench import shaped_recovery  # noqa: E402
from bench.shaped_recovery import MeshTrial  # noqa: E402


def _trial(events: list[dict[str, Any]]) -> MeshTrial:
    trial = MeshTrial.__new__(MeshTrial)
    trial.endpoints, trial.job = "unused:1", "j"
    trial.events, trial.lock = events, threading.Lock()
    return trial


def test_the_phases_split_formation_and_the_first_step(monkeypatch: pytest.MonkeyPatch) -> None:
    killed_at = 100.0
    current = SimpleNamespace(round=4, closed_ms=100_300)
    monkeypatch.setattr(shaped_recovery, "_coordinator_rounds", lambda *_: ([], current))

    def formed(name: str, t: float, formed_s: float, init_s: float, restore_s: float) -> Any:
        return {
            "event": "round_formed", "name": name, "round": 4, "t": t,
            "formed_s": formed_s, "init_s": init_s, "restore_s": restore_s,
        }  # fmt: skip

    events = [
        formed("w0", 101.0, 0.6, 0.1, 0.2),  # started forming at 100.4: between 0.3
        formed("w1", 101.1, 0.6, 0.2, 0.3),  # started at 100.5: between 0.1
        {"event": "trained", "name": "w0", "round": 4, "t": 101.3},
        {"event": "trained", "name": "w1", "round": 4, "t": 101.4},
        {"event": "trained", "name": "w1", "round": 3, "t": 99.0},
        {"event": "step", "name": "w0", "round": 4, "world_size": 2, "t": 101.35},
        {"event": "step", "name": "w1", "round": 4, "world_size": 2, "t": 101.5},
    ]
    phases = shaped_recovery._phases(_trial(events), ["w0", "w1"], 2, killed_at, 101.5)
    assert phases["closed_s"] == pytest.approx(0.3)
    assert phases["noticed_s"] == pytest.approx(0.5)
    assert phases["between_s"] == pytest.approx(0.3)
    assert phases["stepped_s"] == pytest.approx(1.4)
    assert phases["formed_s"] == pytest.approx(1.1)
    assert phases["trained_s"] == pytest.approx(1.5)
