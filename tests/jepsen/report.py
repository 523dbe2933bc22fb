"""Reports: per run a Markdown page (verdicts, the anomaly's operations, the fault log) with
two plots (latency over time with fault windows shaded, throughput); across runs a summary
table. Everything goes under the run directory (store/jepsen/... by default)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from .availability import Window, percentile
from .checkers import CheckResult, Outcome, describe
from .history import Event, Operation, nemesis_windows


@dataclass
class RunSummary:
    name: str
    workloads: str
    nemesis: str
    nodes: int
    duration_s: float
    operations: int
    results: list[CheckResult] = field(default_factory=list)
    # A negative control expects a violation; None for ordinary runs.
    expected_violation: str | None = None
    report_path: Path | None = None
    error: str | None = None
    # Unavailability windows (availability.py), in time order.
    windows: list[Window] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return sum(r.outcome is Outcome.INVALID for r in self.results)

    @property
    def unknowns(self) -> int:
        return sum(r.outcome is Outcome.UNKNOWN for r in self.results)

    @property
    def caught(self) -> bool:
        """For a negative control: the expected checker found its violation."""
        return any(
            r.checker == self.expected_violation and r.outcome is Outcome.INVALID
            for r in self.results
        )


_INSTANTS = {"event", "round"}


def plot_run(
    events: Sequence[Event],
    ops: Sequence[Operation],
    directory: Path,
    unavailable: Sequence[Window] = (),
) -> list[str]:
    """latency.png and throughput.png; their file names."""
    if not events:
        return []
    origin = min(e.time_s for e in events)
    windows = nemesis_windows(events)
    names: list[str] = []

    def shade(axis: plt.Axes) -> None:
        for i, (_, start, stop) in enumerate(windows):
            axis.axvspan(
                start - origin,
                stop - origin,
                color="tab:red",
                alpha=0.15,
                label="fault" if i == 0 else None,
            )

    figure, axis = plt.subplots(figsize=(10, 4))
    shade(axis)
    for i, window in enumerate(unavailable):
        # A band along the top, so the faults' shading stays readable beneath.
        axis.axvspan(
            window.start_s - origin,
            window.end_s - origin,
            ymin=0.93,
            ymax=1.0,
            color="tab:orange",
            alpha=0.9,
            label="no write succeeded" if i == 0 else None,
        )
    # Watch deliveries and round views are recorded as instants, not calls: no latency.
    timed = sorted({op.f for op in ops} - _INSTANTS)
    palette = plt.get_cmap("tab10")
    for i, f in enumerate(timed):
        chosen = [op for op in ops if op.f == f and not op.unknown]
        if chosen:
            axis.scatter(
                [op.call_s - origin for op in chosen],
                [max(0.01, (op.return_s - op.call_s) * 1000) for op in chosen],
                s=4,
                label=f,
                color=palette(i % 10),
            )
    unknown = [op for op in ops if op.unknown]
    if unknown:
        axis.scatter(
            [op.call_s - origin for op in unknown],
            [3000.0] * len(unknown),
            marker="x",
            s=12,
            color="black",
            label="unknown outcome",
        )
    axis.set_yscale("log")
    axis.set_xlabel("time (s)")
    axis.set_ylabel("latency (ms)")
    axis.set_title("Operation latency; shaded: fault windows; orange band: no write succeeded")
    axis.legend(loc="upper right", fontsize=7, markerscale=2)
    figure.tight_layout()
    figure.savefig(directory / "latency.png", dpi=90)
    plt.close(figure)
    names.append("latency.png")

    end = max((op.return_s for op in ops if not op.unknown), default=origin + 1)
    buckets = max(1, math.ceil(end - origin))
    figure, axis = plt.subplots(figsize=(10, 3))
    shade(axis)
    for status, colour in (("ok", "tab:green"), ("info", "black")):
        counts = [0] * buckets
        for op in ops:
            if op.status == status and op.f not in _INSTANTS:
                at = op.return_s if status == "ok" else op.call_s
                counts[min(buckets - 1, int(at - origin))] += 1
        axis.plot(range(buckets), counts, color=colour, label=f"{status} per second")
    axis.set_xlabel("time (s)")
    axis.set_ylabel("operations / s")
    axis.set_title("Throughput")
    axis.legend(loc="upper right", fontsize=7)
    figure.tight_layout()
    figure.savefig(directory / "throughput.png", dpi=90)
    plt.close(figure)
    names.append("throughput.png")
    return names


def write_run_report(
    summary: RunSummary,
    events: Sequence[Event],
    nemesis_log: Sequence[str],
    plots: Sequence[str],
    directory: Path,
) -> Path:
    origin = min((e.time_s for e in events), default=0.0)
    lines = [
        f"# {summary.name}",
        "",
        f"- workloads: {summary.workloads}; nemesis: {summary.nemesis}; "
        f"{summary.nodes} members; {summary.duration_s:.0f} s; {summary.operations} operations",
    ]
    if summary.expected_violation:
        verdict = "caught" if summary.caught else "NOT caught"
        lines.append(
            f"- negative control (unsafe switch on): expects a {summary.expected_violation} "
            f"violation: {verdict}"
        )
    if summary.error:
        lines.append(f"- run error: {summary.error}")
    lines += ["", "| checker | verdict | summary | figures |", "|---|---|---|---|"]
    for result in summary.results:
        figures = ", ".join(f"{k} {v}" for k, v in result.stats.items())
        lines.append(
            f"| {result.checker} | {result.outcome.value} | {result.summary} | {figures} |"
        )
    for result in summary.results:
        if result.anomaly:
            lines += [
                "",
                f"## {result.checker}: the anomaly",
                "",
                "Times in seconds from the run's start; `?` = unknown outcome.",
                "",
                "```",
                *(describe(op, origin) for op in result.anomaly),
                "```",
            ]
    if summary.windows:
        lines += [
            "",
            "## Availability",
            "",
            "Windows in which no write succeeded (from the first write that failed, timed out",
            "or took over an election timeout, to the next acknowledged one), in seconds from",
            "the run's",
            "start; *majority* is the longest stretch of the window with a connected majority",
            "of voters up (judged against the bound).",
            "",
            "| start | length | majority | faults in effect |",
            "|---|---|---|---|",
        ]
        for window in summary.windows:
            length = f"{window.duration_s:.2f}" + (
                " (open at the end)" if window.open_at_end else ""
            )
            faults = "; ".join(window.faults) or "-"
            lines.append(
                f"| {window.start_s - origin:.2f} | {length} | {window.majority_s:.2f} | {faults} |"
            )
    lines += ["", "## Faults", "", "```", *nemesis_log, "```", ""]
    lines += [f"![{name}]({name})" for name in plots]
    path = directory / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_summary(runs: Sequence[RunSummary], path: Path) -> None:
    lines = [
        "# Fault-injection runs",
        "",
        "| run | workloads | nemesis | members | s | ops | verdicts | violations | "
        "unavailable p50 / p99 / max (s) | report |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        verdicts = ", ".join(f"{r.checker}: {r.outcome.value}" for r in run.results)
        if run.expected_violation:
            violations = f"control: {'caught' if run.caught else 'NOT caught'}"
        else:
            violations = str(run.violations)
        report = run.report_path.relative_to(path.parent) if run.report_path else "-"
        lines.append(
            f"| {run.name} | {run.workloads} | {run.nemesis} | {run.nodes} | "
            f"{run.duration_s:.0f} | {run.operations} | {verdicts} | {violations} | "
            f"{_window_figures([w.duration_s for w in run.windows])} | [report]({report}) |"
        )
    ordinary = [r for r in runs if not r.expected_violation]
    mixes = sorted({r.nemesis for r in ordinary})
    lines += [
        "",
        "## Availability per fault mix",
        "",
        "Every window in which no write succeeded, over all runs of the mix; *with a majority*",
        "counts only the part of each window when a connected majority of voters was up.",
        "",
        "| mix | runs | windows | p50 / p99 / max (s) | with a majority: p50 / p99 / max (s) |",
        "|---|---|---|---|---|",
    ]
    for mix in mixes:
        chosen = [r for r in ordinary if r.nemesis == mix]
        windows = [w for r in chosen for w in r.windows]
        lines.append(
            f"| {mix} | {len(chosen)} | {len(windows)} | "
            f"{_window_figures([w.duration_s for w in windows])} | "
            f"{_window_figures([w.majority_s for w in windows])} |"
        )
    lines += [
        "",
        f"{len(ordinary)} runs, {sum(r.violations for r in ordinary)} violations, "
        f"{sum(r.unknowns for r in ordinary)} unknown verdicts; negative controls caught: "
        f"{sum(r.caught for r in runs if r.expected_violation)} of "
        f"{sum(1 for r in runs if r.expected_violation)}",
    ]
    path.write_text("\n".join(lines) + "\n")


def _window_figures(durations: Sequence[float]) -> str:
    if not durations:
        return "-"
    return (
        f"{percentile(durations, 50):.2f} / {percentile(durations, 99):.2f} / {max(durations):.2f}"
    )
