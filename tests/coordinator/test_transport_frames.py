"""A BATCH frame's body made and read without a protobuf object (peerwire/frames.py's
``encode_batch`` and ``decode_batch``) is the wire format it was: the same bytes as
``encode_record`` of a MessageBatch, and every body read as ``decode_record`` reads it,
refused where it refuses.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.coordinator.peer_auth import batch_fields, batch_parts
from rallypoint.coordinator.peerwire.frames import (
    FrameError,
    decode_batch,
    decode_record,
    encode_batch,
    encode_record,
)
from rallypoint.proto.peer.v1 import peer_pb2

U64 = st.integers(min_value=0, max_value=2**64 - 1)
FIELDS = ("cluster_id", "from_id", "to_id", "messages", "incarnation", "abstaining", "mac")
FIELDS += ("challenge", "counter")


@settings(max_examples=150, deadline=None)
@given(
    cluster_id=U64,
    from_id=U64,
    to_id=U64,
    messages=st.lists(st.binary(max_size=64), max_size=5),
    incarnation=U64,
    abstaining=st.booleans(),
    mac=st.binary(max_size=40),
    challenge=st.binary(max_size=20),
    counter=U64,
)
def test_a_batch_encodes_to_the_bytes_of_its_record_and_reads_back(**fields: Any) -> None:
    record = peer_pb2.MessageBatch(**fields)
    body = encode_batch(**fields)
    assert body == encode_record(record)
    batch = decode_batch(body)
    assert {name: getattr(batch, name) for name in FIELDS} == fields
    assert batch_fields(batch) == batch_fields(record)
    assert batch_fields(record) == batch_parts(
        fields["cluster_id"],
        fields["from_id"],
        fields["to_id"],
        fields["incarnation"],
        fields["abstaining"],
        fields["messages"],
    )


# What a msgpack array's element can be after unpacking, the odd ones included.
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**64 - 1, -1, -(2**63)]),
    st.floats(allow_nan=False),
    st.binary(max_size=8),
    st.text(max_size=4),
    st.lists(st.one_of(st.binary(max_size=4), st.text(max_size=2), st.none()), max_size=3),
    st.dictionaries(st.one_of(st.text(max_size=2), st.binary(max_size=2)), st.none(), max_size=2),
)


def outcome(read: Any, body: bytes) -> tuple[str, Any]:
    try:
        batch = read(body)
    except FrameError:
        return ("refused", None)
    except OverflowError:
        # The protobuf bool's C-long conversion: decode_batch refuses these outright.
        return ("refused", None)
    return (
        "read",
        {
            name: list(v) if name == "messages" else v
            for name in FIELDS
            for v in [getattr(batch, name)]
        },
    )


@settings(max_examples=600, deadline=None)
@given(values=st.lists(VALUES, min_size=8, max_size=10))
def test_any_body_is_read_or_refused_as_the_record_decoder_does(values: list[Any]) -> None:
    body = msgpack.packb(values, use_bin_type=True)
    assert outcome(decode_batch, body) == outcome(
        lambda b: decode_record(peer_pb2.MessageBatch, b), body
    )


@pytest.mark.parametrize(
    "body",
    [b"", b"\xc1garbage", msgpack.packb({"a": 1}), msgpack.packb([1, 2, 3]), b"\x93\x01"],
)
def test_bodies_that_are_no_batch_are_refused(body: bytes) -> None:
    with pytest.raises(FrameError):
        decode_batch(body)
    with pytest.raises(FrameError):
        decode_record(peer_pb2.MessageBatch, body)
