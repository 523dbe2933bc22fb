"""Failover benchmark: how long writes stop when the leader fails, rallypoint against etcd.

One run starts a 3-member rallypoint cluster (``python -m rallypoint.coordinator serve``
members started by tests/integration/harness.py's ProcessCluster) and a 3-member etcd cluster
(bench/etcd/cluster.py), both on 127.0.0.1 with each system's default timing: rallypoint ticks
of 100 ms and an election timeout of 10 ticks (randomised up to 2x), pre-vote and
check-quorum on; etcd 3.4's defaults, heartbeat 100 ms and election 1000 ms (pre-vote off).
Members log at their default level (INFO for both), so elections are in their logs.

Scenarios, each trial on a settled cluster (every member up, agreeing on a leader, caught up):

    leader_kill         kill -9 of the leader -> first successful write after it
    restart_then_kill   kill -9 of the leader, down ~3 s while writes go on, restarted, caught
                        up and following the new leader; then kill -9 of the new leader ->
                        first successful write after that second kill
    leader_pause        SIGSTOP of the leader for 5 s, then SIGCONT -> first successful write
                        after the SIGSTOP

Trials alternate between the systems (the order flips every trial), so drift in this shared
machine's load hits both; a trial's killed member is restarted and the cluster settles before
the other system's trial, so one system's restart never loads the other's measurement.

The probe (bench/failover_probe.py). One writer per system, the same code for both, speaking
each system's own gRPC API with grpc.aio (rallypoint's generated stubs, ``KV.Put`` with a
session header; etcd's ``KV.Put`` from bench/etcd/api.py), one channel per member (fast
reconnect, gRPC retries off, as rallypoint's client library sets them). It starts a put every
20 ms whether or not the earlier ones have ended, each with a 0.4 s deadline, to the members in
turn (as etcd's clientv3 balances unary calls round-robin). Both systems' followers forward
writes to the leader through Raft, so any live member serves a put once there is a leader
again. A trial's figure is from the fault (monotonic clock, read just before the signal) to
the answer of the first acknowledged put that started after it; its resolution is about 40 ms
(two live members in three turns of 20 ms).

Why raw stubs and not rallypoint.client.Client: the probe must be the same on both sides, and
etcd has no Python client of the library's design (leader tracking, one call at a time with
full-jitter backoff from 50 ms, session-stamped retries). With raw stubs the writer's policy is
the same line for line, so the difference measured is the servers' (election timing and how
soon a new leader commits), and the library's backoff sleeps are not added to rallypoint's
figure alone.

Output: JSON with the machine, versions, where things ran, parameters,
``results.<system>.<scenario>`` (``p50_s``, ``p99_s``, ``max_s``, ``trials`` in seconds, and
``details`` per trial: when the fault was, which member failed, the failed puts by status code,
and ``leader_elected_after_s``, read from the members' logs after the run, which splits a
figure into the election and what follows it), the ratios rallypoint / etcd and the targets; a
plot beside it (.png); the figures and PASS/MISS on stdout.

    python -m bench.failover_bench --out bench/results/failover.json
    python -m bench.failover_bench --smoke --out /tmp/failover.json   # rallypoint only, ~30 s
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from bench.common import (
    command_version,
    machine_info,
    package_versions,
    percentile,
    write_results,
)
from bench.failover_members import (
    RALLYPOINT_ELECTION_TICKS,
    RALLYPOINT_TICK_MS,
    Members,
    agreed_leader,
    caught_up,
    make_members,
    settle,
    wait_for,
)
from bench.failover_probe import (
    Attempt,
    EtcdPutter,
    Putter,
    RallypointPutter,
    Writer,
    running_writer,
)
from rallypoint.worker.process_tree import run_reaped

SCENARIOS = ("leader_kill", "restart_then_kill", "leader_pause")
PROBE_KEY = b"failover-bench/probe"
# name -> (scenario, figure); ratio = rallypoint / etcd, target <= 1.0 for each.
RATIOS: dict[str, tuple[str, str]] = {
    "leader_kill_p50": ("leader_kill", "p50_s"),
    "leader_kill_p99": ("leader_kill", "p99_s"),
    "restart_then_kill_max": ("restart_then_kill", "max_s"),
    "leader_pause_p50": ("leader_pause", "p50_s"),
}
RATIO_TARGET = 1.0
RESTART_THEN_KILL_MAX_TARGET_S = 3.0


# --- the scenarios ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    interval_s: float
    attempt_timeout_s: float
    give_up_s: float
    down_s: float
    pause_s: float
    settle_timeout_s: float
    quiet_s: float
    timelines: bool

    def writer(
        self, putter: Putter, members: Members
    ) -> contextlib.AbstractAsyncContextManager[Writer]:
        return running_writer(putter, members.endpoints, self.interval_s, self.attempt_timeout_s)


def wall_clock_s(monotonic_s: float) -> float:
    """A monotonic reading as wall-clock seconds since the epoch, to compare with the members'
    logs, which are stamped with the wall clock."""
    return time.time() - (time.monotonic() - monotonic_s)


def clock_text(wall_s: float) -> str:
    return datetime.datetime.fromtimestamp(wall_s).strftime("%H:%M:%S.%f")[:-3]


def outcome(
    writer: Writer, fault_s: float, acknowledged: Attempt | None, settings: Settings
) -> dict[str, Any]:
    """A trial's figure (fault -> first acknowledged put that started after it) and what the
    writer saw in between; an unrecovered trial counts as give_up_s."""
    end_s = acknowledged.ended_s if acknowledged is not None else fault_s + settings.give_up_s
    fault_wall_s = wall_clock_s(fault_s)
    found: dict[str, Any] = {
        "seconds": end_s - fault_s,
        "recovered": acknowledged is not None,
        "fault_wall_s": fault_wall_s,
        "fault_at": clock_text(fault_wall_s),
        "answered_by": (
            writer.endpoints.index(acknowledged.address) + 1 if acknowledged is not None else None
        ),
        "failed_puts": writer.failures_between(fault_s, end_s),
    }
    if settings.timelines:
        # From just before the fault: [start (s after the fault), duration, member, outcome].
        found["puts"] = writer.timeline(fault_s - 0.1, end_s, fault_s)
    return found


async def leader_kill(members: Members, putter: Putter, settings: Settings) -> dict[str, Any]:
    leader = await settle(members, settings.settle_timeout_s)
    async with settings.writer(putter, members) as writer:
        await writer.warm()
        fault_s = time.monotonic()
        members.kill(leader)
        acknowledged = await writer.wait_acknowledged_after(fault_s, settings.give_up_s)
    members.start(leader)
    return {"killed": leader + 1, **outcome(writer, fault_s, acknowledged, settings)}


async def restart_then_kill(members: Members, putter: Putter, settings: Settings) -> dict[str, Any]:
    first = await settle(members, settings.settle_timeout_s)
    others = [i for i in range(len(members.endpoints)) if i != first]
    async with settings.writer(putter, members) as writer:
        await writer.warm()
        first_fault_s = time.monotonic()
        members.kill(first)
        first_ack = await writer.wait_acknowledged_after(first_fault_s, settings.give_up_s)
        # Down for down_s in all, writes going on.
        await asyncio.sleep(max(0.0, first_fault_s + settings.down_s - time.monotonic()))
        restarted_s = time.monotonic()
        members.start(first)
        second = await wait_for(
            lambda: agreed_leader(members, others),
            settings.settle_timeout_s,
            f"{members.name}: the survivors' leader",
        )
        await wait_for(
            lambda: caught_up(members, first, second),
            settings.settle_timeout_s,
            f"{members.name}: member {first + 1} to catch up with member {second + 1}",
        )
        caught_up_s = time.monotonic()
        await writer.warm()
        fault_s = time.monotonic()
        members.kill(second)
        acknowledged = await writer.wait_acknowledged_after(fault_s, settings.give_up_s)
    members.start(second)
    return {
        "killed_first": first + 1,
        "killed_second": second + 1,
        "first_kill_at": clock_text(wall_clock_s(first_fault_s)),
        "first_kill_s": first_ack.ended_s - first_fault_s if first_ack is not None else None,
        "restarted_at": clock_text(wall_clock_s(restarted_s)),
        "restart_to_caught_up_s": caught_up_s - restarted_s,
        **outcome(writer, fault_s, acknowledged, settings),
    }


async def leader_pause(members: Members, putter: Putter, settings: Settings) -> dict[str, Any]:
    leader = await settle(members, settings.settle_timeout_s)
    async with settings.writer(putter, members) as writer:
        await writer.warm()
        fault_s = time.monotonic()
        members.pause(leader)
        try:
            acknowledged = await writer.wait_acknowledged_after(fault_s, settings.give_up_s)
            await asyncio.sleep(max(0.0, fault_s + settings.pause_s - time.monotonic()))
        finally:
            members.resume(leader)
    return {"paused": leader + 1, **outcome(writer, fault_s, acknowledged, settings)}


Scenario = Callable[[Members, Putter, Settings], Awaitable[dict[str, Any]]]
SCENARIO_FUNCTIONS: dict[str, Scenario] = {
    "leader_kill": leader_kill,
    "restart_then_kill": restart_then_kill,
    "leader_pause": leader_pause,
}


# --- the run -----------------------------------------------------------------------------------


def summarize(details: list[dict[str, Any]]) -> dict[str, Any]:
    """Percentiles of the trials' figures, and the medians of their two parts: until a member
    logged that it became leader, and from then to the first acknowledged put."""
    seconds = [d["seconds"] for d in details]
    ordered = sorted(seconds)
    elected = [d for d in details if d.get("leader_elected_after_s") is not None]
    return {
        "p50_s": percentile(ordered, 0.50),
        "p99_s": percentile(ordered, 0.99),
        "max_s": ordered[-1] if ordered else math.nan,
        "unrecovered": sum(1 for d in details if not d["recovered"]),
        "election_p50_s": median([d["leader_elected_after_s"] for d in elected]),
        "after_election_p50_s": median(
            [d["seconds"] - d["leader_elected_after_s"] for d in elected]
        ),
        "trials": seconds,
        "details": details,
    }


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, (scenario, figure) in RATIOS.items():
        try:
            ours = results["rallypoint"][scenario][figure]
            theirs = results["etcd"][scenario][figure]
        except KeyError:
            out[name] = None
            continue
        ok = theirs and math.isfinite(theirs) and math.isfinite(ours)
        out[name] = ours / theirs if ok else None
    return out


def verdict(value: float | None, target: float) -> str:
    if value is None or not math.isfinite(value):
        return "not measured"
    return "PASS" if value <= target else "MISS"


def targets(
    results: dict[str, dict[str, Any]], measured: dict[str, float | None]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        name: {"value": measured[name], "direction": "<=", "target": RATIO_TARGET}
        for name in RATIOS
    }
    restart_max = results.get("rallypoint", {}).get("restart_then_kill", {}).get("max_s")
    out["rallypoint_restart_then_kill_max_s"] = {
        "value": restart_max,
        "direction": "<=",
        "target": RESTART_THEN_KILL_MAX_TARGET_S,
    }
    for entry in out.values():
        entry["verdict"] = verdict(entry["value"], entry["target"])
    return out


def print_report(results: dict[str, dict[str, Any]], checks: dict[str, Any], measured: Run) -> None:
    print(
        f"\n{'system':<11}{'scenario':<19}{'trials':>7}{'p50 s':>8}{'p99 s':>8}{'max s':>8}"
        f"{'elected p50':>13}{'then p50':>10}"
    )
    for system, per_scenario in results.items():
        for scenario, s in per_scenario.items():
            print(
                f"{system:<11}{scenario:<19}{len(s['trials']):>7}{s['p50_s']:>8.2f}"
                f"{s['p99_s']:>8.2f}{s['max_s']:>8.2f}"
                f"{s['election_p50_s']:>13.3f}{s['after_election_p50_s']:>10.3f}"
                + (f"  ({s['unrecovered']} never recovered)" if s["unrecovered"] else "")
            )
    print("\ntargets:")
    for name, check in checks.items():
        value = check["value"]
        shown = "-" if value is None else f"{value:.2f}"
        print(f"  {name:<36}{shown:>7}  <= {check['target']:<5} {check['verdict']}")
    for error in measured.errors:
        print(f"trial failed part way: {error}")
    if measured.aborted:
        print(f"run aborted: {measured.aborted}")


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(results)
    figure, axes = plt.subplots(1, len(SCENARIOS), figsize=(15, 4.8))
    titles = {
        "leader_kill": "kill -9 of the leader",
        "restart_then_kill": "leader killed, restarted, caught up;\nthen the new leader killed",
        "leader_pause": "SIGSTOP of the leader (5 s)",
    }
    jitter = random.Random(0)
    for axis, scenario in zip(axes, SCENARIOS, strict=True):
        for position, system in enumerate(systems):
            summary = results[system].get(scenario)
            if summary is None:
                continue
            trials = summary["trials"]
            xs = [position + jitter.uniform(-0.15, 0.15) for _ in trials]
            axis.scatter(xs, trials, s=14, alpha=0.7, label=system, color=f"C{position}")
            axis.hlines(summary["p50_s"], position - 0.3, position + 0.3, color="black", lw=2)
            axis.annotate(
                f"p50 {summary['p50_s']:.2f} s\nmax {summary['max_s']:.2f} s",
                (position + 0.32, summary["p50_s"]),
                fontsize=8,
                va="center",
            )
        axis.set_xticks(range(len(systems)), systems)
        axis.set_xlim(-0.6, len(systems) - 0.1)
        axis.set_ylim(bottom=0)
        axis.set_ylabel("seconds, fault -> first acknowledged put")
        axis.set_title(titles[scenario], fontsize=10)
        axis.grid(axis="y", alpha=0.3)
    figure.suptitle(
        "Failover: 3 members on loopback, default timing (rallypoint tick 100 ms x 10; "
        "etcd heartbeat 100 ms, election 1000 ms); bar = median"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/failover.json")
    parser.add_argument("--systems", default="rallypoint,etcd", help="comma-separated")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated")
    parser.add_argument("--kill-trials", type=int, default=20)
    parser.add_argument("--restart-trials", type=int, default=10)
    parser.add_argument("--pause-min-trials", type=int, default=5)
    parser.add_argument("--pause-max-trials", type=int, default=20)
    parser.add_argument(
        "--pause-budget-s",
        type=float,
        default=180.0,
        help="leader_pause trials go on (past the minimum, up to the maximum) while the "
        "scenario has run for less than this",
    )
    parser.add_argument("--interval-s", type=float, default=0.02, help="between puts")
    parser.add_argument("--attempt-timeout-s", type=float, default=0.4, help="per put")
    parser.add_argument("--give-up-s", type=float, default=30.0, help="a trial's bound")
    parser.add_argument("--down-s", type=float, default=3.0, help="restart_then_kill downtime")
    parser.add_argument("--pause-s", type=float, default=5.0, help="leader_pause SIGSTOP time")
    parser.add_argument("--settle-timeout-s", type=float, default=60.0)
    parser.add_argument(
        "--quiet-s", type=float, default=0.5, help="idle time after a cluster settles"
    )
    parser.add_argument("--data-dir", help="parent of the members' data and logs (kept)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="rallypoint only (unless --systems is given), 2 short trials per scenario",
    )
    parser.add_argument(
        "--timelines", action="store_true", help="keep every put of every trial in the JSON"
    )
    parser.add_argument("--no-plot", action="store_true")
    return parser


def apply_smoke(args: argparse.Namespace, argv: Sequence[str]) -> None:
    if not any(a.startswith("--systems") for a in argv):
        args.systems = "rallypoint"
    args.kill_trials = args.restart_trials = 2
    args.pause_min_trials = args.pause_max_trials = 2
    args.down_s, args.pause_s, args.quiet_s = 1.0, 1.5, 0.2


def trial_counts(args: argparse.Namespace) -> dict[str, int]:
    return {
        "leader_kill": args.kill_trials,
        "restart_then_kill": args.restart_trials,
        "leader_pause": args.pause_max_trials,
    }


async def restore(members: Members, settings: Settings) -> None:
    """After a trial that failed part way: every member running again, the cluster settled."""
    for member in range(len(members.endpoints)):
        if not members.running(member):
            members.start(member)
        else:
            members.resume(member)  # a no-op unless it was left paused
    await settle(members, settings.settle_timeout_s)


@dataclass(slots=True)
class Run:
    """What the run measured: per system and scenario the trials' details, and the trials
    that failed part way (a cluster that did not settle, a writer that never warmed up)."""

    details: dict[str, dict[str, list[dict[str, Any]]]]
    errors: list[dict[str, Any]]
    load: dict[str, Any]
    aborted: str | None = None


async def run(args: argparse.Namespace, systems: dict[str, Members], measured: Run) -> None:
    settings = Settings(
        interval_s=args.interval_s,
        attempt_timeout_s=args.attempt_timeout_s,
        give_up_s=args.give_up_s,
        down_s=args.down_s,
        pause_s=args.pause_s,
        settle_timeout_s=args.settle_timeout_s,
        quiet_s=args.quiet_s,
        timelines=args.timelines,
    )
    putters: dict[str, Putter] = {}
    measured.load["loadavg_at_start"] = os.getloadavg()
    try:
        for members in systems.values():
            members.start_all()
        for name, members in systems.items():
            leader = await settle(members, settings.settle_timeout_s)
            if name == "rallypoint":
                session_putter = RallypointPutter(PROBE_KEY)
                await session_putter.open_session(members.endpoints[leader])
                putters[name] = session_putter
            else:
                putters[name] = EtcdPutter(PROBE_KEY)
        for scenario in args.scenarios.split(","):
            function = SCENARIO_FUNCTIONS[scenario]
            started = time.monotonic()
            for trial in range(trial_counts(args)[scenario]):
                if (
                    scenario == "leader_pause"
                    and trial >= args.pause_min_trials
                    and time.monotonic() - started >= args.pause_budget_s
                ):
                    break
                order = list(systems) if trial % 2 == 0 else list(reversed(systems))
                for name in order:
                    members = systems[name]
                    try:
                        result = await function(members, putters[name], settings)
                        result["loadavg_1m"] = os.getloadavg()[0]
                        # Leave the cluster as the next trial (of either system) expects it.
                        await settle(members, settings.settle_timeout_s)
                    except (TimeoutError, RuntimeError) as exc:
                        error = f"{type(exc).__name__}: {exc}"
                        print(f"{scenario} trial {trial + 1} {name}: {error}", flush=True)
                        measured.errors.append(
                            {
                                "system": name,
                                "scenario": scenario,
                                "trial": trial + 1,
                                "error": error,
                            }
                        )
                        await restore(members, settings)
                        continue
                    await asyncio.sleep(settings.quiet_s)
                    measured.details[name].setdefault(scenario, []).append(result)
                    print(
                        f"{scenario:<18} trial {trial + 1:>2} {name:<10} "
                        f"{result['seconds']:6.2f} s  failed puts {result['failed_puts']}",
                        flush=True,
                    )
    except (TimeoutError, RuntimeError) as exc:
        # A cluster that cannot be brought back: report what was measured before it.
        measured.aborted = f"{type(exc).__name__}: {exc}"
        print(f"run aborted: {measured.aborted}", flush=True)
    finally:
        measured.load["loadavg_at_end"] = os.getloadavg()
        for putter in putters.values():
            await putter.close()
        for members in systems.values():
            await members.close_channels()


def note_elections(details: dict[str, list[dict[str, Any]]], elected_at: list[float]) -> None:
    """Add to each trial when, after its fault, a member first logged that it became leader:
    what of the figure is the election, and what the new leader's first commit and the probe."""
    for trials in details.values():
        for trial in trials:
            fault_s = trial["fault_wall_s"]
            after = [t - fault_s for t in elected_at if fault_s <= t <= fault_s + trial["seconds"]]
            trial["leader_elected_after_s"] = round(after[0], 3) if after else None


