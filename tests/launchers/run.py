"""``make test-launchers``: every test under tests/launchers, the real jobs included
(RALLYPOINT_LAUNCHERS=1), then one line ``launchers: N passed, M failed`` (a test that was
skipped counts as failed: every row of the table must run). Extra arguments go to pytest.

    .venv/bin/python -m tests.launchers.run [-k accelerate] [-x]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


class Count:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.failed or report.skipped:
            self.failed += 1


def main(argv: list[str]) -> int:
    os.environ["RALLYPOINT_LAUNCHERS"] = "1"
    count = Count()
    code = pytest.main(["-q", "-p", "no:cacheprovider", str(HERE), *argv], plugins=[count])
    print(f"launchers: {count.passed} passed, {count.failed} failed", flush=True)
    return 0 if code == 0 and count.failed == 0 and count.passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
