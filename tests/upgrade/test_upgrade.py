"""The rolling upgrade's short form (``make upgrade-test`` runs it longer): three members of
the previous release upgraded one at a time under the workloads, the cluster version and
the newest feature checked after, then a member taken back to the previous release and
forward again, catching up each time."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .run import run_upgrade

LANE = 38


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("iptables") is None or shutil.which("ip") is None:
        return "needs iptables and iproute2"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if any(line.startswith(f"rpj{LANE}-") for line in listed.stdout.splitlines()):
        return f"another run holds lane {LANE} (make upgrade-test?)"
    return None


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_rolling_upgrade_from_the_previous_release_loses_nothing(
    tmp_path: Path,
) -> None:
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    outcome = run_upgrade(tmp_path / "upgrade", time_s=20.0, lane=LANE)
    report = "\n".join(outcome.log)
    assert not outcome.violations, report
    assert not outcome.stalls, report
    # 3 upgrades, the cluster version, the feature, the member on the previous release and
    # back on this build.
    assert len(outcome.steps) == 7, report
    assert outcome.last_line() == "upgrade: 7 steps, 0 violations, 0 stalls"
