"""Golden files: where they are, and how a test compares a decoded value with its description.

A golden value is stored twice, by the release that made it: its bytes, and a JSON
description of the value (:func:`describe`). A later release decodes the bytes with its own
code and compares the result with the description field by field (:func:`assert_matches`).
Fields compare by position, as the encodings are positional (a renamed field still matches);
a field the description lacks was added later and must hold its default: a newer reader fills
what an older record lacks.

``generate.py`` writes the files; README.md says what each holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import struct
from pathlib import Path
from typing import Any

from rallypoint.coordinator.state import codec
from rallypoint.coordinator.state.errors import Failure
from rallypoint.coordinator.state.results import (
    CloseJobResult,
    CloseRoundResult,
    ClusterVersionResult,
    CompareAndSetResult,
    DeleteResult,
    NoOp,
    RemoveResult,
    RoundTrainedResult,
    StoreCompareSetResult,
    StoreDeleteResult,
    Success,
)

GOLDEN = Path(__file__).resolve().parent
COMMANDS = GOLDEN / "commands"  # <tag>-<Name>-v<version>.msgpack/.json: an encoded Envelope
# The same, for commands valid in no state (an earlier generator's samples): decoded, refused
REFUSED = COMMANDS / "refused"
RAFT = GOLDEN / "raft"  # <type>-<MsgName>.msgpack/.json: raft/codec.py's encode_message
PEER = GOLDEN / "peer"  # <Message>.binpb/.json: proto/peer/v1 messages
# v2/<Message>.binpb/.json: peer format version 2 (coordinator/peer_session.py), stamped
PEER_V2 = PEER / "v2"
DATA = GOLDEN / "data"  # a member's wal/ and snap/, as DiskStorage lays them out
RECORDS = GOLDEN / "records.json"  # every state record type's fields, per format version
SNAPSHOTS = GOLDEN / "snapshots"  # format<N>-snapshot.msgpack: StateMachine.snapshot() bytes
# records.json's mark of a field without a default.
REQUIRED = {"required": True}
DATA_SEGMENT_SIZE_BYTES = 4096  # the WAL segment size data/ was written with

# The entry data a member writes (coordinator/node/driver.py): version 1, proposing member, proposal
# id, then the encoded Envelope. The generator writes it as the format it is; the tests read
# it with the member's own code.
ENTRY_HEADER = struct.Struct(">BQQ")


def command_file(tag: int, name: str, version: int) -> Path:
    return COMMANDS / f"{tag:03d}-{name}-v{version}.msgpack"


def describe(value: Any) -> Any:
    """A JSON form of a decoded value: dataclasses as objects of their fields in order (with
    "@type", and "@tag" for state records), enums with name and value, bytes as hex."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {"@type": type(value).__name__}
        with contextlib.suppress(KeyError):
            out["@tag"] = codec.record_format(type(value)).tag
        for f in dataclasses.fields(value):
            out[f.name] = describe(getattr(value, f.name))
        return out
    if isinstance(value, enum.Enum):
        return {"enum": type(value).__name__, "name": value.name, "value": value.value}
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, (tuple, list)):
        return [describe(item) for item in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    raise TypeError(f"no golden description for {type(value).__name__}")


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise AssertionError(f"field {f.name} has no default")


def assert_matches(value: Any, expected: Any, where: str = "value") -> None:
    """Assert ``value`` (decoded by today's code) is what ``expected`` (a golden description)
    says, field by field; see the module docstring."""
    if isinstance(expected, dict) and "@type" in expected:
        assert dataclasses.is_dataclass(value) and not isinstance(value, type), (
            f"{where}: expected a {expected['@type']}, got {value!r}"
        )
        if "@tag" in expected:
            tag = codec.record_format(type(value)).tag
            assert tag == expected["@tag"], f"{where}: expected tag {expected['@tag']}, got {tag}"
        else:
            assert type(value).__name__ == expected["@type"], f"{where}: got {value!r}"
        golden_fields = [(k, v) for k, v in expected.items() if k not in ("@type", "@tag")]
        fields = dataclasses.fields(value)
        assert len(fields) >= len(golden_fields), (
            f"{where}: {type(value).__name__} lost fields: the golden value has "
            f"{[k for k, _ in golden_fields]}"
        )
        for position, f in enumerate(fields):
            field_value = getattr(value, f.name)
            if position < len(golden_fields):
                golden_name, golden_value = golden_fields[position]
                assert_matches(field_value, golden_value, f"{where}.{f.name} (was {golden_name})")
            else:
                assert field_value == _default(f), (
                    f"{where}.{f.name}: added after the golden file, so it must read as its "
                    f"default {_default(f)!r}, got {field_value!r}"
                )
    elif isinstance(expected, dict) and "enum" in expected:
        assert isinstance(value, enum.Enum), f"{where}: expected {expected}, got {value!r}"
        assert (value.name, value.value) == (expected["name"], expected["value"]), (
            f"{where}: expected {expected}, got {value!r}"
        )
    elif isinstance(expected, dict) and "hex" in expected:
        assert value == bytes.fromhex(expected["hex"]), f"{where}: got {value!r}"
    elif isinstance(expected, list):
        assert isinstance(value, (tuple, list)) and len(value) == len(expected), (
            f"{where}: expected {len(expected)} items, got {value!r}"
        )
        for i, (item, golden_item) in enumerate(zip(value, expected, strict=True)):
            assert_matches(item, golden_item, f"{where}[{i}]")
    else:
        # type() too: True == 1, but a bool field must not decode as an int.
        assert type(value) is type(expected) and value == expected, (
            f"{where}: expected {expected!r}, got {value!r}"
        )


# Answers that can mean "answered, but nothing changed": a leader's proposal gone stale, a
# comparison that did not hold, a delete or a close of nothing. A golden command's state must
# be one in which it changes what it names (generate.py, ``machine_for``).
_CHANGED: dict[type[Success], Any] = {
    CompareAndSetResult: lambda r: r.succeeded,
    DeleteResult: lambda r: r.deleted > 0,
    RemoveResult: lambda r: r.removed,
    CloseRoundResult: lambda r: r.closed,
    CloseJobResult: lambda r: r.ended_round > 0,
    ClusterVersionResult: lambda r: r.raised,
    RoundTrainedResult: lambda r: r.recorded,
    StoreCompareSetResult: lambda r: r.swapped,
    StoreDeleteResult: lambda r: r.existed,
}


def not_applied(result: Any) -> str | None:
    """Why ``result`` (of ``StateMachine.apply``) is not a command applied or answered, or
    None: a typed failure is a refusal; an answer that says nothing changed is not applied."""
    if isinstance(result, Failure):
        return f"refused: {type(result).__name__}: {result.message}"
    if not isinstance(result, Success) or isinstance(result, NoOp):
        return f"not an answer to a command: {result!r}"
    changed = _CHANGED.get(type(result))
    if changed is not None and not changed(result):
        return f"answered, but nothing changed: {result!r}"
    return None


# Peer format version 2: the stamped messages, with what their MAC covers. The golden files
# are stamped under PEER_SECRET for PEER_CHALLENGE, so the MAC's encoding is pinned too.
PEER_SECRET = b"golden-peer-secret-0123456789"
PEER_CHALLENGE = bytes(range(16))
PEER_COUNTER = 3


def peer_v2_formats() -> dict[str, tuple[bytes, Any]]:
    """Message name -> (its MAC tag, its fields function), for every stamped message."""
    from rallypoint.coordinator.peer_auth import (
        BATCH_TAG,
        CHUNK_TAG,
        LIVENESS_TAG,
        batch_fields,
        chunk_fields,
        liveness_fields,
    )

    return {
        "MessageBatch": (BATCH_TAG, batch_fields),
        "SnapshotChunk": (CHUNK_TAG, chunk_fields),
        "LivenessReport": (LIVENESS_TAG, liveness_fields),
    }
