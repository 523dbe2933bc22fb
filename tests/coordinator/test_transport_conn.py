"""One stream peer connection's read deadlines (coordinator/peerwire/conn.py), kept by one
watchdog timer per connection rather than a timer per read: a read with no frame in its idle
time, or a frame begun and not finished in time, still ends the connection; frames that keep
coming keep it alive; a read cancelled by its caller leaves no deadline behind.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import uvloop

from rallypoint.coordinator.peerwire import conn as conn_module
from rallypoint.coordinator.peerwire import frames
from rallypoint.coordinator.peerwire.conn import ConnectionLost, FrameConn
from tests.coordinator.test_transport import wait_for
from tests.coordinator.timeout_scopes import TimeoutScopes


@dataclass
class Link:
    """A FrameConn (the side under test) and the raw writer of the other end."""

    conn: FrameConn
    other: asyncio.StreamWriter
    server: asyncio.Server
    accepted: list[asyncio.StreamWriter] = field(default_factory=list)


@pytest.fixture
async def link() -> AsyncIterator[Link]:
    accepted: list[asyncio.StreamWriter] = []
    ready = asyncio.Event()

    async def serve(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        ready.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.wait_for(ready.wait(), 5.0)
    conn = FrameConn(reader, writer)
    try:
        yield Link(conn, accepted[0], server, accepted)
    finally:
        await conn.aclose()
        for other in accepted:
            other.close()
        server.close()
        await server.wait_closed()


def ping() -> bytes:
    return frames.frame(frames.BATCH, b"body")


async def test_a_read_with_no_frame_in_its_idle_time_ends_the_connection(link: Link) -> None:
    with pytest.raises(ConnectionLost, match="the peer sent nothing in time"):
        await link.conn.read(0.2)
    # The connection is finished: a frame that comes now is not read.
    link.other.write(ping())
    with pytest.raises(ConnectionLost, match="the peer sent nothing in time"):
        await link.conn.read(5.0)


async def test_a_frame_begun_and_not_finished_in_time_ends_the_connection(
    link: Link, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(conn_module, "FRAME_TIMEOUT_S", 0.2)
    link.other.write(frames.frame(frames.BATCH, b"x" * 100)[:20])  # then nothing more
    with pytest.raises(ConnectionLost, match="the peer sent nothing in time"):
        await link.conn.read(None)  # no idle limit: only the begun frame's


async def test_a_later_deadline_is_kept_by_the_armed_watchdog(link: Link) -> None:
    """The first read arms the watchdog for 1 s; the second, with 3 s, moves only the
    deadline: the watchdog fires at 1 s, finds it later and re-arms, and the frame that
    comes after that is read."""
    link.other.write(ping())
    assert await link.conn.read(1.0) == (frames.BATCH, b"body")
    second = asyncio.get_running_loop().create_task(link.conn.read(3.0))
    await wait_for(lambda: link.conn.watchdog_timers == 2, 5.0, "the watchdog to re-arm")
    assert not second.done()
    link.other.write(ping())
    assert await asyncio.wait_for(second, 5.0) == (frames.BATCH, b"body")


async def test_a_read_cancelled_by_its_caller_leaves_no_deadline(link: Link) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await link.conn.read(0.3)  # the caller's own limit ends it first
    # The cancelled read's deadline (0.3 s) passes while the next read waits without one.
    later = asyncio.get_running_loop().create_task(link.conn.read(None))
    await asyncio.sleep(0.5)
    assert not later.done()
    link.other.write(ping())
    assert await asyncio.wait_for(later, 5.0) == (frames.BATCH, b"body")


async def test_frames_read_one_after_another_arm_no_timer_each(
    link: Link, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 frames read with an idle limit: at most the watchdog's one timer, and no
    ``asyncio.timeout`` scope (two per frame before: a timer scheduled and cancelled each)."""
    scopes = TimeoutScopes(monkeypatch)
    for number in range(200):
        link.other.write(frames.frame(frames.BATCH, b"%d" % number))
    for number in range(200):
        assert await link.conn.read(30.0) == (frames.BATCH, b"%d" % number)
    link.conn.write(frames.PONG)
    await link.conn.drain()
    assert scopes.count == 0
    assert link.conn.watchdog_timers == 1


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_writes_after_the_peer_reset_the_connection_raise_connection_lost(loop: str) -> None:
    """A peer that died (its kernel answers with a reset) leaves the connection's transport
    closed. uvloop raised RuntimeError for the next write (asyncio's transport dropped it
    silently): in a peer sender that had frames queued when the reset came, that ended the
    sender's task for good, and the member never sent that peer anything again (the jepsen
    wipe run whose two live members could not elect each other, for 60 s and more). Every
    write on a broken connection now raises ConnectionLost, which the sender handles."""

    async def scenario() -> list[str]:
        async def reset_at_once(_reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.transport.abort()

        server = await asyncio.start_server(reset_at_once, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        conn = FrameConn(reader, writer)
        outcomes: list[str] = []
        try:
            with contextlib.suppress(ConnectionLost):
                await conn.read(5.0)  # the reset, seen by the read side
            for _ in range(5):
                try:
                    conn.write(frames.BATCH, b"body")
                    outcomes.append("queued")
                except ConnectionLost:
                    outcomes.append("lost")
                    break
                except Exception as exc:  # the failure this test guards against
                    outcomes.append(type(exc).__name__)
                    break
                await asyncio.sleep(0.05)  # the transport takes in the failed send
        finally:
            conn.close()
            server.close()
            await server.wait_closed()
        return outcomes

    runner = asyncio.run if loop == "asyncio" else uvloop.run
    outcomes = runner(scenario())
    assert outcomes[-1] == "lost", outcomes
