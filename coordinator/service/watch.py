"""The Watch service: one WatchResponse per revision (or a few, for a huge one), in order,
from the member's watch.

Theory of operation. ``node.watch`` yields the events of one revision at a time, with no
gaps and no duplicates; each batch becomes one response, or, when it holds more than the
member's cap on one answer (``Limits.max_answer_keys`` events, ``max_answer_bytes`` bytes),
consecutive responses with ``fragment`` set on all but the last (a prefix delete of 50,000
keys is one revision). Nothing else is sent between the fragments of a revision, and a
client resumes only from a revision it has whole. With a progress interval, the next batch
is awaited as a task and an empty response carrying the current header is sent whenever the
interval passes without one (the task is kept, not cancelled: cancelling the member's
iterator mid-step would end it). When the start revision was compacted, the member raises
CompactedWatchError; the client is sent one response with ``compact_revision`` set, then
the error ends the stream with OUT_OF_RANGE. When the client cancels, grpc cancels this
handler; ``finally`` releases the member's iterator so its resources go at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from rallypoint.proto.v1 import watch_pb2, watch_pb2_grpc

from ..node.api import CompactedWatchError, ServerNode
from ..state.values import Event, EventType
from . import validate
from .common import Context, header_pb, kv_pb
from .errors import InvalidArgument

_EVENT_TYPES = {EventType.PUT: watch_pb2.PUT, EventType.DELETE: watch_pb2.DELETE}


def event_pb(event: Event, with_prev: bool) -> watch_pb2.Event:
    message = watch_pb2.Event(
        type=_EVENT_TYPES[event.type],
        kv=kv_pb(event.kv),
        prev_revision=event.prev.mod_revision if event.prev is not None else 0,
    )
    if with_prev and event.prev is not None:
        message.prev_kv.CopyFrom(kv_pb(event.prev))
    return message


class WatchServicer(watch_pb2_grpc.WatchServicer):
    def __init__(self, node: ServerNode) -> None:
        self.node = node

    async def Watch(
        self, request: watch_pb2.WatchRequest, context: Context
    ) -> AsyncIterator[watch_pb2.WatchResponse]:
        if not request.key and not request.prefix:
            raise InvalidArgument("key", "must not be empty unless prefix is set")
        validate.key(request.key, self.node.state.limits, allow_empty=True)
        start_revision = validate.non_negative(request.start_revision, "start_revision")
        interval_ms = validate.non_negative(request.progress_interval_ms, "progress_interval_ms")
        batches = self.node.watch(start_revision, request.key, request.prefix)
        limits = self.node.state.limits
        try:
            async for batch in _with_progress(batches, interval_ms / 1000):
                if not batch:
                    yield watch_pb2.WatchResponse(header=header_pb(self.node.header()))
                    continue
                events = [event_pb(event, request.prev_kv) for event in batch]
                parts = _split(events, limits.max_answer_keys, limits.max_answer_bytes)
                for number, part in enumerate(parts, 1):
                    yield watch_pb2.WatchResponse(
                        header=header_pb(self.node.header()),
                        events=part,
                        fragment=number < len(parts),
                    )
        except CompactedWatchError as compacted:
            yield watch_pb2.WatchResponse(
                header=header_pb(self.node.header()),
                compact_revision=compacted.first_available,
            )
            raise


def _split(
    events: list[watch_pb2.Event], max_events: int, max_bytes: int
) -> list[list[watch_pb2.Event]]:
    """``events`` in order, cut into parts of at most ``max_events`` events and
    ``max_bytes`` encoded bytes (a single larger event is a part of its own)."""
    parts: list[list[watch_pb2.Event]] = [[]]
    size_bytes = 0
    for event in events:
        event_bytes = event.ByteSize()
        if parts[-1] and (len(parts[-1]) == max_events or size_bytes + event_bytes > max_bytes):
            parts.append([])
            size_bytes = 0
        parts[-1].append(event)
        size_bytes += event_bytes
    return parts


async def _with_progress(
    batches: AsyncIterator[list[Event]], interval_s: float
) -> AsyncIterator[list[Event]]:
    """The batches, with an empty one whenever ``interval_s`` (> 0) passes without a batch.
    Closes ``batches`` when done, however it ends."""
    pending: asyncio.Future[list[Event]] | None = None
    try:
        if interval_s <= 0:
            async for batch in batches:
                yield batch
            return
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(batches))
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield []
                continue
            try:
                batch = pending.result()
            except StopAsyncIteration:
                return
            finally:
                pending = None
            yield batch
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
        aclose = getattr(batches, "aclose", None)
        if aclose is not None:
            await aclose()
