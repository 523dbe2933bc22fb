"""Effective training time at 16,384 GPUs: torchrun (restart everything from a disk
checkpoint), torchft (survivors keep going, a replica group is missing until its replacement
heals) and rallypoint (in-process re-formation, restore from the survivors' replicas, spare
hosts), the same job for the two (HSDP-shaped: a whole replica per replica group), over the
54 days and 466 interruptions Llama 3 reported, each system's recovery composed from figures
this repository measured and published figures where a cost grows with scale.

    .venv/bin/python -m bench.ettr_bench [--out bench/results/ettr.json]   # < 1 minute
    .venv/bin/python -m bench.ettr_bench --replicates 20 --sensitivity-replicates 5 \\
        --out /tmp/ettr.json --no-plot                                     # quicker

The simulation is ``bench/ettr_model.py``; the inputs and their sources ``bench/ettr_inputs.py``.
ETTR is productive time over wall time (the metric of Kokolis et al. 2024), the mean over
``--replicates`` seeded runs; the sensitivity table halves and doubles each input in turn on
the same seeds.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import machine_info, package_versions, print_targets, verdicts, write_results
from bench.ettr_inputs import CAUSES, SOURCES, Input, build_inputs
from bench.ettr_model import (
    DAY_S,
    LOSS_KINDS,
    Cause,
    Event,
    Kind,
    Outcome,
    Response,
    Scope,
    System,
    Tier,
    count_key,
    generate_events,
    simulate,
    young_interval_s,
)

SYSTEMS = ("torchrun", "torchft", "rallypoint")
TARGETS = {"ettr.rallypoint": (">=", 0.99)}
# Fractions cannot pass 1 when doubled.
SHARES = ("job_wide_software_fraction", "planned_drainable_fraction")
DESCRIPTIONS = {
    "torchrun": "every interruption stops and restarts every process (launcher relaunch, "
    "process start, process groups of every rank, the last disk checkpoint read from storage); "
    "training since that checkpoint is redone; a hang waits out the NCCL timeout; each "
    "checkpoint holds training while it is written",
    "torchft": "a lost host, crash or hang costs every survivor torchft's stall, then the "
    "survivors train on without the failed replica group (the in-flight step is dropped) until "
    "its replacement has started and healed from a peer; a job-wide fault or planned stop "
    "restarts everything from disk like torchrun; a per-step quorum cost",
    "rallypoint": "the same job as torchft's (a whole replica per replica group): a lost "
    "host, crash or hang: detection, the round change, a spare host filling the loss, "
    "survivors re-forming in process (process groups of every rank) and restoring from their "
    "own replicas at the step they trained to (source replicas: only the step in flight is "
    "dropped), the newcomer receiving its shards from a survivor holding them; a job-wide "
    "fault relaunches every process on the same hosts, which restore the last memory "
    "snapshot from host memory (snapshot_dir on a tmpfs: the snapshots outlive the "
    "processes), taken every N steps by Young's formula over the job-wide faults; a planned "
    "stop restarts from disk; a planned drain loses nothing",
}
# The job as rallypoint ran it in this model before the replicas restore existed (state
# sharded over data parallel, memory snapshots every N steps by Young's formula, every rank
# rolled back to the last one): reported beside the systems as ``variants``, not a system.
SHARDED_VARIANT = "rallypoint_sharded_over_dp"
VARIANT_DESCRIPTION = (
    "rallypoint with the state sharded over data parallel (FSDP): a lost host, crash or hang "
    "re-forms every rank and restores the last memory snapshot (rolled back to it), the "
    "newcomer fetching its shards from peers' memory; memory snapshots every N steps, N by "
    "Young's formula; what this model reported for rallypoint before (0.9848)"
)

# How each system's stall for each kind of event is summed, in input names (``derived`` names
# full_restart_s = job_relaunch_s + process_start_s + pg_init_s + checkpoint read,
# memory_restore_s = state_bytes_per_gpu / memory_restore_bytes_per_s and
# replica_restore_s = state_bytes_per_gpu / replica_restore_bytes_per_s and
# host_memory_restore_s = state_bytes_per_gpu / host_memory_restore_bytes_per_s).
COMPOSITION = {
    "torchrun": {
        "host_lost, process_crash, job_wide": "torchrun_restart_s + full_restart_s; "
        "redo since the disk checkpoint",
        "hang": "nccl_timeout_s + torchrun_restart_s + full_restart_s; redo since the disk "
        "checkpoint",
        "drain, planned_restart": "torchrun_restart_s + checkpoint write + full_restart_s",
    },
    "torchft": {
        "host_lost, process_crash, hang": "torchft_kill_stall_s for every GPU, the step in "
        "flight dropped; then hosts / replica_groups of the job missing for process_start_s + "
        "torchft_rejoin_s + memory_restore_s (the heal from a peer)",
        "drain": "one replica group missing for the same replacement time, no stall",
        "job_wide": "torchrun_restart_s + full_restart_s; redo since the disk checkpoint",
        "planned_restart": "torchrun_restart_s + checkpoint write + full_restart_s",
    },
    "rallypoint": {
        "host_lost": "rallypoint_memory_recovery_s + (detect_silent_s - detect_sigkill_s) + "
        "round_close_s + pg_init_s + replica_restore_s; the step in flight dropped",
        "process_crash": "rallypoint_memory_recovery_s + round_close_s + pg_init_s + "
        "replica_restore_s; the step in flight dropped",
        "hang": "max(hang_factor x step_s, hang_floor_s) + hang_recovery_s + round_close_s + "
        "pg_init_s + replica_restore_s; the step in flight dropped",
        "drain": "round_close_s + pg_init_s + replica_restore_s, nothing redone",
        "job_wide": "rallypoint_restart_s + job_relaunch_s + process_start_s + pg_init_s + "
        "host_memory_restore_s (the last memory snapshot taken up from host memory by the "
        "relaunched processes, instead of the disk checkpoint's read); redo since that "
        "snapshot (host_snapshot_every_steps)",
        "planned_restart": "rallypoint_restart_s + checkpoint write + full_restart_s",
    },
}


def derived(values: Mapping[str, float]) -> dict[str, float]:
    """Costs every system shares, computed from the inputs."""
    wall_s = values["days"] * DAY_S
    full_restart = values["job_relaunch_s"] + values["process_start_s"] + values["pg_init_s"]
    full_restart += values["checkpoint_bytes"] / values["storage_bytes_per_s"]
    memory_events = sum(
        values[count_key(c)] * (1.0 - values["job_wide_software_fraction"])
        if c.scope is Scope.SOFTWARE
        else values[count_key(c)]
        for c in CAUSES
        if c.scope is not Scope.PLANNED
    )
    memory_events *= values["interruption_rate_multiplier"] * values["days"] / values["window_days"]
    blocked = values["snapshot_blocked_s_per_gb"] * values["state_bytes_per_gpu"] / 1e9
    mtbf = wall_s / memory_events if memory_events > 0 else float("inf")
    interval = young_interval_s(blocked, mtbf) if blocked > 0 else values["step_s"]
    snapshot_steps = max(1, round(interval / values["step_s"])) if math.isfinite(interval) else 1
    # rallypoint's snapshots in host memory: only a job-wide fault restores from one (every
    # other event from the survivors' replicas), so Young's interval is over those alone;
    # none at all when there are none (0: no snapshots, no cost).
    job_wide_events = sum(
        values[count_key(c)] * values["job_wide_software_fraction"]
        for c in CAUSES
        if c.scope is Scope.SOFTWARE
    )
    job_wide_events *= values["interruption_rate_multiplier"] * values["days"]
    job_wide_events /= values["window_days"]
    host_steps = 0.0
    if job_wide_events > 0:
        host_interval = young_interval_s(blocked, wall_s / job_wide_events)
        host_steps = max(1.0, round(host_interval / values["step_s"])) if blocked > 0 else 1.0
    return {
        "wall_s": wall_s,
        "checkpoint_write_s": values["checkpoint_bytes"] / values["storage_bytes_per_s"],
        "full_restart_s": full_restart,
        "snapshot_blocked_s": blocked,
        "snapshot_every_steps": float(snapshot_steps),
        "memory_restore_s": values["state_bytes_per_gpu"] / values["memory_restore_bytes_per_s"],
        "replica_restore_s": values["state_bytes_per_gpu"] / values["replica_restore_bytes_per_s"],
        "host_snapshot_every_steps": host_steps,
        "host_memory_restore_s": values["state_bytes_per_gpu"]
        / values["host_memory_restore_bytes_per_s"],
        "replica_groups": values["gpus"] / values["replica_group_gpus"],
        "hang_detect_s": max(values["hang_factor"] * values["step_s"], values["hang_floor_s"]),
    }


def make_systems(values: Mapping[str, float]) -> dict[str, System]:
    d = derived(values)
    step_s = values["step_s"]
    interval = values["disk_checkpoint_interval_s"]
    write_fraction = d["checkpoint_write_s"] / (interval + d["checkpoint_write_s"])
    planned_stop = d["checkpoint_write_s"] + d["full_restart_s"]

    def torchrun(event: Event) -> Response:
        restart = values["torchrun_restart_s"] + d["full_restart_s"]
        if event.kind in (Kind.DRAIN, Kind.PLANNED_RESTART):
            return Response(values["torchrun_restart_s"] + planned_stop, Tier.FRESH_DISK)
        if event.kind is Kind.HANG:
            return Response(values["nccl_timeout_s"] + restart, Tier.DISK)
        return Response(restart, Tier.DISK)

    def torchft(event: Event) -> Response:
        groups = d["replica_groups"]
        replacement = values["process_start_s"] + values["torchft_rejoin_s"] + d["memory_restore_s"]
        if event.kind is Kind.PLANNED_RESTART:
            return Response(values["torchrun_restart_s"] + planned_stop, Tier.FRESH_DISK)
        if event.kind is Kind.JOB_WIDE:
            return Response(values["torchrun_restart_s"] + d["full_restart_s"], Tier.DISK)
        if event.kind is Kind.DRAIN:
            return Response(0.0, Tier.NONE, replacement, 1.0 / groups)
        lost_groups = min(float(event.hosts), groups)
        return Response(
            values["torchft_kill_stall_s"], Tier.IN_FLIGHT, replacement, lost_groups / groups
        )

    # Every process relaunched on the same hosts; the state taken up from host memory.
    host_memory_restart = values["job_relaunch_s"] + values["process_start_s"]
    host_memory_restart += values["pg_init_s"] + d["host_memory_restore_s"]

    def rallypoint_responder(
        restore_s: float, tier: Tier, host_memory: bool
    ) -> Callable[[Event], Response]:
        """rallypoint's answers: ``restore_s`` and ``tier`` are where a lost host's, crash's
        or hang's state comes from (the survivors' replicas, or the last memory snapshot);
        ``host_memory``: a job-wide fault restores the last snapshot from host memory."""

        def respond(event: Event) -> Response:
            reform = restore_s + values["round_close_s"] + values["pg_init_s"]
            if event.kind is Kind.PLANNED_RESTART:
                return Response(values["rallypoint_restart_s"] + planned_stop, Tier.FRESH_DISK)
            if event.kind is Kind.JOB_WIDE and host_memory:
                return Response(values["rallypoint_restart_s"] + host_memory_restart, Tier.MEMORY)
            if event.kind is Kind.JOB_WIDE:
                return Response(values["rallypoint_restart_s"] + d["full_restart_s"], Tier.DISK)
            if event.kind is Kind.DRAIN:
                return Response(reform, Tier.NONE)
            if event.kind is Kind.HANG:
                return Response(d["hang_detect_s"] + values["hang_recovery_s"] + reform, tier)
            measured = values["rallypoint_memory_recovery_s"]
            if event.kind is Kind.HOST_LOST:
                # A host that vanishes is found by silence, not by its connections closing.
                measured += values["detect_silent_s"] - values["detect_sigkill_s"]
            return Response(measured + reform, tier)

        return respond

    # A lost host's unit is one replica group's part: every other group holds its shards at
    # the step the survivors trained to, so only the step in flight is dropped (replicas).
    rallypoint = rallypoint_responder(d["replica_restore_s"], Tier.IN_FLIGHT, True)
    # As this model ran it before: its job-wide faults restart from disk.
    sharded = rallypoint_responder(d["memory_restore_s"], Tier.MEMORY, False)

    def system(
        name: str,
        respond: Callable[[Event], Response],
        snapshot_interval_s: float,
        snapshot_fraction: float,
        per_step_s: float,
    ) -> System:
        return System(
            name=name,
            respond=respond,
            disk_interval_s=interval,
            snapshot_interval_s=snapshot_interval_s,
            step_s=step_s,
            checkpoint_write_fraction=write_fraction,
            snapshot_fraction=snapshot_fraction,
            per_step_fraction=per_step_s / step_s,
        )

    snapshot_interval = d["snapshot_every_steps"] * step_s
    blocked = d["snapshot_blocked_s"]
    host_interval = d["host_snapshot_every_steps"] * step_s
    return {
        "torchrun": system("torchrun", torchrun, 0.0, 0.0, 0.0),
        "torchft": system("torchft", torchft, 0.0, 0.0, values["torchft_step_overhead_s"]),
        # Memory snapshots for the job-wide faults only (0: none, when there are none).
        "rallypoint": system(
            "rallypoint",
            rallypoint,
            host_interval,
            blocked / (host_interval + blocked) if host_interval else 0.0,
            values["rallypoint_step_overhead_s"],
        ),
        SHARDED_VARIANT: system(
            SHARDED_VARIANT,
            sharded,
            snapshot_interval,
            blocked / (snapshot_interval + blocked),
            values["rallypoint_step_overhead_s"],
        ),
    }


# Inputs that change which interruptions happen (the others only change what they cost).
EVENT_INPUTS = (
    "days",
    "window_days",
    "interruption_rate_multiplier",
    "job_wide_software_fraction",
    "planned_drainable_fraction",
    "hosts_per_network_fault",
    *(count_key(cause) for cause in CAUSES),
)


def run_model(
    values: Mapping[str, float],
    seeds: Sequence[int],
    causes: Sequence[Cause] = CAUSES,
    systems: Sequence[str] = SYSTEMS,
) -> dict[str, list[Outcome]]:
    """Every system's outcome on each seed's interruptions (the same interruptions for all)."""
    built = make_systems(values)
    wall_s = values["days"] * DAY_S
    outcomes: dict[str, list[Outcome]] = {name: [] for name in systems}
    for seed in seeds:
        events = generate_events(causes, values, seed)
        for name in systems:
            outcomes[name].append(simulate(built[name], events, wall_s))
    return outcomes


def mean_ettr(outcomes: Sequence[Outcome]) -> float:
    return statistics.fmean(outcome.ettr for outcome in outcomes)


def summarise(
    name: str, outcomes: Sequence[Outcome], values: Mapping[str, float]
) -> dict[str, Any]:
    ettrs = sorted(outcome.ettr for outcome in outcomes)
    hours = 1.0 / 3600.0
    causes = sorted({cause for outcome in outcomes for cause in outcome.lost_by_cause})
    by_cause = {
        cause: statistics.fmean(o.lost_by_cause.get(cause, 0.0) for o in outcomes) * hours
        for cause in causes
    }
    respond = make_systems(values)[name].respond
    recovery = {}
    for kind in Kind:
        response = respond(Event(0.0, "example", kind, 1))
        recovery[kind.value] = {
            "stall_s": response.stall_s,
            "restores_from": response.tier.value,
            "degraded_s": response.degraded_s,
            "degraded_fraction": response.degraded_fraction,
        }
    summary: dict[str, Any] = {
        "ettr": statistics.fmean(ettrs),
        "ettr_p5": ettrs[int(0.05 * (len(ettrs) - 1))],
        "ettr_p95": ettrs[int(0.95 * (len(ettrs) - 1))],
        "description": DESCRIPTIONS[name],
        "lost_hours_by_kind": {
            kind: statistics.fmean(o.lost_by_kind[kind] for o in outcomes) * hours
            for kind in LOSS_KINDS
        },
        "lost_hours_by_cause": dict(sorted(by_cause.items(), key=lambda item: -item[1])),
        "interruptions_mean": statistics.fmean(o.events for o in outcomes),
        "recovery_by_kind": recovery,
        "composition": COMPOSITION[name],
    }
    if name == "rallypoint":
        # Kept in host memory, for the job-wide faults (make_systems); 0: none taken.
        summary["snapshot_every_steps"] = int(derived(values)["host_snapshot_every_steps"])
    return summary


def variants(values: Mapping[str, float], seeds: Sequence[int]) -> dict[str, Any]:
    """rallypoint on the job sharded over data parallel (memory snapshots, rollback), on the
    same seeds: the figure this model gave before the replicas restore, for comparison."""
    outcomes = run_model(values, seeds, systems=(SHARDED_VARIANT,))[SHARDED_VARIANT]
    hours = 1.0 / 3600.0
    return {
        "what": "rallypoint on another job shape, beside the systems (not one of them): the "
        "state sharded over data parallel, so a lost host rolls every rank back to the last "
        "memory snapshot; the systems compare torchft and rallypoint on the same job (a whole "
        "replica per replica group)",
        SHARDED_VARIANT: {
            "ettr": mean_ettr(outcomes),
            "description": VARIANT_DESCRIPTION,
            "lost_hours_by_kind": {
                kind: statistics.fmean(o.lost_by_kind[kind] for o in outcomes) * hours
                for kind in LOSS_KINDS
            },
            "snapshot_every_steps": int(derived(values)["snapshot_every_steps"]),
            "composition": "as rallypoint's, with memory_restore_s for replica_restore_s and "
            "training redone since the last memory snapshot (host_lost, process_crash, hang)",
        },
    }


def sensitivity(inputs: Mapping[str, Input], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """ETTR of each system with each input halved and then doubled, the others as given."""
    base = {name: item.value for name, item in inputs.items()}
    rows = []
    for name, item in inputs.items():
        row: dict[str, Any] = {"input": name, "base": item.value, "kind": item.kind}
        for label, factor in (("halved", 0.5), ("doubled", 2.0)):
            value = item.value * factor
            if name in SHARES:
                value = min(1.0, value)
            outcomes = run_model({**base, name: value}, seeds)
            row[label] = {
                "value": value,
                "ettr": {system: mean_ettr(outcomes[system]) for system in SYSTEMS},
            }
        rows.append(row)
    return rows


def assumptions(
    inputs: Mapping[str, Input], rows: Sequence[Mapping[str, Any]], seeds: Sequence[int]
) -> list[dict[str, Any]]:
    """Every input no source gives, with why it has its value and each system's ETTR with it
    halved, doubled (from the sensitivity table) and at zero (the loss it carries, all of it),
    largest rallypoint swing first. Empty without a sensitivity table."""
    if not seeds:
        return []
    base = {name: item.value for name, item in inputs.items()}
    by_input = {row["input"]: row for row in rows}
    entries = []
    for name, item in inputs.items():
        if item.kind != "assumption":
            continue
        zeroed = run_model({**base, name: 0.0}, seeds)
        row = by_input[name]
        entries.append(
            {
                "input": name,
                "value": item.value,
                "unit": item.unit,
                "reasoning": item.ref,
                "ettr_halved": row["halved"]["ettr"],
                "ettr_doubled": row["doubled"]["ettr"],
                "ettr_zeroed": {system: mean_ettr(zeroed[system]) for system in SYSTEMS},
                "rallypoint_swing": abs(
                    row["halved"]["ettr"]["rallypoint"] - row["doubled"]["ettr"]["rallypoint"]
                ),
            }
        )
    return sorted(entries, key=lambda entry: -entry["rallypoint_swing"])


def limits(summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """What rallypoint loses most to, in words, largest first, and the inputs that move its
    ETTR most."""
    lost = summary["lost_hours_by_kind"]
    total = sum(lost.values())
    lines = [
        f"{kind}: {hours:.1f} h ({hours / total:.0%} of rallypoint's loss)"
        for kind, hours in sorted(lost.items(), key=lambda item: -item[1])
        if hours > 0
    ]
    top = list(summary["lost_hours_by_cause"].items())[:4]
    lines.append("by cause: " + "; ".join(f"{cause} {hours:.1f} h" for cause, hours in top))
    # window_days is the interruption rate's inverse: it would only repeat that row.
    swings = sorted(
        (row for row in rows if row["input"] != "window_days"),
        key=lambda row: (
            -abs(row["halved"]["ettr"]["rallypoint"] - row["doubled"]["ettr"]["rallypoint"])
        ),
    )[:6]
    lines.append(
        "moved most by (halved -> doubled): "
        + "; ".join(
            f"{row['input']} ({row['kind']}) {row['halved']['ettr']['rallypoint']:.4f} -> "
            f"{row['doubled']['ettr']['rallypoint']:.4f}"
            for row in swings
        )
    )
    return lines


def build_document(args: argparse.Namespace) -> dict[str, Any]:
    inputs = build_inputs()
    values = {name: item.value for name, item in inputs.items()}
    seeds = list(range(args.seed, args.seed + args.replicates))
    outcomes = run_model(values, seeds)
    systems = {name: summarise(name, outcomes[name], values) for name in SYSTEMS}
    ettr = {name: systems[name]["ettr"] for name in SYSTEMS}
    sensitivity_seeds = seeds[: args.sensitivity_replicates]
    rows = sensitivity(inputs, sensitivity_seeds) if sensitivity_seeds else []
    sensitivity_base = run_model(values, sensitivity_seeds) if sensitivity_seeds else {}
    unexpected = sum(c.count for c in CAUSES if c.scope is not Scope.PLANNED)
    return {
        "benchmark": "effective training time (model)",
        "ettr": ettr,
        "model": {
            "what": "a seeded discrete-event simulation (bench/ettr_model.py): Poisson "
            "interruptions per root cause over the wall time, each answered by each system "
            "with a stall of every GPU, a restore tier (training since it is redone) and a "
            "degraded window (a fraction of the job missing while the rest trains)",
            "ettr": "productive time / wall time (Kokolis et al. 2024), mean over replicates",
            "simplifications": [
                "recoveries are serialised: an interruption during a stall begins its own "
                "recovery when that stall ends",
                "steady costs (checkpoint writes, snapshots, per-step costs) are fractions of "
                "training time; durable points fall every interval of training time",
                "spare hosts never run out (Llama 3 section 3.3.1: a 24K-GPU cluster, up to "
                "16K used for the job); a lost host's replacement is as fast for every system",
                "memory snapshots keep 2 copies on hosts that fail apart (their placement "
                "across network failure domains is assumed)",
                "the scale-growing costs (pg_init_s, job_relaunch_s, process_start_s) have no "
                "published value at 16k found: they are assumptions, listed with the others in "
                "'assumptions' (halved, doubled and at zero)",
                "torchft and rallypoint run the same job: a whole replica of the training state "
                "in each replica group (HSDP, or tensor parallel inside a unit replicated over "
                "data parallel), so a lost group costs neither a rollback (torchft heals it "
                "from a peer; rallypoint restores from the survivors' replicas at their step, "
                "source replicas, worker/replica_restore.py); the model assumes that fits, "
                "although Llama 3 sharded state to 1 MB-4 GB per GPU across data parallelism "
                "(section 3.3.1). Until this run the model gave rallypoint a job sharded over "
                "data parallel (every rank rolled back to the last memory snapshot) and "
                "torchft the replicated one; that figure is kept in 'variants'. No input's "
                "value changed; replica_restore_bytes_per_s (bench/results/replicas.json) is "
                "new",
                "rallypoint keeps its memory snapshots in host memory (snapshot_dir on a "
                "tmpfs, worker/snapshots/hostfiles.py): a job-wide fault is taken to kill the "
                "training processes and not their hosts (a fault that takes hosts down is "
                "host_lost here), and the relaunch to start them on the same hosts with the "
                "same worker names, which take up the last registered snapshot "
                "(host_memory_restore_bytes_per_s, measured after a crash of every rank). "
                "Until this run the model restarted rallypoint's job-wide faults from the "
                "disk checkpoint (0.9878); the sharded variant still does",
                "rallypoint's survivors wait while a spare host's newcomers receive their "
                "shards (the restore is part of the formation); torchft's train on while its "
                "replacement heals",
                "small-scale figures measured here (4 processes, gloo, 2 CPU cores) are used as "
                "they are: torchft's 5 s stall is its timeout at its defaults, not a cost "
                "measured at 16k",
            ],
        },
        "systems": systems,
        "variants": variants(values, seeds),
        "derived": derived(values),
        "inputs": {name: item.record() for name, item in inputs.items()},
        "sources": SOURCES,
        "interruptions": {
            "source": "llama3, section 3.3.4 and its table of root causes of unexpected "
            "interruptions",
            "total": sum(c.count for c in CAUSES),
            "planned": sum(c.count for c in CAUSES if c.scope is Scope.PLANNED),
            "unexpected": unexpected,
            "causes": [
                {
                    "cause": c.name,
                    "category": c.category,
                    "count": c.count,
                    "share_pct_as_printed": c.share_pct,
                    "takes_hosts_down": c.scope in (Scope.HOST, Scope.NETWORK),
                    "scope": c.scope.value,
                    "scope_basis": c.scope_basis,
                }
                for c in CAUSES
            ],
            "note": "the table prints Faulty GPU as 148 interruptions and 30.1%; 148 of 419 is "
            "35.3%. The counts sum to 419 and are what the model uses. The planned row's "
            "share is 47 of all 466, computed here.",
        },
        "sensitivity": {
            "replicates": len(sensitivity_seeds),
            "base_ettr": {name: mean_ettr(runs) for name, runs in sensitivity_base.items()},
            "rows": rows,
        },
        "assumptions": {
            "what": "the inputs no source gives (kind assumption), each with its reasoning and "
            "every system's ETTR with it halved, doubled and at zero, on the sensitivity seeds "
            "(base_ettr in sensitivity); largest rallypoint swing (halved to doubled) first",
            "rows": assumptions(inputs, rows, sensitivity_seeds),
        },
        "limits": limits(systems["rallypoint"], rows),
        "cross_check": {
            "published": "llama3 section 3.3.4: the team 'maintained more than 90% effective "
            "training time' over the snapshot (with its own, unpublished, checkpoint interval "
            "and restart cost)",
            "torchrun_ettr": ettr["torchrun"],
            "published_elsewhere": "byterobust: 97% ETTR measured over three months on 9,600 "
            "GPUs at ByteDance (its own fault mix and recovery; not this job)",
        },
        "targets": verdicts({"ettr.rallypoint": ettr["rallypoint"]}, TARGETS),
        "parameters": {
            "seed": args.seed,
            "replicates": args.replicates,
            "sensitivity_replicates": len(sensitivity_seeds),
            "hosts": values["gpus"] / values["gpus_per_host"],
        },
        "machine": machine_info(),
        "versions": package_versions(["rallypoint"]),
    }


def plot(document: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (ettr_axis, lost_axis, tornado) = plt.subplots(
        1, 3, figsize=(18, 6), gridspec_kw={"width_ratios": [1, 1, 1.4]}
    )
    systems = document["systems"]
    colors = {"torchrun": "tab:red", "torchft": "tab:orange", "rallypoint": "tab:green"}
    ettrs = [systems[name]["ettr"] for name in SYSTEMS]
    ettr_axis.bar(SYSTEMS, ettrs, color=[colors[name] for name in SYSTEMS])
    for index, value in enumerate(ettrs):
        ettr_axis.text(index, value, f"{value:.4f}", ha="center", va="bottom")
    ettr_axis.axhline(0.99, color="black", linestyle="--", linewidth=1, label="target 0.99")
    ettr_axis.set_ylim(min(ettrs) - 0.02, 1.0)
    ettr_axis.set_ylabel("ETTR (productive / wall time)")
    ettr_axis.set_title("16,384 GPUs, 54 days,\nLlama 3's 466 interruptions (mean)")
    ettr_axis.legend(loc="lower right")

    bottom = [0.0] * len(SYSTEMS)
    for kind in LOSS_KINDS:
        hours = [systems[name]["lost_hours_by_kind"][kind] for name in SYSTEMS]
        if any(hours):
            lost_axis.bar(SYSTEMS, hours, bottom=bottom, label=kind)
            bottom = [b + h for b, h in zip(bottom, hours, strict=True)]
    for index, total in enumerate(bottom):
        lost_axis.text(index, total, f"{total:.1f} h", ha="center", va="bottom")
    lost_axis.set_ylabel("hours of the whole job lost (mean)")
    lost_axis.set_title("time lost, by how")
    lost_axis.legend()

    base = document["sensitivity"]["base_ettr"]["rallypoint"]
    rows = sorted(
        (row for row in document["sensitivity"]["rows"] if row["input"] != "window_days"),
        key=lambda row: (
            -max(abs(row[label]["ettr"]["rallypoint"] - base) for label in ("halved", "doubled"))
        ),
    )[:12]
    # An input no source gives is starred: the bars it draws are a guess's reach.
    stars = [" *" if row["kind"] == "assumption" else "" for row in rows]
    names = [_short(row["input"]) + star for row, star in zip(rows, stars, strict=True)][::-1]
    for label, color in (("halved", "tab:blue"), ("doubled", "tab:purple")):
        deltas = [row[label]["ettr"]["rallypoint"] - base for row in rows][::-1]
        tornado.barh(names, deltas, color=color, alpha=0.7, label=label)
    tornado.axvline(0.0, color="black", linewidth=1)
    tornado.set_xlabel(f"rallypoint ETTR change from {base:.4f}")
    tornado.set_title(
        "rallypoint: the 12 inputs that move it most, halved and doubled\n(* an assumption)"
    )
    tornado.tick_params(axis="y", labelsize=8)
    tornado.legend()
    figure.tight_layout()
    figure.savefig(path)


def _short(name: str, width: int = 34) -> str:
    return name if len(name) <= width else name[: width - 3] + "...]"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", default="bench/results/ettr.json")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replicates", type=int, default=200, help="seeded 54-day runs")
    parser.add_argument(
        "--sensitivity-replicates",
        type=int,
        default=20,
        help="runs per sensitivity cell, the first seeds of --replicates (0: no table)",
    )
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    if args.replicates < 1:
        parser.error(f"--replicates must be at least 1, got {args.replicates}")
    if not 0 <= args.sensitivity_replicates <= args.replicates:
        parser.error("--sensitivity-replicates must be between 0 and --replicates")
    started = time.perf_counter()
    document = build_document(args)
    document["wall_time_s"] = time.perf_counter() - started
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print_targets(document["targets"], 20, 10)
    print("\nrallypoint's loss, largest first:\n  " + "\n  ".join(document["limits"]))
    write_results(out, document, None if args.no_plot else lambda path: plot(document, path))
    ettr = document["ettr"]
    print(
        "ettr at 16,384 GPUs over 54 days: "
        + ", ".join(f"{name} {ettr[name]:.4f}" for name in SYSTEMS)
        + f" (rallypoint target >= 0.99: {document['targets']['ettr.rallypoint']['verdict']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