def rallypoint_source() -> dict[str, str]:
    """Where the members' code came from: the import package's folder and its git commit."""
    import rallypoint.coordinator as coordinator

    folder = Path(coordinator.__file__).resolve().parent.parent
    done = subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return {"rallypoint_source": str(folder), "rallypoint_commit": done.stdout.strip()}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.smoke:
        apply_smoke(args, argv)
    names = args.systems.split(",")
    for scenario in args.scenarios.split(","):
        if scenario not in SCENARIO_FUNCTIONS:
            raise SystemExit(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
    started = time.perf_counter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="failover-bench-") if temporary else args.data_dir)

    systems: dict[str, Members] = {}
    measured = Run(details={name: {} for name in names}, errors=[], load={})
    try:
        for name in names:
            systems[name] = make_members(name, data_dir)
        uvloop.run(run(args, systems, measured))
        for name, members in systems.items():
            note_elections(measured.details[name], members.leader_elected_at())
    finally:
        for members in systems.values():
            members.stop()
        if temporary:
            shutil.rmtree(data_dir, ignore_errors=True)
    results = {
        name: {scenario: summarize(trials) for scenario, trials in per.items()}
        for name, per in measured.details.items()
    }
    figures = ratios(results)
    checks = targets(results, figures)
    versions = package_versions(["rallypoint", "grpcio", "protobuf", "uvloop"])
    versions.update(rallypoint_source())
    if "etcd" in names:
        versions["etcd"] = command_version(["etcd", "--version"])
    document = {
        "benchmark": "failover",
        "machine": machine_info(),
        "versions": versions,
        "where": (
            f"one machine ({os.cpu_count()} cores), everything on 127.0.0.1: the "
            f"{' and '.join(f'3 {n} members' for n in names)} and this load generator (one "
            "process on uvloop, the writer and the status polls) share it; both clusters run "
            "for the whole run, the one not measured idle (its trial finished, its killed "
            "member restarted and caught up, before the other's begins)"
        ),
        "load": measured.load,
        "parameters": {
            "systems": names,
            "members": 3,
            "scenarios": args.scenarios.split(","),
            "trials": trial_counts(args),
            "pause_min_trials": args.pause_min_trials,
            "pause_budget_s": args.pause_budget_s,
            "interval_s": args.interval_s,
            "attempt_timeout_s": args.attempt_timeout_s,
            "give_up_s": args.give_up_s,
            "down_s": args.down_s,
            "pause_s": args.pause_s,
            "quiet_s": args.quiet_s,
            "rallypoint_timing": {
                "tick_ms": RALLYPOINT_TICK_MS,
                "election_ticks": RALLYPOINT_ELECTION_TICKS,
                "heartbeat_ticks": 1,
                "pre_vote": True,
                "check_quorum": True,
            },
            "etcd_timing": {
                "heartbeat_interval_ms": 100,
                "election_timeout_ms": 1000,
                "pre_vote": False,
            },
            "probe": (
                "one grpc.aio writer per system, raw stubs of each system's KV.Put, one channel "
                "per member; a put started every interval_s (overlapping) with an "
                "attempt_timeout_s deadline, to the members in turn; figure: fault -> answer "
                "of the first acknowledged put started after the fault"
            ),
            "smoke": args.smoke,
        },
        "results": results,
        "ratios": figures,
        "targets": checks,
        "errors": measured.errors,
        "aborted": measured.aborted,
        "wall_time_s": time.perf_counter() - started,
    }
    print_report(results, checks, measured)
    write_results(out, document, None if args.no_plot else lambda path: plot(results, path))
    return 1 if measured.aborted else 0


if __name__ == "__main__":
    sys.exit(run_reaped(main))
