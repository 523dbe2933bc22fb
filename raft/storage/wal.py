"""The write-ahead log: hard state, entries and snapshot markers in checksummed segment files.

Theory of operation
===================

Layout. A WAL directory holds segment files named ``<seq>-<index>.wal`` (two 16-digit hex
numbers): ``seq`` counts segments from 0 without gaps; ``index`` is the index the next entry
was expected to have when the segment was cut (informational: an overwrite can later put a
lower index into the segment). Each segment is preallocated (``posix_fallocate``) to
``segment_size_bytes``; zeros after the last record are the end of the log. A segment is cut
once its records pass that size; a single large batch may grow a file past it.

Record. Every record starts at a multiple of 16 bytes::

    offset  size  field
    0       4     payload length, u32 little-endian
    4       1     record type (RecordType)
    5       1     pad: zero bytes after the payload, so the next record is 16-aligned
    6       2     reserved, zero
    8       4     header crc: CRC32C of bytes 0..8 (the length is verified on its own)
    12      4     record crc: CRC32C chained from the previous record's crc, over bytes 0..8
                  and the payload
    16      n     payload (msgpack, see raft/codec.py)
    16+n    pad   zeros

Because records are 16-aligned and a header is 16 bytes, a header never straddles a 512-byte
sector: it is either entirely written or entirely zero, so a length is never torn. The header
crc lets recovery trust a length before reading that far. The record crc is *chained* (each
record's crc is computed starting from the previous record's), so a valid record copied to
another place, or a segment swapped for another, fails verification.

Record types: ``CRC_SEED`` (first record of every segment: the previous segment's last crc,
which seeds the chain, and the segment's seq), ``HARD_STATE`` (term, vote, commit),
``ENTRY`` (one log entry), ``SNAPSHOT`` (a snapshot at (index, term) is durable in the
snapshot directory; ``reset`` marks an installed snapshot, which discards the whole log).
A new segment starts with the seed, the current hard state and the current snapshot marker,
so whole segments before a snapshot can be deleted without losing either.

Replay rules (what the records mean, applied in order): the last ``HARD_STATE`` wins, and term
and vote never go backwards; an ``ENTRY`` at index i replaces any entry at i and everything
after it (this is how an overwritten conflicting suffix is recorded); a ``SNAPSHOT`` with
``reset`` empties the log, which restarts at its index + 1.

Writing. :meth:`WAL.save` and :meth:`WAL.save_snapshot_marker` only encode into a buffer;
:meth:`WAL.sync` writes the buffer with one ``pwrite`` and makes it durable with one fsync,
however many saves came before it (group commit). A segment is cut inside ``sync`` after the
old one is durable: the new segment is written as ``.tmp``, fsynced, renamed, and the
directory fsynced, so a segment with its final name always has a durable seed. A failed fsync
stops the process (see raft/storage/fileutil.py); a failed write makes the WAL refuse further use.

Recovery (:meth:`WAL.open`). Segments are read in seq order and every record verified. Only
the last segment may end damaged, and only in the way a crash leaves it: a record whose bytes
run past the end of the file (the file was cut short), or whose crc fails while one of its
512-byte sectors is all zeros (the write never reached that sector), and nothing but zeros
after it. Such a torn tail is truncated: its bytes are kept in ``<segment>.<offset>.broken``
(deleted along with the segment), then zeroed in the segment, and writing resumes there.
Anything else (a crc mismatch with no zero sector, a bad header, a zeroed header followed by
data, a broken chain, a missing segment, damage in any segment but the last) raises
:class:`WalCorruptionError` naming the file and offset: the node refuses to start rather
than serve a log it cannot trust. (A power loss that persisted sectors of an unsynced write
*after* a lost one is indistinguishable from a zeroed sector in synced data; it is refused
too, which is the safe side. A bit flip in a record that also holds a 512-byte-aligned run
of zeros, when it is the very last record, would pass for a torn tail.)

Threading. A WAL is used by one thread at a time (no locks: ``raft/`` imports no
``threading``). The daemon calls ``save``/``sync``/``release_to`` from a single worker thread
so fsync never blocks the event loop.
"""

