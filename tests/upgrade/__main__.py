"""``python -m tests.upgrade`` (``make upgrade-test``): a rolling upgrade from the previous
release (``previous.PINNED_COMMIT``) to this checkout under the fault-injection workloads,
then the reverse, which must stop at the gate (``run.py`` says how). Needs root (network
namespaces). The last line is ``upgrade: N steps, V violations, S stalls``; the exit status
is non-zero unless V and S are 0."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from .run import run_upgrade


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.upgrade", description=__doc__)
    parser.add_argument("--time", type=float, default=45.0, help="seconds of workload")
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument("--lane", type=int, default=38, help="network namespaces' lane")
    parser.add_argument("--out", type=Path, default=Path("store/upgrade"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if os.geteuid() != 0:
        print("upgrade: needs root (network namespaces, iptables)", file=sys.stderr)
        return 2
    outcome = run_upgrade(args.out, args.time, args.seed, args.lane)
    for line in outcome.log:
        print(line)
    print(f"report: {args.out / 'upgrade.log'}")
    print(outcome.last_line())
    return 0 if not outcome.violations and not outcome.stalls else 1


if __name__ == "__main__":
    sys.exit(main())
