"""The WAL's framing, recovery rules and failure handling (format: raft/storage/wal.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rallypoint.raft.storage.fileutil import FSYNC_FAILED_EXIT_CODE
from rallypoint.raft.storage.wal import (
    HEADER_BYTES,
    SECTOR_BYTES,
    WAL,
    SnapshotMarker,
    WalCorruptionError,
    WalFailedError,
    WalRecord,
    segment_name,
)
from rallypoint.raft.types import Entry, EntryType, HardState, Index, NodeId, Term

SEGMENT_BYTES = 4096


def entry(index: int, term: int = 1, size: int = 20) -> Entry:
    return Entry(Term(term), Index(index), EntryType.NORMAL, bytes([index % 251 + 1]) * size)


def open_wal(path: Path, segment_bytes: int = SEGMENT_BYTES) -> tuple[WAL, list[WalRecord]]:
    return WAL.open(str(path), segment_size_bytes=segment_bytes)


def write_log(path: Path, count: int, size: int = 20, segment_bytes: int = SEGMENT_BYTES) -> WAL:
    wal, _ = open_wal(path, segment_bytes)
    for i in range(1, count + 1):
        wal.save(HardState(Term(1), NodeId(1), Index(i - 1)), [entry(i, size=size)])
        wal.sync()
    return wal


def values(records: list[WalRecord]) -> list[object]:
    return [r.value for r in records]


def entries_of(records: list[WalRecord]) -> list[Entry]:
    return [r.value for r in records if isinstance(r.value, Entry)]


def record_extents(wal_dir: Path) -> tuple[WAL, list[WalRecord], list[tuple[int, int]]]:
    """Reopen and return each record's [start, end) in the (single) segment."""
    wal, records = open_wal(wal_dir)
    ends = [r.offset for r in records[1:]] + [wal.synced_offset]
    return wal, records, [(r.offset, end) for r, end in zip(records, ends, strict=True)]


def only_segment(wal_dir: Path) -> Path:
    (segment,) = sorted(wal_dir.glob("*.wal"))
    return segment


def test_records_round_trip_in_order(tmp_path: Path) -> None:
    wal, records = open_wal(tmp_path)
    assert records == []
    hs = HardState(Term(3), NodeId(2), Index(1))
    ents = [entry(1, 3), entry(2, 3, size=0), Entry(Term(3), Index(3), EntryType.CONF_CHANGE, b"c")]
    wal.save(hs, ents)
    wal.save_snapshot_marker(SnapshotMarker(Index(2), Term(3)))
    wal.sync()
    wal.close()
    _, records = open_wal(tmp_path)
    assert values(records) == [hs, *ents, SnapshotMarker(Index(2), Term(3))]
    assert all(r.offset % 16 == 0 for r in records)


def test_group_commit_is_one_fsync_for_many_saves(tmp_path: Path) -> None:
    calls: list[int] = []

    def counting_fsync(fd: int) -> None:
        calls.append(fd)
        os.fdatasync(fd)

    wal, _ = WAL.open(str(tmp_path), segment_size_bytes=1 << 20, fsync=counting_fsync)
    calls.clear()
    for i in range(1, 101):
        wal.save(HardState(Term(1), NodeId(1), Index(i)), [entry(i)])
    wal.sync()
    assert len(calls) == 1
    wal.sync()  # nothing buffered: no fsync
    assert len(calls) == 1
    wal.close()
    _, records = open_wal(tmp_path, 1 << 20)
    assert [e.index for e in entries_of(records)] == list(range(1, 101))


def test_every_truncation_point_of_the_last_record_is_repaired(tmp_path: Path) -> None:
    write_log(tmp_path / "orig", 5).close()
    _, records, extents = record_extents(tmp_path / "orig")
    last_start, last_end = extents[-1]
    original = only_segment(tmp_path / "orig").read_bytes()
    for cut in range(last_start, last_end):
        wal_dir = tmp_path / f"cut{cut}"
        wal_dir.mkdir()
        (wal_dir / only_segment(tmp_path / "orig").name).write_bytes(original[:cut])
        wal, replayed = open_wal(wal_dir)
        assert values(replayed) == values(records[:-1]), cut
        # The torn bytes are kept aside (up to the last non-zero one: zeros carry nothing).
        torn = original[last_start:cut].rstrip(b"\0")
        broken = list(wal_dir.glob("*.broken"))
        assert [b.read_bytes() for b in broken] == ([torn] if torn else [])
        # The log continues after the repair, and the repair is itself durable.
        wal.save(HardState(), [entry(5)])
        wal.sync()
        wal.close()
        _, replayed = open_wal(wal_dir)
        assert values(replayed) == [*values(records[:-1]), entry(5)]


