"""The snapshot server every process runs: the blobs it holds (its own and the replicas it
protects), the parity shares it keeps and the blobs staged for coding, served to the current
world's ranks over the wire of worker/snapshots/protocol.py. With a directory in host memory
(worker/snapshots/hostfiles.py) what it holds is kept in files there, and a process started
after one that died takes up the files of the registered snapshot (:meth:`recover`)."""

from __future__ import annotations

import hmac
import logging
import pickle
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata

from .hostfiles import (
    NAME,
    Buffer,
    HostFiles,
    blob_name,
    parity_name,
    small_name,
    world_of,
)
from .placement import SnapshotError, SnapshotId, SnapshotPlacement
from .protocol import (
    REQUEST_TIMEOUT_S,
    SOCKET_BUFFER_BYTES,
    recv_exactly,
    recv_header,
    recv_into,
    send,
)

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

    def __init__(
        self, bind: str = "127.0.0.1", advertise: str | None = None, files: HostFiles | None = None
    ) -> None:
        self._lock = threading.Lock()
        # Where what it holds is kept in host memory outside the process (None: the heap).
        self._files = files
        # The world of each round it holds snapshots of (its name in file names).
        self._worlds: dict[int, str] = {}
        self._blobs: dict[tuple[int, int, int], Buffer] = {}
        self._metadata: dict[SnapshotId, Metadata] = {}
        self._placements: dict[SnapshotId, SnapshotPlacement] = {}
        # Parity shares, keyed by (round, step, group, parity index).
        self._parity: dict[tuple[int, int, int, int], Buffer] = {}
        # Data blobs of its groups' ranks a parity holder received to code, keyed like
        # ``_blobs``; dropped once coded (never counted as held).
        self._staged: dict[tuple[int, int, int], Buffer] = {}
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

    def close(self, *, keep_files: bool = False) -> None:
        """Stop serving; ``keep_files`` leaves the snapshot files for a process started
        after this one (else they are removed)."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            if self._files is not None:
                self._files.close(keep=keep_files)
                self._files = None

    # -- what this process holds

    def set_token(self, token: bytes, round_number: int | None = None) -> None:
        """Accept requests of the world holding ``token`` only (a new world's replaces it);
        ``round_number``: the world's round, whose snapshots' files are named by it."""
        with self._lock:
            self._token = token
            if round_number is not None:
                self._worlds[round_number] = world_of(token)

    def world(self, round_number: int) -> str:
        """The name of the world of ``round_number`` ("" if unknown)."""
        with self._lock:
            return self._worlds.get(round_number, "")

    def _world_files(self, round_number: int) -> tuple[HostFiles | None, str]:
        """The directory (None: none) and the name of the world of ``round_number``. Files
        are written outside the server's lock (HostFiles is thread-safe): serving goes on."""
        with self._lock:
            return self._files, self._worlds.get(round_number, "")

    def allocate(self, snapshot: SnapshotId, rank: int, length: int) -> Buffer:
        """A buffer of ``length`` bytes to write rank ``rank``'s blob into before
        :meth:`put` (in its file when there is a directory: no second copy)."""
        files, world = self._world_files(snapshot.round)
        if files is None:
            return bytearray(length)
        return files.allocate(blob_name(snapshot.round, snapshot.step, world, rank), length)

    def abandon(self, buffer: Buffer) -> None:
        """Forget a buffer :meth:`allocate` made that is not put (a transfer failed)."""
        with self._lock:
            files = self._files
        if files is not None:
            files.abandon(buffer)

    def put(self, snapshot: SnapshotId, rank: int, blob: Buffer) -> None:
        files, world = self._world_files(snapshot.round)
        if files is not None:
            blob = files.commit(blob_name(snapshot.round, snapshot.step, world, rank), blob)
        with self._lock:
            self._blobs[_key(snapshot.round, snapshot.step, rank)] = blob

    def put_metadata(self, snapshot: SnapshotId, metadata: Metadata) -> None:
        self._write_small(snapshot, "metadata", pickle.dumps(metadata))
        with self._lock:
            self._metadata[snapshot] = metadata

    def _write_small(self, snapshot: SnapshotId, what: str, data: bytes) -> None:
        files, world = self._world_files(snapshot.round)
        if files is not None:
            files.keep(small_name(snapshot.round, snapshot.step, world, what), data)

    def metadata(self, snapshot: SnapshotId) -> Metadata | None:
        with self._lock:
            return self._metadata.get(snapshot)

    def put_placement(self, snapshot: SnapshotId, placement: SnapshotPlacement) -> None:
        self._write_small(snapshot, "placement", placement.to_bytes())
        with self._lock:
            self._placements[snapshot] = placement

    def placement(self, snapshot: SnapshotId) -> SnapshotPlacement | None:
        with self._lock:
            return self._placements.get(snapshot)

    def put_parity(self, snapshot: SnapshotId, group: int, parity: int, share: Buffer) -> None:
        files, world = self._world_files(snapshot.round)
        if files is not None:
            share = files.commit(
                parity_name(snapshot.round, snapshot.step, world, group, parity), share
            )
        with self._lock:
            self._parity[(snapshot.round, snapshot.step, group, parity)] = share

    def parity(self, snapshot: SnapshotId, group: int, parity: int) -> Buffer | None:
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

    def stage(self, snapshot: SnapshotId, rank: int, blob: Buffer) -> None:
        """Keep rank ``rank``'s blob until this process has coded its parity share(s)."""
        with self._arrived:
            self._staged[_key(snapshot.round, snapshot.step, rank)] = blob
            self._arrived.notify_all()

    def take_staged(
        self, snapshot: SnapshotId, ranks: Sequence[int], timeout_s: float
    ) -> list[Buffer]:
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

    def blob(self, snapshot: SnapshotId, rank: int) -> Buffer | None:
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
            self._drop(lambda other: other < snapshot)

    def drop(self, snapshot: SnapshotId) -> None:
        """Drop ``snapshot`` (refused by the registry: it can never be restored)."""
        with self._lock:
            self._drop(lambda other: other == snapshot)

    def _drop(self, dropped: Callable[[SnapshotId], bool]) -> None:
        """Drop the snapshots ``dropped`` names, and their files (under the lock)."""
        names: list[str] = []
        for held in self._keyed():
            for key in [k for k in held if dropped(SnapshotId(k[0], k[1]))]:
                del held[key]
                world = self._worlds.get(key[0], "")
                if held is self._blobs:
                    names.append(blob_name(key[0], key[1], world, key[2]))
                elif held is self._parity:
                    names.append(parity_name(key[0], key[1], world, key[2], key[3]))
        for snapshots in (self._metadata, self._placements):
            for old in [s for s in snapshots if dropped(s)]:
                del snapshots[old]
                world = self._worlds.get(old.round, "")
                what = "metadata" if snapshots is self._metadata else "placement"
                names.append(small_name(old.round, old.step, world, what))
        if self._files is not None:
            for name in names:
                self._files.remove(name)

    def recover(self, snapshot: SnapshotId | None, world: str) -> tuple[int, ...]:
        """Take up the files a process before this one left of ``snapshot`` of world
        ``world`` (the registered one; None or "": none can be trusted) and remove every other
        file it left (hostfiles.py); the ranks whose blobs were taken up. Once per process:
        later calls find nothing left."""
        with self._lock:
            files = self._files
            if files is None or not files.leftovers:
                return ()
            leftovers, files.leftovers = files.leftovers, []
            taken: list[int] = []
            for name in leftovers:
                found = NAME.fullmatch(name)
                if (
                    snapshot is None
                    or not world
                    or found is None
                    or found["world"] != world
                    or SnapshotId(int(found["round"]), int(found["step"])) != snapshot
                ):
                    files.remove(name)
                    continue
                self._worlds[snapshot.round] = world
                if found["rank"] is not None:
                    rank = int(found["rank"])
                    self._blobs[_key(snapshot.round, snapshot.step, rank)] = files.load(name)
                    taken.append(rank)
                elif found["parity"] is not None:
                    key = (snapshot.round, snapshot.step, int(found["group"]), int(found["parity"]))
                    self._parity[key] = files.load(name)
                elif found["small"] == "metadata":
                    self._metadata[snapshot] = pickle.loads(files.read(name))
                else:
                    self._placements[snapshot] = SnapshotPlacement.from_bytes(files.read(name))
            return tuple(sorted(taken))

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
                if op == "stage":  # coded, then dropped: never kept in a file
                    self.stage(snapshot, rank, recv_exactly(sock, length))
                else:
                    buffer = self.allocate(snapshot, rank, length)
                    try:
                        recv_into(sock, memoryview(buffer))
                    except BaseException:
                        self.abandon(buffer)
                        raise
                    self.put(snapshot, rank, buffer)
                send(sock, {"ok": True})
            elif op in ("read", "read-parity"):
                if op == "read":
                    rank = int(header["rank"])
                    stored: Buffer | None = self.blob(snapshot, rank)
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
