"""Running seeds: one at a time, many across processes, and shrinking a failing one.

A seed's run is a pure function of (seed, fault phase length, disabled faults, disabled
operation kinds), so a violation found in a worker process replays identically in the parent.
Shrinking keeps the violated invariant fixed and greedily disables, one at a time, whole
operation kinds and then single faults, keeping each removal that still breaks the same
invariant; the fewer faults remain, the shorter the trace to read.
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.pool
import os
import sys
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .checker import Violation
from .schedule import TICK, OpKind, Profile, params_for_seed
from .simulation import Options, RunStats, Simulation

#: The length of the fault phase, in ticks, unless told otherwise. With the rates in
#: schedule.py a seed runs about 3,000-6,000 events (~0.1-0.2 s of CPU).
DEFAULT_FAULT_TICKS = 120

#: Lines of the shrunk run's trace printed with a violation (--trace prints all of it).
TRACE_TAIL = 80

#: Before that tail, the trace lines that tell the story: faults, leaders, crashes, restarts.
KEY_EVENTS = (
    "fault #",
    "heal",
    "became leader",
    "crash",
    "kill leader",
    "restart",
    "snapshot at",
    "empty disk",
)
KEY_EVENTS_SHOWN = 60


@dataclass(frozen=True, slots=True)
class Replay:
    """What identifies one run exactly."""

    seed: int
    fault_ticks: int = DEFAULT_FAULT_TICKS
    disabled_faults: frozenset[int] = frozenset()
    disabled_ops: frozenset[OpKind] = frozenset()
    profile: Profile | None = None  # None: the seed draws its own

    def command(self) -> str:
        parts = [f"python -m tests.sim --seed {self.seed}"]
        if self.profile is not None:
            parts.append(f"--profile {self.profile.value}")
        if self.fault_ticks != DEFAULT_FAULT_TICKS:
            parts.append(f"--fault-ticks {self.fault_ticks}")
        if self.disabled_faults:
            parts.append("--disable-faults " + ",".join(map(str, sorted(self.disabled_faults))))
        if self.disabled_ops:
            parts.append("--disable-ops " + ",".join(sorted(k.value for k in self.disabled_ops)))
        return " ".join(parts) + " --trace"


@dataclass(slots=True)
class Outcome:
    replay: Replay
    invariant: str | None  # None: no violation
    detail: str = ""
    stats: RunStats = field(default_factory=RunStats)
    trace: list[str] = field(default_factory=list)
    fault_lines: list[str] = field(default_factory=list)  # the faults enabled in the run


def run(replay: Replay, trace: bool = False) -> Outcome:
    """Run one seed; a Violation, or any exception out of the core, is the outcome."""
    params = params_for_seed(replay.seed, replay.fault_ticks, replay.profile)
    sink: list[str] = []
    sim = Simulation(
        params,
        Options(replay.disabled_faults, replay.disabled_ops, trace=trace, trace_sink=sink),
    )
    faults = [f.describe() for f in params.faults if f.number not in replay.disabled_faults]
    try:
        stats = sim.run()
    except Violation as v:
        return Outcome(replay, v.invariant, v.detail, sim.final_stats(), sink, faults)
    except Exception as exc:  # a broken invariant inside the core, or a crash of the core
        sim.final_stats()
        where = traceback.extract_tb(exc.__traceback__)[-1]
        detail = f"{exc!r} at {where.filename}:{where.lineno} ({where.name})"
        return Outcome(replay, f"exception {type(exc).__name__}", detail, sim.stats, sink, faults)
    return Outcome(replay, None, "", stats, sink, faults)


def shrink(found: Outcome) -> Outcome:
    """A replay of the same seed with fewer operation kinds and faults, same invariant."""
    assert found.invariant is not None
    best = found
    replay = found.replay

    def attempt(candidate: Replay) -> bool:
        nonlocal best
        outcome = run(candidate)
        if outcome.invariant == found.invariant:
            best = outcome
            return True
        return False

    for kind in OpKind:
        if kind is OpKind.PROPOSE or kind in replay.disabled_ops:
            continue
        candidate = replace(replay, disabled_ops=replay.disabled_ops | {kind})
        if attempt(candidate):
            replay = candidate
    params = params_for_seed(replay.seed, replay.fault_ticks, replay.profile)
    violation_time = best.stats.end_time
    # Faults that start after the violation never fired: disabling them changes nothing.
    late = {f.number for f in params.faults if f.start > violation_time}
    replay = replace(replay, disabled_faults=replay.disabled_faults | late)
    for fault in reversed(params.faults):
        if fault.number in replay.disabled_faults:
            continue
        candidate = replace(replay, disabled_faults=replay.disabled_faults | {fault.number})
        if attempt(candidate):
            replay = candidate
    return run(replay, trace=True)


def report(outcome: Outcome, full_trace: bool, out: Iterable[str] | None = None) -> list[str]:
    """The human-readable account of a violation (or of a clean traced run)."""
    lines: list[str] = []
    r = outcome.replay
    if outcome.invariant is not None:
        lines.append(f"VIOLATION seed {r.seed}: {outcome.invariant}: {outcome.detail}")
    else:
        lines.append(f"seed {r.seed}: no violation")
    s = outcome.stats
    lines.append(
        f"  after {s.events} events, at tick {s.end_time / TICK:.3f}; faults in this run: "
        + (", ".join(outcome.fault_lines) or "none")
    )
    lines.append(
        f"  {s.proposals} proposals, {s.conf_changes} conf changes, {s.crashes} crashes, "
        f"{s.snapshots} snapshots, {s.elections} leaders, commit index {s.committed}, "
        f"{s.reads_checked} reads checked, {s.messages} messages ({s.dropped} lost), "
        f"{s.snapshots_sent} MsgSnap, {s.transfers} MsgTimeoutNow, {s.configs} configurations "
        f"({s.joint_configs} joint)"
        + (
            f", {s.wipes} disks lost ({s.creations} created, {s.rejoins} rejoined)"
            if s.wipes
            else ""
        )
    )
    if r.disabled_ops:
        lines.append("  operation kinds disabled: " + ", ".join(k.value for k in r.disabled_ops))
    lines.append(f"  reproduce: {r.command()}")
    trace = outcome.trace if full_trace else outcome.trace[-TRACE_TAIL:]
    if not full_trace and len(outcome.trace) > TRACE_TAIL:
        key = [t for t in outcome.trace[:-TRACE_TAIL] if any(k in t for k in KEY_EVENTS)]
        lines.append(f"  key events before those ({len(key)}: faults, elections, restarts):")
        lines.extend("    " + t for t in key[-KEY_EVENTS_SHOWN:])
    if trace:
        lines.append(f"  trace ({'all' if full_trace else 'last'} {len(trace)} events):")
        lines.extend("    " + t for t in trace)
    return lines


def _run_quietly(replay: Replay) -> tuple[int, str | None, str, int]:
    outcome = run(replay)
    return replay.seed, outcome.invariant, outcome.detail, outcome.stats.events


@dataclass(slots=True)
class SweepResult:
    seeds: int
    violations: list[tuple[int, str, str]]  # (seed, invariant, detail), by seed
    events: int
    seconds: float


def _spawned_pool(jobs: int) -> multiprocessing.pool.Pool:
    """A pool of fresh interpreters. Not forked: a fork copies the caller's objects but not
    its threads, and in a caller that used gRPC (pytest, after the integration tests) a
    channel collected in the child joins a polling thread that does not exist there, forever.
    A spawned child imports this module by name, so the repository root goes on the path
    the children are given (pytest's importlib mode imports ``tests`` without it)."""
    root = str(Path(__file__).resolve().parents[2])
    added = root not in sys.path
    if added:
        sys.path.append(root)
    try:
        return multiprocessing.get_context("spawn").Pool(jobs)
    finally:
        if added:
            sys.path.remove(root)


def sweep(
    seeds: Sequence[int],
    jobs: int,
    fault_ticks: int = DEFAULT_FAULT_TICKS,
    profile: Profile | None = None,
    progress: bool = False,
) -> SweepResult:
    """Run ``seeds`` over ``jobs`` processes (in this process when jobs == 1)."""
    started = time.monotonic()
    violations: list[tuple[int, str, str]] = []
    events = 0
    work = [Replay(seed, fault_ticks, profile=profile) for seed in seeds]
    if jobs <= 1:
        results: Iterable[tuple[int, str | None, str, int]] = map(_run_quietly, work)
        pool = None
    else:
        pool = _spawned_pool(jobs)
        results = pool.imap_unordered(
            _run_quietly, work, chunksize=max(1, min(16, len(work) // (jobs * 8) or 1))
        )
    try:
        for done, (seed, invariant, detail, n) in enumerate(results, 1):
            events += n
            if invariant is not None:
                violations.append((seed, invariant, detail))
                if progress:
                    print(f"[seed {seed}: {invariant}: {detail}]", file=sys.stderr, flush=True)
            if progress and done % 1000 == 0:
                elapsed = time.monotonic() - started
                print(
                    f"[{done}/{len(work)} seeds, {len(violations)} violations, {elapsed:.0f} s]",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    violations.sort()
    return SweepResult(len(work), violations, events, time.monotonic() - started)


def _csv(text: str) -> list[str]:
    return [part for part in text.split(",") if part]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.sim",
        description="Seeded whole-cluster Raft simulation with invariant checks.",
    )
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="the first seed of --seeds")
    parser.add_argument("--seed", type=int, help="run this one seed (add --trace to see it)")
    parser.add_argument("--trace", action="store_true", help="print every event of --seed")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--fault-ticks", type=int, default=DEFAULT_FAULT_TICKS)
    parser.add_argument("--disable-faults", type=_csv, default=[], help="fault numbers, a,b")
    parser.add_argument("--disable-ops", type=_csv, default=[], help="operation kinds, a,b")
    parser.add_argument("--no-shrink", action="store_true", help="report violations as found")
    parser.add_argument("--shrink-limit", type=int, default=3, help="violations to shrink")
    parser.add_argument("--progress", action="store_true", help="progress on stderr")
    parser.add_argument(
        "--profile", choices=[p.value for p in Profile], help="force every seed's fault mix"
    )
    args = parser.parse_args(argv)
    profile = None if args.profile is None else Profile(args.profile)

    if args.seed is not None:
        replay = Replay(
            args.seed,
            args.fault_ticks,
            frozenset(int(n) for n in args.disable_faults),
            frozenset(OpKind(k) for k in args.disable_ops),
            profile,
        )
        outcome = run(replay, trace=True)
        for line in report(outcome, full_trace=args.trace):
            print(line)
        violations = 0 if outcome.invariant is None else 1
        print(f"1 seeds, {violations} violations")
        return 1 if violations else 0

    seeds = range(args.start, args.start + args.seeds)
    result = sweep(seeds, args.jobs, args.fault_ticks, profile, progress=args.progress)
    for index, (seed, invariant, detail) in enumerate(result.violations):
        replay = Replay(seed, args.fault_ticks, profile=profile)
        if index >= args.shrink_limit or args.no_shrink:
            print(f"VIOLATION seed {seed}: {invariant}: {detail}")
            print(f"  reproduce: {replay.command()}")
            continue
        found = run(replay)
        shrunk = shrink(found)
        for line in report(shrunk, full_trace=False):
            print(line)
    per_seed_ms = 1000 * result.seconds * max(1, args.jobs) / max(1, result.seeds)
    print(
        f"{result.events} events in {result.seconds:.1f} s over {args.jobs} processes "
        f"({result.events // max(1, result.seeds)} events, {per_seed_ms:.0f} process-ms per seed)"
    )
    print(f"{result.seeds} seeds, {len(result.violations)} violations")
    return 1 if result.violations else 0
