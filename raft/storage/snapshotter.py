"""Snapshot files: written atomically, verified whole on load, the newest valid one wins.

Theory of operation
===================

A snapshot directory holds ``<term>-<index>.snap`` files (16-digit hex each, as etcd names
them). One file::

    offset   size  field
    0        8     magic b"RPSNAP\\x00\\x01"
    8        4     metadata length m, u32 little-endian
    12       m     SnapshotMetadata (raft/codec.py: index, term, configuration)
    12+m     8     data length d, u64 little-endian
    20+m     d     the state machine's bytes
    20+m+d   4     CRC32C of every byte before it (the whole-file checksum)

:meth:`Snapshotter.save` writes ``<name>.tmp``, fsyncs it, renames it over the final name and
fsyncs the directory (raft/storage/fileutil.py ``write_file_durably``): a crash leaves either
no file
or a complete one, and leftover ``.tmp`` files are deleted on start-up, so a crash between
the temp write and the rename leaves the previous snapshot in force.

:meth:`Snapshotter.load_newest` tries files newest first and returns the first that verifies
(warning about each one skipped). A snapshot file newer than anything the WAL records is
ignored: the crash came between writing the file and logging its marker, so the rest of the
node's durable state does not know it (etcd's "valid snapshot entries" rule). If files exist
but none verifies it raises :class:`SnapshotCorruptionError` with the newest file and the
offset of the damage.

Threading: a Snapshotter touches only its directory; use it from one thread at a time.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

import google_crc32c

from ..codec import CodecError, decode_snapshot_metadata, encode_snapshot_metadata
from ..types import EMPTY_SNAPSHOT, Index, Snapshot, SnapshotMetadata, Term
from .fileutil import (
    DataCorruptionError,
    FsyncFn,
    crc32c_of,
    default_fsync,
    fsync_dir,
    remove_leftover_temp_files,
    write_file_durably,
)

MAGIC = b"RPSNAP\x00\x01"
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SNAP_NAME = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.snap$")


class SnapshotCorruptionError(DataCorruptionError):
    """No snapshot file verifies (or a specific one read on request does not)."""


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    """A snapshot file found in the directory, identified by its name."""

    path: str
    term: Term
    index: Index


def snapshot_file_name(term: int, index: int) -> str:
    return f"{term:016x}-{index:016x}.snap"


def encode_snapshot_file(snapshot: Snapshot) -> list[bytes]:
    """The file's bytes, as chunks (the data is not copied)."""
    meta = encode_snapshot_metadata(snapshot.metadata)
    head = MAGIC + _U32.pack(len(meta)) + meta + _U64.pack(len(snapshot.data))
    crc = google_crc32c.extend(google_crc32c.value(head), snapshot.data)
    return [head, snapshot.data, _U32.pack(crc)]


def decode_snapshot_file(path: str, data: bytes) -> Snapshot:
    """Verify and decode a snapshot file's bytes; raises SnapshotCorruptionError."""
    if len(data) < len(MAGIC) + _U32.size + _U64.size + _U32.size:
        raise SnapshotCorruptionError(path, len(data), "file too short for a snapshot")
    if data[: len(MAGIC)] != MAGIC:
        raise SnapshotCorruptionError(path, 0, "bad magic")
    crc_offset = len(data) - _U32.size
    (stored_crc,) = _U32.unpack_from(data, crc_offset)
    if crc32c_of(data, 0, crc_offset) != stored_crc:
        raise SnapshotCorruptionError(path, crc_offset, "whole-file checksum mismatch")
    # The checksum matched, so what follows failing would mean a writer bug, not bit rot.
    (meta_len,) = _U32.unpack_from(data, len(MAGIC))
    meta_start = len(MAGIC) + _U32.size
    data_len_offset = meta_start + meta_len
    if data_len_offset + _U64.size > crc_offset:
        raise SnapshotCorruptionError(path, len(MAGIC), "metadata length past the end")
    try:
        meta = decode_snapshot_metadata(data[meta_start:data_len_offset])
    except CodecError as exc:
        raise SnapshotCorruptionError(path, meta_start, f"bad metadata: {exc}") from None
    (data_len,) = _U64.unpack_from(data, data_len_offset)
    data_start = data_len_offset + _U64.size
    if data_start + data_len != crc_offset:
        raise SnapshotCorruptionError(path, data_len_offset, "data length does not fit the file")
    return Snapshot(data[data_start:crc_offset], meta)


