"""The record encoding: canonical, round-trips every record, refuses malformed input."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from rallypoint.coordinator.state import codec
from rallypoint.coordinator.state.commands import (
    Add,
    CompareAndSet,
    Envelope,
    Put,
    SessionKeepAlive,
    decode_envelope,
    encode_envelope,
)
from rallypoint.coordinator.state.errors import Failure, StaleFence
from rallypoint.coordinator.state.machine import SNAPSHOT_FORMAT, StateMachine
from rallypoint.coordinator.state.results import DeleteResult, PutResult, Result, Success
from rallypoint.coordinator.state.values import Event, EventType, Fence, KeyValue


@pytest.mark.parametrize(
    "envelope",
    [
        Envelope(1, 2, 1, 1_000, Put(b"k", b"\x00\xff", 3, Fence(3, 3), True)),
        Envelope(1, 3, 0, 1_001, CompareAndSet(b"k", b"v", None, 7)),
        Envelope(1, 4, 0, 1_002, Add(b"n", -(2**63))),
        Envelope(5, 0, 2, 9, SessionKeepAlive()),
    ],
)
def test_envelopes_round_trip_as_arrays(envelope: Envelope) -> None:
    data = encode_envelope(envelope)
    assert decode_envelope(data) == envelope
    assert isinstance(msgpack.unpackb(data), list)
    assert encode_envelope(decode_envelope(data)) == data


def test_results_round_trip_through_their_union() -> None:
    kv = KeyValue(b"k", b"v", 2, 3, 2, 0)
    results: list[Result] = [
        PutResult(kv, None),
        DeleteResult(1, (kv,)),
        StaleFence(b"k", 4, 4, "newer token"),
    ]
    for result in results:
        assert codec.from_obj(codec.to_obj(result), Result) == result
    event = Event(EventType.DELETE, KeyValue(b"k", b"", 0, 4, 0), kv)
    assert codec.decode(codec.encode(event), Event) == event
    assert isinstance(results[2], Failure) and not isinstance(results[2], Success)


def test_a_command_decodes_without_the_generic_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Envelope.command`` (the base class of every command) and ``Put.fence``
    (``Fence | None``) decode straight to the tagged record: the generic path's checks for
    unions, tuples and NewTypes on every value were two thirds of a Put's decoding time,
    paid on every entry applied. Malformed input still gets the generic path's messages
    (test below)."""
    monkeypatch.setattr(codec, "_DECODERS", {})
    monkeypatch.setattr(codec, "_RECORD_DECODERS", {})
    for envelope in (
        Envelope(1, 2, 1, 1_000, Put(b"k", b"v")),
        Envelope(1, 3, 1, 1_000, Put(b"k", b"v", 3, Fence(3, 3), True)),
    ):
        data = encode_envelope(envelope)
        assert decode_envelope(data) == envelope

    def generic(obj: object, hint: object) -> object:
        raise AssertionError(f"generic decoding of {hint!r}")

    monkeypatch.setattr(codec, "_from_obj", generic)
    for envelope in (
        Envelope(1, 4, 1, 1_000, Put(b"k", b"v")),
        Envelope(1, 5, 1, 1_000, Put(b"k", b"v", 3, Fence(3, 3), True)),
    ):
        assert decode_envelope(encode_envelope(envelope)) == envelope


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb([20, 1, 2, 3, 4]), "expected 5 fields"),
        (msgpack.packb([20, 1, 2, 3, 4, [999]]), "tag 999"),
        (msgpack.packb([20, 1, 2, 3, 4, [300, b"k", b"v", 1, 1, 1, 0]]), "not a record of type"),
        (msgpack.packb([20, "1", 2, 3, 4, [9]]), "Envelope.session_id"),
        (msgpack.packb([20, 1, 2, 3, 4, [1, "text key", b"v", 0, None, False]]), "Put.key"),
        (msgpack.packb([20, 1, 2, 3, 4, [1, b"k", b"v", 0, [301, 1], False]]), "Put.fence"),
    ],
)
def test_malformed_envelopes_are_refused_with_a_reason(data: bytes, complaint: str) -> None:
    with pytest.raises(codec.StateCodecError, match=complaint):
        decode_envelope(data)


def test_a_corrupt_entry_stops_the_replica_instead_of_being_skipped() -> None:
    machine = StateMachine()
    with pytest.raises(codec.StateCodecError):
        machine.apply(1, b"\x93\x01\x02")


def test_malformed_snapshots_are_refused() -> None:
    machine = StateMachine()
    good = machine.snapshot()
    machine.restore(good)
    for bad in [
        b"",
        msgpack.packb([SNAPSHOT_FORMAT + 1, *msgpack.unpackb(good)[1:]]),
        msgpack.packb([1, 2]),
    ]:
        with pytest.raises(codec.StateCodecError):
            machine.restore(bad)
    newer = msgpack.packb([SNAPSHOT_FORMAT + 1, *msgpack.unpackb(good)[1:]])
    with pytest.raises(codec.StateCodecError) as refused:
        machine.restore(newer)
    assert str(refused.value) == (
        f"snapshot format {SNAPSHOT_FORMAT + 1} is newer than the formats this build reads "
        f"(2..{SNAPSHOT_FORMAT}): it was written by a newer version of rallypoint; upgrade this "
        "member"
    )


def test_registering_a_tag_twice_is_refused() -> None:
    with pytest.raises(TypeError, match="already names"):
        codec.record(1)(KeyValue)


