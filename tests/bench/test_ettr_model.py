"""The effective-training-time model (bench/ettr_model.py, bench/ettr_bench.py): its
accounting adds up, its bounds hold, more interruptions never help, the interruptions it draws
are the published ones, and the JSON ``make bench-ettr`` writes has every documented field with
a source for every input. Run small: a few seeded 54-day runs."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
# bench/ is a folder of scripts run from the repository (python -m bench.ettr_bench), not an
# installed package: the test imports it the same way.
if str(REPOSITORY) not in sys.path:
    sys.path.insert(0, str(REPOSITORY))

from bench import ettr_bench  # noqa: E402
from bench.ettr_inputs import CAUSES, SOURCES, build_inputs  # noqa: E402
from bench.ettr_model import (  # noqa: E402
    DAY_S,
    LOSS_KINDS,
    Event,
    Kind,
    Response,
    System,
    Tier,
    generate_events,
    simulate,
)

SEEDS = list(range(1, 9))
# The top-level and per-system fields bench/README.md documents for ettr.json.
DOCUMENTED = (
    "benchmark",
    "ettr",
    "model",
    "systems",
    "variants",
    "derived",
    "inputs",
    "sources",
    "interruptions",
    "sensitivity",
    "assumptions",
    "limits",
    "cross_check",
    "targets",
    "parameters",
    "machine",
    "versions",
)
PER_SYSTEM = (
    "ettr",
    "ettr_p5",
    "ettr_p95",
    "description",
    "lost_hours_by_kind",
    "lost_hours_by_cause",
    "interruptions_mean",
    "recovery_by_kind",
    "composition",
)
KINDS = ("published", "measured", "derived", "setting", "assumption")


@pytest.fixture(scope="module")
def values() -> dict[str, float]:
    return {name: item.value for name, item in build_inputs().items()}


def free_system(name: str = "free") -> System:
    """A system whose recoveries and steady state cost nothing."""
    return System(
        name=name,
        respond=lambda event: Response(0.0, Tier.NONE),
        disk_interval_s=1800.0,
        snapshot_interval_s=0.0,
        step_s=6.0,
        checkpoint_write_fraction=0.0,
        snapshot_fraction=0.0,
        per_step_fraction=0.0,
    )


def test_a_free_system_without_interruptions_gets_exactly_one(values: dict[str, float]) -> None:
    wall_s = values["days"] * DAY_S
    assert simulate(free_system(), [], wall_s).ettr == 1.0
    # The real systems with nothing to recover from and nothing spent on checkpoints or on
    # each step either (rallypoint's measured overhead is 0 only while its step is no slower
    # than plain DDP's in the committed peers.json).
    quiet = {**values, "interruption_rate_multiplier": 0.0, "checkpoint_bytes": 0.0}
    quiet["snapshot_blocked_s_per_gb"] = quiet["torchft_step_overhead_s"] = 0.0
    quiet["rallypoint_step_overhead_s"] = 0.0
    for name, outcomes in ettr_bench.run_model(quiet, SEEDS[:2]).items():
        for outcome in outcomes:
            assert outcome.events == 0
            assert outcome.ettr == pytest.approx(1.0, abs=1e-12), name


def test_interruptions_that_cost_nothing_cost_nothing(values: dict[str, float]) -> None:
    events = generate_events(CAUSES, values, seed=3)
    assert events
    assert simulate(free_system(), events, values["days"] * DAY_S).ettr == pytest.approx(1.0)


def test_ettr_is_in_zero_one_and_the_losses_add_up_to_the_wall_time(
    values: dict[str, float],
) -> None:
    wall_s = values["days"] * DAY_S
    for name, outcomes in ettr_bench.run_model(values, SEEDS).items():
        for outcome in outcomes:
            assert 0.0 < outcome.ettr <= 1.0, name
            assert set(outcome.lost_by_kind) == set(LOSS_KINDS)
            assert all(lost >= 0.0 for lost in outcome.lost_by_kind.values()), name
            total = outcome.productive_s + sum(outcome.lost_by_kind.values())
            assert total == pytest.approx(wall_s, rel=1e-9), name
            assert sum(outcome.lost_by_cause.values()) == pytest.approx(
                sum(outcome.lost_by_kind.values()), rel=1e-9
            )


def test_more_interruptions_never_raise_ettr(values: dict[str, float]) -> None:
    previous: dict[str, float] = {}
    for multiplier in (0.25, 0.5, 1.0, 2.0, 4.0):
        outcomes = ettr_bench.run_model(
            {**values, "interruption_rate_multiplier": multiplier}, SEEDS
        )
        means = {name: ettr_bench.mean_ettr(runs) for name, runs in outcomes.items()}
        for name, mean in means.items():
            if name in previous:
                assert mean < previous[name], (name, multiplier, mean, previous[name])
        previous = means


def test_a_higher_rate_only_adds_interruptions(values: dict[str, float]) -> None:
    lower = generate_events(CAUSES, values, seed=5)
    higher = generate_events(CAUSES, {**values, "interruption_rate_multiplier": 2.0}, seed=5)
    assert set(lower) < set(higher)


def test_the_drawn_interruptions_are_the_published_mix(values: dict[str, float]) -> None:
    """Over many 54-day runs the mean count per cause is the table's count (Poisson: the mean
    over 200 runs is within 4 standard errors)."""
    runs = 200
    counts: dict[str, int] = {}
    for seed in range(runs):
        for event in generate_events(CAUSES, values, seed):
            counts[event.cause] = counts.get(event.cause, 0) + 1
    for cause in CAUSES:
        mean = counts.get(cause.name, 0) / runs
        assert abs(mean - cause.count) <= 4 * math.sqrt(cause.count / runs) + 1e-9, cause.name
    assert sum(cause.count for cause in CAUSES) == 466


def test_job_wide_faults_follow_their_share(values: dict[str, float]) -> None:
    none = generate_events(CAUSES, {**values, "job_wide_software_fraction": 0.0}, seed=2)
    every = generate_events(CAUSES, {**values, "job_wide_software_fraction": 1.0}, seed=2)
    assert not [e for e in none if e.kind is Kind.JOB_WIDE]
    software = [e for e in every if e.cause in ("Software Bug", "Dependency")]
    assert software and all(e.kind is Kind.JOB_WIDE for e in software)


def test_a_stall_at_the_end_is_cut_at_the_wall_time() -> None:
    wall_s = 1000.0
    stalling = System(
        name="slow",
        respond=lambda event: Response(5000.0, Tier.NONE),
        disk_interval_s=0.0,
        snapshot_interval_s=0.0,
        step_s=1.0,
        checkpoint_write_fraction=0.0,
        snapshot_fraction=0.0,
        per_step_fraction=0.0,
    )
    outcome = simulate(stalling, [Event(900.0, "x", Kind.HOST_LOST, 1)], wall_s)
    assert outcome.ettr == pytest.approx(0.9)
    assert outcome.lost_by_kind["stall"] == pytest.approx(100.0)


def report(tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "ettr.json"
    argv = ["--replicates=4", "--sensitivity-replicates=1", "--no-plot", f"--out={out}"]
    assert ettr_bench.main(argv) == 0
    document: dict[str, Any] = json.loads(out.read_text())
    return document


def test_the_json_has_every_documented_field_and_a_source_for_every_input(
    tmp_path: Path,
) -> None:
    document = report(tmp_path)
    for field in DOCUMENTED:
        assert field in document, field
    for name in ettr_bench.SYSTEMS:
        assert 0.0 < document["ettr"][name] <= 1.0
        for field in PER_SYSTEM:
            assert field in document["systems"][name], (name, field)
    assert "snapshot_every_steps" in document["systems"]["rallypoint"]
    assert document["targets"]["ettr.rallypoint"]["verdict"] in ("PASS", "MISS")

    inputs = document["inputs"]
    for name, item in inputs.items():
        source = item["source"]
        assert source["kind"] in KINDS, name
        assert source["ref"], name
        if source["kind"] == "published":
            assert source["ref"] in SOURCES, name
            assert source.get("note"), f"{name}: a published input names its section or table"
        if source["kind"] == "measured" and source["ref"].startswith("bench/results/"):
            # The value is the one in the file and field it names.
            file, path = source["ref"].split(": ")
            node: Any = json.loads((REPOSITORY / file).read_text())
            for key in path.split("."):
                node = node[key]
            assert float(node) == item["value"], name
    for entry in SOURCES.values():
        assert entry["title"] and entry["year"] and entry["where"]

    # Every input is varied both ways; every assumption is among them.
    rows = {row["input"]: row for row in document["sensitivity"]["rows"]}
    assert set(rows) == set(inputs)
    for name, row in rows.items():
        for label in ("halved", "doubled"):
            assert set(row[label]["ettr"]) == set(ettr_bench.SYSTEMS), name
    interruptions = document["interruptions"]
    assert (interruptions["total"], interruptions["planned"]) == (466, 47)
    assert interruptions["unexpected"] == 419
    for cause in interruptions["causes"]:
        assert isinstance(cause["takes_hosts_down"], bool) and cause["scope_basis"]


def test_the_same_seed_gives_the_same_figures(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    first, second = report(tmp_path / "a"), report(tmp_path / "b")
    assert first["ettr"] == second["ettr"]
    assert first["sensitivity"]["rows"] == second["sensitivity"]["rows"]


def test_every_assumption_is_named_with_its_reasoning_and_what_it_moves(tmp_path: Path) -> None:
    document = report(tmp_path)
    assumed = {
        name for name, item in document["inputs"].items() if item["source"]["kind"] == "assumption"
    }
    assert {"job_wide_software_fraction", "pg_init_s"} <= assumed
    entries = document["assumptions"]["rows"]
    assert {entry["input"] for entry in entries} == assumed
    rows = {row["input"]: row for row in document["sensitivity"]["rows"]}
    for entry in entries:
        name = entry["input"]
        assert entry["reasoning"].startswith("assumption: "), name
        assert entry["value"] == document["inputs"][name]["value"], name
        assert entry["ettr_halved"] == rows[name]["halved"]["ettr"], name
        assert entry["ettr_doubled"] == rows[name]["doubled"]["ettr"], name
        for label in ("ettr_halved", "ettr_doubled", "ettr_zeroed"):
            assert set(entry[label]) == set(ettr_bench.SYSTEMS), (name, label)
    swings = [entry["rallypoint_swing"] for entry in entries]
    assert swings == sorted(swings, reverse=True)
    # A software fault that reaches every process costs rallypoint a relaunch of every
    # process and the training since its last snapshot: with none of them, it does better.
    software = next(e for e in entries if e["input"] == "job_wide_software_fraction")
    base = document["sensitivity"]["base_ettr"]["rallypoint"]
    assert software["ettr_zeroed"]["rallypoint"] > base


def test_every_measured_input_is_read_from_a_committed_results_file() -> None:
    for name, item in build_inputs().items():
        if item.kind == "measured":
            assert item.ref.startswith("bench/results/"), (name, item.ref)
        if item.kind == "assumption":
            assert item.ref.startswith("assumption: "), name
    for key, entry in SOURCES.items():
        assert entry.get("checked"), f"{key}: say how far the source was checked"


def test_rallypoint_restores_a_lost_host_from_the_replicas_without_rollback(
    values: dict[str, float],
) -> None:
    """The same job for torchft and rallypoint (a whole replica per replica group): a lost
    host, crash or hang drops only rallypoint's step in flight and its restore takes the
    measured replica throughput; the job sharded over data parallel (the variant) rolls back
    to the last memory snapshot."""
    systems = ettr_bench.make_systems(values)
    rallypoint = systems["rallypoint"]
    derived = ettr_bench.derived(values)
    assert derived["replica_restore_s"] == pytest.approx(
        values["state_bytes_per_gpu"] / values["replica_restore_bytes_per_s"]
    )
    for kind in (Kind.HOST_LOST, Kind.PROCESS_CRASH, Kind.HANG):
        response = rallypoint.respond(Event(0.0, "x", kind, 1))
        assert response.tier is Tier.IN_FLIGHT, kind
        sharded = systems[ettr_bench.SHARDED_VARIANT].respond(Event(0.0, "x", kind, 1))
        assert sharded.tier is Tier.MEMORY, kind
        assert response.stall_s - sharded.stall_s == pytest.approx(
            derived["replica_restore_s"] - derived["memory_restore_s"]
        )
    outcomes = ettr_bench.run_model(values, SEEDS)
    variant = ettr_bench.run_model(values, SEEDS, systems=(ettr_bench.SHARDED_VARIANT,))
    replicas_recompute = sum(o.lost_by_kind["recompute"] for o in outcomes["rallypoint"])
    sharded_recompute = sum(
        o.lost_by_kind["recompute"] for o in variant[ettr_bench.SHARDED_VARIANT]
    )
    assert replicas_recompute < sharded_recompute


def test_a_job_wide_fault_restores_rallypoint_from_host_memory(
    values: dict[str, float],
) -> None:
    """rallypoint keeps its memory snapshots in host memory (snapshot_dir), taken every N
    steps by Young's formula over the job-wide faults alone: a job-wide fault relaunches
    every process (the same relaunch, start and process groups as a restart from disk) and
    restores the last snapshot at the measured host-memory throughput instead of reading the
    checkpoint, redoing only the training since that snapshot; the variant still restarts
    from disk. With no job-wide fault it takes no snapshot at all."""
    systems = ettr_bench.make_systems(values)
    rallypoint, variant = systems["rallypoint"], systems[ettr_bench.SHARDED_VARIANT]
    derived = ettr_bench.derived(values)
    assert derived["host_memory_restore_s"] == pytest.approx(
        values["state_bytes_per_gpu"] / values["host_memory_restore_bytes_per_s"]
    )
    job_wide = Event(0.0, "x", Kind.JOB_WIDE, 1)
    from_memory, from_disk = rallypoint.respond(job_wide), variant.respond(job_wide)
    assert (from_memory.tier, from_disk.tier) == (Tier.MEMORY, Tier.DISK)
    checkpoint_read = values["checkpoint_bytes"] / values["storage_bytes_per_s"]
    assert from_memory.stall_s == pytest.approx(
        from_disk.stall_s - checkpoint_read + derived["host_memory_restore_s"]
    )
    steps = derived["host_snapshot_every_steps"]
    assert steps >= 1
    assert rallypoint.snapshot_interval_s == pytest.approx(steps * values["step_s"])
    blocked = derived["snapshot_blocked_s"]
    assert rallypoint.snapshot_fraction == pytest.approx(
        blocked / (rallypoint.snapshot_interval_s + blocked)
    )
    # Fewer events restore from these snapshots than from the variant's: taken less often.
    assert steps > derived["snapshot_every_steps"]
    never = ettr_bench.make_systems({**values, "job_wide_software_fraction": 0.0})["rallypoint"]
    assert never.snapshot_interval_s == 0.0 and never.snapshot_fraction == 0.0
    # Redone since the last snapshot, not since the last checkpoint.
    everything = {**values, "job_wide_software_fraction": 1.0}
    outcomes = ettr_bench.run_model(everything, SEEDS)["rallypoint"]
    events = [e for s in SEEDS for e in generate_events(CAUSES, everything, s)]
    job_wide_count = sum(e.kind is Kind.JOB_WIDE for e in events)
    redone = sum(o.lost_by_kind["recompute"] for o in outcomes)
    # (Every other event drops at most the step in flight.)
    in_flight = (len(events) - job_wide_count) * values["step_s"]
    assert 0.0 < redone <= job_wide_count * rallypoint.snapshot_interval_s + in_flight


def test_the_variant_is_reported_beside_the_systems(tmp_path: Path) -> None:
    document = report(tmp_path)
    variant = document["variants"][ettr_bench.SHARDED_VARIANT]
    assert 0.0 < variant["ettr"] <= 1.0
    assert variant["snapshot_every_steps"] >= 1
    derived = document["derived"]
    assert document["systems"]["rallypoint"]["snapshot_every_steps"] == int(
        derived["host_snapshot_every_steps"]
    )
    replica = document["inputs"]["replica_restore_bytes_per_s"]["source"]
    assert replica == {
        "kind": "measured",
        "ref": "bench/results/replicas.json: replica_restore_bytes_per_s",
        "note": replica["note"],
    }