def test_zeroed_tail_sector_is_a_torn_tail(tmp_path: Path) -> None:
    wal = write_log(tmp_path, 20, size=100)  # records straddle sector boundaries
    wal.close()
    _, records, extents = record_extents(tmp_path)
    straddling = [
        i for i, (s, e) in enumerate(extents) if s // SECTOR_BYTES != (e - 1) // SECTOR_BYTES
    ]
    victim = straddling[-1]
    boundary = (extents[victim][1] - 1) // SECTOR_BYTES * SECTOR_BYTES
    segment = only_segment(tmp_path)
    data = bytearray(segment.read_bytes())
    data[boundary:] = bytes(len(data) - boundary)  # the write never reached this sector
    segment.write_bytes(bytes(data))
    _, replayed = open_wal(tmp_path)
    assert values(replayed) == values(records[:victim])


def test_zeroed_sector_in_the_middle_refuses_to_start(tmp_path: Path) -> None:
    wal = write_log(tmp_path, 20, size=100)
    wal.close()
    segment = only_segment(tmp_path)
    data = bytearray(segment.read_bytes())
    data[SECTOR_BYTES : 2 * SECTOR_BYTES] = bytes(SECTOR_BYTES)
    segment.write_bytes(bytes(data))
    with pytest.raises(WalCorruptionError) as info:
        open_wal(tmp_path)
    assert info.value.path == str(segment)
    assert SECTOR_BYTES - 128 <= info.value.offset <= SECTOR_BYTES
    assert str(segment) in str(info.value)


