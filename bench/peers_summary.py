"""The peers benchmark's summary (bench/peers_bench.py): medians and ranges per system over
its trials, the ratios its targets are read from, the diagnostic ratios, and the plot."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Event = dict[str, Any]
# cold_floor is no system: one cold process's imports, model and a step alone, the least any
# system's cold replacement can take to its first step (bench/peers_worker.py).
COLD_FLOOR = "cold_floor"
SYSTEMS = ("plain", "torchft_default", "torchft_hb1s", "rallypoint", "rallypoint_warm", COLD_FLOOR)
MIN_WORKERS = 3
# A replacement's way in, in order (bench/peers_worker.py's docstring says what each marks);
# connect and session are rallypoint's only.
REJOIN_PHASES: tuple[str, ...] = ("interpreter", "torch", "library", "model", "connect", "session")
REJOIN_PHASES += ("join", "round", "group", "restore", "first_step")


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Median, range and count of the values measured (None: not measured)."""
    kept = [float(v) for v in values if v is not None]
    if not kept:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(kept), "min": min(kept), "max": max(kept), "n": len(kept)}


def summarize(trials: Sequence[Event]) -> dict[str, Any]:
    by_system: dict[str, list[Event]] = {}
    for trial in trials:
        by_system.setdefault(trial["system"], []).append(trial)
    figures: dict[str, Any] = {
        "steady_step_s": {},
        "kill_stall_s": {},
        "kill_first_gap_s": {},
        "rejoin_first_step_s": {},
        "rejoin_parts_s": {},
        "rejoin_phases_s": {},
        "rejoin_after_torch_s": {},
        "rejoin_into_training_s": {},
        "survivors_training_at_spawn": {},
        "replacement_wait_s": {},
        "rejoin_stall_s": {},
        "steps_rolled_back": {},
        "rejoin_in_sync": {},
        "bit_identical": {},
        "trials_ok": {},
    }
    for system, runs in by_system.items():
        ok = [t for t in runs if t["ok"]]
        figures["trials_ok"][system] = f"{len(ok)}/{len(runs)}"
        if system != COLD_FLOOR:  # one process alone: no steady step, no world to agree
            figures["steady_step_s"][system] = spread([t["steady_step_s"] for t in ok])
            figures["bit_identical"][system] = bool(ok) and all(t["bit_identical"] for t in ok)
        if system == "plain":
            continue
        figures["rejoin_first_step_s"][system] = spread([t["rejoin_first_step_s"] for t in ok])
        figures["rejoin_phases_s"][system] = {
            name: spread([t["rejoin_phases_s"].get(name) for t in ok])
            for name in REJOIN_PHASES
            if any(name in t["rejoin_phases_s"] for t in ok)
        }
        # How long the replacement, runnable, waited for its CPU before it had made its model:
        # what processes the bench did not start took from it (none of the bench's ran there).
        figures["replacement_wait_s"][system] = spread(
            [t.get("replacement_placement", {}).get("replacement_wait_s") for t in ok]
        )
        if system == COLD_FLOOR:
            continue
        figures["kill_stall_s"][system] = spread([s for t in ok for s in t["kill_stall_s"]])
        figures["kill_first_gap_s"][system] = spread([s for t in ok for s in t["kill_first_gap_s"]])
        figures["rejoin_parts_s"][system] = {
            part: spread([t["rejoin_parts_s"][part] for t in ok])
            for part in ("start_to_imported", "imported_to_joined", "joined_to_first_step")
        }
        figures["rejoin_after_torch_s"][system] = spread([t["rejoin_after_torch_s"] for t in ok])
        # Only the trials whose every survivor had trained again when the replacement
        # started: it joined a world that was training, not one still stalled by the kill.
        resumed = [t for t in ok if t["survivors_training_at_spawn"] == MIN_WORKERS]
        figures["rejoin_into_training_s"][system] = spread(
            [t["rejoin_first_step_s"] for t in resumed]
        )
        figures["survivors_training_at_spawn"][system] = spread(
            [t["survivors_training_at_spawn"] for t in ok]
        )
        figures["rejoin_stall_s"][system] = spread([t.get("rejoin_stall_s") for t in ok])
        figures["steps_rolled_back"][system] = spread([t["steps_rolled_back"] for t in ok])
        synced = sum(bool(t["rejoin_in_sync"]) for t in ok)
        figures["rejoin_in_sync"][system] = f"{synced}/{len(ok)}"
    # What each system's cold replacement takes beyond the cold floor (medians): its own part
    # (the warm restart's starts at a fork, past most of the floor: not comparable).
    floor = figures["rejoin_first_step_s"].get(COLD_FLOOR, {}).get("median")
    figures["rejoin_above_cold_floor_s"] = {
        system: entry["median"] - floor
        for system, entry in figures["rejoin_first_step_s"].items()
        if system not in (COLD_FLOOR, "rallypoint_warm")
        and floor is not None
        and entry["median"] is not None
    }
    return figures


