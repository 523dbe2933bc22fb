"""The Session service: open, keep alive and close client sessions, all replicated (session
expiry is decided by the state machine from leader time, so activity must be in the log).
A session opened by an authenticated caller records the caller's role as its owner, which
alone may use it afterwards (``authz.py``)."""

from __future__ import annotations

from rallypoint.proto.v1 import session_pb2, session_pb2_grpc
from rallypoint.proto.v1.defaults import MAX_SESSION_TTL_MS

from ..node.api import ServerNode
from ..state.commands import OwnedSessionOpen, SessionClose, SessionKeepAlive, SessionOpen
from ..state.results import SessionCloseResult, SessionKeepAliveResult, SessionOpenResult
from . import validate
from .authz import CALLER
from .common import Context, header_pb, propose


class SessionServicer(session_pb2_grpc.SessionServicer):
    def __init__(self, node: ServerNode) -> None:
        self.node = node

    async def Open(
        self, request: session_pb2.SessionOpenRequest, context: Context
    ) -> session_pb2.SessionOpenResponse:
        ttl_ms = validate.bounded(
            request.ttl_ms, "ttl_ms", MAX_SESSION_TTL_MS, "7 days, the longest session TTL"
        )
        caller = CALLER.get()
        command = SessionOpen(ttl_ms) if caller is None else OwnedSessionOpen(ttl_ms, caller.name)
        result = await propose(self.node, command, context, SessionOpenResult)
        return session_pb2.SessionOpenResponse(
            header=header_pb(self.node.header()),
            session_id=result.session_id,
            ttl_ms=result.ttl_ms,
        )

    async def KeepAlive(
        self, request: session_pb2.SessionKeepAliveRequest, context: Context
    ) -> session_pb2.SessionKeepAliveResponse:
        result = await propose(
            self.node,
            SessionKeepAlive(),
            context,
            SessionKeepAliveResult,
            session_id=validate.session_id(request.session_id),
            first_unacked=request.first_unacked,
        )
        return session_pb2.SessionKeepAliveResponse(
            header=header_pb(self.node.header()), ttl_ms=result.ttl_ms
        )

    async def Close(
        self, request: session_pb2.SessionCloseRequest, context: Context
    ) -> session_pb2.SessionCloseResponse:
        await propose(
            self.node,
            SessionClose(),
            context,
            SessionCloseResult,
            session_id=validate.session_id(request.session_id),
        )
        return session_pb2.SessionCloseResponse(header=header_pb(self.node.header()))
