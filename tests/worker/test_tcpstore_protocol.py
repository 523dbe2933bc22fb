"""The TCPStore wire protocol without sockets (worker/tcpstore/protocol.py): every request
survives any split of the byte stream, answers encode to torch's bytes, and bad input is one
clear ProtocolError. (tests/worker/test_torchrun.py checks the bytes against the installed
torch's own client, through a real cluster.)"""

from __future__ import annotations

import pytest

from rallypoint.worker.tcpstore import protocol as wire

# One request of every kind served, with awkward values: empty keys and values, bytes that
# look like lengths or query types, an empty key list, the i64 extremes.
EVERY_REQUEST: list[wire.Request] = [
    wire.Validate(wire.VALIDATION_MAGIC),
    wire.Ping(0xFFFFFFFF),
    wire.Set(b"key", b"value"),
    wire.Set(b"", b""),
    wire.CompareSet(b"k", b"", b"\x00\x01"),
    wire.Get(b"\x06\x00\x00\x00\x00\x00\x00\x00"),
    wire.Add(b"counter", -(2**63)),
    wire.Add(b"counter", 2**63 - 1),
    wire.Check((b"a", b"bc")),
    wire.Wait(()),
    wire.Wait((b"a", b"b", b"c")),
    wire.GetNumKeys(),
    wire.DeleteKey(b"gone"),
    wire.Append(b"log", b"line\n"),
    wire.MultiGet((b"x", b"")),
    wire.MultiSet(((b"a", b"1"), (b"b", b""))),
    wire.CancelWait(),
]


def u64(number: int) -> bytes:
    return number.to_bytes(8, "little")


def data(value: bytes) -> bytes:
    return u64(len(value)) + value


def drain(parser: wire.RequestParser) -> list[wire.Request]:
    requests = []
    while (request := parser.next_request()) is not None:
        requests.append(request)
    return requests


def test_requests_are_encoded_as_torchs_client_sends_them() -> None:
    encode, query = wire.encode_request, wire.Query
    assert encode(wire.Set(b"key", b"v")) == bytes([query.SET]) + data(b"key") + data(b"v")
    wait = bytes([query.WAIT]) + u64(2) + data(b"a") + data(b"bc")
    assert encode(wire.Wait((b"a", b"bc"))) == wait
    minus_two = (-2).to_bytes(8, "little", signed=True)
    assert encode(wire.Add(b"n", -2)) == bytes([query.ADD]) + data(b"n") + minus_two
    assert encode(wire.Validate(wire.VALIDATION_MAGIC)) == b"\x00" + bytes.fromhex("cef7853c")
    multi_set = bytes([query.MULTI_SET]) + u64(1) + data(b"a") + data(b"1")
    assert encode(wire.MultiSet(((b"a", b"1"),))) == multi_set
    assert encode(wire.CancelWait()) == bytes([query.CANCEL_WAIT])


def test_every_request_is_parsed_back_from_its_bytes() -> None:
    for request in EVERY_REQUEST:
        parser = wire.RequestParser()
        parser.receive_data(wire.encode_request(request))
        assert parser.next_request() == request
        assert parser.next_request() is None and parser.buffered_bytes == 0


def test_a_stream_split_at_any_byte_gives_the_same_requests_in_order() -> None:
    stream = b"".join(wire.encode_request(request) for request in EVERY_REQUEST)
    for cut in range(len(stream) + 1):
        parser = wire.RequestParser()
        parser.receive_data(stream[:cut])
        first = drain(parser)
        assert first == EVERY_REQUEST[: len(first)], cut
        parser.receive_data(stream[cut:])
        assert first + drain(parser) == EVERY_REQUEST, cut
        assert parser.buffered_bytes == 0


def test_a_stream_fed_one_byte_at_a_time_gives_each_request_once_it_is_whole() -> None:
    parser = wire.RequestParser()
    for request in EVERY_REQUEST:
        encoded = wire.encode_request(request)
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
    parser = wire.RequestParser()
    good = wire.encode_request(wire.Get(b"k"))
    parser.receive_data(good + stream + good)
    assert parser.next_request() == wire.Get(b"k")  # what came before the bad bytes is served
    with pytest.raises(wire.ProtocolError, match=f"^{message}$"):
        parser.next_request()
    # The framing is lost: nothing after the bad bytes is ever handed out.
    with pytest.raises(wire.ProtocolError, match=f"^{message}$"):
        parser.next_request()


def test_answers_are_encoded_as_torchs_client_reads_them() -> None:
    assert wire.encode_value(b"abc") == u64(3) + b"abc"
    assert wire.encode_value(b"") == u64(0)
    assert wire.encode_values([b"a", b"", b"bc"]) == data(b"a") + data(b"") + data(b"bc")
    assert wire.encode_values([]) == b""
    assert wire.encode_integer(-1) == b"\xff" * 8
    assert wire.encode_integer(2**63 - 1) == b"\xff" * 7 + b"\x7f"
    assert wire.encode_check(True) == b"\x00" and wire.encode_check(False) == b"\x01"
    assert wire.encode_wait(wire.WaitResponse.STOP_WAITING) == b"\x00"
    assert wire.encode_wait(wire.WaitResponse.WAIT_CANCELED) == b"\x01"
    assert wire.encode_pong(7) == (7).to_bytes(4, "little")
