"""Registering the public API on a grpc.aio server, with error mapping and token auth.

Theory of operation. Each service's generated ``add_*_to_server`` is pointed at a recorder
instead of the server, which yields the service's method handlers. Every handler's behaviour
is then wrapped once, here, before the handlers reach the real server, so no servicer method
can escape it: the wrapper checks the bearer token (when one is configured), parses the
request (grpc's own parsing is turned off: a request that does not parse is INVALID_ARGUMENT
for an authenticated caller and UNAUTHENTICATED for anyone else, never grpc's UNKNOWN; see
``grpc_handlers.py``), runs the servicer, and turns any exception into a status through
:func:`.errors.status_for`. The
standard health service is registered unwrapped: health probes (load balancers, Kubernetes)
rarely carry credentials, and health reveals nothing but "serving".
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, NoReturn, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from rallypoint.proto.v1 import (
    cluster_pb2_grpc,
    kv_pb2_grpc,
    lease_pb2_grpc,
    rendezvous_pb2_grpc,
    session_pb2_grpc,
    watch_pb2_grpc,
)

from ..grpc_handlers import Parse, Recorder, parse_or_refuse, parsed_stream, taking_bytes
from ..node_api import ServerNode
from .checkpoint import CheckpointServicer
from .cluster import ClusterServicer
from .common import Context
from .errors import InvalidArgument, Status, Unauthenticated, status_for
from .kv import KVServicer
from .lease import LeaseServicer
from .rendezvous import RendezvousServicer
from .roundstore import RoundStoreServicer
from .session import SessionServicer
from .watch import WatchServicer

AUTHORIZATION_KEY = "authorization"

SERVICE_NAMES = (
    "rallypoint.v1.KV",
    "rallypoint.v1.Watch",
    "rallypoint.v1.Lease",
    "rallypoint.v1.Session",
    "rallypoint.v1.Cluster",
    "rallypoint.v1.Rendezvous",
    "rallypoint.v1.RoundStore",
    "rallypoint.v1.CheckpointRegistry",
)

Handler = Any  # grpc.RpcMethodHandler: a namedtuple whose behaviour fields we replace


async def _unparsable(error: Exception) -> NoReturn:
    raise InvalidArgument("request", f"does not parse: {error}")


class _Guard:
    """Authenticates a call and maps whatever its handler raises to a status."""

    def __init__(self, auth_token: str | None) -> None:
        self._expected = f"Bearer {auth_token}".encode() if auth_token else None

    def _authenticated(self, context: Context) -> bool:
        if self._expected is None:
            return True
        for key, value in context.invocation_metadata() or ():
            if key == AUTHORIZATION_KEY:
                presented = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(presented, self._expected)
        return False

    def _check(self, context: Context) -> None:
        if not self._authenticated(context):
            raise Unauthenticated(
                'missing or wrong credentials: send metadata "authorization: Bearer <token>"'
            )

    async def _fail(self, context: Context, error: Exception) -> NoReturn:
        if isinstance(error, grpc.aio.AbortError):
            raise error
        remaining_s: float | None = context.time_remaining()
        await _abort(context, status_for(error, remaining_s is not None and remaining_s <= 0))

    async def _request(self, data: Any, parse: Parse, streaming: bool) -> Any:
        """The request (or the stream of requests) parsed from what grpc handed over."""
        if streaming:
            return parsed_stream(data, parse, _unparsable)
        return await parse_or_refuse(parse, data, _unparsable)

    def unary(self, behaviour: Callable[..., Any], parse: Parse, streaming: bool) -> Any:
        async def guarded(data: Any, context: Context) -> Any:
            try:
                self._check(context)
                request = await self._request(data, parse, streaming)
                return await behaviour(request, context)
            except Exception as error:
                await self._fail(context, error)

        return guarded

    def streaming(self, behaviour: Callable[..., Any], parse: Parse, streaming: bool) -> Any:
        async def guarded(data: Any, context: Context) -> AsyncIterator[Any]:
            try:
                self._check(context)
                request = await self._request(data, parse, streaming)
                async for response in behaviour(request, context):
                    yield response
            except Exception as error:
                await self._fail(context, error)

        return guarded

    def wrap(self, handler: Handler) -> Handler:
        wrapper = self.streaming if handler.response_streaming else self.unary
        return taking_bytes(
            handler,
            lambda behaviour, parse: wrapper(behaviour, parse, handler.request_streaming),
        )


async def _abort(context: Context, status: Status) -> NoReturn:
    await context.abort(status.code, status.message, status.trailing_metadata())


class _Health(HealthServicer):  # type: ignore[misc]
    def __init__(self, services: Sequence[str]) -> None:
        super().__init__()
        # HealthServicer.set is a coroutine, and add_services runs before the server starts
        # (often outside the event loop); with no watchers yet, setting the status is only
        # this assignment, which is what set() would do.
        for service in services:
            self._server_status[service] = health_pb2.HealthCheckResponse.SERVING


def add_services(
    server: grpc.aio.Server, node: ServerNode, *, auth_token: str | None = None
) -> None:
    """Register KV, Watch, Lease, Session, Cluster, Rendezvous, RoundStore and
    CheckpointRegistry over ``node``, and the health service
    (SERVING for "" and each service). With ``auth_token``, every call to the public API
    must carry the metadata ``authorization: Bearer <auth_token>`` (else UNAUTHENTICATED)."""
    recorder = Recorder()
    target = cast(grpc.aio.Server, recorder)
    kv_pb2_grpc.add_KVServicer_to_server(KVServicer(node), target)
    watch_pb2_grpc.add_WatchServicer_to_server(WatchServicer(node), target)
    lease_pb2_grpc.add_LeaseServicer_to_server(LeaseServicer(node), target)
    session_pb2_grpc.add_SessionServicer_to_server(SessionServicer(node), target)
    cluster_pb2_grpc.add_ClusterServicer_to_server(ClusterServicer(node), target)
    rendezvous_pb2_grpc.add_RendezvousServicer_to_server(RendezvousServicer(node), target)
    rendezvous_pb2_grpc.add_RoundStoreServicer_to_server(RoundStoreServicer(node), target)
    rendezvous_pb2_grpc.add_CheckpointRegistryServicer_to_server(CheckpointServicer(node), target)
    recorded = tuple(service for service, _ in recorder.services)
    if recorded != SERVICE_NAMES:
        raise AssertionError(f"generated code registered {recorded}, expected {SERVICE_NAMES}")
    guard = _Guard(auth_token)
    for service, handlers in recorder.services:
        wrapped = {name: guard.wrap(handler) for name, handler in handlers.items()}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))
    health_pb2_grpc.add_HealthServicer_to_server(_Health(("", *SERVICE_NAMES)), server)