class Snapshotter:
    """Saves and loads the snapshots of one node."""

    def __init__(
        self,
        directory: str,
        *,
        fsync: FsyncFn = default_fsync,
        logger: logging.Logger | None = None,
    ) -> None:
        self._directory = directory
        self._fsync = fsync
        self._logger = logger if logger is not None else logging.getLogger(__name__)
        os.makedirs(directory, exist_ok=True)
        for name in remove_leftover_temp_files(directory, fsync):
            self._logger.warning("removed %s: a snapshot write interrupted by a crash", name)

    @property
    def directory(self) -> str:
        return self._directory

    def path_for(self, metadata: SnapshotMetadata) -> str:
        return os.path.join(self._directory, snapshot_file_name(metadata.term, metadata.index))

    def save(self, snapshot: Snapshot) -> str:
        """Write ``snapshot`` durably and atomically; returns its path."""
        if snapshot.is_empty():
            raise ValueError("refusing to save an empty snapshot")
        path = self.path_for(snapshot.metadata)
        write_file_durably(path, encode_snapshot_file(snapshot), self._fsync)
        return path

    def files(self) -> list[SnapshotFile]:
        """Snapshot files present, newest (highest index, then term) first."""
        found = []
        for name in os.listdir(self._directory):
            match = _SNAP_NAME.match(name)
            if match:
                term, index = int(match.group(1), 16), int(match.group(2), 16)
                found.append(
                    SnapshotFile(os.path.join(self._directory, name), Term(term), Index(index))
                )
        found.sort(key=lambda f: (f.index, f.term), reverse=True)
        return found

    def read(self, snapshot_file: SnapshotFile) -> Snapshot:
        """Read and verify one file; its metadata must match its name."""
        with open(snapshot_file.path, "rb") as f:
            data = f.read()
        snapshot = decode_snapshot_file(snapshot_file.path, data)
        meta = snapshot.metadata
        if (meta.index, meta.term) != (snapshot_file.index, snapshot_file.term):
            raise SnapshotCorruptionError(
                snapshot_file.path,
                len(MAGIC),
                f"metadata says {meta.term}/{meta.index}, the file name does not",
            )
        return snapshot

    def load_newest(
        self,
        max_index: Index,
        accept: Callable[[SnapshotMetadata], str | None] = lambda meta: None,
    ) -> Snapshot:
        """The newest snapshot that verifies, is at or below ``max_index`` and ``accept``s.

        ``accept`` returns None to take a snapshot or a reason to skip it. Returns
        EMPTY_SNAPSHOT when no file is a candidate; raises SnapshotCorruptionError (for the
        newest candidate) when candidates exist and none is usable.
        """
        first_error: SnapshotCorruptionError | None = None
        for snapshot_file in self.files():
            if snapshot_file.index > max_index:
                self._logger.info(
                    "ignoring %s: the WAL does not record it (crash before its marker)",
                    snapshot_file.path,
                )
                continue
            try:
                snapshot = self.read(snapshot_file)
                reason = accept(snapshot.metadata)
                if reason is not None:
                    raise SnapshotCorruptionError(snapshot_file.path, 0, reason)
            except SnapshotCorruptionError as exc:
                self._logger.warning("skipping snapshot: %s; trying an older one", exc)
                first_error = first_error or exc
                continue
            if first_error is not None:
                self._logger.warning(
                    "fell back to snapshot %s after the newer one failed", snapshot_file.path
                )
            return snapshot
        if first_error is not None:
            raise SnapshotCorruptionError(
                first_error.path,
                first_error.offset,
                f"{first_error.reason}; and no older snapshot verifies",
            )
        return EMPTY_SNAPSHOT

    def retain(self, keep: int) -> list[str]:
        """Delete all but the ``keep`` newest snapshot files; returns the paths removed."""
        if keep < 1:
            raise ValueError("keep at least one snapshot")
        removed = [f.path for f in self.files()[keep:]]
        for path in removed:
            os.unlink(path)
        if removed:
            fsync_dir(self._directory, self._fsync)
        return removed
