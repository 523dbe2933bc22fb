"""``python -m tests.jepsen``: run a matrix of fault-injection runs and report.

The last line is ``jepsen: R runs, V violations``; the exit status is non-zero when V > 0 or
a negative control was not caught. Needs root (network namespaces, iptables, tc).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
from collections.abc import Generator
from pathlib import Path

from rallypoint.worker.process_tree import run_reaped

from . import netns
from .report import RunSummary, write_summary
from .runner import (
    LONG_MIXES,
    long_matrix,
    negative_controls,
    run_one,
    run_parallel,
    short_matrix,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.jepsen", description=__doc__)
    parser.add_argument("--matrix", choices=["short", "long"], default="short")
    parser.add_argument("--runs", type=int, default=20, help="runs per fault mix (long)")
    parser.add_argument("--time", type=float, default=None, help="seconds per run")
    parser.add_argument("--mix", action="append", help="only these fault mixes or run names")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("store/jepsen"))
    parser.add_argument("--no-controls", action="store_true", help="skip negative controls")
    parser.add_argument(
        "--lanes",
        type=int,
        default=1,
        help="runs at once, each cluster in its own namespaces and subnet (default 1); "
        "more lanes share the CPU, so each run sees fewer operations and slower members",
    )
    args = parser.parse_args(argv)
    if args.lanes < 1 or args.lanes >= netns.MAX_LANES:
        parser.error(f"--lanes must be 1..{netns.MAX_LANES - 1}")
    # The clients' own warnings (a participant declared failed during a pause) are expected
    # under faults; the reports say what happened.
    logging.basicConfig(level=logging.ERROR)
    if os.geteuid() != 0:
        print("jepsen: needs root (network namespaces, iptables, tc)", file=sys.stderr)
        return 2
    if args.matrix == "short":
        specs = short_matrix(args.time or 20.0, args.seed)
        if args.no_controls:
            specs = [s for s in specs if s.expect_violation is None]
        if args.mix:
            specs = [s for s in specs if s.nemesis in args.mix or s.name in args.mix]
    else:
        try:
            specs = long_matrix(args.runs, args.time or 60.0, args.seed, args.mix or LONG_MIXES)
        except ValueError as error:
            parser.error(str(error))
        if not args.no_controls:
            specs += negative_controls(args.time or 60.0, args.seed)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out / f"{args.matrix}-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    latest = args.out / f"latest-{args.matrix}"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(out.name)
    finished: dict[int, RunSummary] = {}
    results: Generator[tuple[int, RunSummary], None, None]
    if args.lanes == 1:
        results = ((i, run_one(spec, out / spec.name)) for i, spec in enumerate(specs))
    else:
        results = run_parallel(specs, out, args.lanes)
    try:
        for index, summary in results:
            finished[index] = summary
            spec = specs[index]
            verdicts = ", ".join(f"{r.checker} {r.outcome.value}" for r in summary.results)
            control = ""
            if spec.expect_violation:
                control = " [control: " + ("caught]" if summary.caught else "NOT caught]")
            print(
                f"[{len(finished)}/{len(specs)}] {spec.name}: {summary.operations} ops; {verdicts}"
                f"{control}" + (f"; error: {summary.error}" if summary.error else ""),
                flush=True,
            )
            write_summary([finished[i] for i in sorted(finished)], out / "summary.md")
    finally:
        if args.lanes == 1:
            netns.cleanup()  # lane 0, where the runs went
        else:
            # run_parallel cleans the lanes it used, 1 to --lanes; lane 0 may be another
            # run's (a plain make jepsen beside this one) and is left alone.
            results.close()
    summaries = [finished[i] for i in sorted(finished)]
    ordinary = [s for s in summaries if s.expected_violation is None]
    violations = sum(s.violations for s in ordinary)
    missed = [s.name for s in summaries if s.expected_violation and not s.caught]
    errors = [s.name for s in summaries if s.error]
    print(f"reports: {out}/summary.md")
    if errors:
        print(f"runs that did not complete: {', '.join(errors)}")
    if missed:
        print(f"negative controls not caught: {', '.join(missed)}")
    print(f"jepsen: {len(ordinary)} runs, {violations} violations")
    return 1 if violations or missed or errors else 0


if __name__ == "__main__":
    sys.exit(run_reaped(main))
