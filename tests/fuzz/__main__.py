"""``python -m tests.fuzz --time S [--seed N]``: fuzz both ports of a 3-member cluster.

Prints the seed, then per mode and RPC the messages sent and how they ended, the checks,
every failure (the first few of each kind in full), and last ``fuzz: N messages, C failures``;
the exit status is 1 when C > 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path

from rallypoint.worker.process_tree import run_reaped

from .runner import MODES, Report, run

SHOWN_PER_KIND = 3


def print_report(report: Report) -> None:
    for mode in MODES:
        rows = [(rpc, f) for (m, rpc), f in report.figures.items() if m == mode]
        sent = sum(f.sent for _, f in rows)
        print(f"mode {mode}: {sent} messages")
        for rpc, figures in sorted(rows):
            outcomes = ", ".join(f"{code} {n}" for code, n in figures.outcomes.most_common())
            skipped = f" (not sent, well-formed: {figures.skipped})" if figures.skipped else ""
            print(f"  {rpc:<46} {figures.sent:>6}  {outcomes}{skipped}")
    for line in report.checks:
        print(f"check: {line}")
    kinds: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for finding in report.findings:
        kinds[(finding.mode, finding.rpc, finding.kind)].append(str(finding))
    for (mode, rpc, _), found in kinds.items():
        for text in found[:SHOWN_PER_KIND]:
            print(f"FAIL {text}")
        if len(found) > SHOWN_PER_KIND:
            print(f"FAIL ... and {len(found) - SHOWN_PER_KIND} more like it ([{mode}] {rpc})")
    untried = report.untried()
    if untried:
        print(f"never tried: {', '.join(untried)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--time", type=float, default=60.0, help="seconds of fuzzing")
    parser.add_argument("--seed", type=int, default=None, help="default: a random seed")
    parser.add_argument("--keep", type=Path, default=None, help="keep the cluster's files here")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    print(f"fuzz: seed {seed} (reproduce with --seed {seed}), {args.time:g} s", flush=True)
    report = run(args.time, seed, lambda line: print(line, flush=True), args.keep)
    print_report(report)
    failures = len(report.findings) + len(report.untried())
    print(f"fuzz: {report.messages} messages, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(run_reaped(main))
