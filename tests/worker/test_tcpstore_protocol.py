"""The TCPStore wire protocol without sockets (worker/tcpstore/protocol.py): every request
survives any split of the byte stream, answers encode to torch's bytes, and bad input is one
clear ProtocolError. (tests/worker/test_torchrun.py checks the bytes against the installed
torch's own client, through a real cluster.)"""

from __future__ import annotations

import pytest

from rallypoint.worker.tcpstore.protocol import (
    VALIDATION_MAGIC,
    Add,
    Append,
    CancelWait,
    Check,
    CompareSet,
    DeleteKey,
    Get,
    GetNumKeys,
    MultiGet,
    MultiSet,
    Ping,
    ProtocolError,
    Query,
    Request,
    RequestParser,
    Set,
    Validate,
    Wait,
    WaitResponse,
    encode_check,
    encode_integer,
    encode_pong,
    encode_request,
    encode_value,
    encode_values,
    encode_wait,
)

# One request of every kind served, with awkward values: empty keys and values, bytes that
# look like lengths or query types, an empty key list, the i64 extremes.
EVERY_REQUEST: list[Request] = [
    Validate(VALIDATION_MAGIC),
    Ping(0xFFFFFFFF),
    Set(b"key", b"value"),
    Set(b"", b""),
    CompareSet(b"k", b"", b"\x00\x01"),
    Get(b"\x06\x00\x00\x00\x00\x00\x00\x00"),
    Add(b"counter", -(2**63)),
    Add(b"counter", 2**63 - 1),
    Check((b"a", b"bc")),
    Wait(()),
    Wait((b"a", b"b", b"c")),
    GetNumKeys(),
    DeleteKey(b"gone"),
    Append(b"log", b"line\n"),
    MultiGet((b"x", b"")),
    MultiSet(((b"a", b"1"), (b"b", b""))),
    CancelWait(),
]


def u64(number: int) -> bytes:
    return number.to_bytes(8, "little")


def data(value: bytes) -> bytes:
    return u64(len(value)) + value


def drain(parser: RequestParser) -> list[Request]:
    requests = []
    while (request := parser.next_request()) is not None:
        requests.append(request)
    return requests


def test_requests_are_encoded_as_torchs_client_sends_them() -> None:
    assert encode_request(Set(b"key", b"v")) == bytes([Query.SET]) + data(b"key") + data(b"v")
    assert encode_request(Wait((b"a", b"bc"))) == (
        bytes([Query.WAIT]) + u64(2) + data(b"a") + data(b"bc")
    )
    assert encode_request(Add(b"n", -2)) == (
        bytes([Query.ADD]) + data(b"n") + (-2).to_bytes(8, "little", signed=True)
    )
    assert encode_request(Validate(VALIDATION_MAGIC)) == b"\x00" + bytes.fromhex("cef7853c")
    assert encode_request(MultiSet(((b"a", b"1"),))) == (
        bytes([Query.MULTI_SET]) + u64(1) + data(b"a") + data(b"1")
    )
    assert encode_request(CancelWait()) == bytes([Query.CANCEL_WAIT])


def test_every_request_is_parsed_back_from_its_bytes() -> None:
    for request in EVERY_REQUEST:
        parser = RequestParser()
        parser.receive_data(encode_request(request))
        assert parser.next_request() == request
        assert parser.next_request() is None and parser.buffered_bytes == 0


def test_a_stream_split_at_any_byte_gives_the_same_requests_in_order() -> None:
    stream = b"".join(encode_request(request) for request in EVERY_REQUEST)
    for cut in range(len(stream) + 1):
        parser = RequestParser()
        parser.receive_data(stream[:cut])
        first = drain(parser)
        assert first == EVERY_REQUEST[: len(first)], cut
        parser.receive_data(stream[cut:])
        assert first + drain(parser) == EVERY_REQUEST, cut
        assert parser.buffered_bytes == 0


def test_a_stream_fed_one_byte_at_a_time_gives_each_request_once_it_is_whole() -> None:
    parser = RequestParser()
    for request in EVERY_REQUEST:
        encoded = encode_request(request)
        for at, byte in enumerate(encoded[:-1]):
            parser.receive_data(bytes([byte]))
            assert parser.next_request() is None
            assert parser.buffered_bytes == at + 1  # nothing taken from a partial request
        parser.receive_data(encoded[-1:])
        assert parser.next_request() == request
    assert parser.buffered_bytes == 0


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (bytes([42]), "query type 42 is not served"),
        (bytes([14]) + data(b"queue"), "query type 14 is not served"),  # torch's QUEUE_PUSH
        (b"\x00" + (0xDEADBEEF).to_bytes(4, "little"), "bad validation number 0xdeadbeef"),
    ],
)
def test_bad_input_is_one_protocol_error_and_the_parser_stays_failed(
    stream: bytes, message: str
) -> None:
    parser = RequestParser()
    good = encode_request(Get(b"k"))
    parser.receive_data(good + stream + good)
    assert parser.next_request() == Get(b"k")  # what came before the bad bytes is served
    with pytest.raises(ProtocolError, match=f"^{message}$"):
        parser.next_request()
    # The framing is lost: nothing after the bad bytes is ever handed out.
    with pytest.raises(ProtocolError, match=f"^{message}$"):
        parser.next_request()


def test_answers_are_encoded_as_torchs_client_reads_them() -> None:
    assert encode_value(b"abc") == u64(3) + b"abc"
    assert encode_value(b"") == u64(0)
    assert encode_values([b"a", b"", b"bc"]) == data(b"a") + data(b"") + data(b"bc")
    assert encode_values([]) == b""
    assert encode_integer(-1) == b"\xff" * 8
    assert encode_integer(2**63 - 1) == b"\xff" * 7 + b"\x7f"
    assert encode_check(True) == b"\x00" and encode_check(False) == b"\x01"
    assert encode_wait(WaitResponse.STOP_WAITING) == b"\x00"
    assert encode_wait(WaitResponse.WAIT_CANCELED) == b"\x01"
    assert encode_pong(7) == (7).to_bytes(4, "little")
