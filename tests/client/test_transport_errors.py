"""Transport failures in our words: each names the endpoint, what happened and what to check;
gRPC's own text stays on the error (``grpc_detail``), never in the message. Endpoints without
a port and numbers out of range are refused before anything is sent."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable

import grpc
import grpc.aio
import pytest

from rallypoint.client import (
    Client,
    DeadlineExceededError,
    FailureKind,
    InternalError,
    InvalidValueError,
    RallypointError,
    UnavailableError,
    WrongEndpointError,
)
from rallypoint.client.errors import map_rpc_error
from rallypoint.client.transport import parse_endpoint, parse_endpoints

from .fake_server import FakeCluster

S = grpc.StatusCode

# gRPC's words as they arrive (taken from real failures), and what the user must read instead.
TRANSPORT_CASES = [
    (
        S.UNAVAILABLE,
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:25050: "
        "Failed to connect to remote host: Connection refused",
        UnavailableError,
        FailureKind.REFUSED,
        "no member answered at 10.1.2.3:2379 (connection refused): is a member running there, "
        "and is that its client port?",
    ),
    (
        S.UNAVAILABLE,
        "errors resolving nohost.invalid:2379: [field:hostname lookup error:address lookup "
        "failed for nohost.invalid:2379: Domain name not found]",
        UnavailableError,
        FailureKind.UNRESOLVED,
        "cannot resolve the host of 10.1.2.3:2379",
    ),
    (
        S.UNAVAILABLE,
        "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:46003: "
        "Failed parsing HTTP/2 (Expected SETTINGS frame as the first frame, got frame type 79)",
        WrongEndpointError,
        FailureKind.NOT_GRPC,
        "10.1.2.3:2379 is not a rallypoint member (it answered in another protocol)",
    ),
    (
        S.UNIMPLEMENTED,
        "Received http2 header with status: 404",
        WrongEndpointError,
        FailureKind.NOT_GRPC,
        "10.1.2.3:2379 is not a rallypoint member (it answered HTTP status 404)",
    ),
    (
        S.UNAVAILABLE,
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:55901: Tls "
        "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL "
        "routines:OPENSSL_internal:WRONG_VERSION_NUMBER",
        WrongEndpointError,
        FailureKind.TLS,
        "the TLS handshake with 10.1.2.3:2379 failed",
    ),
    (
        S.UNAVAILABLE,
        "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:44693: "
        "Socket closed",
        UnavailableError,
        FailureKind.CLOSED,
        "10.1.2.3:2379 closed the connection before answering",
    ),
    (
        S.UNAVAILABLE,
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:35409: "
        "connection attempt timed out before receiving SETTINGS frame",
        UnavailableError,
        FailureKind.SILENT,
        "10.1.2.3:2379 accepted the connection but never answered: is the member paused",
    ),
    (
        S.UNKNOWN,
        "Stream removed (Deadline Exceeded)",
        UnavailableError,
        FailureKind.LOST,
        "the connection to 10.1.2.3:2379 was lost during the call",
    ),
    (
        S.DEADLINE_EXCEEDED,
        "Deadline Exceeded",
        DeadlineExceededError,
        FailureKind.NO_ANSWER,
        "10.1.2.3:2379 did not answer within 5 s: is the member paused or overloaded",
    ),
    (
        S.UNIMPLEMENTED,
        "Method not found!",
        WrongEndpointError,
        FailureKind.NOT_RALLYPOINT,
        "10.1.2.3:2379 answers, but not with rallypoint's client API",
    ),
]


def rpc_error(code: grpc.StatusCode, details: str, reason: str = "") -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata(("rallypoint-error-reason", reason)) if reason else None
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details, None)


def assert_our_words(message: str) -> None:
    for noise in ("ipv4:", "ipv6:", "UNKNOWN:", "UNAVAILABLE:", "Traceback", "SSL_ERROR"):
        assert noise not in message, message
    assert "grpc" not in message.lower(), message


@pytest.mark.parametrize(("code", "details", "cls", "kind", "expected"), TRANSPORT_CASES)
def test_a_transport_failure_is_said_in_our_words(
    code: grpc.StatusCode,
    details: str,
    cls: type[RallypointError],
    kind: FailureKind,
    expected: str,
) -> None:
    error = map_rpc_error(rpc_error(code, details), "10.1.2.3:2379", timeout_s=5.0)
    assert type(error) is cls
    assert error.failure is kind
    assert str(error).startswith(expected), str(error)
    assert_our_words(str(error))
    # The raw detail is kept for debugging.
    assert (error.grpc_code, error.grpc_detail, error.endpoint) == (
        code.name,
        details,
        "10.1.2.3:2379",
    )


def test_a_peer_port_is_named() -> None:
    error = map_rpc_error(rpc_error(S.UNIMPLEMENTED, "Method not found!"), "h:2380", peer_port=True)
    assert isinstance(error, WrongEndpointError)
    assert str(error).startswith("h:2380 is a member's peer port, not its client port")


def test_a_members_own_refusal_keeps_its_words() -> None:
    # A member always sends a reason: its UNAVAILABLE is its own words, not a transport's.
    error = map_rpc_error(
        rpc_error(S.UNAVAILABLE, "no leader: an election is under way", "NO_LEADER"), "h:1"
    )
    assert type(error) is UnavailableError and error.failure is None
    assert str(error) == "no leader: an election is under way [NO_LEADER]"
    internal = map_rpc_error(rpc_error(S.INTERNAL, "internal error: boom", "X"), "h:1")
    assert type(internal) is InternalError


# ------------------------------------------------------------------ servers that are not ours


async def peer_like(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A member's peer port as a client meets it: the stream peer protocol's preamble is
    answered with its own, and anything else (gRPC's HTTP/2) closed at once."""
    try:
        first = await reader.readexactly(8)
        if first.startswith(b"RPPW"):
            writer.write(b"RPPW" + first[4:])
            await reader.read()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@pytest.fixture
