"""gRPC method handlers that parse their own requests.

grpc parses each request with its handler's deserializer before the handler runs; a request
that does not parse (corrupt bytes, a string that is not UTF-8) then ends the call with
UNKNOWN and the parser's message, logged with a traceback, before any check of ours: an
unauthenticated caller learns how we parse, and a client error looks like a server bug. So
both ports register handlers that take the request's bytes (no deserializer) and parse them
where the port decides: the public port after it authenticated the caller, answering
INVALID_ARGUMENT; the peer port, which cannot authenticate what it cannot read, refusing it
as any unauthenticated request.

:class:`Recorder` stands in for the server in a generated ``add_*_to_server`` and keeps the
handlers, so that every method of a service is wrapped, including ones added later.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NoReturn

from google.protobuf.message import DecodeError

Handler = Any  # grpc.RpcMethodHandler: a namedtuple whose fields we replace
Parse = Callable[[bytes], Any]
# Ends the call for a request that does not parse (raises; never returns).
Refuse = Callable[[DecodeError], Awaitable[NoReturn]]


class Recorder:
    """Stands in for the server in a generated ``add_*_to_server``: keeps the handlers."""

    def __init__(self) -> None:
        self.services: list[tuple[str, dict[str, Handler]]] = []

    def add_generic_rpc_handlers(self, handlers: Sequence[object]) -> None:
        """Ignored: the same handlers arrive through add_registered_method_handlers."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Handler]) -> None:
        self.services.append((service, handlers))


def behaviour_field(handler: Handler) -> str:
    """The name of the handler's behaviour field (``unary_unary``, ``stream_unary``, ...)."""
    first = "stream" if handler.request_streaming else "unary"
    second = "stream" if handler.response_streaming else "unary"
    return f"{first}_{second}"


def taking_bytes(
    handler: Handler, wrap: Callable[[Callable[..., Any], Parse], Callable[..., Any]]
) -> Handler:
    """``handler`` with grpc's parsing turned off: its behaviour becomes ``wrap(behaviour,
    parse)``, which receives the request's bytes (or an iterator of them) and parses them
    with ``parse`` (the handler's own deserializer) where it sees fit."""
    field = behaviour_field(handler)
    parse: Parse = handler.request_deserializer
    return handler._replace(
        request_deserializer=None, **{field: wrap(getattr(handler, field), parse)}
    )


async def parse_or_refuse(parse: Parse, data: bytes, refuse: Refuse) -> Any:
    try:
        return parse(data)
    except DecodeError as error:
        await refuse(error)


async def parsed_stream(
    requests: AsyncIterator[bytes], parse: Parse, refuse: Refuse
) -> AsyncIterator[Any]:
    """The requests of a stream, parsed one by one as the handler reads them; the first
    that does not parse ends the call through ``refuse`` (raised where the handler reads, so
    its own clean-up runs)."""
    async for data in requests:
        yield await parse_or_refuse(parse, data, refuse)
