"""A job's lifecycle over real member processes: a job whose workers finish is shown finished
(not "joining, world size 0" forever), one whose worker fails is shown failed, a recovery
reads as detected / re-formed / training again with its restore source, and an operator
prunes ended jobs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from rallypoint.client import (
    JobConfig,
    LeaveOutcome,
    SyncClient,
    SyncParticipant,
    TrainingProgress,
)
from rallypoint.coordinator.cli.main import main as rallypoint_main

from .harness import ProcessCluster, running_cluster, wait_until

pytestmark = pytest.mark.integration

# Closes at once with both workers; a survivor alone re-forms after a short last call.
CONFIG = JobConfig(min_nodes=1, max_nodes=2, last_call_ms=300)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with running_cluster(tmp_path_factory.mktemp("lifecycle"), 3, tick_ms=50) as running:
        yield running


@pytest.fixture
def client(cluster: ProcessCluster) -> Iterator[SyncClient]:
    with SyncClient(cluster.endpoints, timeout_s=20) as made:
        yield made


def cli(
    capsys: pytest.CaptureFixture[str], cluster: ProcessCluster, *argv: str
) -> tuple[int, str, str]:
    capsys.readouterr()
    code = rallypoint_main([*argv, "--endpoints", ",".join(cluster.endpoints)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_json(capsys: pytest.CaptureFixture[str], cluster: ProcessCluster, *argv: str) -> Any:
    code, out, err = cli(capsys, cluster, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def step(participant: SyncParticipant, round_number: int, number: int, restore: str) -> None:
    """What the elastic loop reports after a training step (and at a round's start)."""
    participant.report_progress(
        TrainingProgress(
            round=round_number, step=number, step_done_s=time.monotonic(), restore=restore
        )
    )


def train(
    client: SyncClient, job: str, participant: SyncParticipant, first_step: int, restore: str
) -> int:
    """Wait for this worker's round, report a step in it (its state restored from
    ``restore``), and wait until the leader noted that the round trains; the round's number."""
    info = participant.wait_for_round(timeout_s=20)
    step(participant, info.round, first_step, restore)
    time.sleep(0.3)  # a heartbeat carries the round's starting point first
    step(participant, info.round, first_step + 1, restore)
    wait_until(
        lambda: client.get_job(job).round.trained_ms,
        10,
        f"round {info.round} of {job} noted as training",
    )
    return info.round


def test_a_finished_job_is_shown_finished_with_its_recovery_and_can_be_pruned(
    cluster: ProcessCluster, client: SyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    job = "lc-done"
    with SyncClient(cluster.endpoints, timeout_s=20) as dying:
        doomed = dying.join(job, "w0", config=CONFIG)
        survivor = client.join(job, "w1", config=CONFIG)
        first = train(client, job, survivor, 0, "fresh")
        # w0's process dies (no leave): detected, the survivor re-forms alone and trains.
        doomed.close()
    # The survivor alone keeps the state it holds, as the elastic loop would say.
    second = train(client, job, survivor, 2, "keep")
    assert second > first
    survivor.leave(outcome=LeaveOutcome.FINISHED, detail="w1 reached step 3")

    listed = {j["job"]: j for j in cli_json(capsys, cluster, "jobs")["jobs"]}[job]
    assert (listed["job_state"], listed["job_end_detail"]) == ("finished", "w1 reached step 3")
    assert listed["job_ended_ms"] > 0
    code, out, _ = cli(capsys, cluster, "jobs")
    row = next(line for line in out.splitlines() if job in line)
    assert code == 0 and "finished" in row and "joining" not in row

    rounds = cli_json(capsys, cluster, "rounds", job)
    recovery = next(r for r in rounds["recoveries"] if r["round"] == first)
    assert (recovery["end_reason"], recovery["ended_by"]) == ("member_failed", "w0")
    detected, reformed, trained = (
        recovery["detected_ms"],
        recovery["reformed_ms"],
        recovery["training_ms"],
    )
    assert detected <= reformed <= trained, recovery
    assert recovery["training_after_s"] >= recovery["reformed_after_s"] >= 0
    assert recovery["restore"] == "keep"
    history = {r["round"]: r for r in rounds["history"]}
    assert history[first]["trained_ms"] > 0 and history[second]["trained_ms"] == trained
    assert (history[first]["restore"], history[second]["restore"]) == ("fresh", "keep")
    code, out, _ = cli(capsys, cluster, "rounds", job)
    assert code == 0 and "recoveries" in out and "training again" in out
    assert "restore" in out and "keep" in out
    # A local clock time, not the leader's epoch milliseconds.
    ended = datetime.fromtimestamp(listed["job_ended_ms"] / 1000).strftime("%H:%M:%S")
    assert f"job finished at {ended} (" in out and str(listed["job_ended_ms"]) not in out
    assert listed["state"] == "finished" and listed["round_state"] == "joining"

    # A failed run of another job: its worker says so as it leaves.
    failing = client.join("lc-failed", "w0", config=CONFIG)
    failing.wait_for_round(timeout_s=20)
    failing.leave(outcome=LeaveOutcome.FAILED, detail="w0: RuntimeError: CUDA out of memory")
    # And one still running, which prune leaves alone.
    running = client.join("lc-open", "w0", config=CONFIG)
    jobs = {j["job"]: j for j in cli_json(capsys, cluster, "jobs")["jobs"]}
    assert jobs["lc-failed"]["job_state"] == "failed"
    assert jobs["lc-failed"]["job_end_detail"] == "w0: RuntimeError: CUDA out of memory"
    assert jobs["lc-open"]["job_state"] == "open"

    pruned = cli_json(capsys, cluster, "jobs", "prune", "lc-done", "lc-failed", "lc-open")
    assert pruned == {"pruned": ["lc-done", "lc-failed"]}
    remaining = {j["job"] for j in cli_json(capsys, cluster, "jobs")["jobs"]}
    assert "lc-open" in remaining and not {"lc-done", "lc-failed"} & remaining
    code, out, _ = cli(capsys, cluster, "jobs", "prune")
    assert (code, out.strip()) == (0, "no ended job to prune")
    running.leave()


def test_a_rerun_under_the_same_id_starts_the_job_again(
    cluster: ProcessCluster, client: SyncClient
) -> None:
    job = "lc-rerun"
    first = client.join(job, "w0", config=CONFIG)
    first.wait_for_round(timeout_s=20)
    first.leave(outcome=LeaveOutcome.FINISHED)
    ended = client.get_job(job).round
    assert ended.job_state.value == "finished"
    again = client.join(job, "w0", config=JobConfig(min_nodes=1, max_nodes=1))
    info = again.wait_for_round(timeout_s=20)
    # The ended run's empty JOINING round takes the new run: numbers never go back.
    assert info.round >= ended.round and info.job_state.value == "open"
    again.leave()


def test_a_leave_without_an_outcome_leaves_the_job_open(
    cluster: ProcessCluster, client: SyncClient, tmp_path: Path
) -> None:
    job = "lc-quiet"
    participant = client.join(job, "w0", config=CONFIG)
    participant.wait_for_round(timeout_s=20)
    participant.leave()
    assert client.get_job(job).round.job_state.value == "open"
