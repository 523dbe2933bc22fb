"""Byte encodings of the Raft vocabulary, shared by the WAL, snapshots and the peer transport.

Every value is encoded as a msgpack array with a fixed field order (never a map: arrays are
smaller and their encoding is canonical), so the same value always yields the same bytes.
Decoding validates shapes and ranges (every term, index and id at most ``MAX_VALUE``) and
raises :class:`CodecError` with what was wrong; callers that read from disk add the file and
offset.
"""

from __future__ import annotations

from typing import Any

import msgpack

from .types import (
    MAX_VALUE,
    ConfChange,
    ConfChangeSingle,
    ConfChangeTransition,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Index,
    Message,
    MessageType,
    NodeId,
    Snapshot,
    SnapshotMetadata,
    Term,
)


class CodecError(ValueError):
    """Bytes that do not decode to the expected value."""


# Every term, index and node id decoded is at most MAX_VALUE (defined beside Raft's MAX_TERM,
# which is derived from it, so the terms Raft can reach always encode with room to campaign).
# No real cluster comes near it, and keeping well below 2^64 means a value from a peer plus
# one (a new term, the next index) still fits the WAL's unsigned 64-bit integers: a
# malformed value is refused here rather than crashing the writer later.


def _in_range(*values: Any) -> bool:
    return all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_VALUE for v in values
    )


def _ids(values: Any) -> tuple[NodeId, ...]:
    if not isinstance(values, (list, tuple)) or not _in_range(*values):
        raise CodecError(f"expected a list of node ids, got {values!r}"[:300])
    return tuple(NodeId(v) for v in values)


def _array(obj: Any, length: int, what: str) -> list[Any]:
    if not isinstance(obj, list) or len(obj) != length:
        raise CodecError(f"malformed {what}: expected an array of {length}, got {obj!r}"[:300])
    return obj


def _unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, use_list=True, raw=False, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise CodecError(f"not valid msgpack: {exc}") from exc


def _pack(obj: Any) -> bytes:
    out = msgpack.packb(obj, use_bin_type=True)
    assert isinstance(out, bytes)
    return out


# -- plain-object forms (nested inside other values) ------------------------------------


def entry_to_obj(entry: Entry) -> list[Any]:
    return [entry.term, entry.index, int(entry.type), entry.data]


def entry_from_obj(obj: Any) -> Entry:
    term, index, type_, data = _array(obj, 4, "entry")
    if not (_in_range(term, index) and isinstance(data, bytes)):
        raise CodecError(f"malformed entry fields: {obj!r}"[:300])
    try:
        entry_type = EntryType(type_)
    except ValueError as exc:
        raise CodecError(f"unknown entry type {type_!r}") from exc
    return Entry(Term(term), Index(index), entry_type, data)


def conf_state_to_obj(cs: ConfState) -> list[Any]:
    return [
        list(cs.voters),
        list(cs.learners),
        list(cs.voters_outgoing),
        list(cs.learners_next),
        cs.auto_leave,
    ]


def conf_state_from_obj(obj: Any) -> ConfState:
    voters, learners, outgoing, learners_next, auto_leave = _array(obj, 5, "conf state")
    return ConfState(
        voters=_ids(voters),
        learners=_ids(learners),
        voters_outgoing=_ids(outgoing),
        learners_next=_ids(learners_next),
        auto_leave=bool(auto_leave),
    )


def snapshot_metadata_to_obj(meta: SnapshotMetadata) -> list[Any]:
    return [conf_state_to_obj(meta.conf_state), meta.index, meta.term]


def snapshot_metadata_from_obj(obj: Any) -> SnapshotMetadata:
    cs, index, term = _array(obj, 3, "snapshot metadata")
    if not _in_range(index, term):
        raise CodecError(f"malformed snapshot metadata: {obj!r}"[:300])
    return SnapshotMetadata(conf_state_from_obj(cs), Index(index), Term(term))


def snapshot_to_obj(snap: Snapshot) -> list[Any]:
    return [snap.data, snapshot_metadata_to_obj(snap.metadata)]


def snapshot_from_obj(obj: Any) -> Snapshot:
    data, meta = _array(obj, 2, "snapshot")
    if not isinstance(data, bytes):
        raise CodecError("malformed snapshot: data is not bytes")
    return Snapshot(data, snapshot_metadata_from_obj(meta))


