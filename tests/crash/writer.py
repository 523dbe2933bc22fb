"""The process the crash loop kills: appends entries through DiskStorage and acknowledges them.

Usage: ``python -m tests.crash.writer DATA_DIR SEED``. Prints (unbuffered, one atomic write
per line) ``READY <last index>`` once the storage is open, then after every persist that
returned (so is fsynced) ``ACK <last index> <wal segment> <synced offset>``, and after every
durable snapshot ``SNAP <index> <wal segment> <synced offset>`` (preceded by
``SNAPSHOTTING`` when it starts). It runs until killed.

Entry data is a function of the index alone (:func:`expected_data`), so the checker can tell
an intact entry from a damaged or invented one without a record of what was written.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys

from rallypoint.raft.storage.disk_storage import DiskStorage, SnapshotPolicy
from rallypoint.raft.types import ConfState, Entry, HardState, Index, NodeId, Term

SEGMENT_SIZE_BYTES = 64 * 1024
POLICY = SnapshotPolicy(entries_per_snapshot=400, retain_snapshots=2)
CONF = ConfState(voters=(NodeId(1),))


def expected_data(index: int) -> bytes:
    """Between 16 and 255 bytes derived from the index (at most ~300 bytes per record)."""
    digest = hashlib.blake2b(str(index).encode(), digest_size=32).digest()
    length = 16 + index * 7919 % 240
    return (digest * (length // 32 + 1))[:length]


def expected_snapshot(index: int) -> bytes:
    return b"state through %d: " % index + hashlib.blake2b(b"%d" % index).digest()


def open_storage(data_dir: str) -> DiskStorage:
    return DiskStorage.open(data_dir, segment_size_bytes=SEGMENT_SIZE_BYTES, policy=POLICY)


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main(argv: list[str]) -> int:
    data_dir, seed = argv[0], int(argv[1])
    rng = random.Random(seed)
    storage = open_storage(data_dir)
    term = storage.hard_state.term + 1  # a new term per run: the hard state moves forward
    say(f"READY {storage.last_index()}")
    while True:
        last = storage.last_index()
        count = rng.randint(1, 30)
        entries = [
            Entry(Term(term), Index(i), data=expected_data(i))
            for i in range(last + 1, last + 1 + count)
        ]
        storage.persist(HardState(Term(term), NodeId(1), Index(last)), entries)
        segment, offset = storage.wal_position()
        say(f"ACK {storage.last_index()} {segment} {offset}")
        applied = Index(storage.last_index())
        if storage.should_snapshot(applied):
            # From here until SNAP the WAL syncs a marker the checker has not been told of,
            # so it must not treat anything after the last ACK as unsynced.
            say("SNAPSHOTTING")
            storage.create_snapshot(applied, CONF, expected_snapshot(applied))
            storage.compact(applied)
            segment, offset = storage.wal_position()
            say(f"SNAP {applied} {segment} {offset}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