from __future__ import annotations

import enum
import glob
import itertools
import logging
import os
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import google_crc32c
import msgpack

from ..codec import CodecError, decode_entry, decode_hard_state, encode_entry, encode_hard_state
from ..types import NONE, Entry, HardState, Index, Term
from .fileutil import (
    DataCorruptionError,
    FsyncFn,
    default_fsync,
    fsync_dir,
    fsync_or_die,
    is_all_zero,
    remove_leftover_temp_files,
    write_all,
    write_file_durably,
)

DEFAULT_SEGMENT_SIZE_BYTES = 64 * 1024 * 1024
RECORD_ALIGN_BYTES = 16
SECTOR_BYTES = 512

_HEAD = struct.Struct("<IBBH")  # length, type, pad, reserved: the bytes the header crc covers
_CHECKS = struct.Struct("<II")  # header crc, record crc
HEADER_BYTES = _HEAD.size + _CHECKS.size
assert HEADER_BYTES == RECORD_ALIGN_BYTES and SECTOR_BYTES % RECORD_ALIGN_BYTES == 0

_SEGMENT_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.wal$")


class RecordType(enum.IntEnum):
    CRC_SEED = 1
    HARD_STATE = 2
    ENTRY = 3
    SNAPSHOT = 4


@dataclass(frozen=True, slots=True)
class SnapshotMarker:
    """A snapshot at (index, term) is durable; ``reset``: it was installed and replaced the log."""

    index: Index
    term: Term
    reset: bool = False


WalValue = HardState | Entry | SnapshotMarker


@dataclass(frozen=True, slots=True)
class WalRecord:
    """One replayed record and where it was read (for error messages)."""

    value: WalValue
    path: str
    offset: int


class WalCorruptionError(DataCorruptionError):
    """The WAL is damaged in a way a crash cannot explain; refuse to start."""


class WalFailedError(RuntimeError):
    """A write to the WAL failed earlier; its on-disk state is unknown until a restart."""


def segment_name(seq: int, first_index: int) -> str:
    return f"{seq:016x}-{first_index:016x}.wal"


def hard_state_goes_backwards(old: HardState, new: HardState) -> bool:
    """True if ``new`` lowers the term, or changes a vote already cast in the same term."""
    if new.term != old.term:
        return new.term < old.term
    return old.vote != NONE and new.vote != old.vote


def _pack(obj: Any) -> bytes:
    out = msgpack.packb(obj, use_bin_type=True)
    assert isinstance(out, bytes)
    return out


def encode_record(record_type: RecordType, payload: bytes, prev_crc: int) -> tuple[bytes, int]:
    """The framed record and its chained crc."""
    pad = -(HEADER_BYTES + len(payload)) % RECORD_ALIGN_BYTES
    head = _HEAD.pack(len(payload), record_type, pad, 0)
    crc = google_crc32c.extend(google_crc32c.extend(prev_crc, head), payload)
    checks = _CHECKS.pack(google_crc32c.value(head), crc)
    return b"".join((head, checks, payload, bytes(pad))), crc


def _encode_value(value: WalValue) -> tuple[RecordType, bytes]:
    if isinstance(value, Entry):
        return RecordType.ENTRY, encode_entry(value)
    if isinstance(value, HardState):
        return RecordType.HARD_STATE, encode_hard_state(value)
    return RecordType.SNAPSHOT, _pack([value.index, value.term, value.reset])


