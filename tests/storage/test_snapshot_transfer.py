"""Chunked snapshot transfer: in-order writes, resume, whole-file checksum, atomic install."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rallypoint.raft.storage.snapshot_transfer import (
    ChunkOutOfOrderError,
    SnapshotChecksumError,
    SnapshotReceiver,
    SnapshotTransferError,
    read_chunks,
)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "send" / "0000000000000002-0000000000000064.snap"
    path.parent.mkdir()
    path.write_bytes(random.Random(7).randbytes(10_000))
    return path


def target(tmp_path: Path) -> Path:
    return tmp_path / "recv" / "0000000000000002-0000000000000064.snap"


def test_whole_transfer_installs_only_at_the_end(tmp_path: Path, source: Path) -> None:
    receiver = SnapshotReceiver(str(target(tmp_path)))
    chunks = list(read_chunks(str(source), chunk_size_bytes=3000))
    assert [c.offset for c in chunks] == [0, 3000, 6000, 9000]
    assert {c.total_size for c in chunks} == {10_000}
    for chunk in chunks[:-1]:
        assert receiver.accept(chunk) is False
        assert not target(tmp_path).exists()  # never visible half-installed
    assert receiver.accept(chunks[-1]) is True
    assert target(tmp_path).read_bytes() == source.read_bytes()
    assert list(target(tmp_path).parent.iterdir()) == [target(tmp_path)]


def test_resume_after_an_interrupted_stream_and_a_receiver_restart(
    tmp_path: Path, source: Path
) -> None:
    first = SnapshotReceiver(str(target(tmp_path)))
    stream = read_chunks(str(source), chunk_size_bytes=1024)
    for _ in range(4):
        first.accept(next(stream))
    # The receiver process restarts; the sender starts over from 0 and is told where to go.
    second = SnapshotReceiver(str(target(tmp_path)))
    restart = read_chunks(str(source), chunk_size_bytes=1024)
    with pytest.raises(ChunkOutOfOrderError) as info:
        second.accept(next(restart))
    assert info.value.expected_offset == 4096
    done = False
    for chunk in read_chunks(str(source), chunk_size_bytes=1024, start_offset=4096):
        done = second.accept(chunk)
    assert done and target(tmp_path).read_bytes() == source.read_bytes()


def test_damaged_partial_file_fails_the_whole_checksum(tmp_path: Path, source: Path) -> None:
    receiver = SnapshotReceiver(str(target(tmp_path)))
    chunks = list(read_chunks(str(source), chunk_size_bytes=4000))
    receiver.accept(chunks[0])
    (partial,) = target(tmp_path).parent.glob("*.partial")
    data = bytearray(partial.read_bytes())
    data[100] ^= 1
    partial.write_bytes(bytes(data))
    receiver.accept(chunks[1])
    with pytest.raises(SnapshotChecksumError):
        receiver.accept(chunks[2])
    assert not target(tmp_path).exists()
    assert not list(target(tmp_path).parent.glob("*.partial"))
    for chunk in chunks:  # a clean retry from offset 0 succeeds
        receiver.accept(chunk)
    assert target(tmp_path).read_bytes() == source.read_bytes()


def test_a_different_snapshot_discards_the_old_partial(tmp_path: Path, source: Path) -> None:
    receiver = SnapshotReceiver(str(target(tmp_path)))
    receiver.accept(next(read_chunks(str(source), chunk_size_bytes=1000)))
    other = source.with_name("other.snap")
    other.write_bytes(b"a newer snapshot" * 100)
    chunks = list(read_chunks(str(other), chunk_size_bytes=1000))
    for chunk in chunks:
        receiver.accept(chunk)
    assert target(tmp_path).read_bytes() == other.read_bytes()
    assert not list(target(tmp_path).parent.glob("*.partial"))


def test_a_chunk_past_the_declared_size_is_refused(tmp_path: Path, source: Path) -> None:
    receiver = SnapshotReceiver(str(target(tmp_path)))
    chunk = next(read_chunks(str(source), chunk_size_bytes=20_000))
    bad = type(chunk)(0, chunk.data + b"x", chunk.total_size, chunk.whole_crc)
    with pytest.raises(SnapshotTransferError):
        receiver.accept(bad)
