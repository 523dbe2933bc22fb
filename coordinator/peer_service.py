"""The receiving side of the peer port over gRPC (service ``rallypoint.peer.v1.Raft``).

Theory of operation. Every stream (Send, InstallSnapshot, Liveness) opens with this member's
fresh challenge in its initial metadata (peer_session.py). Every request is checked by
:class:`~rallypoint.coordinator.peer_gate.PeerGate` (the checks, their order and what each
refusal says live there, shared with the stream transport in ``peerwire/``); a refusal ends
the stream with its status code, and a member's refused traffic carries its reason in the
trailing metadata ``rallypoint-error-reason``.

The service is registered by :func:`add_peer_service`, which parses each request itself
(grpc_handlers.py): a request that does not even parse cannot be authenticated, and is
refused as any unauthenticated one, with UNAUTHENTICATED and nothing else said (grpc would
answer UNKNOWN with the parser's error).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc
import grpc.aio

from rallypoint.proto.peer.v1 import peer_pb2, peer_pb2_grpc

from .grpc_handlers import Parse, Recorder, parse_or_refuse, parsed_stream, taking_bytes
from .peer_gate import (
    FREE_SPACE_MARGIN_BYTES,
    UNAUTHENTICATED_MESSAGE,
    PeerGate,
    PeerReceiver,
    PeerRefused,
    SnapshotIntake,
    remove_partial_snapshots,
)
from .peer_session import InboundSession, challenge_metadata

__all__ = [
    "FREE_SPACE_MARGIN_BYTES",
    "UNAUTHENTICATED_MESSAGE",
    "PeerReceiver",
    "add_peer_service",
    "remove_partial_snapshots",
]

Context = grpc.aio.ServicerContext[Any, Any]


def add_peer_service(server: grpc.aio.Server, host: PeerReceiver) -> None:
    """Register the peer service for ``host`` on ``server``; see the module docstring."""
    recorder = Recorder()
    peer_pb2_grpc.add_RaftServicer_to_server(PeerServicer(host), recorder)  # type: ignore[arg-type]
    for service, handlers in recorder.services:
        wrapped = {name: taking_bytes(h, _refusing_unparsable(h)) for name, h in handlers.items()}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))


def _refusing_unparsable(handler: Any) -> Any:
    """A wrapper for ``taking_bytes``: parse, and end the call UNAUTHENTICATED when a
    request does not parse."""

    def wrap(behaviour: Any, parse: Parse) -> Any:
        async def parsing(data: Any, context: Context) -> Any:
            async def refuse(error: Exception) -> NoReturn:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
                raise AssertionError("abort returned")  # abort always raises

            if handler.request_streaming:
                request = parsed_stream(data, parse, refuse)
            else:
                request = await parse_or_refuse(parse, data, refuse)
            return await behaviour(request, context)

        async def parsing_streamed(data: Any, context: Context) -> AsyncIterator[Any]:
            async def refuse(error: Exception) -> NoReturn:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
                raise AssertionError("abort returned")  # abort always raises

            request = parsed_stream(data, parse, refuse)
            async for response in behaviour(request, context):
                yield response

        if handler.response_streaming:
            if not handler.request_streaming:
                raise AssertionError("the peer service has no server-streaming-only method")
            return parsing_streamed
        return parsing

    return wrap


class PeerServicer(peer_pb2_grpc.RaftServicer):
    """Receives Raft traffic for one member over gRPC; see the module docstring."""

    def __init__(self, host: PeerReceiver) -> None:
        self._gate = PeerGate(host)

    async def _abort(self, context: Context, refused: PeerRefused) -> NoReturn:
        if refused.reason:
            context.set_trailing_metadata((("rallypoint-error-reason", refused.reason),))
        await context.abort(refused.code, refused.message)
        raise AssertionError("abort returned")  # abort always raises

    async def _open_session(self, context: Context) -> InboundSession:
        """This stream's session: its challenge goes out before any request is read."""
        session = InboundSession(self._gate.host.peer_key)
        await context.send_initial_metadata(challenge_metadata(session.challenge))
        return session

    async def Send(
        self,
        request_iterator: AsyncIterator[peer_pb2.MessageBatch],
        context: grpc.aio.ServicerContext[peer_pb2.MessageBatch, peer_pb2.SendAck],
    ) -> peer_pb2.SendAck:
        batches = 0
        session = await self._open_session(context)
        names = _certificate_names(context)
        async for batch in request_iterator:
            try:
                self._gate.take_batch(session, batch, names)
            except PeerRefused as refused:
                await self._abort(context, refused)
            batches += 1
        return peer_pb2.SendAck(batches=batches)

    async def InstallSnapshot(
        self,
        request_iterator: AsyncIterator[peer_pb2.SnapshotChunk],
        context: grpc.aio.ServicerContext[peer_pb2.SnapshotChunk, peer_pb2.SnapshotAck],
    ) -> peer_pb2.SnapshotAck:
        session = await self._open_session(context)
        intake = SnapshotIntake(self._gate, session, _certificate_names(context))
        async for chunk in request_iterator:
            try:
                ack = await intake.take(chunk)
            except PeerRefused as refused:
                await intake.discard()
                await self._abort(context, refused)
            if ack is not None:
                return ack
        return intake.ended()

    async def Hello(
        self,
        request: peer_pb2.HelloRequest,
        context: grpc.aio.ServicerContext[peer_pb2.HelloRequest, peer_pb2.HelloAnswer],
    ) -> peer_pb2.HelloAnswer:
        try:
            return self._gate.hello(request, _certificate_names(context))
        except PeerRefused as refused:
            await self._abort(context, refused)

    async def Liveness(
        self,
        request_iterator: AsyncIterator[peer_pb2.LivenessReport],
        context: grpc.aio.ServicerContext[peer_pb2.LivenessReport, peer_pb2.LivenessAck],
    ) -> AsyncIterator[peer_pb2.LivenessAck]:
        session = await self._open_session(context)
        names = _certificate_names(context)
        async for request in request_iterator:
            try:
                taken = self._gate.liveness(session, request, names)
            except PeerRefused as refused:
                await self._abort(context, refused)
            yield peer_pb2.LivenessAck(taken=taken)


def _certificate_names(context: Context) -> frozenset[str]:
    auth = context.auth_context()
    names: set[str] = set()
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in auth.get(key, ()):
            names.add(value.decode() if isinstance(value, bytes) else str(value))
    return frozenset(names)
