"""Today's code reads every golden file (see README.md) and, where the encoding is canonical,
writes the same bytes again; every command, record, Raft and peer message type has one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from rallypoint.coordinator.peer_auth import PeerKey
from rallypoint.coordinator.peer_session import InboundSession, Stamp
from rallypoint.coordinator.state import codec
from rallypoint.coordinator.state.commands import Command, decode_envelope, encode_envelope
from rallypoint.coordinator.state.errors import InvalidCommand, StaleFence
from rallypoint.coordinator.state.machine import StateMachine
from rallypoint.proto.peer.v1 import peer_pb2
from rallypoint.raft.codec import (
    decode_conf_change,
    decode_message,
    encode_conf_change,
    encode_message,
)
from rallypoint.raft.types import MessageType

from .formats import (
    COMMANDS,
    PEER,
    PEER_SECRET,
    PEER_V2,
    RAFT,
    RECORDS,
    REFUSED,
    REQUIRED,
    assert_matches,
    describe,
    not_applied,
    peer_v2_formats,
)
from .generate import machine_for

assert StateMachine  # every state record type is registered once the machine is imported


def golden(path: Path) -> tuple[bytes, Any]:
    return path.read_bytes(), json.loads(path.with_suffix(".json").read_text())


def our_records() -> dict[int, codec.RecordFormat]:
    return {
        tag: fmt
        for tag, fmt in codec.record_formats().items()
        if codec.record_class(tag).__module__.startswith("rallypoint.coordinator.")
    }


# ------------------------------------------------------------------ commands


def test_every_command_type_has_a_golden_file_at_its_current_version() -> None:
    missing = [
        f"{fmt.tag:03d}-*-v{fmt.version}.msgpack ({fmt.name})"
        for fmt in our_records().values()
        if issubclass(codec.record_class(fmt.tag), Command)
        and not list(COMMANDS.glob(f"{fmt.tag:03d}-*-v{fmt.version}.msgpack"))
    ]
    assert not missing, f"run tests/golden/generate.py; no golden file for {missing}"


@pytest.mark.parametrize("path", sorted(COMMANDS.glob("*.msgpack")), ids=lambda p: p.stem)
def test_command_golden_files_decode_field_by_field_and_encode_the_same(path: Path) -> None:
    data, expected = golden(path)
    envelope = decode_envelope(data)
    assert_matches(envelope, expected, "envelope")
    assert encode_envelope(envelope) == data


@pytest.mark.parametrize("path", sorted(COMMANDS.glob("*.msgpack")), ids=lambda p: p.stem)
def test_every_command_golden_file_is_applied_or_answered_not_refused(path: Path) -> None:
    # Applied in a state where the command is valid (generate.py's SETUP: its session, lease,
    # job, round and checkpoint exist), today's code must do what the old bytes asked, not
    # refuse them; an exception would stop a replica.
    data = path.read_bytes()
    machine, index = machine_for(decode_envelope(data).command)
    problem = not_applied(machine.apply(index, data))
    assert problem is None, f"{path.name}: {problem}"


# Why each file of commands/refused/ is refused wherever it is applied.
REFUSED_AS = {
    "001-Put-v1": StaleFence,  # token 12 for lease 7, whose token is 7
    "002-Delete-v1": StaleFence,
    "003-CompareAndSet-v1": InvalidCommand,  # three comparisons, where one is allowed
    "004-Add-v1": StaleFence,
}


def test_every_refused_command_golden_file_says_why() -> None:
    assert sorted(p.stem for p in REFUSED.glob("*.msgpack")) == sorted(REFUSED_AS)


@pytest.mark.parametrize("path", sorted(REFUSED.glob("*.msgpack")), ids=lambda p: p.stem)
def test_refused_command_golden_files_still_decode_and_are_refused_as_before(path: Path) -> None:
    """Bytes an earlier release wrote with every field set, kept although no state accepts
    them: they still decode field by field, encode the same, and are refused, not a crash."""
    data, expected = golden(path)
    envelope = decode_envelope(data)
    assert_matches(envelope, expected, "envelope")
    assert encode_envelope(envelope) == data
    machine, index = machine_for(envelope.command)
    assert type(machine.apply(index, data)) is REFUSED_AS[path.stem]


# ------------------------------------------------------------------ record schemas


def test_every_record_version_is_in_records_json_as_it_was() -> None:
    recorded: dict[str, Any] = json.loads(RECORDS.read_text())
    for tag_text, entry in recorded.items():
        tag = int(tag_text)
        cls = codec.record_class(tag)  # a tag is never dropped or reused
        fmt = codec.record_format(cls)
        for version_text, fields in entry["versions"].items():
            version = int(version_text)
            assert version <= fmt.version, f"{fmt.name} lost format version {version}"
            current = dataclasses.fields(cls)[: len(fmt.fields_of(version))]
            now = [
                [f.name, added, _default_description(f)]
                for f, added in zip(current, fmt.field_versions, strict=False)
            ]
            assert now == fields, (
                f"{fmt.name} (tag {tag}) format version {version} was {fields}, is now {now}: "
                "fields are only ever appended, with since(<new version>, default), and a "
                "default never changes (older records read as it)"
            )
    unrecorded = [
        f"{fmt.name} v{fmt.version}"
        for tag, fmt in our_records().items()
        if str(fmt.version) not in recorded.get(str(tag), {}).get("versions", {})
    ]
    assert not unrecorded, f"run tests/golden/generate.py; records.json lacks {unrecorded}"


def _default_description(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return describe(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return describe(f.default_factory())
    return REQUIRED


# ------------------------------------------------------------------ raft messages


def test_every_raft_message_type_has_a_golden_file() -> None:
    names = {path.stem for path in RAFT.glob("*.msgpack")}
    missing = [t.name for t in MessageType if f"{t.value:02d}-{t.name}" not in names]
    assert not missing, f"run tests/golden/generate.py; no golden message for {missing}"


@pytest.mark.parametrize("path", sorted(RAFT.glob("??-Msg*.msgpack")), ids=lambda p: p.stem)
def test_raft_messages_decode_field_by_field_and_encode_the_same(path: Path) -> None:
    data, expected = golden(path)
    message = decode_message(data)
    assert_matches(message, expected, "message")
    assert encode_message(message) == data


def test_the_conf_change_decodes_field_by_field_and_encodes_the_same() -> None:
    from rallypoint.coordinator.member_table import ConfChangeContext

    data, expected = golden(RAFT / "conf-change.msgpack")
    change = decode_conf_change(data)
    assert_matches(change, expected, "conf change")
    assert encode_conf_change(change) == data
    context = ConfChangeContext.decode(change.context)
    assert context == ConfChangeContext("10.0.0.4:7001", "10.0.0.4:7000", 1, 33)


# ------------------------------------------------------------------ peer messages


def test_every_peer_message_has_a_golden_file() -> None:
    names = set(peer_pb2.DESCRIPTOR.message_types_by_name)
    missing = sorted(name for name in names if not (PEER / f"{name}.binpb").exists())
    assert not missing, f"run tests/golden/generate.py; no golden peer message for {missing}"


@pytest.mark.parametrize("path", sorted(PEER.glob("*.binpb")), ids=lambda p: p.stem)
def test_peer_messages_parse_field_by_field_and_serialize_the_same(path: Path) -> None:
    data, expected = golden(path)
    message = getattr(peer_pb2, path.stem).FromString(data)
    assert json_format.MessageToDict(message, preserving_proto_field_name=True) == expected
    assert message.SerializeToString(deterministic=True) == data
    # The Raft messages inside are today's encoding too.
    inner = [*list(getattr(message, "messages", [])), getattr(message, "message", b"")]
    for encoded in filter(None, inner):
        assert encode_message(decode_message(encoded)) == encoded


def test_every_stamped_peer_message_has_a_golden_file_of_format_2() -> None:
    missing = sorted(n for n in peer_v2_formats() if not (PEER_V2 / f"{n}.binpb").exists())
    assert not missing, f"run tests/golden/generate.py; no format-2 golden for {missing}"


@pytest.mark.parametrize("path", sorted(PEER_V2.glob("*.binpb")), ids=lambda p: p.stem)
def test_format_2_peer_messages_parse_and_their_mac_still_verifies(path: Path) -> None:
    """The session stamp's encoding (peer_session.py) is part of the wire format: a member
    of a later release must verify the MAC a member of this one made."""
    data, expected = golden(path)
    message = getattr(peer_pb2, path.stem).FromString(data)
    assert json_format.MessageToDict(message, preserving_proto_field_name=True) == expected
    assert message.SerializeToString(deterministic=True) == data
    tag, fields = peer_v2_formats()[path.stem]
    receiver = InboundSession(PeerKey(PEER_SECRET), challenge=message.challenge)
    stamp = Stamp(message.challenge, message.counter, message.mac)
    assert receiver.authentic(tag, fields(message), stamp)
    receiver.accept(stamp)
