"""Snapshot files: format, whole-file checksum, atomic replacement, fallback, retention."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rallypoint.raft.storage.snapshotter import (
    SnapshotCorruptionError,
    Snapshotter,
    decode_snapshot_file,
    encode_snapshot_file,
)
from rallypoint.raft.types import (
    EMPTY_SNAPSHOT,
    ConfState,
    Index,
    NodeId,
    Snapshot,
    SnapshotMetadata,
    Term,
)


def snap(index: int, term: int = 1, data: bytes = b"state") -> Snapshot:
    conf = ConfState(voters=(NodeId(1), NodeId(2), NodeId(3)))
    return Snapshot(data, SnapshotMetadata(conf, Index(index), Term(term)))


def test_round_trip_and_newest_first(tmp_path: Path) -> None:
    snapshotter = Snapshotter(str(tmp_path))
    assert snapshotter.load_newest(Index(100)) == EMPTY_SNAPSHOT
    for index in (5, 20, 10):
        snapshotter.save(snap(index, data=b"at %d" % index))
    assert [f.index for f in snapshotter.files()] == [20, 10, 5]
    assert snapshotter.load_newest(Index(100)) == snap(20, data=b"at 20")


def test_every_bit_flip_in_a_snapshot_file_is_detected() -> None:
    data = b"".join(encode_snapshot_file(snap(7, 2, b"xy")))
    assert decode_snapshot_file("f.snap", data) == snap(7, 2, b"xy")
    for bit in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(SnapshotCorruptionError) as info:
            decode_snapshot_file("f.snap", bytes(flipped))
        assert info.value.path == "f.snap"
    for cut in range(len(data)):
        with pytest.raises(SnapshotCorruptionError):
            decode_snapshot_file("f.snap", data[:cut])


def test_crash_between_temp_write_and_rename_keeps_the_old_snapshot(tmp_path: Path) -> None:
    Snapshotter(str(tmp_path)).save(snap(10, data=b"old"))
    script = textwrap.dedent(
        f"""
        import os, signal
        from rallypoint.raft.storage.snapshotter import Snapshotter
        from rallypoint.raft.types import Index, Snapshot, SnapshotMetadata, Term

        def crash_instead_of_rename(src, dst):
            os.kill(os.getpid(), signal.SIGKILL)

        os.rename = crash_instead_of_rename
        new = Snapshot(b"new", SnapshotMetadata(index=Index(20), term=Term(1)))
        Snapshotter({str(tmp_path)!r}).save(new)
        print("saved")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert result.returncode == -9 and b"saved" not in result.stdout
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # the temp file was written
    snapshotter = Snapshotter(str(tmp_path))
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    assert snapshotter.load_newest(Index(100)) == snap(10, data=b"old")


def test_corrupt_newest_falls_back_to_an_older_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    snapshotter = Snapshotter(str(tmp_path))
    snapshotter.save(snap(10, data=b"ten"))
    newest = Path(snapshotter.save(snap(20, data=b"twenty")))
    data = bytearray(newest.read_bytes())
    data[-6] ^= 0x10
    newest.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert snapshotter.load_newest(Index(100)) == snap(10, data=b"ten")
    assert str(newest) in caplog.text and "checksum mismatch" in caplog.text


def test_none_verifies_refuses_with_file_and_offset(tmp_path: Path) -> None:
    snapshotter = Snapshotter(str(tmp_path))
    older = Path(snapshotter.save(snap(10)))
    newest = Path(snapshotter.save(snap(20)))
    older.write_bytes(older.read_bytes()[:-1])
    newest.write_bytes(b"XXXX" + newest.read_bytes()[4:])
    with pytest.raises(SnapshotCorruptionError) as info:
        snapshotter.load_newest(Index(100))
    assert info.value.path == str(newest) and info.value.offset == 0
    assert "no older snapshot verifies" in str(info.value)


def test_snapshots_the_wal_does_not_record_are_ignored(tmp_path: Path) -> None:
    snapshotter = Snapshotter(str(tmp_path))
    snapshotter.save(snap(10))
    snapshotter.save(snap(20))
    assert snapshotter.load_newest(Index(15)) == snap(10)
    assert snapshotter.load_newest(Index(9)) == EMPTY_SNAPSHOT


def test_accept_rejection_falls_back(tmp_path: Path) -> None:
    snapshotter = Snapshotter(str(tmp_path))
    snapshotter.save(snap(10))
    snapshotter.save(snap(20, term=3))
    chosen = snapshotter.load_newest(Index(20), lambda m: "term differs" if m.term == 3 else None)
    assert chosen == snap(10)


def test_retain_keeps_the_newest(tmp_path: Path) -> None:
    snapshotter = Snapshotter(str(tmp_path))
    for index in range(1, 6):
        snapshotter.save(snap(index))
    removed = snapshotter.retain(2)
    assert len(removed) == 3
    assert [f.index for f in snapshotter.files()] == [5, 4]