def ratio(top: dict[str, Any], field: str, ours: str, theirs: str) -> float | None:
    mine, other = top[field].get(ours, {}), top[field].get(theirs, {})
    if mine.get("median") is None or not other.get("median"):
        return None
    return float(mine["median"]) / float(other["median"])


def ratios(top: dict[str, Any]) -> dict[str, float | None]:
    return {
        "overhead_vs_plain": ratio(top, "steady_step_s", "rallypoint", "plain"),
        # Against torchft at a 1 s heartbeat timeout, its fastest setting measured here.
        "kill_stall_vs_torchft": ratio(top, "kill_stall_s", "rallypoint", "torchft_hb1s"),
        "rejoin_vs_torchft": ratio(top, "rejoin_first_step_s", "rallypoint", "torchft_hb1s"),
    }


def diagnostic_ratios(top: dict[str, Any]) -> dict[str, float | None]:
    """Not targets: where the rejoin ratio comes from. The replacement's time after its
    `import torch` (identical code in both systems, and the part load moves most), and the
    rejoin into a world that was training again (``rejoin_into_training_s``: torchft's
    survivors often still wait out gloo's timeout 2 s after the kill, and a replacement
    that starts then waits with them, which the target's median counts; None when no
    torchft trial drew the other case). And the warm restart's rejoin
    (``rallypoint_warm``: the killed process a warm launcher's child, its replacement the
    launcher's fork, timed from the fork; worker/warm.py) against torchft's cold one: it
    skips the interpreter and the imports a cold process pays, so it is no target's figure
    (``rejoin_vs_torchft`` stays the cold rejoin); None when either did not run. And the cold
    floor (``cold_floor``: one process's imports, model and a step alone, no system) against
    torchft's replacement: what no cold replacement can go below."""
    found = {
        f"{field[:-2]}_vs_torchft": ratio(top, field, "rallypoint", "torchft_hb1s")
        for field in ("rejoin_after_torch_s", "rejoin_into_training_s")
    }
    found["rejoin_warm_vs_torchft"] = ratio(
        top, "rejoin_first_step_s", "rallypoint_warm", "torchft_hb1s"
    )
    # The cold floor against torchft's replacement, all its trials and those into a world
    # training again: at or above the target's 0.8, no cold replacement of any system meets
    # `rejoin_vs_torchft` in this run, however little its coordination takes.
    found["cold_floor_vs_torchft"] = ratio(top, "rejoin_first_step_s", COLD_FLOOR, "torchft_hb1s")
    floor = top["rejoin_first_step_s"].get(COLD_FLOOR, {}).get("median")
    theirs = top["rejoin_into_training_s"].get("torchft_hb1s", {}).get("median")
    found["cold_floor_vs_torchft_into_training"] = floor / theirs if floor and theirs else None
    return found


def plot(top: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(14, 4.8))
    colors = {
        "plain": "tab:gray",
        "torchft_default": "tab:red",
        "torchft_hb1s": "tab:orange",
        "rallypoint": "tab:green",
        "rallypoint_warm": "tab:olive",
    }

    def bars(axis: Any, field: str, systems: Sequence[str], offset: float, width: float) -> None:
        for position, system in enumerate(systems):
            entry = top[field].get(system) or {}
            if entry.get("median") is None:
                continue
            low, high = entry["median"] - entry["min"], entry["max"] - entry["median"]
            axis.bar(
                position + offset,
                entry["median"],
                width,
                yerr=[[low], [high]],
                capsize=3,
                color=colors[system],
                alpha=1.0 if offset <= 0 else 0.55,
            )

    shown = [s for s in SYSTEMS if s in top["steady_step_s"]]
    bars(left, "steady_step_s", shown, 0.0, 0.6)
    left.set_xticks(range(len(shown)), shown)
    left.set_ylabel("seconds per step (median, range)")
    left.set_title("steady step: 4 processes, 1.3 M-parameter MLP, gloo")
    elastic = [s for s in SYSTEMS if s != "plain" and s in top["kill_stall_s"]]
    bars(right, "kill_stall_s", elastic, -0.2, 0.4)
    bars(right, "rejoin_first_step_s", elastic, 0.2, 0.4)
    floor = (top["rejoin_first_step_s"].get(COLD_FLOOR) or {}).get("median")
    if floor is not None:
        right.axhline(floor, color="black", linestyle="--", linewidth=1)
        right.annotate(
            "cold floor: imports, model, a step alone (no system)",
            (len(elastic) - 0.5, floor),
            ha="right",
            va="bottom",
            fontsize=8,
        )
    right.set_xticks(range(len(elastic)), elastic)
    right.set_ylabel("seconds (median, range)")
    right.set_title("SIGKILL: survivors' stall (solid), replacement start -> first step (light)")
    figure.tight_layout()
    figure.savefig(path)
