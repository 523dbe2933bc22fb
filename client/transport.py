"""Channels to the members, leader discovery, and the retry loop every unary call goes through.

Theory of operation. The client knows a list of endpoints (members' client addresses) and
keeps one gRPC channel per address it has used. ``preferred`` is the member tried first: the
last one that answered, or the leader a refusal named. A member that cannot serve a request
answers UNAVAILABLE, with the leader's address in the ``rallypoint-leader`` trailing metadata
when it knows one (common.proto). The retry loop then:

- follows a leader hint at once, without sleeping (a redirect is not a failure of the
  cluster), at most ``len(endpoints) + 1`` times in a row so two members with stale views
  cannot bounce a request forever;
- otherwise forgets the preferred member, moves on to the next endpoint in rotation, and
  sleeps with exponential backoff and full jitter (``backoff.py``);
- moves on at once, without sleeping, from an endpoint that is not a member's client port
  (a peer port, another kind of server: ``WrongEndpointError``), and gives up at once when
  every endpoint is such a one;
- stops when the call's deadline passes: UnavailableError when members kept refusing,
  DeadlineExceededError when the last attempt got no answer in time. When no member answered
  at all, the message lists each endpoint's own failure, in the words of ``errors.py``.

Each attempt is bounded by ``attempt_timeout_s`` as well as by the deadline, so a member that
accepts connections but never answers (a paused process) costs one attempt, not the whole
call. Only UnavailableError (and an attempt cut short by ``attempt_timeout_s``) is retried;
every other error is the answer.

The hint-or-backoff decision is :class:`Retrier`, the client's one retry policy: the same
class serves this loop, the reads the server holds (round store), and the streams that
reconnect (heartbeat, round watch, lease keep-alive, watch), each loop with its own counts.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
import grpc.aio

from rallypoint.proto.v1 import (
    cluster_pb2_grpc,
    kv_pb2_grpc,
    lease_pb2_grpc,
    session_pb2_grpc,
    watch_pb2_grpc,
)

from .arguments import positive_seconds
from .backoff import DEFAULT_BACKOFF, Backoff
from .errors import (
    TOKEN_OPTIONS,
    DeadlineExceededError,
    InvalidValueError,
    RallypointError,
    UnavailableError,
    WrongEndpointError,
    failure_check,
    map_rpc_error,
)
from .transport_failures import FailureKind

Request = TypeVar("Request")
Response = TypeVar("Response")

# The preamble of a hello connection of the members' stream peer protocol
# (docs/peer-protocol.md: magic, frame version 1, kind 3, two zero bytes). A member's peer
# port answers it with its own preamble, which begins with the same magic; it closes a gRPC
# connection at its first bytes, which gRPC reports as a closed socket.
PEER_PREAMBLE = b"RPPW\x01\x03\x00\x00"
PEER_MAGIC = b"RPPW"


def _failure_words(error: RallypointError) -> str:
    return error.failure.value if error.failure is not None else error.server_message


# Reconnect quickly to a member that restarted: gRPC's default reconnect backoff grows to
# 120 s, far longer than a member's restart or a leader election.
# The members' own cap on a message (coordinator/transport.py): an answer as large as they
# may send is taken (gRPC's default, 4 MiB, is less than the RoundInfo of a round of 100,000
# that Configure, Join or Evict answer with).
MAX_ANSWER_BYTES = 64 * 1024 * 1024

_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_ANSWER_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.enable_retries", 0),
]


# Where the command line and the training integrations (torchrun's backend, elastic_training)
# find a bearer token when none is given to them.
TOKEN_ENV = "RALLYPOINT_TOKEN"


def token_or_environment(token: str | None) -> str | None:
    """``token``, else ``$RALLYPOINT_TOKEN``, else None (an empty value is no token)."""
    return token or os.environ.get(TOKEN_ENV) or None


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """PEM bytes. ``root_certificates`` None uses the system roots; a client certificate needs
    both ``certificate_chain`` and ``private_key``."""

    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None

    @staticmethod
    def from_files(
        ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
    ) -> TlsConfig:
        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        return TlsConfig(read(ca_file), read(cert_file), read(key_file))


class Deadline:
    """An absolute point on the event loop's clock, with the timeout it came from."""

    def __init__(self, timeout_s: float) -> None:
        positive_seconds(timeout_s, "timeout_s")
        self.timeout_s = timeout_s
        self._time = asyncio.get_running_loop().time
        self._at = self._time() + timeout_s

    def remaining_s(self) -> float:
        return self._at - self._time()


