"""CI's short run of the crash loop (``make crash-test ITER=N`` runs longer ones)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .crash_loop import Mutation, run


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fifty_sigkills_lose_nothing_acknowledged(tmp_path: Path) -> None:
    totals = run(50, seed=20240611, data_dir=str(tmp_path), max_kill_delay_s=0.2, verbose=False)
    assert totals.notes == []
    assert (totals.iterations, totals.lost, totals.undetected) == (50, 0, 0)
    # The run exercised every kind of damage, and each flip was refused.
    assert set(totals.mutations) == {m.value for m in Mutation}
    assert totals.refusals > 0 and totals.repairs > 0
