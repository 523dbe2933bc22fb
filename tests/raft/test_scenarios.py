"""Data-driven Raft scenarios: one test per ``testdata/*.txt`` file (format in its README).

``RALLYPOINT_REWRITE=1`` regenerates the expected outputs in place; read the diff before
committing it, since a rewrite records whatever the code does, right or wrong.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.raft.interaction.datadriven import run_file
from tests.raft.interaction.env import InteractionEnv

TESTDATA = Path(__file__).parent / "testdata"
SCENARIOS = sorted(TESTDATA.glob("*.txt"))

# Scenarios whose expected output is the correct behaviour, which the core does not show yet.
# Strict: once the core is fixed the scenario passes, the xfail fails, and the entry goes.
KNOWN_CORE_BUGS: dict[str, str] = {}


def _param(path: Path) -> object:
    reason = KNOWN_CORE_BUGS.get(path.stem)
    marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
    return pytest.param(path, id=path.stem, marks=marks)


def test_scenarios_exist() -> None:
    assert SCENARIOS, f"no scenario files in {TESTDATA}"


@pytest.mark.parametrize("path", [_param(p) for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    rewrite = os.environ.get("RALLYPOINT_REWRITE") == "1"
    if rewrite and path.stem in KNOWN_CORE_BUGS:
        pytest.skip("not rewritten: its expected output is the behaviour the core lacks")
    run_file(path, InteractionEnv().handle, rewrite=rewrite)
