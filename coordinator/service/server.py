"""Registering the public API on a grpc.aio server, with error mapping and token auth by role.

Theory of operation. Each service's generated ``add_*_to_server`` is pointed at a recorder
instead of the server, which yields the service's method handlers. Every handler's behaviour
is then wrapped once, here, before the handlers reach the real server, so no servicer method
can escape it: the wrapper finds the caller's role from its bearer token (when the member
requires tokens, :mod:`.tokens`), parses the request (grpc's own parsing is turned off: a
request that does not parse is INVALID_ARGUMENT for an authenticated caller and
UNAUTHENTICATED for anyone else, never grpc's UNKNOWN; see ``grpc_handlers.py``), checks the
call against the method's rule in :data:`.authz.RULES` (a method without a rule cannot be
registered), runs the servicer, and turns any exception into a status through
:func:`.errors.status_for`. Round-store and checkpoint-registry calls are counted there
too, by method and outcome (``rallypoint_store_operations``,
``rallypoint_checkpoint_operations``; counters looked up once per method and outcome),
and every stream it accepts, by method (``rallypoint_streams_opened``). The standard health
service is registered unwrapped: health probes (load balancers, Kubernetes) rarely carry
credentials, and health reveals nothing but "serving".
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NoReturn, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from prometheus_client import Counter

from rallypoint.proto.v1 import (
    cluster_pb2_grpc,
    kv_pb2_grpc,
    lease_pb2_grpc,
    maintenance_pb2_grpc,
    rendezvous_pb2_grpc,
    session_pb2_grpc,
    watch_pb2_grpc,
)

from ..grpc_handlers import Parse, Recorder, parse_or_refuse, parsed_stream, taking_bytes
from ..metrics import NodeMetrics
from ..node.api import ProposalTimeoutError, ServerNode
from .authz import (
    CALLER,
    OPERATION_COUNTER,
    OPERATION_GUARD,
    OperationGuard,
    Role,
    RoleKind,
    Rule,
    rule_for,
)
from .checkpoint import CheckpointServicer
from .cluster import ClusterServicer
from .common import Context, wait_s
from .errors import (
    UNSPECIFIED,
    InvalidArgument,
    PermissionDenied,
    Status,
    Unauthenticated,
    status_for,
)
from .kv import KVServicer
from .lease import LeaseServicer
from .maintenance import MaintenanceServicer
from .rendezvous import RendezvousServicer
from .roundstore import RoundStoreServicer
from .session import SessionServicer
from .tokens import ClientTokens
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
    "rallypoint.v1.Maintenance",
)

Handler = Any  # grpc.RpcMethodHandler: a namedtuple whose behaviour fields we replace


async def _unparsable(error: Exception) -> NoReturn:
    raise InvalidArgument("request", f"does not parse: {error}")


class _Outcomes:
    """One method's counters by outcome: ``ok``, or the error reason of the status it
    ended with (the status code when the reason is unspecified), in snake case."""

    def __init__(self, counter: Counter, method: str) -> None:
        self._counter = counter
        # "/rallypoint.v1.RoundStore/CompareSet" -> "compare_set"
        self._op = _snake(method)
        self.ok = counter.labels(self._op, "ok")
        self._failed: dict[str, Counter] = {}

    def failed(self, status: Status) -> None:
        outcome = (status.code.name if status.reason == UNSPECIFIED else status.reason).lower()
        child = self._failed.get(outcome)
        if child is None:
            child = self._failed[outcome] = self._counter.labels(self._op, outcome)
        child.inc()


def _snake(method: str) -> str:
    """A method's label: "/rallypoint.v1.Rendezvous/HeartbeatBatch" -> "heartbeat_batch"."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", method.rsplit("/", 1)[1]).lower()


def _outcomes(metrics: NodeMetrics | None, method: str) -> _Outcomes | None:
    """The counters of ``method``, if its service is one whose calls are counted."""
    if metrics is None:
        return None
    service = method.split("/")[1]
    if service == "rallypoint.v1.RoundStore":
        return _Outcomes(metrics.store_operations, method)
    if service == "rallypoint.v1.CheckpointRegistry":
        return _Outcomes(metrics.checkpoint_operations, method)
    return None


