"""The dashboard's web server: just enough HTTP/1.1 for one page, JSON and server-sent events.

Theory of operation. The dashboard is read-only and serves a handful of GET routes, so it
speaks HTTP over asyncio streams instead of pulling in a web framework: read one request
(request line and headers, bounded in size and time), answer it, close the connection
(``Connection: close``: no keep-alive state to get wrong). A route returns a
:class:`Response` (status, content type, body) or, for ``/events``, an async iterator of
server-sent events that is streamed until the browser goes away. Anything the server cannot
serve gets a status and one line of text: 400 for a request it cannot parse, 404 for a
path or job it does not know, 405 for a method other than GET or HEAD.

JSON bodies are encoded with :func:`json_bytes`: the CLI's ``--json`` prints an infinite
phi (a confirmed suspicion) as ``Infinity``, which browsers' ``JSON.parse`` refuses, so
non-finite numbers become the strings ``"Infinity"``, ``"-Infinity"`` and ``"NaN"`` here:
the same word, in a form every JSON reader takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import unquote, urlsplit

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16 * 1024
REQUEST_TIMEOUT_S = 10.0


class HttpError(Exception):
    """A request the server refuses: its status and one line saying why."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Response:
    status: HTTPStatus
    content_type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Event:
    """One server-sent event: its name and its data (JSON); no name is a keep-alive, a
    comment line the browser ignores (sent on idle streams so proxies keep them open)."""

    name: str
    data: bytes = b""

    def encode(self) -> bytes:
        if not self.name:
            return b": keep-alive\n\n"
        return b"event: " + self.name.encode() + b"\ndata: " + self.data + b"\n\n"


EventStream = AsyncGenerator[Event, None]
Handler = Callable[[str, dict[str, str]], Awaitable[Response | EventStream]]


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def json_bytes(document: object) -> bytes:
    return json.dumps(_finite(document), allow_nan=False).encode()


def json_response(document: object) -> Response:
    return Response(HTTPStatus.OK, "application/json", json_bytes(document))


def text_response(status: HTTPStatus, line: str) -> Response:
    return Response(status, "text/plain; charset=utf-8", (line + "\n").encode())


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]]:
    """(method, path, query) of one request; its headers are read and dropped."""
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request too large") from None
    except (asyncio.IncompleteReadError, TimeoutError):
        raise HttpError(HTTPStatus.BAD_REQUEST, "incomplete request") from None
    request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"not an HTTP/1.x request line: {request_line!r}")
    method, target, _ = parts
    split = urlsplit(target)
    if not split.path.startswith("/"):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"bad request target {target!r}")
    query: dict[str, str] = {}
    for pair in filter(None, split.query.split("&")):
        key, _, value = pair.partition("=")
        query[unquote(key)] = unquote(value)
    return method, unquote(split.path), query


def _head(status: HTTPStatus, content_type: str, length: int | None) -> bytes:
    lines = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        f"Content-Type: {content_type}",
        "Cache-Control: no-store",
        "Connection: close",
        "X-Content-Type-Options: nosniff",
    ]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _stream_events(writer: asyncio.StreamWriter, events: EventStream) -> None:
    writer.write(_head(HTTPStatus.OK, "text/event-stream", None))
    # The browser reconnects by itself a second after the stream breaks.
    writer.write(b"retry: 1000\n\n")
    await writer.drain()
    try:
        async for event in events:
            writer.write(event.encode())
            await writer.drain()
    finally:
        await events.aclose()


def serve(
    handler: Handler,
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A connection callback for ``asyncio.start_server`` that answers with ``handler``."""

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        method = "GET"
        try:
            try:
                method, path, query = await _read_request(reader)
                if method not in ("GET", "HEAD"):
                    raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method}: only GET is served")
                answer = await handler(path, query)
            except HttpError as error:
                answer = text_response(error.status, str(error))
            if isinstance(answer, Response):
                writer.write(_head(answer.status, answer.content_type, len(answer.body)))
                if method != "HEAD":
                    writer.write(answer.body)
                await writer.drain()
            else:
                await _stream_events(writer, answer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the browser went away
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    return on_connection