class Stubs:
    """The five service stubs over one channel, each made on first use (a stub makes a
    callable per method up front, and most clients use two or three services)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel

    @functools.cached_property
    def kv(self) -> kv_pb2_grpc.KVStub:
        return kv_pb2_grpc.KVStub(self.channel)

    @functools.cached_property
    def watch(self) -> watch_pb2_grpc.WatchStub:
        return watch_pb2_grpc.WatchStub(self.channel)

    @functools.cached_property
    def lease(self) -> lease_pb2_grpc.LeaseStub:
        return lease_pb2_grpc.LeaseStub(self.channel)

    @functools.cached_property
    def session(self) -> session_pb2_grpc.SessionStub:
        return session_pb2_grpc.SessionStub(self.channel)

    @functools.cached_property
    def cluster(self) -> cluster_pb2_grpc.ClusterStub:
        return cluster_pb2_grpc.ClusterStub(self.channel)


Method = Callable[[Stubs], "grpc.aio.UnaryUnaryMultiCallable[Request, Response]"]


_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.%a-z]+\]|[^:\s\[\]/@,]+):(?P<port>[^:]*)")


def parse_endpoint(text: str) -> str:
    """One member's client address, ``host:port`` (``[v6]:port``; an ``http://`` or
    ``https://`` prefix and a trailing ``/`` are dropped). Refused, as InvalidValueError,
    without a port (gRPC would dial 443 in silence) or with one that is not 1..65535 (gRPC
    would dial it modulo 65536)."""
    address = text.strip()
    if address.startswith(("http://", "https://")):
        address = address.split("://", 1)[1].rstrip("/")
    if address.startswith("unix:"):
        return address
    match = _HOST_PORT.fullmatch(address)
    if match is None:
        if ":" not in address.rsplit("]", 1)[-1]:
            raise InvalidValueError(
                f"endpoint {text.strip()!r} has no port: write host:port, e.g. "
                f"{address or 'host'}:2379"
            )
        raise InvalidValueError(f"endpoint {text.strip()!r} is not host:port")
    port = match.group("port")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidValueError(
            f"endpoint {text.strip()!r}: the port must be a number from 1 to 65535, got {port!r}"
        )
    return address


def parse_endpoints(endpoints: str | Sequence[str]) -> list[str]:
    """ "a:1,b:2" or ["a:1", "b:2"] -> ["a:1", "b:2"], without blanks or repeats; each one
    checked by :func:`parse_endpoint`."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    result: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise InvalidValueError(f"an endpoint is a 'host:port' string, got {item!r}")
        if not item.strip():
            continue
        address = parse_endpoint(item)
        if address not in result:
            result.append(address)
    if not result:
        raise InvalidValueError("at least one endpoint (host:port) is required")
    return result


