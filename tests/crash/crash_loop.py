"""The crash loop: SIGKILL a WAL writer at random moments, damage its files, restart, check.

Each iteration starts :mod:`tests.crash.writer` on the same data directory, reads the
indexes it acknowledges (each one fsynced), kills it with SIGKILL after a random delay, and
then, chosen at random, leaves the files alone or damages them the way a crash or the disk
could:

- ``truncate``: cut the last segment at a random byte at or after the last acknowledged
  write (a file cut short by a crash mid-write);
- ``zero-tail``: zero the last sector written after the last acknowledged write (a write
  that never reached that sector);
- ``flip``: flip one bit of acknowledged, synced data in the middle of the log (bit rot).

Then it opens the storage itself and checks: every acknowledged entry is present and intact
(else *lost*), no entry holds bytes the writer never wrote (else *undetected*), a torn tail
was repaired durably (a second open finds nothing more to repair), and a flip made the
storage refuse to start naming the damaged file (else *undetected*); the flipped bit is then
restored and the next iteration continues on the same log. The last line of output is
``N iterations, L lost, U undetected``; the exit status is non-zero when L or U > 0.
"""

from __future__ import annotations

import argparse
import enum
import logging
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rallypoint.raft.storage.disk_storage import DiskStorage
from rallypoint.raft.storage.fileutil import DataCorruptionError
from rallypoint.raft.storage.wal import SECTOR_BYTES

from .writer import POLICY, SEGMENT_SIZE_BYTES, expected_data, expected_snapshot

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0


class Mutation(enum.Enum):
    NONE = "none"
    TRUNCATE = "truncate"
    ZERO_TAIL = "zero-tail"
    FLIP = "flip"


@dataclass
class Acknowledged:
    """What the writers reported, across all iterations so far."""

    index: int = 0  # highest acknowledged (fsynced) entry index
    snapshot_index: int = 0  # highest durable snapshot
    segment: str = ""  # WAL segment of the last report, and the end of its durable records
    synced_offset: int = 0
    # False while a snapshot was being written: its WAL marker may be synced past
    # synced_offset, so nothing after it may be treated as unsynced.
    position_known: bool = True


@dataclass
class Totals:
    iterations: int = 0
    lost: int = 0
    undetected: int = 0
    mutations: dict[str, int] = field(default_factory=dict)
    repairs: int = 0
    refusals: int = 0
    notes: list[str] = field(default_factory=list)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _quiet_logger() -> tuple[logging.Logger, _Capture]:
    capture = _Capture()
    logger = logging.getLogger(f"crash-check-{id(capture)}")
    logger.propagate = False
    logger.handlers = [capture]
    logger.setLevel(logging.DEBUG)
    return logger, capture


