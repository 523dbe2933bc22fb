"""WAL micro-benchmark: appends/s and fsyncs/s at batch sizes 1, 10, 100, against raw fdatasync.

The anchor is the disk itself: a plain file, 256-byte append + fdatasync in a loop, measured in
the same run in the same directory (ratios are against it). The same loop over a preallocated
file is reported too: WAL segments are preallocated, so their fdatasync updates no file size
and can beat the appending anchor. Each WAL trial opens a fresh WAL and runs rounds of
``save(hard_state, batch of entries)`` + ``sync()`` (one fsync per round: group commit).
Trials are repeated and medians reported; each trial is bounded both in rounds and in time.

    python bench/wal_bench.py --out bench/results/wal.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import google_crc32c

from rallypoint.raft.storage.fileutil import default_fsync
from rallypoint.raft.storage.wal import WAL
from rallypoint.raft.types import Entry, HardState, Index, NodeId, Term
from rallypoint.worker.process_tree import run_reaped


def raw_fdatasync_trial(
    directory: str, max_rounds: int, budget_s: float, size: int, preallocate: bool = False
) -> dict[str, Any]:
    path = os.path.join(directory, "raw.dat")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    payload = os.urandom(size)
    if preallocate:  # as WAL segments are: the writes then change no file size
        os.posix_fallocate(fd, 0, max_rounds * size)
        default_fsync(fd)
    try:
        rounds = 0
        started = time.perf_counter()
        while rounds < max_rounds and time.perf_counter() - started < budget_s:
            os.pwrite(fd, payload, rounds * size)
            default_fsync(fd)
            rounds += 1
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        os.unlink(path)
    return {"rounds": rounds, "elapsed_s": elapsed, "fsyncs_per_s": rounds / elapsed}


def wal_trial(
    directory: str, batch: int, entry_bytes: int, max_rounds: int, budget_s: float
) -> dict[str, Any]:
    wal_dir = tempfile.mkdtemp(prefix="wal-", dir=directory)
    fsyncs = 0

    def counting_fsync(fd: int) -> None:
        nonlocal fsyncs
        fsyncs += 1
        default_fsync(fd)

    wal, _ = WAL.open(wal_dir, fsync=counting_fsync)
    data = os.urandom(entry_bytes)
    try:
        fsyncs = 0
        index = 0
        rounds = 0
        started = time.perf_counter()
        while rounds < max_rounds and time.perf_counter() - started < budget_s:
            entries = [Entry(Term(1), Index(index + i + 1), data=data) for i in range(batch)]
            index += batch
            wal.save(HardState(Term(1), NodeId(1), Index(index - batch)), entries)
            wal.sync()
            rounds += 1
        elapsed = time.perf_counter() - started
    finally:
        wal.close()
        shutil.rmtree(wal_dir)
    return {
        "rounds": rounds,
        "entries": index,
        "fsyncs": fsyncs,
        "elapsed_s": elapsed,
        "appends_per_s": index / elapsed,
        "fsyncs_per_s": fsyncs / elapsed,
    }


def machine_info(directory: str) -> dict[str, Any]:
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "absent"

    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": sys.version,
        "msgpack": version("msgpack"),
        "google-crc32c": version("google-crc32c"),
        "crc32c_implementation": google_crc32c.implementation,
        "bench_directory": directory,
        "fsync": "fdatasync" if hasattr(os, "fdatasync") else "fsync",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/wal.json")
    parser.add_argument("--dir", default=None, help="where to write (default: beside --out)")
    parser.add_argument("--batch-sizes", default="1,10,100")
    parser.add_argument("--entry-bytes", type=int, default=256)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--max-rounds", type=int, default=500, help="fsyncs per trial, at most")
    parser.add_argument("--trial-budget-s", type=float, default=2.0)
    args = parser.parse_args(argv)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="wal-bench-", dir=args.dir or out.parent)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    started = time.perf_counter()
    try:
        raw_trials = [
            raw_fdatasync_trial(directory, args.max_rounds, args.trial_budget_s, args.entry_bytes)
            for _ in range(args.trials)
        ]
        raw_median = statistics.median(t["fsyncs_per_s"] for t in raw_trials)
        prealloc_trials = [
            raw_fdatasync_trial(
                directory, args.max_rounds, args.trial_budget_s, args.entry_bytes, True
            )
            for _ in range(args.trials)
        ]
        prealloc_median = statistics.median(t["fsyncs_per_s"] for t in prealloc_trials)
        per_batch: dict[str, Any] = {}
        for batch in batches:
            trials = [
                wal_trial(directory, batch, args.entry_bytes, args.max_rounds, args.trial_budget_s)
                for _ in range(args.trials)
            ]
            appends = statistics.median(t["appends_per_s"] for t in trials)
            fsyncs = statistics.median(t["fsyncs_per_s"] for t in trials)
            per_batch[str(batch)] = {
                "median_appends_per_s": appends,
                "median_fsyncs_per_s": fsyncs,
                "fsyncs_vs_raw": fsyncs / raw_median,
                "appends_vs_raw_fsyncs": appends / raw_median,
                "trials": trials,
            }
            print(
                f"batch {batch:>3}: {appends:>10.0f} appends/s  {fsyncs:>8.0f} fsyncs/s  "
                f"({fsyncs / raw_median:.2f} x raw fdatasync)"
            )
    finally:
        shutil.rmtree(directory)
    print(
        f"raw fdatasync: {raw_median:.0f}/s appending {args.entry_bytes}-byte writes, "
        f"{prealloc_median:.0f}/s into a preallocated file"
    )
    result = {
        "benchmark": "wal",
        "machine": machine_info(str(out.parent.resolve())),
        "parameters": {
            "entry_bytes": args.entry_bytes,
            "batch_sizes": batches,
            "trials": args.trials,
            "max_rounds_per_trial": args.max_rounds,
            "trial_budget_s": args.trial_budget_s,
        },
        "anchor_raw_fdatasync": {"median_fsyncs_per_s": raw_median, "trials": raw_trials},
        "raw_fdatasync_preallocated": {
            "median_fsyncs_per_s": prealloc_median,
            "trials": prealloc_trials,
        },
        "wal": per_batch,
        "wall_time_s": time.perf_counter() - started,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_reaped(main))
