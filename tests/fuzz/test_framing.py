"""The stream listener against bad framing (framing.py): bounded, in process.

A fixed number of attacks drawn from one seed, each on its own connection to a real
``PeerListener`` (its handshake time shortened, so a slowloris is cut off fast). Each must
end within a deadline set by the listener, not by the attacker; nothing reaches Raft; and a
member's batch is taken afterwards.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest

from rallypoint.coordinator.peerwire import server as server_module
from rallypoint.coordinator.peerwire.server import PeerListener
from rallypoint.coordinator.peerwire.transport import StreamSender
from tests.coordinator.test_transport import (
    Host,
    delivered_numbers,
    free_port,
    heartbeat,
    wait_for,
)

from .framing import Attack, attacks
from .runner import run_batch

EXAMPLES = 60
HANDSHAKE_S = 0.3
DEFAULT_SEED = 20261205


async def _attack(address: str, attack: Attack) -> bytes:
    """Send the attack; what the listener said before it closed the connection."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    said = b""

    async def feed() -> None:
        try:
            if not attack.step:
                writer.write(attack.data)
                await writer.drain()
                return
            for i in range(0, len(attack.data), attack.step):
                writer.write(attack.data[i : i + attack.step])
                await writer.drain()
                await asyncio.sleep(attack.pause_s)
            # ... and then it keeps the connection open, saying nothing more.
        except (ConnectionError, OSError):
            pass

    feeding = asyncio.get_running_loop().create_task(feed())
    try:
        # The listener ends every connection: within its handshake time of the last byte it
        # was waiting for (plus scheduling slack on a loaded machine).
        async with asyncio.timeout(HANDSHAKE_S * 4 + 10.0):
            while chunk := await reader.read(65536):
                said += chunk
    except ConnectionError:
        pass
    finally:
        feeding.cancel()
        writer.close()
    return said


async def test_bad_framing_is_refused_and_the_listener_keeps_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "HANDSHAKE_TIMEOUT_S", HANDSHAKE_S)
    seed = int(os.environ.get("RALLYPOINT_FUZZ_SEED", DEFAULT_SEED))
    drawn: list[Attack] = []
    run_batch(attacks(), seed, EXAMPLES, drawn.append)
    assert len(drawn) == EXAMPLES
    assert any(a.what.startswith("slowloris") for a in drawn)
    assert any("oversized" in a.what for a in drawn)
    receiver = Host(2, tmp_path)
    listener = PeerListener(receiver)
    address = f"127.0.0.1:{free_port()}"
    await listener.start(address)
    try:
        # Concurrently, as an attacker would: the listener serves each apart.
        await asyncio.gather(*(_attack(address, a) for a in drawn))
        assert not receiver.delivered, [a.what for a in drawn]
        # A member is still served.
        sender_host = Host(1, tmp_path)
        sender_host.addresses[2] = address
        sender = StreamSender(sender_host, 2, None, random.Random(seed))
        sender.start()
        try:
            sender.send(heartbeat(1))
            await wait_for(lambda: 1 in delivered_numbers(receiver), 10.0, "a member's batch")
        finally:
            await sender.stop()
    finally:
        await listener.stop(grace=None)