def test_records_gain_trailing_fields_with_defaults_and_refuse_newer_ones() -> None:
    """Formats evolve: a record written before a field was added decodes with the field's
    default; a record with fields this version does not know is refused, saying why."""
    from rallypoint.coordinator.state.jobs import JobConfig

    config = JobConfig(2, 4)
    full = codec.to_obj(config)
    required = sum(
        1
        for f in dataclasses.fields(JobConfig)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    older = full[: 1 + required]  # as a version that knew only the required fields wrote it
    assert codec.from_obj(older, JobConfig) == config
    # Every field this build knows (trailing ones at their default are not written), then one
    # more: a newer version's.
    names = codec.record_format(JobConfig).field_names
    complete = [*full, *(getattr(config, name) for name in names[len(full) - 1 :])]
    assert codec.from_obj(complete, JobConfig) == config
    with pytest.raises(codec.StateCodecError, match="written by a newer version"):
        codec.from_obj([*complete, 7], JobConfig)
    with pytest.raises(codec.StateCodecError, match="expected"):
        codec.from_obj(full[:2], JobConfig)


# A record as a later release declares it: version 1 had ``name``, version 2 added ``weight``
# and version 3 ``labels``. Tag 9_990 is reserved for this test (not a Command).
@codec.record(9_990)
@dataclasses.dataclass(frozen=True, slots=True)
class _Evolved:
    name: str
    count: int = 0
    weight: int = codec.since(2, 1)
    labels: tuple[str, ...] = codec.since(3, ())


def test_record_formats_are_explicit_per_record_type() -> None:
    fmt = codec.record_format(_Evolved)
    assert (fmt.tag, fmt.version, fmt.required) == (9_990, 3, 1)
    assert fmt.field_versions == (1, 1, 2, 3)
    assert fmt.fields_of(1) == ("name", "count")
    assert fmt.fields_of(2) == ("name", "count", "weight")
    assert [fmt.version_of(n) for n in (1, 2, 3, 4)] == [1, 1, 2, 3]
    formats = codec.record_formats()
    assert formats[1].name == "Put" and formats[20].name == "Envelope"
    assert codec.record_class(20) is Envelope


def test_a_newer_reader_fills_the_fields_an_older_record_lacks() -> None:
    for written, expected in [
        ([9_990, "a"], _Evolved("a")),  # version 1, only its required field
        ([9_990, "a", 2], _Evolved("a", 2)),  # version 1
        ([9_990, "a", 2, 5], _Evolved("a", 2, 5)),  # version 2
        ([9_990, "a", 2, 5, ["x"]], _Evolved("a", 2, 5, ("x",))),  # version 3
    ]:
        assert codec.from_obj(written, _Evolved) == expected


def test_newer_fields_at_their_default_are_not_written_so_older_readers_can_read() -> None:
    assert codec.to_obj(_Evolved("a")) == [9_990, "a", 0]  # version-1 fields always written
    assert codec.to_obj(_Evolved("a", 2, 5)) == [9_990, "a", 2, 5]
    assert codec.to_obj(_Evolved("a", 2, 1, ("x",))) == [9_990, "a", 2, 1, ["x"]]
    for value in [_Evolved("a"), _Evolved("a", 2, 5), _Evolved("a", 2, 1, ("x",))]:
        data = codec.encode(value)
        assert codec.decode(data, _Evolved) == value
        assert codec.encode(codec.decode(data, _Evolved)) == data


def test_an_older_reader_refuses_a_newer_record_in_one_line_naming_both_versions() -> None:
    with pytest.raises(codec.StateCodecError) as caught:
        codec.from_obj([9_990, "a", 2, 5, ["x"], 7], _Evolved)
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        "_Evolved record (tag 9990) has 5 fields: it was written by a newer version of "
        "rallypoint; this build reads _Evolved up to format version 3 (4 fields); upgrade "
        "this member"
    )
    # The same for a command a future release extends, in an entry this build applies.
    future_put = msgpack.packb([20, 1, 2, 0, 5, [1, b"k", b"v", 0, None, False, False, 9]])
    with pytest.raises(codec.StateCodecError, match=r"Put record \(tag 1\) has 7 fields.*"):
        StateMachine().apply(1, future_put)


def test_registration_refuses_versions_out_of_order() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Skips:
        name: str
        late: int = codec.since(3, 0)

    @dataclasses.dataclass(frozen=True, slots=True)
    class GoesBack:
        name: str
        newer: int = codec.since(2, 0)
        older: int = 0

    for cls in (Skips, GoesBack):
        with pytest.raises(TypeError, match="versions start at 1"):
            codec.record(9_991)(cls)
    with pytest.raises(ValueError, match="version 1"):
        codec.since(1, 0)


@pytest.mark.parametrize("length", [0, 1, 15, 16, 1023, 1024, 1025, 65_535, 65_536, 70_000])
def test_a_sliced_pack_is_the_whole_pack_byte_for_byte(length: int) -> None:
    """Snapshots are packed a slice at a time (so the encoder thread lets the event loop run
    between slices); the bytes must be exactly those of one pack: equal states give equal
    snapshots, and members compare them."""
    long = [[b"k%d" % i, "v" * (i % 7), i, -i, None, {"a": i}] for i in range(length)]
    obj = [5, long, [], list(range(length)), b"x" * 300, {"n": [1, 2]}, long[:17]]
    assert codec.pack_sliced(obj) == codec.pack(obj)
    assert codec.unpack(codec.pack_sliced(obj)) == codec.unpack(codec.pack(obj))
