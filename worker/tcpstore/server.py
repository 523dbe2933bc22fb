"""Serves torch's TCPStore wire protocol on a local port, backed by a coordinator round store.

Theory of operation. Under torchrun, a worker's ``init_process_group()`` (``env://``) opens a
``TCPStore`` client to ``MASTER_ADDR:MASTER_PORT``; with ``TORCHELASTIC_USE_AGENT_STORE=True``
it assumes the agent serves that address and never starts a server of its own. The rallypoint
torchrun handler sets that flag and hands each agent's workers the address of a bridge in
that agent (``bridge.py``): every request the workers make is forwarded to the round store
of the agent's current round (rendezvous.proto, service RoundStore). So the workers' store
is replicated by the coordinator cluster, no worker connects to another node's host, and a
round's keys vanish with the round.

One listening port per round: :meth:`StoreBridge.serve_round` opens a fresh port bound to
the new round's store and closes the previous one with its connections, so a worker of an
earlier round can never read or write the new round's keys (and the coordinator refuses its
old round anyway). The port is any free one, or, with a :class:`PortRange` (a firewall's
opening), a free one of the range in random order, the previous round's last; a range of one
port serves every round on it, one after the other. A request the coordinator refuses (the
round ended, a limit) closes the connection: the worker's store call fails at once instead of
waiting out its timeout.

The wire protocol is parsed and encoded by ``protocol.py`` (sans IO); the round's requests
are coalesced by ``coalescing.py``, and answered from the leader's cache leases where they
run (``lease_cache.py``). Reads go to the client's preferred member (the leader once found)
on one ``RoundStore/Batch`` stream: the leader serves them under its lease without a round
trip, which measured faster than spreading them over followers (each of whose read barriers
is a ReadIndex forwarded to the leader). Each connection is an ``asyncio.Protocol``:
requests are parsed as the socket delivers them, and a leased read is answered there and
then, with no task or await (see :class:`Connection`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, assert_never

from rallypoint.client import Client, DeadlineExceededError, RallypointError, RoundStore
from rallypoint.client.tasks import cancel_and_wait
from rallypoint.proto.v1.counters import fits_int64, parse_counter

from ..errors import WorkerError
from .coalescing import Adds, Reads, Sets, Writes, resolve
from .protocol import (
    Add,
    Append,
    CancelWait,
    Check,
    CompareSet,
    DeleteKey,
    Get,
    GetNumKeys,
    MultiGet,
    MultiSet,
    Ping,
    ProtocolError,
    Request,
    RequestParser,
    Set,
    Validate,
    Wait,
    WaitResponse,
    encode_check,
    encode_integer,
    encode_pong,
    encode_value,
    encode_values,
    encode_wait,
)

# The name the bridge has always logged under (before it became a package).
log = logging.getLogger("rallypoint.worker.tcpstore_bridge")


def _int64(value: bytes) -> int | None:
    """``value`` as the coordinator's Add reads a counter, if it is one within int64 (an
    answer must fit the i64 the client reads), else None."""
    number = parse_counter(value)
    return number if number is not None and fits_int64(number) else None


# A connection stops reading its socket while this many bytes of requests wait behind one
# being answered.
_BUFFER_BYTES = 256 * 1024


class Connection(asyncio.Protocol):
    """One worker's TCPStore client, served against one round's store.

    An ``asyncio.Protocol``: the requests are parsed (``protocol.RequestParser``) as the
    socket delivers them, in :meth:`data_received`, and a read that running leases answer
    (most of gloo's bootstrap) is answered there and then, with no task, future or await,
    and a WAIT that they do not answer starts its wait task there (``waiting``: only a
    CANCEL_WAIT may follow it). Any other request that needs the coordinator starts a task
    (``serving``) that answers it and then every request behind it, in order, until the
    parser holds no whole request; while it runs, data received only joins the parser
    (reading pauses past ``_BUFFER_BYTES``). So the answers go out in the order the requests
    came, as the worker's client expects.

    ``closed`` is resolved once the socket closed and the task serving it (if any) ended.
    """

    def __init__(
        self,
        store: RoundStore,
        reads: Reads,
        adds: Adds,
        writes: Writes,
        sets: Sets | None = None,
    ) -> None:
        self.store = store
        self.reads = reads
        self.adds = adds
        self.writes = writes
        # The round's combined SETs (the bridge shares one among its connections; by default
        # this connection's own).
        self.sets = Sets(store) if sets is None else sets
        self.transport: asyncio.Transport | None = None
        self.peer: Any = None
        self.parser = RequestParser()
        # The task answering queries that need the coordinator (None when none is).
        self.serving: asyncio.Task[None] | None = None
        # The WAIT being served. Invariant: at most one (the client sends one query at a
        # time, and only CANCEL_WAIT may follow a WAIT before its answer).
        self.waiting: asyncio.Task[None] | None = None
        # Set while the transport's write buffer is full (the worker does not read).
        self._writable: asyncio.Future[None] | None = None
        self._lost = False
        self._reading_paused = False
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # --- the transport's callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")

    def data_received(self, data: bytes) -> None:
        self.parser.receive_data(data)
        if self.serving is not None:
            if self.parser.buffered_bytes > _BUFFER_BYTES and not self._reading_paused:
                self._reading_paused = True
                self.transport.pause_reading()  # type: ignore[union-attr]
            return
        try:
            while self._writable is None:
                request = self._next()
                if request is None:
                    return
                if self.answer_leased(request):
                    continue
                if isinstance(request, Wait):
                    # Its answer comes from a task of its own in any case (only CANCEL_WAIT
                    # may follow it): no serving task is needed to start that one.
                    self.start_wait(request.keys)
                    continue
                self.serving = asyncio.create_task(self._serve(request))
                return
            # The worker does not read its answers: serve the rest once it does.
            self.serving = asyncio.create_task(self._serve(None))
        except ProtocolError as error:
            self._close(error)

    def eof_received(self) -> bool | None:
        if self.parser.buffered_bytes and self.serving is None:
            log.warning("closing the store connection of %s: it ended within a query", self.peer)
        return None  # close the transport

    def connection_lost(self, error: Exception | None) -> None:
        self._lost = True
        if self.waiting is not None:
            self.waiting.cancel()
        if self._writable is not None:
            resolve(self._writable)
        if self.serving is None:
            resolve(self.closed)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None:
            resolve(writable)

    # --- serving

    def _next(self) -> Request | None:
        """The next whole request the parser holds, or None."""
        request = self.parser.next_request()
        if request is None and self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        return request

    async def _serve(self, request: Request | None) -> None:
        """Answer ``request`` and the requests behind it until the parser holds no whole
        one."""
        try:
            while not self._lost:
                if request is not None and not self.answer_leased(request):
                    await self.answer(request)
                if self._writable is not None:
                    await self._writable
                request = self._next()
                if request is None:
                    return
        except (RallypointError, ProtocolError) as error:
            self._close(error)
        except BaseException:
            self.close()  # the worker must not wait for an answer that will not come
            raise
        finally:
            self.serving = None
            if self._lost:
                resolve(self.closed)

    def _close(self, error: Exception) -> None:
        if isinstance(error, RallypointError):
            log.warning(
                "store %s refused a request of %s: %s", self.store.namespace, self.peer, error
            )
        else:
            log.warning("closing the store connection of %s: %s", self.peer, error)
        self.close()

    def write(self, data: bytes) -> None:
        """Send ``data`` to the worker (nothing once the connection is closing)."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def get(self, keys: Sequence[bytes]) -> list[bytes]:
        """The keys' values from the next coalesced read; a missing key fails the request."""
        await self.writes.settled()
        values = await self.reads.read(keys)
        if values is None:
            missing = ", ".join(repr(key) for key in keys)
            raise DeadlineExceededError(f"{self.store.namespace}: a key of {missing} is missing")
        return values

    def answer_leased(self, request: Request) -> bool:
        """Answer a read at once, with no task or future, if running leases hold every key
        it needs and no write of this bridge is in flight (a read waits for those: see
        ``Writes``); False if it must be served by :meth:`answer`. Most of gloo's
        bootstrap requests end here."""
        if self.writes.busy():
            return False
        if isinstance(request, Get):
            keys: Sequence[bytes] = (request.key,)
        elif isinstance(request, Wait | Check | MultiGet):
            keys = request.keys
        elif isinstance(request, Add) and request.delta == 0:
            keys = (request.key,)
        else:
            return False
        held = self.reads.cache.leased(keys) if keys else None
        if held is None:
            return False
        if isinstance(request, Get):
            self.write(encode_value(held[0]))
        elif isinstance(request, Add):
            count = _int64(held[0])
            if count is None:
                return False
            self.write(encode_integer(count))
        elif isinstance(request, Wait):
            if self.waiting is not None and not self.waiting.done():
                raise ProtocolError("a WAIT arrived while another was pending")
            self.write(encode_wait(WaitResponse.STOP_WAITING))
        elif isinstance(request, Check):
            self.write(encode_check(True))
        else:
            self.write(encode_values(held))
        return True

    async def answer(self, request: Request) -> None:
        store, write, writes = self.store, self.write, self.writes
        if isinstance(request, Validate):
            pass  # the parser checked its magic number; it has no answer
        elif isinstance(request, Ping):
            write(encode_pong(request.nonce))
        elif isinstance(request, Set):
            await writes.run(self.sets.set(request.key, request.value))
        elif isinstance(request, CompareSet):
            expected = request.expected
            result = await writes.run(store.compare_set(request.key, expected, request.desired))
            # torch's answer for an absent key with a non-empty expectation is the expectation.
            write(encode_value(expected if result.value is None else result.value))
        elif isinstance(request, Get):
            write(encode_value((await self.get([request.key]))[0]))
        elif isinstance(request, Add):
            key, delta = request.key, request.delta
            value = await self.counter(key) if delta == 0 else None
            if value is None:
                value = await writes.run(self.adds.add(key, delta))
            write(encode_integer(value))
        elif isinstance(request, Check):
            await writes.settled()
            write(encode_check(await self.reads.read(request.keys) is not None))
        elif isinstance(request, Wait):
            self.start_wait(request.keys)
        elif isinstance(request, CancelWait):
            await self.cancel_wait()
            write(encode_wait(WaitResponse.WAIT_CANCELED))
        elif isinstance(request, GetNumKeys):
            await writes.settled()
            write(encode_integer(await store.num_keys()))
        elif isinstance(request, DeleteKey):
            write(encode_integer(1 if await writes.run(store.delete(request.key)) else 0))
        elif isinstance(request, Append):
            await writes.run(store.append(request.key, request.value))
        elif isinstance(request, MultiGet):
            if request.keys:
                write(encode_values(await self.get(request.keys)))
        elif isinstance(request, MultiSet):
            await writes.run(store.multi_set(request.items))
        else:
            assert_never(request)

    async def counter(self, key: bytes) -> int | None:
        """An ADD of 0 answered by a read: the integer at ``key`` from the next coalesced read
        (c10d's store-based barrier reads its count so, every rank at once). Adding 0 to an
        integer that exists changes nothing, so the read's answer is the add's, at a point
        inside the request. None when the key is missing or holds no integer: then the add
        itself runs (creating the key, or failing as the coordinator says)."""
        await self.writes.settled()
        values = await self.reads.read([key], lease=False)
        return None if values is None else _int64(values[0])

    def start_wait(self, keys: Sequence[bytes]) -> None:
        if self.waiting is not None and not self.waiting.done():
            raise ProtocolError("a WAIT arrived while another was pending")
        self.waiting = asyncio.create_task(self.wait_for(keys))

    async def wait_for(self, keys: Sequence[bytes]) -> None:
        """Answer STOP_WAITING once every key exists, until the WAIT is cancelled: at once if
        running leases hold them; for a numbered key read in sequence (gloo's full mesh, a
        WAIT before every GET), by the next coalesced read, which reads the keys after it
        ahead; else by the shared coordinator wait on them, which answers as soon as they
        exist, at once if they do (a read first would be a second call whenever they do not
        yet: NCCL's unique id, a barrier's last-worker key). A connection that joined that
        wait after it was sent reads after it (answered by the wait's lease, if it got one)."""
        try:
            await self.writes.settled()
            reads = self.reads
            found = reads.cache.leased(keys) if keys else []
            if found is None and reads.in_sequence(keys):
                found = await reads.read(keys)
            while found is None:
                found = await reads.wait(keys)
                if found is None:  # joined a wait already sent: look again
                    found = await reads.read(keys)
        except RallypointError as error:
            # The reader is blocked on the socket: closing it ends the worker's wait now.
            log.warning("store %s refused a wait: %s", self.store.namespace, error)
            self.close()
            return
        self.write(encode_wait(WaitResponse.STOP_WAITING))

    async def cancel_wait(self) -> None:
        task, self.waiting = self.waiting, None
        if task is not None and not task.done():
            await cancel_and_wait(task)


@dataclass(frozen=True, slots=True)
class PortRange:
    """The TCP ports a listener may use, ``low`` to ``high`` inclusive."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high <= 65535:
            raise ValueError(f"port range {self.low}-{self.high}: need 1 <= LOW <= HIGH <= 65535")

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"

    def __len__(self) -> int:
        return self.high - self.low + 1

    @staticmethod
    def parse(text: str, setting: str = "port range") -> PortRange:
        """``LOW-HIGH`` (or one ``PORT``); a ValueError naming ``setting`` otherwise."""
        low, sep, high = text.strip().partition("-")
        try:
            port_range = PortRange(int(low), int(high if sep else low))
        except ValueError:
            raise ValueError(
                f"{setting}={text!r}: expected LOW-HIGH, two ports from 1 to 65535 with "
                "LOW <= HIGH (for example 29500-29599)"
            ) from None
        return port_range

    def candidates(self, rng: random.Random, last: int = 0) -> list[int]:
        """Every port of the range in random order, ``last`` (if in it) at the end."""
        ports = [port for port in range(self.low, self.high + 1) if port != last]
        rng.shuffle(ports)
        if self.low <= last <= self.high:
            ports.append(last)
        return ports


class NoFreePortError(OSError, WorkerError):
    """Every port of the range was in use."""


class StoreBridge:
    """The bridge's serving part on the running event loop, over a ``client`` it does not
    own (connected or not: the session opens with the first store call). One round at a time,
    as :class:`TCPStoreBridge` (which runs one of these on a thread of its own); for a program
    already on asyncio, or many bridges on one loop (``bench.store_load``)."""

    def __init__(
        self,
        client: Client,
        *,
        host: str = "127.0.0.1",
        port_range: PortRange | None = None,
    ) -> None:
        self.host = host
        self.port_range = port_range
        self._rng = random.Random()
        self._client = client
        # The listener of the current round; None before the first round and after close.
        self._server: asyncio.Server | None = None
        # The coalesced reads of the current round's connections (None when _server is).
        self._reads: Reads | None = None
        # The connections of the current round's listener.
        self._connections: set[Connection] = set()
        self.round_number = 0
        self.port = 0

    async def serve_round(self, job: str, round_number: int, participant_id: int) -> int:
        """Stop serving the previous round and serve this one on a fresh port; the port."""
        await self.stop_serving()
        # Reads go to the client's preferred member (the leader, once found) on its
        # RoundStore/Batch stream: the leader answers them under its lease with no round trip,
        # where a follower forwards a ReadIndex to the leader for every barrier. Measured
        # (bench.store_bench, gloo at 256 ranks, 3 members): 18.5-20.5 s on the leader against
        # 33.7-38.1 s spread over the members by participant id.
        store = self._client.round_store(job, round_number, participant_id)
        reads = self._reads = Reads(store, lambda: len(self._connections))
        adds = Adds(store)
        sets = Sets(store, reads.cache)
        writes = Writes()

        def accept() -> Connection:
            connection = Connection(store, reads, adds, writes, sets)
            self._connections.add(connection)
            connection.closed.add_done_callback(lambda _: self._connections.discard(connection))
            return connection

        self._server = await self._listen(accept)
        self.round_number = round_number
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("serving the store of %s to local workers on %s:%d", store, self.host, self.port)
        return self.port

    async def _listen(self, accept: Callable[[], Connection]) -> asyncio.Server:
        """A listener on a free port: any, or one of ``port_range``."""
        loop = asyncio.get_running_loop()
        if self.port_range is None:
            return await loop.create_server(accept, self.host, 0)
        for port in self.port_range.candidates(self._rng, last=self.port):
            try:
                return await loop.create_server(accept, self.host, port)
            except OSError as error:
                if error.errno != errno.EADDRINUSE:
                    raise
        raise NoFreePortError(
            f"no free port for the workers' store on {self.host} in {self.port_range}: "
            f"all {len(self.port_range)} are in use"
        )

    async def stop_serving(self) -> None:
        """Close the listener and every connection; a connection's task answering a query
        (if any) ends on its own once its call returns, which cancelling it would not do
        cleanly (a write may be on its way through Raft)."""
        server, self._server = self._server, None
        reads, self._reads = self._reads, None
        if server is not None:
            server.close()
        for connection in self._connections:
            connection.close()
        if self._connections:
            await asyncio.wait([connection.closed for connection in self._connections])
        if server is not None:
            await server.wait_closed()
        if reads is not None:
            reads.close()
