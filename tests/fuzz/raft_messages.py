"""Malformed Raft messages and snapshots, as a member gone wrong would send them.

Theory of operation. An authenticated peer is trusted to be a member, not to be right: a
member's bug or corrupted memory must not kill or wedge another member, and nothing it sends
may be persisted unless it is valid. Raft itself does not defend against a member that lies
in well-formed messages (a valid MsgTimeoutNow, a valid MsgApp at the current term), and
neither does rallypoint (docs/security.md, "Security"), so the fuzzer never sends one as an insider.

Each message starts from a plausible one built from the cluster's current view (its term,
its last index, the member it is sent to and a member it claims to come from), then takes
exactly one kind of damage (:data:`DAMAGES`): a term, index or id out of range (2^62 and
up, near 2^64, negative), a field of the wrong type, an unknown message or entry type, ends
that differ from the batch's, a MsgSnap inside a batch, entries that would not apply (no
header, an unknown version, a command that does not decode, a configuration change or its
context that does not decode), a wrong shape (array length, a map, entries that are not an
array), or bytes that do not decode at all (truncated, trailing bytes, noise, a flipped bit).

What is sent is decided by :func:`message_problem`, written from the wire contract (the
message codec's documented ranges and shapes, the peer service's documented checks) rather
than from the receiver's code: it names what is wrong with the bytes, or returns None when
it finds nothing wrong. A message it finds nothing wrong with may be well-formed (a bit
flip that changed a term, say) and is not sent. For entries and snapshots, "would apply" is
decided with the product's own decoders; they only ever keep a message from being sent.

Snapshots (:class:`SnapshotRecipe`) are damaged the same way: a declared size over the
member's limit (up to 2^64 - 1), a wrong checksum, a chunk past the declared end, a file
whose format is broken under a correct checksum, garbage content in a valid file (state
that does not decode, no voter, voters without addresses, index or term 0, a term past its
sender's), a bad MsgSnap header, the wrong ends, or a transfer left unfinished.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import google_crc32c
import msgpack
from hypothesis import strategies as st

from rallypoint.coordinator.member_table import ConfChangeContext, decode_app_snapshot
from rallypoint.coordinator.state.commands import decode_envelope
from rallypoint.coordinator.state.machine import Limits, StateMachine
from rallypoint.raft.codec import decode_conf_change
from rallypoint.raft.storage.snapshotter import MAGIC
from rallypoint.raft.types import EntryType, MessageType

from .wire import weighted

MAX_VALUE = 2**62 - 1  # every term, index and id a peer sends is at most this (codec.py)
ENTRY_HEADER = struct.Struct(">BQQ")  # version, proposer, proposal id (node/proposals.py)
ENTRY_VERSION = 1

OUT_OF_RANGE = (2**62, 2**62 + 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1, -1, -(2**63))
WRONG_TYPES: tuple[Any, ...] = ("7", 1.5, None, [1], b"\x01", {"a": 1}, float("nan"))
UNKNOWN_TYPES = (19, 99, 255, -1, 2**32)

DAMAGES = (
    "out_of_range",
    "wrong_type",
    "unknown_type",
    "wrong_ends",
    "snap_in_batch",
    "bad_entries",
    "shape",
    "undecodable",
)
# Positions in a message array (raft/codec.py message_to_obj) that hold numbers.
_TYPE, _TO, _FROM, _TERM, _LOG_TERM, _INDEX, _ENTRIES, _COMMIT, _SNAP = range(9)
_REJECT, _HINT, _CONTEXT = 9, 10, 11
_NUMBERS = (_TO, _FROM, _TERM, _LOG_TERM, _INDEX, _COMMIT, _HINT)


@dataclass
class PeerView:
    """The cluster as the fuzzer last saw it; materialising a recipe reads it."""

    receiver: int
    sender: int
    others: tuple[int, ...]
    term: int
    last_index: int


@dataclass(frozen=True, slots=True)
class RaftRecipe:
    """Everything drawn for one message; :func:`materialise` turns it into bytes."""

    type_: int
    term_delta: int
    index_delta: int
    entry_count: int
    with_snapshot: bool
    damage: str
    slot: int
    value: Any
    noise: bytes


def raft_recipes() -> st.SearchStrategy[RaftRecipe]:
    return st.builds(
        RaftRecipe,
        type_=st.sampled_from([int(t) for t in MessageType]),
        term_delta=st.integers(-2, 2),
        index_delta=st.integers(-3, 3),
        entry_count=st.integers(0, 3),
        with_snapshot=st.booleans(),
        damage=st.sampled_from(DAMAGES),
        slot=st.integers(0, 2**16),
        value=weighted(
            [
                (3, st.sampled_from(OUT_OF_RANGE)),
                (2, st.sampled_from(WRONG_TYPES)),
                (1, st.integers(2**62, 2**64 - 1)),
                (1, st.integers(-(2**63), -1)),
            ]
        ),
        noise=st.binary(max_size=48),
    )


def _garbage_entry_data(variant: int, noise: bytes) -> tuple[int, bytes]:
    """(entry type, data) of an entry that cannot apply."""
    header = ENTRY_HEADER.pack(ENTRY_VERSION, 1, 7)
    choices: list[tuple[int, bytes]] = [
        (EntryType.NORMAL, bytes([ENTRY_VERSION]) + noise[:3]),  # shorter than the header
        (EntryType.NORMAL, ENTRY_HEADER.pack(2, 1, 7) + noise),  # unknown version
        (EntryType.NORMAL, header + noise),
        (EntryType.NORMAL, header + _pack([20, 1, 1, 0, 0])),  # an envelope without a command
        (EntryType.NORMAL, header + _pack(["not", "a", "record"])),
        (EntryType.CONF_CHANGE, noise),
        (EntryType.CONF_CHANGE, _pack([[[0, 9]], 0, b"\xc1"])),  # context that is not msgpack
        # A context with addresses but a proposer that is not a number.
        (EntryType.CONF_CHANGE, _pack([[[0, 9]], 0, _pack(["a:1", "b:2", [1], 2])])),
        (EntryType.CONF_CHANGE, _pack([[[7, 9]], 0, b""])),  # unknown change type
        (EntryType.CONF_CHANGE, _pack([[[0, 2**63]], 0, b""])),  # id out of range
    ]
    return choices[variant % len(choices)]


def _pack(obj: Any) -> bytes:
    out = msgpack.packb(obj, use_bin_type=True)
    assert isinstance(out, bytes)
    return out


def _snapshot_obj(view: PeerView, noise: bytes) -> list[Any]:
    conf = [[view.receiver, view.sender, *view.others], [], [], [], False]
    return [noise, [conf, view.last_index + 100, view.term]]


def _paths(obj: list[Any]) -> list[tuple[int, ...]]:
    """Every number-holding position in a message array, nested ones included."""
    paths: list[tuple[int, ...]] = [(i,) for i in _NUMBERS]
    for k, _ in enumerate(obj[_ENTRIES]):
        paths += [(_ENTRIES, k, 0), (_ENTRIES, k, 1)]
    if obj[_SNAP] is not None:
        paths += [(_SNAP, 1, 1), (_SNAP, 1, 2), (_SNAP, 1, 0, 0, 0)]
    return paths


def _set(obj: Any, path: tuple[int, ...], value: Any) -> None:
    for step in path[:-1]:
        obj = obj[step]
    obj[path[-1]] = value


def materialise(recipe: RaftRecipe, view: PeerView) -> bytes:
    """The recipe's message for ``view``, with its damage done."""
    term = max(0, view.term + recipe.term_delta)
    index = max(0, view.last_index + recipe.index_delta)
    entries = [[term, index + k + 1, int(EntryType.NORMAL), b""] for k in range(recipe.entry_count)]
    snap = _snapshot_obj(view, recipe.noise) if recipe.with_snapshot else None
    obj: Any = [
        recipe.type_,
        view.receiver,
        view.sender,
        term,
        term,
        index,
        entries,
        index,
        snap,
        False,
        0,
        b"",
    ]
    slot, value, noise = recipe.slot, recipe.value, recipe.noise
    damage = recipe.damage
    if damage == "out_of_range":
        bad = value if isinstance(value, int) else OUT_OF_RANGE[slot % len(OUT_OF_RANGE)]
        paths = _paths(obj)
        _set(obj, paths[slot % len(paths)], bad)
    elif damage == "wrong_type":
        bad = value if not isinstance(value, int) else WRONG_TYPES[slot % len(WRONG_TYPES)]
        paths = [*_paths(obj), (_CONTEXT,), (_ENTRIES,)]
        _set(obj, paths[slot % len(paths)], bad)
    elif damage == "unknown_type":
        bad = UNKNOWN_TYPES[slot % len(UNKNOWN_TYPES)]
        if entries and slot % 2:
            entries[slot % len(entries)][2] = bad
        else:
            obj[_TYPE] = bad
    elif damage == "wrong_ends":
        # Another member id in range: this message claims other ends than its batch's.
        at = _FROM if slot % 2 else _TO
        obj[at] = obj[at] + 1 + slot % 5
    elif damage == "snap_in_batch":
        obj[_TYPE] = int(MessageType.MsgSnap)
        obj[_SNAP] = _snapshot_obj(view, noise)
    elif damage == "bad_entries":
        obj[_TYPE] = int(MessageType.MsgApp if slot % 2 else MessageType.MsgProp)
        entry_type, data = _garbage_entry_data(slot // 2, noise)
        obj[_ENTRIES] = [*entries, [term, index + len(entries) + 1, int(entry_type), data]]
    elif damage == "shape":
        shapes: list[Any] = [
            obj[:-1],
            [*obj, 0],
            {"type": recipe.type_},
            recipe.type_,
            [*obj[:_ENTRIES], b"entries", *obj[_ENTRIES + 1 :]],
            [*obj[:_ENTRIES], [[term, index + 1, 0]], *obj[_ENTRIES + 1 :]],
            [*obj[:_SNAP], [b"data"], *obj[_SNAP + 1 :]],
            [*obj[:_CONTEXT], "text context"],
        ]
        obj = shapes[slot % len(shapes)]
    if damage != "undecodable":
        return _pack(obj)
    packed = _pack(obj)
    variant = slot % 4
    if variant == 0:
        return packed[: (slot // 4) % max(1, len(packed))]  # truncated
    if variant == 1:
        return packed + (noise or b"\x00")  # trailing bytes
    if variant == 2:
        return noise
    bit = (slot // 4) % (len(packed) * 8)
    flipped = bytearray(packed)
    flipped[bit // 8] ^= 1 << (bit % 8)
    return bytes(flipped)


# -- what is wrong with a message ---------------------------------------------------------


def _number_ok(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_VALUE


def _enum_ok(value: Any, enum_type: type[EntryType] | type[MessageType]) -> bool:
    """Whether ``value`` names a member of ``enum_type`` (as the codec looks it up: a value
    equal to a member's, such as True for 1 or 3.0 for 3, is not this check's business)."""
    try:
        enum_type(value)
    except (ValueError, TypeError):
        return False
    return True


def _ids_problem(values: Any) -> str | None:
    if not isinstance(values, list) or not all(_number_ok(v) for v in values):
        return f"member ids {values!r}"
    return None


def _snapshot_shape_problem(snap: Any) -> str | None:
    if not (isinstance(snap, list) and len(snap) == 2 and isinstance(snap[0], bytes)):
        return "snapshot is not [data, metadata]"
    meta = snap[1]
    if not (isinstance(meta, list) and len(meta) == 3):
        return "snapshot metadata is not [conf, index, term]"
    conf, index, term = meta
    if not (_number_ok(index) and _number_ok(term)):
        return f"snapshot index/term {index!r}/{term!r}"
    if not (isinstance(conf, list) and len(conf) == 5):
        return "configuration is not an array of 5"
    for ids in conf[:4]:
        if problem := _ids_problem(ids):
            return problem
    return None


def entry_problem(entry_type: int, data: bytes) -> str | None:
    """Why an entry a leader appends (or a follower forwards) would not apply; None when it
    would (decided with the product's decoders)."""
    try:
        if entry_type == EntryType.CONF_CHANGE:
            ConfChangeContext.decode(decode_conf_change(data).context)
        elif data:
            if len(data) < ENTRY_HEADER.size:
                return "entry shorter than its header"
            if data[0] != ENTRY_VERSION:
                return f"entry version {data[0]}"
            decode_envelope(data[ENTRY_HEADER.size :])
    except Exception as exc:  # any failure to decode means it would not apply
        return f"entry does not decode: {type(exc).__name__}"
    return None


def message_problem(raw: bytes, batch_from: int, receiver: int) -> str | None:
    """What is wrong with one encoded message of a batch from ``batch_from`` to
    ``receiver``; None when nothing is (the message may be well-formed: never sent)."""
    try:
        obj = msgpack.unpackb(raw, use_list=True, raw=False, strict_map_key=True)
    except Exception as exc:  # any failure to decode is the finding
        return f"not msgpack: {type(exc).__name__}"
    if not (isinstance(obj, list) and len(obj) == 12):
        return "not an array of 12"
    type_, to, frm = obj[_TYPE], obj[_TO], obj[_FROM]
    if not _enum_ok(type_, MessageType):
        return f"message type {type_!r}"
    for at in _NUMBERS:
        if not _number_ok(obj[at]):
            return f"field {at} = {obj[at]!r}"
    if not isinstance(obj[_CONTEXT], bytes):
        return "context is not bytes"
    entries = obj[_ENTRIES]
    if not isinstance(entries, list):
        return "entries is not an array"
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 4):
            return "an entry is not an array of 4"
        term, index, entry_type, data = entry
        if not (_number_ok(term) and _number_ok(index) and isinstance(data, bytes)):
            return f"entry fields {entry!r}"[:200]
        if not _enum_ok(entry_type, EntryType):
            return f"entry type {entry_type!r}"
    if obj[_SNAP] is not None and (problem := _snapshot_shape_problem(obj[_SNAP])):
        return problem
    if type_ == MessageType.MsgSnap:
        return "MsgSnap in a batch"
    # A proposal or read request travels on through a follower keeping its originator
    # (peer_gate.py): only its receiver must be the batch's.
    forwarded = type_ in (MessageType.MsgProp, MessageType.MsgReadIndex)
    if (frm != batch_from and not forwarded) or to != receiver:
        return f"ends {frm}->{to} in a batch {batch_from}->{receiver}"
    if type_ in (MessageType.MsgApp, MessageType.MsgProp):
        for _, _, entry_type, data in entries:
            if problem := entry_problem(entry_type, data):
                return problem
    return None


# -- snapshots ----------------------------------------------------------------------------

SNAPSHOT_FLAWS = (
    "over_limit",
    "wrong_crc",
    "past_end",
    "bad_file",
    "garbage_content",
    "bad_header",
    "wrong_ends",
    "unfinished",
)


@dataclass(frozen=True, slots=True)
class SnapshotRecipe:
    flaw: str
    variant: int
    chunk_bytes: int
    index_delta: int
    declared_size: int
    noise: bytes


def snapshot_recipes() -> st.SearchStrategy[SnapshotRecipe]:
    return st.builds(
        SnapshotRecipe,
        flaw=st.sampled_from(SNAPSHOT_FLAWS),
        variant=st.integers(0, 2**16),
        chunk_bytes=st.sampled_from((0, 0, 1, 7, 64, 1024)),
        index_delta=st.integers(1, 10**6),
        declared_size=st.sampled_from((8 * 1024**3 + 1, 2**40, 2**63, 2**64 - 1)),
        noise=st.binary(max_size=64),
    )


def snapshot_file(meta: list[Any], data: bytes) -> bytes:
    """A snapshot file (raft/storage/snapshotter.py format) holding ``data``, checksum included."""
    encoded_meta = _pack(meta)
    body = (
        MAGIC
        + struct.pack("<I", len(encoded_meta))
        + encoded_meta
        + struct.pack("<Q", len(data))
        + data
    )
    return body + struct.pack("<I", google_crc32c.value(body))


def _member_table(ids: list[int]) -> list[Any]:
    return [[i, f"127.0.0.1:{20000 + i}", f"127.0.0.1:{30000 + i}"] for i in ids]


def garbage_snapshot(recipe: SnapshotRecipe, view: PeerView) -> tuple[list[Any], bytes]:
    """(metadata, data) of a snapshot whose content cannot be installed."""
    voters = [view.receiver, view.sender, *view.others]
    index, term = view.last_index + recipe.index_delta, view.term
    conf = [voters, [], [], [], False]
    table = _member_table(voters)
    noise = recipe.noise or b"\x00"
    choices: list[tuple[list[Any], bytes]] = [
        ([conf, index, term], noise),
        ([conf, index, term], _pack([2, table, 3, noise])),
        ([conf, index, term], _pack([2, table, 3, _pack([1, 2, 3])])),
        ([conf, index, term], _pack([2, {"x": 1}, 3, noise])),
        ([conf, index, term], _pack([2, [[1, 2]], 3, noise])),
        ([conf, index, term], _pack([2, table, -5, noise])),
        ([conf, index, term], _pack([1, table, noise])),
        ([conf, index, term], _pack([9, table, 3, noise])),
        ([[[], [], [], [], False], index, term], _pack([2, table, 3, noise])),
        ([conf, 0, term], _pack([2, table, 3, noise])),
        ([conf, index, 0], _pack([2, table, 3, noise])),
        ([conf, index, term + 5], _pack([2, table, 3, noise])),
        ([conf, index, term], _pack([2, _member_table(voters[:1]), 3, noise])),
    ]
    return choices[recipe.variant % len(choices)]


def bad_file(recipe: SnapshotRecipe, meta: list[Any], data: bytes) -> bytes:
    """A file whose checksum is right and whose format is not."""
    good = snapshot_file(meta, data)
    body = good[:-4]
    variant = recipe.variant % 6
    if variant == 0:
        broken = b""  # too short for a snapshot
    elif variant == 1:
        broken = b"NOTSNAP!" + body[8:]
    elif variant == 2:
        broken = MAGIC + struct.pack("<I", 2**31) + body[12:]  # metadata past the end
    elif variant == 3:
        broken = MAGIC + struct.pack("<I", 3) + b"\xc1\xc1\xc1" + body[12 + 3 :]
    elif variant == 4:
        broken = body + b"\x00"  # the data length no longer fits the file
    else:
        broken = body[:12] + _pack([[], "x", None]) + body[12:]
    if not broken:
        return b""
    return broken + struct.pack("<I", google_crc32c.value(broken))


def snapshot_problem(file_bytes: bytes, header_term: int) -> str | None:
    """Why a complete snapshot file cannot be installed; None when it could (never sent).
    The file format and content are judged with the product's decoders."""
    from rallypoint.raft.storage.snapshotter import decode_snapshot_file

    try:
        snapshot = decode_snapshot_file("fuzz", file_bytes)
        meta = snapshot.metadata
        if meta.index < 1 or meta.term < 1:
            return "index or term 0"
        if meta.term > header_term:
            return "term past its sender's"
        if not meta.conf_state.voters:
            return "no voter"
        members, state = decode_app_snapshot(snapshot.data)
        StateMachine(Limits()).restore(state)
        if any(members.get(v) is None for v in meta.conf_state.voters):
            return "voters without addresses"
    except Exception as exc:  # any failure to decode is the finding
        return f"does not decode: {type(exc).__name__}"
    return None