class Transport:
    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        token: str | None = None,
        tls: TlsConfig | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
        attempt_timeout_s: float = 5.0,
        rng: random.Random | None = None,
        token_hint: str = TOKEN_OPTIONS,
    ) -> None:
        self.endpoints: list[str] = parse_endpoints(endpoints)
        # How the program's user passes a token: named when a member refuses the call's.
        self.token_hint = token_hint
        # Invariant: every address in `preferred` and `_channels` is in `endpoints` (hinted
        # leaders are added to it).
        self.preferred: str | None = None
        self.backoff = backoff
        self.attempt_timeout_s = positive_seconds(attempt_timeout_s, "attempt_timeout_s")
        self.rng = rng if rng is not None else random.Random()
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self._tls = tls
        self._channels: dict[str, Stubs] = {}
        self._rotation = 0
        self._closed = False

    def stubs(self, address: str) -> Stubs:
        if self._closed:
            raise UnavailableError("the client is closed")
        stubs = self._channels.get(address)
        if stubs is None:
            if self._tls is None:
                channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
            else:
                credentials = grpc.ssl_channel_credentials(
                    self._tls.root_certificates,
                    self._tls.private_key,
                    self._tls.certificate_chain,
                )
                channel = grpc.aio.secure_channel(address, credentials, options=_CHANNEL_OPTIONS)
            stubs = self._channels[address] = Stubs(channel)
        return stubs

    def pick(self) -> str:
        """The member to try next: the preferred one, else the next endpoint in rotation."""
        if self.preferred is not None:
            return self.preferred
        address = self.endpoints[self._rotation % len(self.endpoints)]
        self._rotation += 1
        return address

    def learn(self, addresses: Sequence[str]) -> None:
        """Add members' client addresses the cluster told of (membership answers), so the
        client still reaches the cluster after the members it was given are replaced."""
        for address in addresses:
            if address and address not in self.endpoints:
                self.endpoints.append(address)

    def note_success(self, address: str) -> None:
        self.preferred = address

    def note_failure(self, address: str, error: RallypointError) -> bool:
        """Learn from a refusal; True when it named a leader other than ``address``."""
        hint = error.leader_hint
        if hint and hint != address:
            self.learn([hint])
            self.preferred = hint
            return True
        if self.preferred == address:
            self.preferred = None
            # Resume the rotation after the member that failed.
            if address in self.endpoints:
                self._rotation = self.endpoints.index(address) + 1
        return False

    async def unary(
        self,
        method: Method[Request, Response],
        request: Request,
        deadline: Deadline,
        *,
        address: str | None = None,
        on_retry: Callable[[RallypointError], None] | None = None,
    ) -> Response:
        """Call ``method`` until it answers, a non-retryable error, or the deadline.

        ``address`` asks one member for its own answer: one attempt, no redirect.
        ``on_retry`` hears about every failed attempt that is about to be retried: callers
        that write use it to know the request may have been applied.
        """

        def attempt(target: str, timeout_s: float) -> Awaitable[Response]:
            return method(self.stubs(target))(request, timeout=timeout_s, metadata=self.metadata)

        return await self.retrying(attempt, deadline, address=address, on_retry=on_retry)

    async def retrying(
        self,
        attempt: Callable[[str, float], Awaitable[Response]],
        deadline: Deadline,
        *,
        address: str | None = None,
        on_retry: Callable[[RallypointError], None] | None = None,
    ) -> Response:
        """The retry loop of :meth:`unary` around ``attempt(address, attempt_timeout_s)``, one
        try at one member, which answers or raises a gRPC error or a RallypointError (the
        batch stream's attempts, ``kv_stream.py``, raise the latter)."""
        retrier: Retrier | None = None  # made at the first failure
        last_error: RallypointError | None = None
        # Each endpoint's latest failure in this call, for the message when it gives up.
        failures: dict[str, RallypointError] = {}
        target = address if address is not None else self.pick()
        while True:
            remaining_s = deadline.remaining_s()
            if remaining_s <= 0:
                raise self._gave_up(last_error, failures, deadline)
            attempt_timeout_s = min(remaining_s, self.attempt_timeout_s)
            try:
                response = await attempt(target, attempt_timeout_s)
            except grpc.aio.AioRpcError as rpc_error:
                error = await self.failure(target, rpc_error, timeout_s=attempt_timeout_s)
            except RallypointError as refused:
                if self._closed:
                    raise
                error = refused
            else:
                if address is None:
                    self.note_success(target)
                return response
            failures[target] = error
            cut_short = isinstance(error, DeadlineExceededError) and (
                attempt_timeout_s < remaining_s
            )
            if not isinstance(error, UnavailableError) and not cut_short:
                if isinstance(error, DeadlineExceededError):
                    raise self._gave_up(error, failures, deadline)
                raise error
            if address is not None:
                raise error
            last_error = error
            if on_retry is not None:
                on_retry(error)
            if isinstance(error, WrongEndpointError):
                if all(isinstance(failures.get(e), WrongEndpointError) for e in self.endpoints):
                    raise self._every_endpoint_wrong(failures)
                # Not a member: try the next endpoint at once, there is nothing to wait for.
                self.note_failure(target, error)
                target = self.pick()
                continue
            if retrier is None:
                retrier = Retrier(self)
            await retrier.after_failure(target, error, max_sleep_s=deadline.remaining_s())
            target = self.pick()

    async def failure(
        self, address: str, rpc_error: grpc.aio.AioRpcError, *, timeout_s: float | None = None
    ) -> RallypointError:
        """The client error for a call to ``address`` that failed. A server that closed the
        connection at once is checked once more: if the port answers the members' stream
        peer protocol, this is a member's peer port (said so), not merely a server down."""
        peer_port = False
        if rpc_error.code() is grpc.StatusCode.UNAVAILABLE and "Socket closed" in (
            rpc_error.details() or ""
        ):
            peer_port = await self._serves_peer_protocol(address)
        return map_rpc_error(
            rpc_error,
            address,
            timeout_s=timeout_s,
            peer_port=peer_port,
            token_sent=bool(self.metadata),
            token_hint=self.token_hint,
        )

    async def _serves_peer_protocol(self, address: str) -> bool:
        # A hello connection's preamble, answered with the member's own, then closed: the
        # member is asked nothing (it waits for a hello that never comes).
        host, _, port = address.rpartition(":")
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(min(self.attempt_timeout_s, 2.0)):
                reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
                writer.write(PEER_PREAMBLE)
                answer = await reader.readexactly(len(PEER_PREAMBLE))
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
            return False
        finally:
            if writer is not None:
                writer.close()
        return answer.startswith(PEER_MAGIC)

    def _every_endpoint_wrong(self, failures: dict[str, RallypointError]) -> RallypointError:
        if len(self.endpoints) == 1:
            return failures[self.endpoints[0]]
        listed = "; ".join(failures[e].server_message for e in self.endpoints)
        error = WrongEndpointError(f"no endpoint is a member's client port: {listed}")
        error.failure = FailureKind.NOT_RALLYPOINT
        return error

    def _gave_up(
        self,
        last_error: RallypointError | None,
        failures: dict[str, RallypointError],
        deadline: Deadline,
    ) -> RallypointError:
        within = f"within {deadline.timeout_s:g} s"
        tried = [e for e in self.endpoints if e in failures]
        silent = bool(tried) and all(failures[e].failure is not None for e in tried)
        if silent and isinstance(last_error, UnavailableError | DeadlineExceededError):
            # No member answered at all: say what each endpoint did, and what to check.
            silence = isinstance(last_error, DeadlineExceededError)
            prefix = f"no answer {within}" if silence else f"no member answered {within}"
            if len(tried) == 1 and not silence:
                only = failures[tried[0]]
                message = f"{only.server_message} (retried for {deadline.timeout_s:g} s)"
            elif len(tried) == 1:
                message = f"{prefix} from {tried[0]}: {failure_check(failures[tried[0]])}"
            else:
                each = "; ".join(f"{e}: {_failure_words(failures[e])}" for e in tried)
                checks = dict.fromkeys(failure_check(failures[e]) for e in tried)
                message = f"{prefix} ({each}): {' '.join(checks)}"
            cls: type[RallypointError] = DeadlineExceededError if silence else UnavailableError
            error = cls(message)
            error.carry_from(last_error)
            error.endpoint = None
            return error
        if isinstance(last_error, UnavailableError):
            listed = ", ".join(self.endpoints)
            error = UnavailableError(
                f"no member could serve the request {within} (endpoints: {listed}); "
                f"last error: {last_error.server_message}",
                reason=last_error.reason,
                leader_hint=last_error.leader_hint,
            )
            error.carry_from(last_error)
            return error
        detail = f"; last error: {last_error.server_message}" if last_error is not None else ""
        return DeadlineExceededError(f"no answer {within}{detail}")

    async def close(self) -> None:
        self._closed = True
        channels, self._channels = self._channels, {}
        await asyncio.gather(*(stubs.channel.close(None) for stubs in channels.values()))


