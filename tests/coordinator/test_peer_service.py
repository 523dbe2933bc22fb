"""The peer service on a real port, for what the fuzzer (tests/fuzz) found in it.

grpc parsed each request before the servicer saw it, and answered one that does not parse
with UNKNOWN and the parser's error, before the MAC was checked: an outsider learned how we
parse, and the member logged a traceback per request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from rallypoint.coordinator.peer_auth import HELLO_TAG
from rallypoint.coordinator.peer_hello import hello_request_fields
from rallypoint.coordinator.peer_service import UNAUTHENTICATED_MESSAGE, add_peer_service
from rallypoint.proto.peer.v1 import peer_pb2

from .test_transport import CLUSTER_ID, Host


@pytest.fixture
async def channel(tmp_path: Path) -> AsyncIterator[grpc.aio.Channel]:
    server = grpc.aio.server()
    add_peer_service(server, Host(2, tmp_path))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel
    finally:
        await channel.close(None)
        await server.stop(grace=None)


@pytest.mark.parametrize("payload", [b"\xff\xff\xff", b"\x22\x10abc"])  # corrupt, truncated
async def test_a_request_that_does_not_parse_is_unauthenticated(
    channel: grpc.aio.Channel, payload: bytes
) -> None:
    calls = {
        "Send": lambda: channel.stream_unary("/rallypoint.peer.v1.Raft/Send")(iter([payload])),
        "InstallSnapshot": lambda: channel.stream_unary("/rallypoint.peer.v1.Raft/InstallSnapshot")(
            iter([payload])
        ),
        "Hello": lambda: channel.unary_unary("/rallypoint.peer.v1.Raft/Hello")(payload),
    }
    for name, call in calls.items():
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call()
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
        assert refused.value.details() == UNAUTHENTICATED_MESSAGE, name


async def test_a_signed_request_still_parses(channel: grpc.aio.Channel, tmp_path: Path) -> None:
    host = Host(2, tmp_path)
    request = peer_pb2.HelloRequest(cluster_id=CLUSTER_ID, from_id=1, to_id=2, nonce=b"n")
    request.mac = host.peer_key.sign(HELLO_TAG, hello_request_fields(request))
    answer = await channel.unary_unary(
        "/rallypoint.peer.v1.Raft/Hello",
        request_serializer=peer_pb2.HelloRequest.SerializeToString,
        response_deserializer=peer_pb2.HelloAnswer.FromString,
    )(request)
    assert answer.member_id == 2