@pytest.mark.parametrize("which", ["middle", "last"])
def test_every_bit_flip_in_a_record_is_detected(tmp_path: Path, which: str) -> None:
    wal, _ = open_wal(tmp_path / "orig")
    for i in range(1, 4):
        wal.save(HardState(), [Entry(Term(1), Index(i), EntryType.NORMAL, b"abc")])
    wal.sync()
    wal.close()
    _, _, extents = record_extents(tmp_path / "orig")
    start, end = extents[1] if which == "middle" else extents[-1]
    segment = only_segment(tmp_path / "orig")
    original = segment.read_bytes()
    wal_dir = tmp_path / "flipped"
    wal_dir.mkdir()
    flipped_path = wal_dir / segment.name
    assert end - start == 32  # small enough to try every bit
    for bit in range((end - start) * 8):
        data = bytearray(original)
        data[start + bit // 8] ^= 1 << (bit % 8)
        flipped_path.write_bytes(bytes(data))
        with pytest.raises(WalCorruptionError) as info:
            open_wal(wal_dir)
        assert info.value.path == str(flipped_path)
        assert start <= info.value.offset < end, bit


def test_a_valid_record_copied_elsewhere_is_detected(tmp_path: Path) -> None:
    write_log(tmp_path / "orig", 4).close()
    _, _, extents = record_extents(tmp_path / "orig")
    segment = only_segment(tmp_path / "orig")
    original = segment.read_bytes()
    start, end = extents[3]  # an entry record
    # Copied after the last record, where the next record would go ...
    appended = bytearray(original)
    tail = extents[-1][1]
    appended[tail : tail + end - start] = original[start:end]
    # ... and over another record of the same size (a replay out of place).
    swapped = bytearray(original)
    other_start, other_end = extents[5]
    assert other_end - other_start == end - start
    swapped[other_start:other_end] = original[start:end]
    for name, data in [("appended", appended), ("swapped", swapped)]:
        wal_dir = tmp_path / name
        wal_dir.mkdir()
        (wal_dir / segment.name).write_bytes(bytes(data))
        with pytest.raises(WalCorruptionError, match="checksum mismatch"):
            open_wal(wal_dir)


def test_segments_are_cut_chained_and_released(tmp_path: Path) -> None:
    write_log(tmp_path, 200).close()
    wal, records = open_wal(tmp_path)
    names = [os.path.basename(p) for p in wal.segment_paths()]
    assert len(names) >= 4
    assert names == sorted(names)
    assert names[0] == segment_name(0, 1)
    assert [e.index for e in entries_of(records)] == list(range(1, 201))
    # Every segment restates the hard state at its head, so a released prefix loses none.
    kept_aside = Path(wal.segment_paths()[0] + ".40.broken")
    kept_aside.write_bytes(b"torn")
    removed = wal.release_to(Index(100))
    assert removed and all(p not in wal.segment_paths() for p in removed)
    assert str(kept_aside) in removed and not kept_aside.exists()
    wal.close()
    _, after = open_wal(tmp_path)
    replayed = entries_of(after)
    assert replayed[-1].index == 200 and replayed[0].index <= 101
    assert [e.index for e in replayed] == list(range(replayed[0].index, 201))
    assert [r.value for r in after if isinstance(r.value, HardState)][-1].commit == 199


def test_a_missing_or_swapped_segment_refuses_to_start(tmp_path: Path) -> None:
    write_log(tmp_path, 200).close()
    paths = sorted(tmp_path.glob("*.wal"))
    middle = paths[len(paths) // 2]
    data = middle.read_bytes()
    middle.unlink()
    with pytest.raises(WalCorruptionError, match="is missing"):
        open_wal(tmp_path)
    # A segment from another log in its place breaks the crc chain at its seed.
    middle.write_bytes(data)
    other = tmp_path / "other"
    write_log(other, 200, size=21).close()
    foreign = sorted(other.glob("*.wal"))[paths.index(middle)]
    middle.write_bytes(foreign.read_bytes())
    with pytest.raises(WalCorruptionError, match="crc chain broken") as info:
        open_wal(tmp_path)
    assert info.value.path == str(middle) and info.value.offset == 0


def test_damage_in_a_segment_that_is_not_the_last_refuses_to_start(tmp_path: Path) -> None:
    write_log(tmp_path, 200).close()
    first = sorted(tmp_path.glob("*.wal"))[0]
    _, records = open_wal(tmp_path)
    last_in_first = [r for r in records if r.path == str(first)][-1]
    with open(first, "r+b") as f:  # cut short, as a torn write would: fine only at the end
        f.truncate(last_in_first.offset + HEADER_BYTES + 2)
    with pytest.raises(WalCorruptionError, match="not the last") as info:
        open_wal(tmp_path)
    assert info.value.offset == last_in_first.offset


def test_hard_state_never_goes_backwards(tmp_path: Path) -> None:
    wal, _ = open_wal(tmp_path)
    wal.save(HardState(Term(5), NodeId(2), Index(0)), [])
    with pytest.raises(AssertionError, match="backwards"):
        wal.save(HardState(Term(4), NodeId(2), Index(0)), [])
    with pytest.raises(AssertionError, match="backwards"):
        wal.save(HardState(Term(5), NodeId(3), Index(0)), [])
    wal.save(HardState(Term(6), NodeId(0), Index(0)), [])  # new term: vote reset is fine
    wal.sync()
    # A log that goes backwards on disk (written around the check) refuses to start.
    wal._encode(HardState(Term(2), NodeId(1), Index(0)))
    wal.sync()
    wal.close()
    with pytest.raises(WalCorruptionError, match="goes back"):
        open_wal(tmp_path)


def test_leftover_segment_temp_file_is_removed(tmp_path: Path) -> None:
    write_log(tmp_path, 3).close()
    (tmp_path / (segment_name(1, 4) + ".tmp")).write_bytes(b"half a segment")
    wal, records = open_wal(tmp_path)
    assert len(entries_of(records)) == 3
    assert not list(tmp_path.glob("*.tmp"))
    assert len(wal.segment_paths()) == 1


def test_failed_fsync_stops_the_process(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import errno, os, sys
        from rallypoint.raft.types import Entry, HardState, Index, Term
        from rallypoint.raft.storage.wal import WAL

        failing = False

        def fsync(fd):
            if failing:
                raise OSError(errno.EIO, "simulated EIO")
            os.fdatasync(fd)

        wal, _ = WAL.open({str(tmp_path)!r}, segment_size_bytes=4096, fsync=fsync)
        failing = True
        wal.save(HardState(), [Entry(Term(1), Index(1))])
        try:
            wal.sync()
        except BaseException as exc:
            print("sync raised", type(exc).__name__)
        print("sync returned")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == FSYNC_FAILED_EXIT_CODE, result.stderr
    assert "sync r" not in result.stdout  # neither returned nor raised: the process stopped
    assert "fsync of" in result.stderr and "simulated EIO" in result.stderr


def test_a_failed_write_makes_the_wal_refuse_further_use(tmp_path: Path) -> None:
    wal, _ = open_wal(tmp_path)
    read_only = os.open(wal.segment_paths()[-1], os.O_RDONLY)
    os.dup2(read_only, wal._fd)  # the next pwrite fails with EBADF
    os.close(read_only)
    wal.save(HardState(), [entry(1)])
    with pytest.raises(WalFailedError, match="write to"):
        wal.sync()
    with pytest.raises(WalFailedError):
        wal.save(HardState(), [entry(2)])
    wal.close()
    _, records = open_wal(tmp_path)
    assert records == []
