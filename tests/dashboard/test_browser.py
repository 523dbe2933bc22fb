"""The dashboard in a real browser, against a real cluster with real workers.

Headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by selenium) opens
the dashboard of a 3-member cluster whose job has 3 elastic training workers. The page must
show the leader, the job and its round; then one worker is SIGKILLed and, without a reload,
the page must show that round's end with its cause (member_failed, by that worker), the
next round with the two survivors, and the recovery's restore source as the workers reported
it. A screenshot of that page is saved (PNG); with ``RALLYPOINT_UPDATE_SCREENSHOT=1`` it
replaces ``docs/dashboard.png``, the one docs/operations.md shows.

``make test-browser`` installs what it needs and runs this alone; ``make test`` runs it too.
As root (CI) a missing browser is installed here with apt, and a failure to install fails
the test; otherwise it is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import ProcessCluster, running_cluster, wait_until

from .processes import Workers, dashboard

pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent.parent
SCREENSHOT = ROOT / "docs" / "dashboard.png"
APT_PACKAGES = ["chromium", "chromium-driver"]
JOB = "browser"
START_S = 180.0
CHANGE_S = 60.0
# Where a round's state can come from (worker/restore_choice.py's RestoreSource).
RESTORE_SOURCES = {"keep", "broadcast", "disk", "fresh"}


def browser_binaries() -> tuple[str, str]:
    """(chromium, chromedriver); installs them as root when missing, else skips."""
    found = shutil.which("chromium"), shutil.which("chromedriver")
    if all(found):
        return found[0] or "", found[1] or ""
    if os.geteuid() != 0:
        pytest.skip("needs chromium and chromedriver: sudo make test-browser installs them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", *APT_PACKAGES]):
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        if result.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed: {result.stderr.strip()[-2000:]}")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.fail(f"apt installed {APT_PACKAGES} but chromium or chromedriver is not on PATH")
    return chromium, driver


@pytest.fixture
def browser() -> Iterator[Any]:
    chromium, driver_path = browser_binaries()
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        if os.geteuid() == 0:
            pytest.fail("selenium is not installed: it is in the dev extra (make setup)")
        pytest.skip("selenium is not installed (the dev extra has it)")
    options = Options()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in CI containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1200",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def api(base: str, path: str) -> Any:
    with urllib.request.urlopen(base + path, timeout=5) as response:
        return json.load(response)


def page_shows(driver: Any, script: str) -> Any:
    """The value of a JavaScript expression on the page (falsy: not yet)."""
    return driver.execute_script("return " + script)


def test_the_page_follows_a_worker_failure_live(browser: Any, tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster") as cluster:
        workers = Workers(cluster.endpoints, JOB, tmp_path)
        try:
            run_scenario(browser, cluster, workers, tmp_path)
        except BaseException:
            print(workers.stderr_tails())
            raise
        finally:
            workers.stop_all()


def run_scenario(driver: Any, cluster: ProcessCluster, workers: Workers, tmp_path: Path) -> None:
    names = ["worker-1", "worker-2", "worker-3"]
    for name in names:
        workers.start(name)
    with dashboard(cluster.endpoints, tmp_path) as base:
        # The page is open before the job is whole: everything after arrives as events.
        driver.get(f"{base}/#job={JOB}")
        driver.execute_script("window.loadedOnce = true")
        world = wait_until(
            lambda: page_shows(
                driver,
                "document.getElementById('job-summary').dataset.state === 'active' && "
                "document.querySelectorAll('#participants tbody tr').length === 3 && "
                "document.getElementById('job-summary').dataset.round",
            ),
            START_S,
            "the page to show the job's round with 3 workers",
        )
        round_number = int(world)

        # The leader, the job and its round, as the cluster and the API say.
        leader = cluster.leader()
        wait_until(
            lambda: f"member {leader} " in page_shows(driver, "document.body.innerText"),
            CHANGE_S,
            f"the page to name member {leader} the leader",
        )
        assert f"leader: member {leader} " in driver.find_element("id", "leader").text
        # Read in one script: the table is rebuilt with every jobs event (each poll), so an
        # element found in one call may be gone by the next.
        cells = page_shows(
            driver,
            f"Array.from(document.querySelectorAll(\"#jobs tbody tr[data-job='{JOB}'] td\"))"
            ".map(cell => cell.innerText)",
        )
        assert cells[0] == JOB and cells[1] == str(round_number) and cells[3] == "3", cells
        assert api(base, f"/api/jobs/{JOB}")["round"]["round"] >= round_number

        # A worker dies: the page shows the round's end, its cause and the next round.
        workers.kill("worker-3")
        ended = f".round[data-round='{round_number}'][data-end-reason='member_failed']"
        cause = wait_until(
            lambda: page_shows(driver, f'(document.querySelector("{ended}") || {{}}).innerText'),
            CHANGE_S,
            f"the page to show round {round_number} ended by a member failure",
        )
        assert "member_failed by worker-3" in cause, cause
        assert "heartbeat stream closed" in cause or "phi" in cause, cause
        wait_until(
            lambda: page_shows(
                driver,
                f"Number(document.getElementById('job-summary').dataset.round) > {round_number}"
                " && document.getElementById('job-summary').dataset.state === 'active' && "
                "document.querySelectorAll('#participants tbody tr').length === 2",
            ),
            CHANGE_S,
            "the page to show the next round with the 2 survivors",
        )
        recoveries = driver.find_element("id", "recoveries").text
        assert "member_failed" in recoveries and "worker-3" in recoveries, recoveries
        # Once the survivors train again, the recovery says where their state came from, as
        # the elastic workers reported it (survivors at one step: keep, or broadcast).
        restore = wait_until(
            lambda: next(
                (
                    r["restore"]
                    for r in api(base, f"/api/jobs/{JOB}")["recoveries"]
                    if r["round"] == round_number
                ),
                None,
            ),
            CHANGE_S,
            f"the restore of the round after round {round_number}",
        )
        assert restore in RESTORE_SOURCES, restore
        phases = f".round[data-round='{round_number}'] .phases"
        wait_until(
            lambda: (
                f"restore: {restore}"
                in page_shows(
                    driver, f'(document.querySelector("{phases}") || {{}}).innerText || ""'
                )
            ),
            CHANGE_S,
            f"the page to show round {round_number}'s recovery restored from {restore}",
        )
        # The same page all along: nothing reloaded it, and its script never failed.
        assert page_shows(driver, "window.loadedOnce === true")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
        wait_until(
            lambda: page_shows(driver, "document.getElementById('checkpoint').dataset.step"),
            CHANGE_S,
            "a committed checkpoint on the page",
        )

        update = os.environ.get("RALLYPOINT_UPDATE_SCREENSHOT") == "1"
        if update:  # a picture worth keeping: some seconds of phi in the charts
            wait_until(
                lambda: min(map(len, api(base, f"/api/jobs/{JOB}")["phi_history"].values())) >= 20,
                CHANGE_S,
                "20 phi readings per worker",
            )
        shot = tmp_path / "dashboard.png"
        assert driver.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if update:
            SCREENSHOT.parent.mkdir(exist_ok=True)
            shutil.copyfile(shot, SCREENSHOT)
