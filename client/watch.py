"""A watch that survives reconnects and leader changes with no gaps and no duplicates.

Theory of operation (proto/v1/watch.proto). The server streams events in revision order,
every event of one revision in one response, or, for a revision too large for one answer,
in consecutive responses marked ``fragment`` but the last. The watcher keeps a revision's
fragments aside and delivers them only once the last one arrived, so a revision is always
delivered whole; a stream that breaks between fragments drops them, and the new stream sends
that revision again from its start. The watcher tracks two revisions:

- ``delivered_next``: the last delivered event's revision + 1. Events below it (a member
  resending what another already sent after a reconnect) are dropped, so nothing is
  delivered twice.
- ``next_revision``, where a new stream starts: at least ``delivered_next``, and moved further
  by progress notifications (responses without events, whose header revision says how far
  the member is), so an idle watcher does not resume from history that has since been
  compacted. A progress mark is trusted only once a *later* progress mark arrives on the same
  stream: a member's header can run a little ahead of its watch stream (the batch for that
  revision may still be on its way), and a whole progress interval later it no longer is.

A watch "from now" (start_revision 0) first reads the current revision with a linearizable
range and starts at that revision + 1, so even a stream that breaks before its first event
resumes without a gap. "Now" is when the watch starts: on ``async with`` entry, ``start()``,
or the first iteration. To watch with no gap after a read, pass the read's revision + 1.

When the server says the start revision was compacted the watcher raises
:class:`CompactedError`. A stream that ends, fails with UNAVAILABLE, or stays silent
for three progress intervals is reopened (following leader hints, with backoff); any other
error is raised.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable

import grpc
import grpc.aio

from rallypoint.proto.v1 import watch_pb2

from .arguments import count
from .errors import CompactedError, RallypointError, UnavailableError, map_rpc_error
from .transport import Retrier, Transport
from .values import WatchEvent

WatchCall = grpc.aio.UnaryStreamCall[watch_pb2.WatchRequest, watch_pb2.WatchResponse]


class Watcher:
    """``async for event in watcher``; close it with ``aclose()`` or ``async with``."""

    def __init__(
        self,
        transport: Transport,
        key: bytes,
        *,
        prefix: bool,
        start_revision: int,
        prev_kv: bool,
        progress_interval_s: float | None,
        current_revision: Callable[[], Awaitable[int]],
    ) -> None:
        count(start_revision, "start_revision", least=0)
        self._transport = transport
        self.key = key
        self.prefix = prefix
        self._prev_kv = prev_kv
        self._progress_interval_s = progress_interval_s
        self._current_revision = current_revision
        # Invariant: every event with revision < delivered_next was delivered (or precedes the
        # watch's start); none with revision >= delivered_next was. 0 until the start is known.
        self.delivered_next = start_revision
        # The last progress mark of the current stream, not trusted yet (see the docstring),
        # and the latest trusted one. Invariant: every matching event with revision <=
        # progress_confirmed was delivered.
        self._progress_candidate = 0
        self._progress_confirmed = 0
        self._buffer: collections.deque[WatchEvent] = collections.deque()
        # The events of a revision whose last fragment has not arrived on this stream yet.
        # Invariant: all share one revision >= delivered_next; empty after _drop_stream.
        self._fragments: list[WatchEvent] = []
        self._call: WatchCall | None = None
        self._address = ""
        self._retrier = Retrier(transport)
        self._compact_revision = 0
        self._closed = False
        # Number of streams opened; the first is 1.
        self.streams_opened = 0

    def __aiter__(self) -> Watcher:
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            await self._fill()
        return self._buffer.popleft()

    async def __aenter__(self) -> Watcher:
        await self.start()
        return self

    async def start(self) -> None:
        """Fix the start revision (for a watch from now) and open the stream. Iterating does
        this too; ``async with`` does it on entry, so changes made inside the block are seen."""
        if self.delivered_next == 0:
            self.delivered_next = await self._current_revision() + 1
        if self._call is None:
            self._call = self._open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        self._drop_stream()

    @property
    def next_revision(self) -> int:
        """Where a new stream would start: nothing before it remains to be delivered."""
        return max(self.delivered_next, self._progress_confirmed + 1)

    def _drop_stream(self) -> None:
        self._progress_candidate = 0
        self._fragments = []
        if self._call is not None:
            self._call.cancel()
            self._call = None

    def _open(self) -> WatchCall:
        self._address = self._transport.pick()
        request = watch_pb2.WatchRequest(
            key=self.key,
            prefix=self.prefix,
            start_revision=self.next_revision,
            prev_kv=self._prev_kv,
            progress_interval_ms=round((self._progress_interval_s or 0) * 1000),
        )
        self.streams_opened += 1
        return self._transport.stubs(self._address).watch.Watch(
            request, metadata=self._transport.metadata
        )

    async def _fill(self) -> None:
        """Read one response into the buffer, or recover from one failure."""
        await self.start()
        assert self._call is not None
        patience_s = None
        if self._progress_interval_s:
            patience_s = 3 * self._progress_interval_s + 1.0
        try:
            async with asyncio.timeout(patience_s):
                response = await self._call.read()
        except asyncio.CancelledError:
            # A cancellation of the reading task itself propagates. Otherwise the stream was
            # cancelled under a pending read: by aclose() (the iteration ends) or by gRPC.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            if self._closed:
                raise StopAsyncIteration from None
            await self._recover(UnavailableError(f"the watch stream to {self._address} ended"))
            return
        except TimeoutError:
            await self._recover(
                UnavailableError(f"{self._address} sent nothing on a watch for {patience_s:g} s")
            )
            return
        except grpc.aio.AioRpcError as rpc_error:
            error = map_rpc_error(rpc_error, self._address)
            if isinstance(error, CompactedError):
                self._drop_stream()
                raise CompactedError(
                    f"{error.server_message}: watch from revision {self.next_revision} "
                    "needs history that was compacted; re-read the state and watch from the "
                    "read's revision + 1",
                    reason=error.reason,
                    compact_revision=self._compact_revision,
                ) from None
            if not isinstance(error, UnavailableError):
                self._drop_stream()
                raise error from None
            await self._recover(error)
            return
        if not isinstance(response, watch_pb2.WatchResponse):  # grpc.aio.EOF
            await self._recover(UnavailableError(f"{self._address} ended the watch stream"))
            return
        self._retrier.answered()
        self._transport.note_success(self._address)
        if response.compact_revision:
            # The stream ends with OUT_OF_RANGE next; remember what the server offered.
            self._compact_revision = response.compact_revision
            return
        self._deliver(response)

    def _deliver(self, response: watch_pb2.WatchResponse) -> None:
        if not response.events:
            if self._progress_candidate:
                self._progress_confirmed = max(self._progress_confirmed, self._progress_candidate)
            self._progress_candidate = response.header.revision
            return
        for proto_event in response.events:
            event = WatchEvent.from_proto(proto_event)
            if event.revision >= self.delivered_next:
                self._fragments.append(event)
        if response.fragment:
            return
        self._buffer.extend(self._fragments)
        self._fragments = []
        if self._buffer:
            self.delivered_next = self._buffer[-1].revision + 1

    async def _recover(self, error: RallypointError) -> None:
        self._drop_stream()
        await self._retrier.after_failure(self._address, error)
