"""The bridge a torchrun agent holds: a :class:`~.server.StoreBridge` on an event loop thread
and a coordinator client of its own.

The bridge runs apart from the agent's participant (its own loop, its own client), so a
burst of worker store traffic never delays the agent's heartbeats. Its methods block the
calling thread (the agent's) until the loop has done what they ask.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from rallypoint.client import Client, TlsConfig

from .server import PortRange, StoreBridge

T = TypeVar("T")


class TCPStoreBridge:
    """Serves the TCPStore protocol for one round at a time, from an event loop thread and
    a coordinator client of its own; see ``server.py``."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        host: str = "127.0.0.1",
        token: str | None = None,
        tls: TlsConfig | None = None,
        timeout_s: float = 10.0,
        port_range: PortRange | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rallypoint-tcpstore-bridge", daemon=True
        )
        self._thread.start()
        # The session opens with the first store call: making a bridge never waits for the
        # coordinator (the agent's own client waits for it, see patience.py).
        self._client = Client(
            list(endpoints),
            token=token,
            tls=tls,
            timeout_s=timeout_s,
            open_session_on_connect=False,
        )
        self._bridge = StoreBridge(self._client, host=host, port_range=port_range)
        # The address the workers connect to (the port changes with each round).
        self.host = host
        self._closed = False
        self._run(self._client.connect())

    @property
    def port(self) -> int:
        """The current round's port (0 before the first)."""
        return self._bridge.port

    @property
    def round_number(self) -> int:
        """The round served now (0 before the first)."""
        return self._bridge.round_number

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def serve_round(self, job: str, round_number: int, participant_id: int) -> int:
        """Stop serving the previous round and serve this one on a fresh port; the port."""
        if self._closed:
            raise RuntimeError("the bridge is closed")
        return self._run(self._bridge.serve_round(job, round_number, participant_id))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._bridge.stop_serving())
            self._run(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
