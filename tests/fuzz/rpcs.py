"""Every RPC of the public API, found in the protobuf descriptors, every exchange of the peer
port, and one way to call the RPCs.

The public services are enumerated from the generated modules' file descriptors (every
``*_pb2`` module of ``rallypoint.proto.v1``), so an RPC added to a .proto is fuzzed without
touching the fuzzer. The peer port speaks the stream peer protocol, not gRPC: its five
exchanges (``PEER_EXCHANGES``, one per connection kind, docs/peer-protocol.md) keep the
names of the gRPC methods they replaced (Members, which came after, is named like them).
Calls go through a raw channel with identity serializers (None: bytes pass as they are):
the fuzzer sends bytes it built (or damaged) itself, and parses what comes back.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from dataclasses import dataclass, field
from types import ModuleType

import grpc
from google.protobuf import empty_pb2, message_factory
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError, Message

from rallypoint.proto import v1 as public_v1
from rallypoint.proto.peer.v1 import peer_pb2

# The most responses read from one streaming call before the fuzzer cancels it.
MAX_STREAM_RESPONSES = 16
REASON_KEY = "rallypoint-error-reason"


@dataclass(frozen=True, slots=True)
class Rpc:
    service: str  # "rallypoint.v1.KV"
    method: str  # "Put"
    request: Descriptor
    response: type[Message]
    client_streaming: bool
    server_streaming: bool

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.method}"

    @property
    def name(self) -> str:
        return f"{self.service}/{self.method}"

    @property
    def streaming(self) -> bool:
        return self.client_streaming or self.server_streaming

    def request_text(self, payload: bytes, limit: int = 300) -> str:
        """The request as protobuf text when it parses, else its bytes; shortened."""
        return describe(message_factory.GetMessageClass(self.request), payload, limit)


def describe(cls: type[Message], payload: bytes, limit: int = 300) -> str:
    try:
        text = str(cls.FromString(payload)).replace("\n", " ").strip() or "(empty)"
    except DecodeError:
        text = f"undecodable {payload[:limit]!r}"
    return shorten(text, limit)


def shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} chars)"


def _modules(package: str, path: list[str]) -> list[ModuleType]:
    return [
        importlib.import_module(f"{package}.{info.name}")
        for info in sorted(pkgutil.iter_modules(path), key=lambda info: info.name)
        if info.name.endswith("_pb2")
    ]


def _rpcs(package: str, path: list[str]) -> list[Rpc]:
    found = []
    for module in _modules(package, path):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                found.append(
                    Rpc(
                        service.full_name,
                        method.name,
                        method.input_type,
                        message_factory.GetMessageClass(method.output_type),
                        method.client_streaming,
                        method.server_streaming,
                    )
                )
    return found


def public_rpcs() -> list[Rpc]:
    """Every method of every service of the public API (proto/v1)."""
    return _rpcs(public_v1.__name__, list(public_v1.__path__))


PEER_SERVICE = "rallypoint.peer.v1.Raft"
# (name, request, answer, many requests, many answers): what each connection kind carries.
PEER_EXCHANGES: tuple[tuple[str, type[Message], type[Message], bool, bool], ...] = (
    ("Send", peer_pb2.MessageBatch, empty_pb2.Empty, True, False),  # no answer but a refusal
    ("InstallSnapshot", peer_pb2.SnapshotChunk, peer_pb2.SnapshotAck, True, False),
    ("Hello", peer_pb2.HelloRequest, peer_pb2.HelloAnswer, False, False),
    ("Members", peer_pb2.MembersRequest, peer_pb2.MembersAnswer, False, False),
    ("Liveness", peer_pb2.LivenessReport, peer_pb2.LivenessAck, True, True),
)


def peer_rpcs() -> list[Rpc]:
    """Every exchange of the peer port (the stream peer protocol's connection kinds)."""
    return [
        Rpc(PEER_SERVICE, name, request.DESCRIPTOR, answer, many_in, many_out)
        for name, request, answer, many_in, many_out in PEER_EXCHANGES
    ]


@dataclass
class Answer:
    """How one call ended: its status, its message, its reason metadata and the responses
    read (serialized)."""

    code: grpc.StatusCode
    details: str = ""
    reason: str = ""
    responses: list[bytes] = field(default_factory=list)
    cancelled_by_us: bool = False


def _reason(error: grpc.RpcError) -> str:
    trailing = getattr(error, "trailing_metadata", lambda: None)() or ()
    return next((str(value) for key, value in trailing if key == REASON_KEY), "")


def _ended(error: grpc.RpcError, responses: list[bytes]) -> Answer:
    code = error.code()
    details = error.details() or ""
    return Answer(code, details, _reason(error), responses)


def invoke(
    channel: grpc.Channel,
    rpc: Rpc,
    payloads: list[bytes],
    metadata: tuple[tuple[str, str], ...],
    timeout_s: float,
    stream_window_s: float,
) -> Answer:
    """Send ``payloads`` (one for a unary request) and wait for the end, reading a streaming
    answer for at most ``stream_window_s`` (a watch stays open: the fuzzer then cancels)."""
    if not rpc.server_streaming:
        try:
            if rpc.client_streaming:
                response = channel.stream_unary(rpc.path, None, None)(
                    iter(payloads), timeout=timeout_s, metadata=metadata
                )
            else:
                response = channel.unary_unary(rpc.path, None, None)(
                    payloads[0], timeout=timeout_s, metadata=metadata
                )
        except grpc.RpcError as error:
            return _ended(error, [])
        return Answer(grpc.StatusCode.OK, responses=[response])
    if rpc.client_streaming:
        call = channel.stream_stream(rpc.path, None, None)(
            iter(payloads), timeout=stream_window_s, metadata=metadata
        )
    else:
        call = channel.unary_stream(rpc.path, None, None)(
            payloads[0], timeout=stream_window_s, metadata=metadata
        )
    responses: list[bytes] = []
    started = time.monotonic()
    try:
        for response in call:
            responses.append(response)
            if len(responses) >= MAX_STREAM_RESPONSES or (
                time.monotonic() - started > stream_window_s
            ):
                call.cancel()  # type: ignore[no-untyped-call]
                return Answer(grpc.StatusCode.OK, responses=responses, cancelled_by_us=True)
    except grpc.RpcError as error:
        return _ended(error, responses)
    return Answer(grpc.StatusCode.OK, responses=responses)
