"""The snapshot server every process runs: the blobs it holds (its own and the replicas it
protects), the parity shares it keeps and the blobs staged for coding, served to the current
world's ranks over the wire of worker/snapshots/protocol.py."""

from __future__ import annotations

import hmac
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Sequence
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata

from .placement import SnapshotError, SnapshotId, SnapshotPlacement
from .protocol import REQUEST_TIMEOUT_S, SOCKET_BUFFER_BYTES, recv_exactly, recv_header, send

log = logging.getLogger("rallypoint.worker.snapshots")


# Connections the kernel queues before the server's thread accepts them (socketserver's
# default is 5). A new world's ranks all fetch at once, several blobs each, and the accepting
# thread of a CPU-starved process runs late: a connection beyond the queue is dropped and its
# client's kernel sends it again only after its initial retransmission timeout, a second
# (measured: two ranks of a spare host's restore held 1.0 s, every other rank waiting for
# them at the restore's agreement).
LISTEN_BACKLOG = 512


def _key(round_number: int, step: int, rank: int) -> tuple[int, int, int]:
    return (round_number, step, rank)


class SnapshotServer:
    """The blobs this process holds (its own and the replicas it protects) and the parity
    shares it keeps, served to the current world's ranks over TCP. Thread-safe; one per
    process, across rounds."""

    def __init__(self, bind: str = "127.0.0.1", advertise: str | None = None) -> None:
        self._lock = threading.Lock()
        self._blobs: dict[tuple[int, int, int], bytes | bytearray] = {}
        self._metadata: dict[SnapshotId, Metadata] = {}
        self._placements: dict[SnapshotId, SnapshotPlacement] = {}
        # Parity shares, keyed by (round, step, group, parity index).
        self._parity: dict[tuple[int, int, int, int], bytes] = {}
        # Data blobs of its groups' ranks a parity holder received to code, keyed like
        # ``_blobs``; dropped once coded (never counted as held).
        self._staged: dict[tuple[int, int, int], bytes | bytearray] = {}
        self._arrived = threading.Condition(self._lock)
        self._token = b""
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = LISTEN_BACKLOG

        self._server = Server((bind, 0), Handler)
        self.address = f"{advertise or bind}:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="rallypoint-snapshots", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- what this process holds

    def set_token(self, token: bytes) -> None:
        """Accept requests of the world holding ``token`` only (a new world's replaces it)."""
        with self._lock:
            self._token = token

    def put(self, snapshot: SnapshotId, rank: int, blob: bytes | bytearray) -> None:
        with self._lock:
            self._blobs[_key(snapshot.round, snapshot.step, rank)] = blob

    def put_metadata(self, snapshot: SnapshotId, metadata: Metadata) -> None:
        with self._lock:
            self._metadata[snapshot] = metadata

    def metadata(self, snapshot: SnapshotId) -> Metadata | None:
        with self._lock:
            return self._metadata.get(snapshot)

    def put_placement(self, snapshot: SnapshotId, placement: SnapshotPlacement) -> None:
        with self._lock:
            self._placements[snapshot] = placement

    def placement(self, snapshot: SnapshotId) -> SnapshotPlacement | None:
        with self._lock:
            return self._placements.get(snapshot)

    def put_parity(self, snapshot: SnapshotId, group: int, parity: int, share: bytes) -> None:
        with self._lock:
            self._parity[(snapshot.round, snapshot.step, group, parity)] = share

    def parity(self, snapshot: SnapshotId, group: int, parity: int) -> bytes | None:
        with self._lock:
            return self._parity.get((snapshot.round, snapshot.step, group, parity))

    def held_parity(self, snapshot: SnapshotId) -> tuple[tuple[int, int], ...]:
        """The (group, parity index) shares of ``snapshot`` this process holds."""
        with self._lock:
            return tuple(
                sorted(
                    (g, j)
                    for (rnd, step, g, j) in self._parity
                    if SnapshotId(rnd, step) == snapshot
                )
            )

    def stage(self, snapshot: SnapshotId, rank: int, blob: bytes | bytearray) -> None:
        """Keep rank ``rank``'s blob until this process has coded its parity share(s)."""
        with self._arrived:
            self._staged[_key(snapshot.round, snapshot.step, rank)] = blob
            self._arrived.notify_all()

    def take_staged(
        self, snapshot: SnapshotId, ranks: Sequence[int], timeout_s: float
    ) -> list[bytes | bytearray]:
        """Wait until the blobs of ``ranks`` are staged, then hand them over (in that order)
        and forget them; raises SnapshotError naming the ranks still missing at the
        deadline."""
        keys = [_key(snapshot.round, snapshot.step, rank) for rank in ranks]
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while not all(key in self._staged for key in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [key[2] for key in keys if key not in self._staged]
                    raise SnapshotError(
                        f"{snapshot}: the blobs of rank(s) {', '.join(map(str, missing))} "
                        f"did not arrive within {timeout_s:.0f} s"
                    )
                self._arrived.wait(left)
            return [self._staged.pop(key) for key in keys]

    def blob(self, snapshot: SnapshotId, rank: int) -> bytes | bytearray | None:
        with self._lock:
            return self._blobs.get(_key(snapshot.round, snapshot.step, rank))

    def held(self, snapshot: SnapshotId) -> tuple[int, ...]:
        """The ranks of ``snapshot``'s world whose blobs this process holds."""
        with self._lock:
            return tuple(
                sorted(r for (rnd, step, r) in self._blobs if SnapshotId(rnd, step) == snapshot)
            )

    def snapshots(self) -> list[SnapshotId]:
        with self._lock:
            return sorted(
                {SnapshotId(rnd, step) for (rnd, step, _) in self._blobs}
                | {SnapshotId(rnd, step) for (rnd, step, _, _) in self._parity}
            )

    def held_bytes(self) -> int:
        """The bytes of the blobs and parity shares this process holds (and blobs staged for
        coding, none at rest)."""
        with self._lock:
            return sum(
                len(blob)
                for held in (self._blobs, self._parity, self._staged)
                for blob in held.values()
            )

    def _keyed(self) -> tuple[dict[Any, Any], ...]:
        """What it keeps keyed by (round, step, ...)."""
        return (self._blobs, self._parity, self._staged)

    def drop_older(self, snapshot: SnapshotId) -> None:
        """Drop every snapshot older than ``snapshot`` (once it is registered, nothing older
        can be the one to restore)."""
        with self._lock:
            for held in self._keyed():
                for key in [k for k in held if SnapshotId(k[0], k[1]) < snapshot]:
                    del held[key]
            for snapshots in (self._metadata, self._placements):
                for older in [s for s in snapshots if s < snapshot]:
                    del snapshots[older]

    def drop(self, snapshot: SnapshotId) -> None:
        """Drop ``snapshot`` (refused by the registry: it can never be restored)."""
        with self._lock:
            for held in self._keyed():
                for key in [k for k in held if SnapshotId(k[0], k[1]) == snapshot]:
                    del held[key]
            self._metadata.pop(snapshot, None)
            self._placements.pop(snapshot, None)

    # -- serving

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(REQUEST_TIMEOUT_S)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        peer = sock.getpeername()
        try:
            header = recv_header(sock)
            with self._lock:
                token = self._token
            offered = header.get("token")
            if not (isinstance(offered, bytes) and token and hmac.compare_digest(offered, token)):
                send(sock, {"error": "refused: not a member of the current world"})
                log.warning("refused a snapshot request of %s: wrong or stale token", peer)
                return
            op = header.get("op")
            snapshot = SnapshotId(int(header["round"]), int(header["step"]))
            if op in ("put", "stage"):
                rank = int(header["rank"])
                length = int(header["length"])
                blob = recv_exactly(sock, length)
                (self.put if op == "put" else self.stage)(snapshot, rank, blob)
                send(sock, {"ok": True})
            elif op in ("read", "read-parity"):
                if op == "read":
                    rank = int(header["rank"])
                    stored: bytes | bytearray | None = self.blob(snapshot, rank)
                    what = f"blob of rank {rank}"
                else:
                    group, parity = int(header["group"]), int(header["parity"])
                    stored = self.parity(snapshot, group, parity)
                    what = f"parity share {parity} of group {group}"
                if stored is None:
                    send(sock, {"error": f"holds no {what} of {snapshot}"})
                    return
                view = memoryview(stored)
                ranges = [(int(offset), int(length)) for offset, length in header["ranges"]]
                if any(o < 0 or n < 0 or o + n > len(view) for o, n in ranges):
                    send(sock, {"error": f"a range is outside the blob of {len(view)} bytes"})
                    return
                send(sock, {"ok": True}, [view[o : o + n] for o, n in ranges])
            else:
                send(sock, {"error": f"unknown operation {op!r}"})
        except (OSError, ConnectionError, KeyError, TypeError, ValueError) as error:
            log.warning("a snapshot request of %s failed: %s", peer, error)