async def servers() -> AsyncIterator[Callable[[bool], str]]:
    """Starts servers without rallypoint's client API: a peer port, or a bare gRPC server.
    The peer port's connections are all closed before the test's loop ends (Python 3.11's
    ``Server.wait_closed`` does not wait for them: a handler left behind kept a transport that
    the garbage collector later reported as unclosed, failing whichever test it ran in)."""
    started: list[grpc.aio.Server] = []
    handlers: set[asyncio.Task[None]] = set()

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        await peer_like(reader, writer)

    peer_server = await asyncio.start_server(tracked, "127.0.0.1", 0)

    async def start() -> str:
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        started.append(server)
        return f"127.0.0.1:{port}"

    addresses: dict[bool, str] = {
        True: f"127.0.0.1:{peer_server.sockets[0].getsockname()[1]}",
        False: await start(),
    }
    yield addresses.__getitem__
    for server in started:
        await server.stop(None)
    peer_server.close()
    for handler in handlers:
        handler.cancel()  # its writer is closed on the way out (peer_like's finally)
    await asyncio.gather(*handlers, return_exceptions=True)
    await peer_server.wait_closed()


async def test_a_client_pointed_at_a_peer_port_is_told_so(
    servers: Callable[[bool], str],
) -> None:
    peer = servers(True)
    async with asyncio.timeout(3):
        client = Client([peer], timeout_s=30, open_session_on_connect=False)
        with pytest.raises(WrongEndpointError) as raised:
            await client.get("k")
        await client.close()
    assert str(raised.value).startswith(f"{peer} is a member's peer port, not its client port")
    assert raised.value.failure is FailureKind.PEER_PORT
    assert "Socket closed" in raised.value.grpc_detail


async def test_a_server_without_our_api_is_not_called_a_peer_port(
    servers: Callable[[bool], str],
) -> None:
    bare = servers(False)
    client = Client([bare], timeout_s=30, open_session_on_connect=False)
    with pytest.raises(WrongEndpointError, match="answers, but not with rallypoint's client API"):
        await client.get("k")
    await client.close()


async def test_a_wrong_endpoint_is_skipped_at_once_when_a_member_answers(
    servers: Callable[[bool], str], cluster: FakeCluster
) -> None:
    # The peer port first: the call moves on without waiting, and the member answers.
    client = Client([servers(True), cluster.members[0].address], timeout_s=30)
    started = time.monotonic()
    await client.connect()
    assert await client.get("k") is None
    assert time.monotonic() - started < 5
    await client.close()