class Retrier:
    """The one retry policy, for unary calls, reads the server holds, and streams that
    reconnect (heartbeat, round watch, lease keep-alive, watch): follow a leader hint at once
    (at most ``len(endpoints) + 1`` times in a row, so two members with stale views cannot
    bounce a request forever), otherwise sleep with full-jitter backoff (``backoff``: the
    transport's unless given; the heartbeat caps it at two intervals), never past
    ``max_sleep_s`` (what is left of the caller's deadline). One per loop: its counts are
    that loop's."""

    def __init__(self, transport: Transport, backoff: Backoff | None = None) -> None:
        self._transport = transport
        self.backoff = backoff if backoff is not None else transport.backoff
        # Invariant: retry counts the backoff sleeps since the last answer; redirects the
        # leader hints followed in a row since the last sleep or answer.
        self.retry = 0
        self.redirects = 0

    def answered(self) -> None:
        self.retry = 0
        self.redirects = 0

    def delay_s(
        self, address: str, error: RallypointError, *, max_sleep_s: float | None = None
    ) -> float:
        """How long to wait before the next attempt after ``address`` failed with ``error``
        (0 to follow a hint, which the transport learns)."""
        transport = self._transport
        if transport.note_failure(address, error) and self.redirects <= len(transport.endpoints):
            self.redirects += 1
            return 0.0
        self.redirects = 0
        delay_s = self.backoff.delay_s(self.retry, transport.rng)
        self.retry += 1
        if max_sleep_s is not None:
            delay_s = min(delay_s, max(0.0, max_sleep_s))
        return delay_s

    async def after_failure(
        self, address: str, error: RallypointError, *, max_sleep_s: float | None = None
    ) -> None:
        # Sleeps even 0 s: a loop that follows hints still lets the event loop run.
        await asyncio.sleep(self.delay_s(address, error, max_sleep_s=max_sleep_s))