def run_writer(data_dir: str, seed: int, kill_after_s: float, acked: Acknowledged) -> None:
    """Run one writer until ``kill_after_s`` after it is ready, SIGKILL it, record its acks."""
    with (
        tempfile.TemporaryFile() as stderr,
        subprocess.Popen(
            [sys.executable, "-m", "tests.crash.writer", data_dir, str(seed)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
        ) as proc,
    ):
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        pending = b""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        ready = killed = False
        while True:
            if not killed and time.monotonic() >= deadline:
                if not ready:
                    proc.kill()
                    raise RuntimeError("the writer did not start in time")
                proc.send_signal(signal.SIGKILL)
                killed = True
            timeout = None if killed else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([fd], [], [], timeout)
            if not readable:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                words = line.decode().split()
                if words[0] == "READY" and not ready:
                    ready = True
                    deadline = time.monotonic() + kill_after_s
                elif words[0] == "ACK":
                    acked.index = max(acked.index, int(words[1]))
                    acked.segment, acked.synced_offset = words[2], int(words[3])
                    acked.position_known = True
                elif words[0] == "SNAPSHOTTING":
                    acked.position_known = False
                elif words[0] == "SNAP":
                    acked.snapshot_index = max(acked.snapshot_index, int(words[1]))
                    acked.segment, acked.synced_offset = words[2], int(words[3])
                    acked.position_known = True
        returncode = proc.wait()
        if returncode != -signal.SIGKILL:
            stderr.seek(0)
            raise RuntimeError(
                f"writer exited with {returncode} before it was killed:\n"
                f"{stderr.read().decode(errors='replace')}"
            )


def _segments(wal_dir: Path) -> list[Path]:
    return sorted(wal_dir.glob("*.wal"))


def _nonzero_end(data: bytes) -> int:
    return len(data.rstrip(b"\0"))


def mutate(
    kind: Mutation, wal_dir: Path, acked: Acknowledged, rng: random.Random
) -> tuple[Path, int, int] | None:
    """Damage the files; for a flip return (file, byte offset, bit) so it can be undone.

    Truncation and zeroing touch only bytes after the last acknowledged write (what a crash
    can damage); when that position is not known (the writer cut a segment, or was writing a
    snapshot, after its last report) they do nothing. A flip hits synced data before the
    last record of the log.
    """
    last = _segments(wal_dir)[-1]
    last_is_known = acked.position_known and acked.segment == str(last)
    if kind is Mutation.TRUNCATE and last_is_known:
        end = _nonzero_end(last.read_bytes())
        os.truncate(last, rng.randint(acked.synced_offset, max(acked.synced_offset, end)))
    elif kind is Mutation.ZERO_TAIL and last_is_known:
        data = last.read_bytes()
        end = _nonzero_end(data)
        if end > acked.synced_offset:
            start = max(acked.synced_offset, (end - 1) // SECTOR_BYTES * SECTOR_BYTES)
            with open(last, "r+b") as f:
                f.seek(start)
                f.write(bytes(end - start))
    elif kind is Mutation.FLIP:
        candidates: list[tuple[Path, int]] = []
        for segment in _segments(wal_dir):
            if segment != last:  # fully synced before the next segment was cut
                candidates.append((segment, _nonzero_end(segment.read_bytes())))
            elif last_is_known:  # keep clear of the last record, which may be torn
                candidates.append((segment, acked.synced_offset - SECTOR_BYTES))
        candidates = [(path, size) for path, size in candidates if size > 0]
        if not candidates:
            return None
        path, size = rng.choices(candidates, weights=[s for _, s in candidates])[0]
        offset, bit = rng.randrange(size), rng.randrange(8)
        _flip(path, offset, bit)
        return path, offset, bit
    return None


def _flip(path: Path, offset: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def _open(data_dir: str) -> tuple[DiskStorage, _Capture]:
    logger, capture = _quiet_logger()
    storage = DiskStorage.open(
        data_dir, segment_size_bytes=SEGMENT_SIZE_BYTES, policy=POLICY, logger=logger
    )
    return storage, capture


def check(data_dir: str, acked: Acknowledged, totals: Totals, label: str) -> None:
    """Open the storage and compare it with what was acknowledged (see module docstring)."""
    try:
        storage, capture = _open(data_dir)
    except DataCorruptionError as exc:
        totals.lost += acked.index
        totals.notes.append(f"{label}: refused to start without cause: {exc}")
        return
    try:
        snapshot = storage.snapshot()
        snapshot_index = snapshot.metadata.index
        if snapshot_index and snapshot.data != expected_snapshot(snapshot_index):
            totals.undetected += 1
            totals.notes.append(f"{label}: snapshot {snapshot_index} holds foreign bytes")
        if snapshot_index < acked.snapshot_index:
            totals.notes.append(f"{label}: durable snapshot {acked.snapshot_index} is gone")
            totals.lost += 1
        first, last = storage.first_index(), storage.last_index()
        if last < acked.index:
            totals.lost += acked.index - last
            totals.notes.append(f"{label}: acknowledged {acked.index}, log ends at {last}")
        entries = storage.entries(first, last + 1) if last >= first else []
        for entry in entries:
            if entry.data != expected_data(entry.index):
                if entry.index <= acked.index:
                    totals.lost += 1
                else:
                    totals.undetected += 1
                totals.notes.append(f"{label}: entry {entry.index} is damaged")
        terms = [e.term for e in entries]
        if terms != sorted(terms):
            totals.undetected += 1
            totals.notes.append(f"{label}: entry terms go backwards")
        state = (first, last, entries, storage.hard_state, snapshot)
    finally:
        storage.close()
    if any("torn tail" in m for m in capture.messages):
        totals.repairs += 1
    again, capture_again = _open(data_dir)
    try:
        same = (
            again.first_index(),
            again.last_index(),
            again.entries(first, last + 1) if last >= first else [],
            again.hard_state,
            again.snapshot(),
        ) == state
    finally:
        again.close()
    if not same or any("torn tail" in m for m in capture_again.messages):
        totals.undetected += 1
        totals.notes.append(f"{label}: the repair was not complete or not durable")


def run(
    iterations: int, seed: int, data_dir: str, max_kill_delay_s: float, verbose: bool
) -> Totals:
    rng = random.Random(seed)
    acked = Acknowledged()
    totals = Totals()
    wal_dir = Path(data_dir) / "wal"
    for iteration in range(iterations):
        run_writer(data_dir, rng.randrange(1 << 30), rng.uniform(0, max_kill_delay_s), acked)
        kind = rng.choice(list(Mutation))
        totals.mutations[kind.value] = totals.mutations.get(kind.value, 0) + 1
        label = f"iteration {iteration} ({kind.value})"
        flipped = mutate(kind, wal_dir, acked, rng)
        if flipped is not None:
            path, offset, bit = flipped
            try:
                storage, _ = _open(data_dir)
            except DataCorruptionError as exc:
                if exc.path != str(path) or exc.offset > offset:
                    totals.undetected += 1
                    totals.notes.append(f"{label}: flip at {path}:{offset} reported as {exc}")
                totals.refusals += 1
                if verbose:
                    print(f"{label}: refused as expected: {exc}")
                _flip(path, offset, bit)  # restore, so the loop continues on a sound log
            else:  # the open may have rewritten the file: leave it as it is now
                storage.close()
                totals.undetected += 1
                totals.notes.append(f"{label}: bit {bit} of {path}:{offset} flipped unnoticed")
        check(data_dir, acked, totals, label)
        totals.iterations += 1
        if verbose:
            print(f"{label}: acknowledged {acked.index}, snapshot {acked.snapshot_index}")
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.crash", description=__doc__)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--seed", type=int, default=None, help="default: random, printed")
    parser.add_argument("--data-dir", default=None, help="default: a temporary directory")
    parser.add_argument("--max-kill-delay-s", type=float, default=0.25)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"crash loop: {args.iterations} iterations, seed {seed}", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="crash-loop-") as tmp:
        data_dir = args.data_dir or tmp
        totals = run(args.iterations, seed, data_dir, args.max_kill_delay_s, args.verbose)
    for note in totals.notes:
        print(note)
    mutations = ", ".join(f"{k} {v}" for k, v in sorted(totals.mutations.items()))
    print(
        f"mutations: {mutations}; torn tails repaired {totals.repairs}; "
        f"flips refused {totals.refusals}; {time.monotonic() - started:.1f} s"
    )
    print(f"{totals.iterations} iterations, {totals.lost} lost, {totals.undetected} undetected")
    return 1 if totals.lost or totals.undetected else 0