async def test_every_endpoint_wrong_gives_up_at_once(servers: Callable[[bool], str]) -> None:
    client = Client([servers(True), servers(False)], timeout_s=30, open_session_on_connect=False)
    started = time.monotonic()
    with pytest.raises(WrongEndpointError) as raised:
        await client.get("k")
    assert time.monotonic() - started < 5
    message = str(raised.value)
    assert message.startswith("no endpoint is a member's client port")
    assert f"{servers(True)} is a member's peer port" in message
    assert f"{servers(False)} answers, but not with rallypoint's client API" in message
    await client.close()


async def test_a_member_that_never_answers_is_named(
    cluster: FakeCluster, make_client: Callable[..., Client]
) -> None:
    member = cluster.members[0]
    client = await make_client([member.address]).connect()
    member.switches.hang = True
    with pytest.raises(DeadlineExceededError) as raised:
        await client.get("k", timeout_s=0.3)
    assert str(raised.value) == (
        f"no answer within 0.3 s from {member.address}: is the member paused or overloaded, or "
        "does a firewall drop the traffic?"
    )


# ------------------------------------------------------------------ refused before sending


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("localhost", "endpoint 'localhost' has no port: write host:port, e.g. localhost:2379"),
        ("10.0.0.1", "endpoint '10.0.0.1' has no port"),
        ("h:99999", "endpoint 'h:99999': the port must be a number from 1 to 65535, got '99999'"),
        ("h:0", "endpoint 'h:0': the port must be a number from 1 to 65535, got '0'"),
        ("h:abc", "endpoint 'h:abc': the port must be a number from 1 to 65535, got 'abc'"),
        ("h:", "endpoint 'h:': the port must be a number from 1 to 65535, got ''"),
        ("a:1:2", "endpoint 'a:1:2' is not host:port"),
    ],
)
def test_an_endpoint_needs_a_port(text: str, expected: str) -> None:
    with pytest.raises(InvalidValueError, match="^" + expected.replace("(", r"\(")):
        parse_endpoint(text)


def test_endpoints_that_are_fine() -> None:
    assert parse_endpoints(" a:1, http://b:2/ ,, [::1]:2379,a:1") == ["a:1", "b:2", "[::1]:2379"]
    with pytest.raises(InvalidValueError, match="at least one endpoint"):
        parse_endpoints(" , ")
    with pytest.raises(ValueError, match="has no port"):  # still a ValueError, as before
        Client("localhost")


async def test_numbers_out_of_range_are_refused_before_anything_is_sent(
    cluster: FakeCluster, client: Client
) -> None:
    calls_before = sum(sum(m.calls.values()) for m in cluster.members)
    refusals: list[tuple[str, Callable[[], object]]] = [
        ("ttl_s must be at least 0.001 seconds, got -5", lambda: client.grant_lease(-5)),
        ("ttl_s must be at least 0.001 seconds, got 0", lambda: client.grant_lease(0)),
        ("ttl_s must be at least 0.001 seconds, got nan", lambda: client.grant_lease(math.nan)),
        # A member refuses a TTL above 7 days (defaults.MAX_LEASE_TTL_MS): checked here first.
        ("ttl_s must be at most 604800 seconds, got 604801", lambda: client.grant_lease(604_801)),
        ("timeout_s must be above 0 seconds, got -1", lambda: client.get("k", timeout_s=-1)),
        ("limit must be an integer of at least 0, got -1", lambda: client.range("k", limit=-1)),
        ("lease_id must be an integer of at least 1, got 0", lambda: client.revoke_lease(0)),
        ("lease must be an integer of at least 0, got -3", lambda: client.put("k", "v", lease=-3)),
        ("member_id must be an integer of at least 1, got -1", lambda: client.member_remove(-1)),
    ]
    for expected, call in refusals:
        with pytest.raises(InvalidValueError, match="^" + expected):
            result = call()
            if asyncio.iscoroutine(result):
                await result
    with pytest.raises(InvalidValueError, match="start_revision"):
        client.watch("k", start_revision=-1)
    for options in (
        {"timeout_s": 0},
        {"attempt_timeout_s": -1},
        {"session_ttl_s": 0},
        {"session_ttl_s": 604_801},
    ):
        with pytest.raises(InvalidValueError):
            Client(cluster.addresses, **options)  # type: ignore[arg-type]
    assert sum(sum(m.calls.values()) for m in cluster.members) == calls_before