def hard_state_to_obj(hs: HardState) -> list[Any]:
    return [hs.term, hs.vote, hs.commit]


def hard_state_from_obj(obj: Any) -> HardState:
    term, vote, commit = _array(obj, 3, "hard state")
    if not _in_range(term, vote, commit):
        raise CodecError(f"malformed hard state: {obj!r}"[:300])
    return HardState(Term(term), NodeId(vote), Index(commit))


def message_to_obj(m: Message) -> list[Any]:
    return [
        int(m.type),
        m.to,
        m.from_,
        m.term,
        m.log_term,
        m.index,
        [entry_to_obj(e) for e in m.entries],
        m.commit,
        None if m.snapshot is None else snapshot_to_obj(m.snapshot),
        m.reject,
        m.reject_hint,
        m.context,
    ]


def message_from_obj(obj: Any) -> Message:
    (type_, to, frm, term, log_term, index, entries, commit, snap, reject, hint, context) = _array(
        obj, 12, "message"
    )
    try:
        msg_type = MessageType(type_)
    except ValueError as exc:
        raise CodecError(f"unknown message type {type_!r}") from exc
    if not _in_range(to, frm, term, log_term, index, commit, hint) or not isinstance(
        context, bytes
    ):
        raise CodecError(f"malformed message fields: {obj!r}"[:300])
    if not isinstance(entries, list):
        raise CodecError("malformed message: entries is not an array")
    return Message(
        type=msg_type,
        to=NodeId(to),
        from_=NodeId(frm),
        term=Term(term),
        log_term=Term(log_term),
        index=Index(index),
        entries=tuple(entry_from_obj(e) for e in entries),
        commit=Index(commit),
        snapshot=None if snap is None else snapshot_from_obj(snap),
        reject=bool(reject),
        reject_hint=Index(hint),
        context=context,
    )


# -- byte forms --------------------------------------------------------------------------


def encode_entry(entry: Entry) -> bytes:
    return _pack(entry_to_obj(entry))


def decode_entry(data: bytes) -> Entry:
    return entry_from_obj(_unpack(data))


def encode_hard_state(hs: HardState) -> bytes:
    return _pack(hard_state_to_obj(hs))


def decode_hard_state(data: bytes) -> HardState:
    return hard_state_from_obj(_unpack(data))


def encode_snapshot_metadata(meta: SnapshotMetadata) -> bytes:
    return _pack(snapshot_metadata_to_obj(meta))


def decode_snapshot_metadata(data: bytes) -> SnapshotMetadata:
    return snapshot_metadata_from_obj(_unpack(data))


def encode_message(m: Message) -> bytes:
    return _pack(message_to_obj(m))


def decode_message(data: bytes) -> Message:
    return message_from_obj(_unpack(data))


def encode_messages(msgs: list[Message] | tuple[Message, ...]) -> bytes:
    """A batch of messages in one frame (the transport sends batches)."""
    return _pack([message_to_obj(m) for m in msgs])


def decode_messages(data: bytes) -> list[Message]:
    obj = _unpack(data)
    if not isinstance(obj, list):
        raise CodecError("malformed message batch: not an array")
    return [message_from_obj(m) for m in obj]


def encode_conf_change(cc: ConfChange) -> bytes:
    return _pack([[[int(c.type), c.node_id] for c in cc.changes], int(cc.transition), cc.context])


def decode_conf_change(data: bytes) -> ConfChange:
    changes, transition, context = _array(_unpack(data), 3, "conf change")
    if not isinstance(changes, list) or not isinstance(context, bytes):
        raise CodecError("malformed conf change")
    singles = []
    for c in changes:
        type_, node = _array(c, 2, "conf change single")
        if not _in_range(node):
            raise CodecError(f"malformed conf change single {c!r}"[:300])
        try:
            singles.append(ConfChangeSingle(ConfChangeType(type_), NodeId(int(node))))
        except (ValueError, TypeError) as exc:
            raise CodecError(f"malformed conf change single {c!r}") from exc
    try:
        tr = ConfChangeTransition(transition)
    except ValueError as exc:
        raise CodecError(f"unknown conf change transition {transition!r}") from exc
    return ConfChange(tuple(singles), tr, context)
