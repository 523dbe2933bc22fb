"""A snapshot server queues the connections a new world's ranks open at once while its
accepting thread has not run yet (a CPU-starved process): none is dropped. A dropped one is
only sent again after its client's retransmission timeout, a second, which held a spare
host's whole restore (every rank waits for the slowest at the restore's agreement)."""

from __future__ import annotations

import select
import socket
import time

from rallypoint.worker.snapshots.server import SnapshotServer

CONNECTIONS = 48


def test_connections_wait_in_the_queue_while_the_server_accepts_none() -> None:
    server = SnapshotServer()
    host, port = server.address.rsplit(":", 1)
    # Its accepting thread stops; the listening socket stays open, as a starved thread's.
    server._server.shutdown()
    clients: list[socket.socket] = []
    try:
        for _ in range(CONNECTIONS):
            client = socket.socket()
            client.setblocking(False)
            client.connect_ex((host, int(port)))
            clients.append(client)
        pending = set(clients)
        deadline = time.monotonic() + 5.0
        while pending and time.monotonic() < deadline:
            _, writable, _ = select.select([], list(pending), [], 0.1)
            for client in writable:
                assert client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
                pending.discard(client)
        assert not pending, f"{len(pending)} of {CONNECTIONS} connections were not queued"
    finally:
        for client in clients:
            client.close()
        server.close()