class _Guard:
    """Authenticates and authorizes a call, and maps whatever its handler raises to a status.

    ``tokens`` None: the member requires no credentials (every call is let through)."""

    def __init__(
        self, node: ServerNode, tokens: ClientTokens | None, metrics: NodeMetrics | None
    ) -> None:
        self._node = node
        self._tokens = tokens
        self._metrics = metrics
        # The counters of the methods batch-stream operations stand for, made on first use.
        self._stream_outcomes: dict[str, _Outcomes | None] = {}

    def _role(self, context: Context) -> Role | None:
        """The caller's role; None when no credentials are required."""
        if self._tokens is None:
            return None
        for key, value in context.invocation_metadata() or ():
            if key == AUTHORIZATION_KEY:
                presented = value.encode() if isinstance(value, str) else value
                scheme, _, token = presented.partition(b" ")
                bearer = scheme.lower() == b"bearer" and token
                grant = self._tokens.lookup(token) if bearer else None
                if grant is not None:
                    return grant.role
                break
        raise Unauthenticated(
            'missing or wrong credentials: send metadata "authorization: Bearer <token>"'
        )

    async def _admit(
        self, role: Role, method: str, rule: Rule, request: Any, context: Context
    ) -> Any:
        """The request, once ``role`` may make it under ``rule``."""
        role.check(rule, method, request)
        if rule.session is not None and role.kind is not RoleKind.ADMIN:
            session_id = rule.session(request)
            owner = await self._session_owner(session_id, context) if session_id else None
            if owner is not None and owner != role.name:
                raise PermissionDenied(
                    f"permission denied: session {session_id} was opened by another role; "
                    f"role {role.name!r} may use only its own sessions ({method.lstrip('/')})"
                )
        return request

    def _operation_guard(self, role: Role, context: Context) -> OperationGuard:
        """Checks each operation of ``role``'s batch stream under its unary method's rule."""

        async def check(method: str, request: Any) -> None:
            await self._admit(role, method, rule_for(method), request, context)

        return check

    def _count_operation(self, method: str, error: Exception | None) -> None:
        """Counts one operation of a batch stream as its unary ``method``'s call would be
        (an ``OperationCounter``; set only when the member keeps metrics)."""
        if method not in self._stream_outcomes:
            assert self._metrics is not None
            self._stream_outcomes[method] = _outcomes(self._metrics, method)
        counted = self._stream_outcomes[method]
        if counted is None:
            return
        if error is None:
            counted.ok.inc()
        else:
            counted.failed(status_for(error, False))

    async def _admit_stream(
        self, role: Role, method: str, rule: Rule, requests: Any, context: Context
    ) -> Any:
        """A request stream whose every message ``role`` may send under ``rule``."""
        if rule.job is None:
            role.check(rule, method, None)
            return requests
        return _checked_messages(role, method, rule, requests)

    async def _session_owner(self, session_id: int, context: Context) -> str | None:
        """The role that opened the session; None when it does not exist (the state machine
        then refuses the request itself). A session id is the raft index of its open, so a
        member that has applied that index knows the session for good or never will: until
        then (a follower a few entries behind the leader that answered the open), wait."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + wait_s(context)
        while self._node.state.applied_index < session_id:
            remaining_s = give_up_at - loop.time()
            if remaining_s <= 0 or not await self._node.wait_for_apply(remaining_s):
                raise ProposalTimeoutError(
                    f"session {session_id} is not applied on this member yet; retry"
                )
        info = self._node.state.session_info(session_id)
        return None if info is None else info.owner

    async def _fail(
        self, context: Context, error: Exception, outcomes: _Outcomes | None = None
    ) -> NoReturn:
        if isinstance(error, grpc.aio.AbortError):
            raise error
        remaining_s: float | None = context.time_remaining()
        status = status_for(error, remaining_s is not None and remaining_s <= 0)
        if outcomes is not None:
            outcomes.failed(status)
        await _abort(context, status)

    async def _request(self, data: Any, parse: Parse, streaming: bool) -> Any:
        """The request (or the stream of requests) parsed from what grpc handed over."""
        if streaming:
            return parsed_stream(data, parse, _unparsable)
        return await parse_or_refuse(parse, data, _unparsable)

    def _unary(
        self,
        method: str,
        rule: Rule,
        admit: _Admit,
        behaviour: _Behaviour,
        parse: Parse,
        streaming: bool,
    ) -> _Behaviour:
        outcomes = _outcomes(self._metrics, method)

        async def guarded(data: Any, context: Context) -> Any:
            try:
                role = self._role(context)
                request = await self._request(data, parse, streaming)
                if role is not None:
                    request = await admit(role, method, rule, request, context)
                caller = CALLER.set(role)
                try:
                    response = await behaviour(request, context)
                finally:
                    CALLER.reset(caller)
            except Exception as error:
                await self._fail(context, error, outcomes)
            if outcomes is not None:
                outcomes.ok.inc()
            return response

        return guarded

    def _streaming(
        self,
        method: str,
        rule: Rule,
        admit: _Admit,
        behaviour: _Behaviour,
        parse: Parse,
        streaming: bool,
    ) -> _Behaviour:
        opened = (
            self._metrics.streams_opened.labels(_snake(method))
            if self._metrics is not None
            else None
        )

        async def guarded(data: Any, context: Context) -> AsyncIterator[Any]:
            if opened is not None:
                opened.inc()
            try:
                role = self._role(context)
                request = await self._request(data, parse, streaming)
                if role is not None:
                    request = await admit(role, method, rule, request, context)
                    OPERATION_GUARD.set(self._operation_guard(role, context))
                if self._metrics is not None:
                    OPERATION_COUNTER.set(self._count_operation)
                async for response in behaviour(request, context):
                    yield response
            except Exception as error:
                await self._fail(context, error)

        return guarded

    def wrap(self, method: str, handler: Handler) -> Handler:
        """``handler`` of ``method`` ("/rallypoint.v1.KV/Put"), guarded by its rule."""
        rule = rule_for(method)
        if handler.request_streaming and rule.session is not None:
            raise AssertionError(f"{method}: a request stream cannot be checked per session")
        admit = self._admit_stream if handler.request_streaming else self._admit
        guard = self._streaming if handler.response_streaming else self._unary
        streaming = handler.request_streaming
        return taking_bytes(
            handler,
            lambda behaviour, parse: guard(method, rule, admit, behaviour, parse, streaming),
        )


_Admit = Callable[[Role, str, Rule, Any, Context], Awaitable[Any]]
_Behaviour = Callable[..., Any]


async def _checked_messages(
    role: Role, method: str, rule: Rule, requests: AsyncIterator[Any]
) -> AsyncIterator[Any]:
    async for request in requests:
        role.check(rule, method, request)
        yield request


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
    server: grpc.aio.Server,
    node: ServerNode,
    *,
    tokens: ClientTokens | None = None,
    auth_token: str | None = None,
    metrics: NodeMetrics | None = None,
) -> None:
    """Register KV, Watch, Lease, Session, Cluster, Rendezvous, RoundStore and
    CheckpointRegistry over ``node``, and the health service
    (SERVING for "" and each service). With ``tokens`` (or ``auth_token``, one admin token),
    every call to the public API must carry the metadata ``authorization: Bearer <token>``
    of a known token (else UNAUTHENTICATED) whose role allows it (else PERMISSION_DENIED).
    With ``metrics``, round-store and checkpoint calls are counted in them."""
    if tokens is None and auth_token:
        tokens = ClientTokens(admin_token=auth_token)
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
    maintenance_pb2_grpc.add_MaintenanceServicer_to_server(MaintenanceServicer(node), target)
    recorded = tuple(service for service, _ in recorder.services)
    if recorded != SERVICE_NAMES:
        raise AssertionError(f"generated code registered {recorded}, expected {SERVICE_NAMES}")
    guard = _Guard(node, tokens, metrics)
    for service, handlers in recorder.services:
        wrapped = {
            name: guard.wrap(f"/{service}/{name}", handler) for name, handler in handlers.items()
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))
    add_health_service(server)


def add_health_service(server: grpc.aio.Server) -> None:
    """The standard health service, SERVING for "" and each public service: on the client
    port (:func:`add_services`), or alone on the member's health port (``--health-address``),
    which probes reach without the client port's TLS or token."""
    health_pb2_grpc.add_HealthServicer_to_server(_Health(("", *SERVICE_NAMES)), server)