def _decode_value(record_type: RecordType, payload: bytes) -> WalValue | tuple[int, int]:
    """The record's value; a seed decodes to (prev_crc, seq). Raises CodecError."""
    if record_type is RecordType.ENTRY:
        return decode_entry(payload)
    if record_type is RecordType.HARD_STATE:
        return decode_hard_state(payload)
    try:
        obj = msgpack.unpackb(payload, use_list=True, raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise CodecError(f"not valid msgpack: {exc}") from exc
    if record_type is RecordType.CRC_SEED:
        if not (isinstance(obj, list) and len(obj) == 2 and all(isinstance(v, int) for v in obj)):
            raise CodecError(f"malformed crc seed {obj!r}"[:200])
        return obj[0], obj[1]
    if not (isinstance(obj, list) and len(obj) == 3):
        raise CodecError(f"malformed snapshot marker {obj!r}"[:200])
    index, term, reset = obj
    if not (isinstance(index, int) and isinstance(term, int) and isinstance(reset, bool)):
        raise CodecError(f"malformed snapshot marker {obj!r}"[:200])
    return SnapshotMarker(Index(index), Term(term), reset)


def _has_zero_sector(data: bytes, start: int, end: int) -> bool:
    """True if some piece of ``data[start:end]`` cut at 512-byte file offsets is all zeros."""
    pos = start
    while pos < end:
        boundary = min(end, (pos // SECTOR_BYTES + 1) * SECTOR_BYTES)
        if is_all_zero(data, pos, boundary):
            return True
        pos = boundary
    return False


@dataclass(slots=True)
class _Segment:
    seq: int
    first_index: int
    path: str
    # Highest entry index written to this segment (0 if none): the segment may be deleted
    # once the log is compacted up to it (and it is not the last segment).
    max_entry_index: int


@dataclass(slots=True)
class _Scan:
    """What reading one segment found."""

    records: list[WalRecord]
    end_offset: int  # just past the last valid record
    last_crc: int  # crc of the last valid record
    max_entry_index: int
    has_seed: bool  # the segment's CRC_SEED record verified
    torn: bool  # a torn tail starts at end_offset (only allowed in the last segment)


class _Corrupt(Exception):
    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason


def _scan_segment(path: str, data: bytes, seq: int, expected_prev_crc: int | None) -> _Scan:
    """Verify and decode one segment's records; raises _Corrupt, never repairs."""
    records: list[WalRecord] = []
    offset = 0
    crc = 0
    max_entry_index = 0
    has_seed = False

    def stop(torn: bool) -> _Scan:
        return _Scan(records, offset, crc, max_entry_index, has_seed, torn)

    while True:
        if offset == len(data):
            return stop(torn=False)
        if offset + HEADER_BYTES > len(data):
            return stop(torn=True)  # the file was cut short
        if is_all_zero(data, offset, offset + HEADER_BYTES):
            if not is_all_zero(data, offset):
                raise _Corrupt(offset, "zeroed record header followed by more data")
            return stop(torn=False)
        length, type_code, pad, reserved = _HEAD.unpack_from(data, offset)
        header_crc, stored_crc = _CHECKS.unpack_from(data, offset + _HEAD.size)
        if header_crc != google_crc32c.value(data[offset : offset + _HEAD.size]):
            raise _Corrupt(offset, "record header checksum mismatch")
        if reserved != 0 or pad != -(HEADER_BYTES + length) % RECORD_ALIGN_BYTES:
            raise _Corrupt(offset, f"malformed record header (pad {pad}, reserved {reserved})")
        try:
            record_type = RecordType(type_code)
        except ValueError:
            raise _Corrupt(offset, f"unknown record type {type_code}") from None
        payload_end = offset + HEADER_BYTES + length
        end = payload_end + pad
        if end > len(data):
            return stop(torn=True)  # the file was cut short
        payload = data[offset + HEADER_BYTES : payload_end]
        if not has_seed:  # the seed: its payload names the crc the chain continues from
            if record_type is not RecordType.CRC_SEED:
                raise _Corrupt(offset, f"segment starts with {record_type.name}, not CRC_SEED")
            try:
                seed = _decode_value(record_type, payload)
            except CodecError as exc:
                raise _Corrupt(offset, f"undecodable crc seed: {exc}") from None
            assert isinstance(seed, tuple)
            crc = seed[0]
        elif record_type is RecordType.CRC_SEED:
            raise _Corrupt(offset, "CRC_SEED record in the middle of a segment")
        computed = google_crc32c.extend(
            google_crc32c.extend(crc, data[offset : offset + _HEAD.size]), payload
        )
        if computed != stored_crc:
            if _has_zero_sector(data, offset + HEADER_BYTES, payload_end):
                if not is_all_zero(data, end):
                    raise _Corrupt(offset, "record with a zeroed sector followed by more data")
                return stop(torn=True)
            raise _Corrupt(offset, "record checksum mismatch (chained crc32c)")
        if not is_all_zero(data, payload_end, end):
            raise _Corrupt(payload_end, "non-zero record padding")
        try:
            value = _decode_value(record_type, payload)
        except CodecError as exc:
            raise _Corrupt(offset, f"undecodable {record_type.name} record: {exc}") from None
        if isinstance(value, tuple):
            prev_crc, seed_seq = value
            if seed_seq != seq:
                raise _Corrupt(offset, f"crc seed names segment seq {seed_seq}, file is {seq}")
            if expected_prev_crc is not None and prev_crc != expected_prev_crc:
                raise _Corrupt(offset, "crc chain broken between this segment and the previous")
            has_seed = True
        else:
            if isinstance(value, Entry):
                max_entry_index = max(max_entry_index, value.index)
            records.append(WalRecord(value, path, offset))
        crc = computed
        offset = end


class WAL:
    """An open write-ahead log; see the module docstring for the format and the rules."""

    def __init__(
        self,
        directory: str,
        segments: list[_Segment],
        offset: int,
        crc: int,
        hard_state: HardState,
        snapshot_marker: SnapshotMarker | None,
        last_entry_index: int,
        *,
        segment_size_bytes: int,
        fsync: FsyncFn,
        logger: logging.Logger,
    ) -> None:
        """Use :meth:`open`; this only assembles the state open() recovered."""
        self._directory = directory
        # Invariant: non-empty, ordered by seq, seqs consecutive; the last one is open in _fd.
        self._segments = segments
        self._fd = os.open(segments[-1].path, os.O_RDWR)
        # Invariant: offset is 16-aligned and everything in the last segment before it is
        # valid records; everything from it on is zeros (buffered records go here next).
        self._offset = offset
        # crc of the last record encoded (buffered ones included): the next record chains on.
        self._crc = crc
        # The last hard state / snapshot marker encoded (buffered ones included); written at
        # the head of every new segment. Invariant: the hard state never goes backwards.
        self._hard_state = hard_state
        self._snapshot_marker = snapshot_marker
        # Index of the last entry after the replay rules; names the next segment.
        self._last_entry_index = last_entry_index
        self._buffer = bytearray()  # encoded records not yet written
        self._segment_size_bytes = segment_size_bytes
        self._fsync = fsync
        self._logger = logger
        self._failure: str | None = None  # set by a failed write; the WAL is then unusable

    # -- opening and recovery ---------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str,
        *,
        segment_size_bytes: int = DEFAULT_SEGMENT_SIZE_BYTES,
        fsync: FsyncFn = default_fsync,
        logger: logging.Logger | None = None,
    ) -> tuple[WAL, list[WalRecord]]:
        """Open (creating if needed) the WAL in ``directory``; return it and its records.

        Repairs a torn tail of the last segment; raises :class:`WalCorruptionError` for any
        other damage. The records are in write order, crc seeds left out.
        """
        log = logger if logger is not None else logging.getLogger(__name__)
        os.makedirs(directory, exist_ok=True)
        for name in remove_leftover_temp_files(directory, fsync):
            log.warning("removed %s: a segment creation interrupted by a crash", name)
        found: list[tuple[int, int, str]] = []
        for name in os.listdir(directory):
            match = _SEGMENT_NAME.match(name)
            if match:
                seq, first = int(match.group(1), 16), int(match.group(2), 16)
                found.append((seq, first, os.path.join(directory, name)))
        found.sort()
        if not found:
            cls._create_segment(directory, 0, 1, 0, (), segment_size_bytes, fsync)
            return cls.open(
                directory, segment_size_bytes=segment_size_bytes, fsync=fsync, logger=logger
            )
        for (prev_seq, _, _), (seq, _, path) in itertools.pairwise(found):
            if seq != prev_seq + 1:
                raise WalCorruptionError(path, 0, f"segment {prev_seq + 1:016x} is missing")

        segments: list[_Segment] = []
        records: list[WalRecord] = []
        crc: int | None = None
        scan: _Scan | None = None
        data = b""
        for i, (seq, first, path) in enumerate(found):
            with open(path, "rb") as f:
                data = f.read()
            try:
                scan = _scan_segment(path, data, seq, crc)
            except _Corrupt as exc:
                raise WalCorruptionError(path, exc.offset, exc.reason) from None
            is_last = i == len(found) - 1
            if scan.torn and not is_last:
                raise WalCorruptionError(
                    path, scan.end_offset, "damaged record in a segment that is not the last"
                )
            if not scan.has_seed:
                raise WalCorruptionError(path, 0, "segment has no valid crc seed")
            records.extend(scan.records)
            segments.append(_Segment(seq, first, path, scan.max_entry_index))
            crc = scan.last_crc
        assert scan is not None and crc is not None
        last_path = segments[-1].path
        if scan.torn:
            cls._repair_tail(last_path, data, scan.end_offset, fsync, log)
        if len(data) < segment_size_bytes:
            fd = os.open(last_path, os.O_RDWR)
            try:
                os.posix_fallocate(fd, 0, segment_size_bytes)
                fsync_or_die(fd, fsync, last_path)
            finally:
                os.close(fd)

        hard_state = HardState()
        marker: SnapshotMarker | None = None
        last_entry_index = 0
        for record in records:
            value = record.value
            if isinstance(value, HardState):
                if hard_state_goes_backwards(hard_state, value):
                    raise WalCorruptionError(
                        record.path,
                        record.offset,
                        f"hard state {value} goes back from {hard_state}",
                    )
                hard_state = value
            elif isinstance(value, Entry):
                last_entry_index = value.index
            else:
                marker = value
                if value.reset:
                    last_entry_index = value.index
        wal = cls(
            directory,
            segments,
            scan.end_offset,
            crc,
            hard_state,
            marker,
            last_entry_index,
            segment_size_bytes=segment_size_bytes,
            fsync=fsync,
            logger=log,
        )
        return wal, records

    @staticmethod
    def _repair_tail(
        path: str, data: bytes, offset: int, fsync: FsyncFn, log: logging.Logger
    ) -> None:
        """Keep the torn bytes aside in a .broken file, then zero them in the segment."""
        garbage_end = len(data.rstrip(b"\0"))
        if garbage_end <= offset:
            return  # the file was cut short exactly at a record boundary: nothing to keep
        broken_path = f"{path}.{offset:x}.broken"
        write_file_durably(broken_path, [data[offset:garbage_end]], fsync)
        fd = os.open(path, os.O_RDWR)
        try:
            write_all(fd, bytes(garbage_end - offset), offset)
            fsync_or_die(fd, fsync, path)
        finally:
            os.close(fd)
        log.warning(
            "%s: torn tail at offset %d truncated; %d bytes kept in %s",
            path,
            offset,
            garbage_end - offset,
            broken_path,
        )

    @staticmethod
    def _create_segment(
        directory: str,
        seq: int,
        first_index: int,
        prev_crc: int,
        head_values: Iterable[WalValue],
        segment_size_bytes: int,
        fsync: FsyncFn,
    ) -> tuple[_Segment, int, int]:
        """Write a new segment durably (seed + ``head_values``); returns it, its end and crc."""
        seed, crc = encode_record(RecordType.CRC_SEED, _pack([prev_crc, seq]), prev_crc)
        chunks = [seed]
        for value in head_values:
            record_type, payload = _encode_value(value)
            framed, crc = encode_record(record_type, payload, crc)
            chunks.append(framed)
        path = os.path.join(directory, segment_name(seq, first_index))
        write_file_durably(path, chunks, fsync, preallocate_bytes=segment_size_bytes)
        return _Segment(seq, first_index, path, 0), sum(len(c) for c in chunks), crc

    # -- writing -------------------------------------------------------------------------

    def _encode(self, value: WalValue) -> None:
        record_type, payload = _encode_value(value)
        framed, self._crc = encode_record(record_type, payload, self._crc)
        self._buffer += framed

    def save(self, hard_state: HardState, entries: Sequence[Entry]) -> None:
        """Buffer a hard state (skipped when empty) and entries; durable after :meth:`sync`.

        Raises AssertionError if the hard state would move term or vote backwards.
        """
        self._check_usable()
        if not hard_state.is_empty() and hard_state != self._hard_state:
            if hard_state_goes_backwards(self._hard_state, hard_state):
                raise AssertionError(
                    f"hard state {hard_state} goes backwards from {self._hard_state}"
                )
            self._encode(hard_state)
            self._hard_state = hard_state
        for entry in entries:
            self._encode(entry)
        if entries:
            self._last_entry_index = entries[-1].index
            last = self._segments[-1]
            last.max_entry_index = max(last.max_entry_index, entries[-1].index)

    def save_snapshot_marker(self, marker: SnapshotMarker) -> None:
        """Buffer a snapshot marker (the snapshot file must already be durable)."""
        self._check_usable()
        self._encode(marker)
        self._snapshot_marker = marker
        if marker.reset:
            self._last_entry_index = marker.index

    def sync(self) -> None:
        """Write everything buffered and make it durable with one fsync; cut if full."""
        self._check_usable()
        if not self._buffer:
            return
        try:
            write_all(self._fd, self._buffer, self._offset)
        except OSError as exc:
            self._failure = f"write to {self._segments[-1].path} failed: {exc!r}"
            raise WalFailedError(self._failure) from exc
        self._offset += len(self._buffer)
        self._buffer.clear()
        fsync_or_die(self._fd, self._fsync, self._segments[-1].path)
        if self._offset >= self._segment_size_bytes:
            self._cut()

    def _cut(self) -> None:
        """Start the next segment; the current one is durable (sync just flushed it)."""
        head: list[WalValue] = []
        if not self._hard_state.is_empty():
            head.append(self._hard_state)
        if self._snapshot_marker is not None:
            head.append(SnapshotMarker(self._snapshot_marker.index, self._snapshot_marker.term))
        try:
            segment, offset, crc = self._create_segment(
                self._directory,
                self._segments[-1].seq + 1,
                self._last_entry_index + 1,
                self._crc,
                head,
                self._segment_size_bytes,
                self._fsync,
            )
            fd = os.open(segment.path, os.O_RDWR)
        except OSError as exc:
            self._failure = f"cutting a new segment failed: {exc!r}"
            raise WalFailedError(self._failure) from exc
        os.close(self._fd)
        self._fd, self._offset, self._crc = fd, offset, crc
        self._segments.append(segment)

    def release_to(self, index: Index) -> list[str]:
        """Delete the oldest segments whose entries are all at or below ``index``.

        The last segment is always kept. Call only once the log up to ``index`` is covered
        by a durable snapshot. Their ``.broken`` files go too. Returns the paths removed.
        """
        self._check_usable()
        removed: list[str] = []
        while len(self._segments) > 1 and self._segments[0].max_entry_index <= index:
            segment = self._segments.pop(0)
            os.unlink(segment.path)
            removed.append(segment.path)
            # Torn tails kept aside from this segment go with it.
            for broken in glob.glob(glob.escape(segment.path) + ".*.broken"):
                os.unlink(broken)
                removed.append(broken)
        if removed:
            fsync_dir(self._directory, self._fsync)
        return removed

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise WalFailedError(self._failure)

    def close(self) -> None:
        """Close the file; anything buffered and not synced is dropped."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- introspection (tests, metrics) ----------------------------------------------------

    @property
    def directory(self) -> str:
        return self._directory

    def segment_paths(self) -> list[str]:
        return [s.path for s in self._segments]

    @property
    def write_offset(self) -> int:
        """Offset in the last segment where the next buffered record will be written."""
        return self._offset + len(self._buffer)

    @property
    def synced_offset(self) -> int:
        """End of the durable records in the last segment."""
        return self._offset
