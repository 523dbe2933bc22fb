"""In-memory snapshots of the training state, protected in peers' memory across hosts.

Theory of operation. A disk checkpoint costs a storage write, so jobs take one every tens of
minutes and a failure loses everything since. A memory snapshot costs a copy: every rank
keeps its part of the state (its shards, for a sharded model) in host memory, and ships a
replica to ranks on other hosts, so a lost rank's part (or a whole lost host's) comes back
from its peers' memory and the world resumes at most one snapshot behind.

Taking one (:meth:`MemorySnapshots.take`). The state (``get_state_dict`` of model and
optimizer, sharded, plus the step, sampler position and extra state; found again from a plan
while the state keeps its layout) is copied into staging buffers kept from one snapshot to the
next; training is held only for the copy of the model's buffers, the parameters and optimizer
state being copied in the background while the next forward and backward run
(``optimizer.step()`` waits for that copy: worker/snapshot_copy.py). A background thread
then:

1. lays the copy out as torch.distributed.checkpoint (DCP) would store it, through DCP's own
   save planner (so replicated tensors are stored once, by one rank) with a storage writer
   that packs each rank's items into one bytes object (a *blob*, tensors as their raw bytes)
   and records where each item lives (rank, offset, length) in DCP's metadata; every rank
   gets the global metadata back from the save;
2. pushes its blob to the ranks that protect it (:func:`protectors`: ``copies - 1`` ranks on
   other hosts, spread so that every rank holds about as many replicas as it ships) over a
   small TCP server every process runs (:class:`SnapshotServer`), and waits for their acks
   (erasure-coded: see below);
3. agrees with every rank that every blob is protected (an all-reduce over the snapshot's own
   process group), and only then calls ``on_complete`` on rank 0 (the elastic loop registers
   the snapshot with the coordinator, fenced by the round; a zombie's registration is
   refused) and drops the older snapshots everywhere.

A snapshot still in flight when the next is asked for makes the next one skipped, never
waited for: training is never held by the protection of an earlier step.

Restoring (:func:`restore_from_memory`, chosen by ``checkpoint.restore_state``). After a
failure the world re-forms with its survivors (and perhaps newcomers); each process still
holds what its server held: its own blobs and the replicas it protects, named by the old
world's round, step and rank. If the registered snapshot's every old rank is held by some
process of the new world, the state is loaded by DCP's load planner for the *new* world's
layout (resharding 4 -> 3 ranks is DCP's work) through a storage reader that fetches each
stored item from the process holding it (its own memory when it holds it; only the rows the
item needs, received straight into the target tensor): bit for bit what was snapshotted.
Otherwise the restore falls back to the disk checkpoint, saying which ranks were lost.

Between worlds. torch caches DTensor shardings by specs whose meshes compare equal across
worlds, so a process whose rank moved would get the previous world's coordinate:
:func:`forget_previous_world` clears those caches before the new world's model is made. The
previous world's snapshot groups are kept until their timeout passed (``attach``): dropping
them would run gloo's destructor, which waits for any collective still pending on them.

Erasure coding (``MemorySnapshots(host, erasure=(k, m))``), for (k+m)/k of the state at rest
instead of ``copies`` times. The ranks form groups of k (:func:`erasure_protectors`; the rule
and the code are in worker/erasure.py), each with m parity shares kept by m ranks chosen for
host diversity and balance. In step 2 each rank ships its blob to its group's parity holders
instead (``stage``: kept aside, never counted as held); a parity holder waits for all of its
group's blobs, computes only its own parity share(s) (zfec, over the blobs zero-padded to the
longest), keeps them and drops the blobs it received; the agreement of step 3 then means every
parity share is kept. The placement registered carries every blob's length (from the save's
metadata), which a rebuilt blob is trimmed to. At rest a process holds its own blob and its
parity shares. To restore, every group must keep k of its k+m shares (blobs or parity shares
held by the new world's processes; else the restore falls back to disk naming the group and
what it lost); a rebuild step first has one process per damaged group (the one holding most
of its shares) fetch k shares (``read`` and ``read-parity``), decode the lost blobs and keep
them in its server, agreed by every rank before any reads: then the load above finds every old
rank's blob held, and what it reads is bit for bit what was snapshotted.

Trust. The servers listen on the address the ranks advertise; every request carries the
current world's token (random, chosen by rank 0 of each world and sent over the process
group), so only members of the current world can read or place snapshots, and a process of
an ended world (its token is replaced) is refused. The token is not encryption: run it on
the training network only, as gloo's own traffic is.
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import queue
import secrets
import socket
import socketserver
import struct
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import msgpack
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import (
    Metadata,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult

from .erasure import MAX_SHARES, decode_blobs, encode_parity, erasure_groups, parity_holders
from .sampler import ElasticSampler
from .snapshot_copy import DeferredCopy, Stager, copy_all, state_bytes

log = logging.getLogger("rallypoint.worker.memory")

# torch's default timeout of a gloo group, when attach() is given none.
DEFAULT_GROUP_TIMEOUT_S = 1800.0
# How long a peer's server may take to answer one request (a push of a large blob included).
REQUEST_TIMEOUT_S = 60.0
_HEADER = struct.Struct("<I")
# Socket buffers of blob transfers (the kernel caps them at net.core.[rw]mem_max).
_SOCKET_BUFFER = 4 << 20
# A request's or answer's header (msgpack) may not be larger than this.
_MAX_HEADER_BYTES = 1 << 20


class SnapshotError(Exception):
    """A snapshot could not be taken, protected or restored (the message says why)."""


@dataclass(frozen=True, slots=True, order=True)
class SnapshotId:
    """A snapshot of the world of round ``round`` at ``step``."""

    round: int
    step: int

    def __str__(self) -> str:
        return f"round {self.round} step {self.step}"


@dataclass(frozen=True, slots=True)
class RegisteredSnapshot:
    """A memory snapshot the coordinator registered as complete: the one to restore."""

    round: int
    step: int
    world_size: int

    @property
    def snapshot(self) -> SnapshotId:
        return SnapshotId(self.round, self.step)


# The placement's encoding in the coordinator's registry. Version 1 (replication only) had
# no "version" key; it is still read.
PLACEMENT_VERSION = 2


@dataclass(frozen=True, slots=True)
class SnapshotPlacement:
    """Where a snapshot's blobs live: ``holders[r]`` are the ranks of its world that hold
    rank r's blob (r itself first), ``hosts[r]`` the host rank r declared.

    Erasure-coded (``erasure`` is (k, m); None under replication): every rank holds its own
    blob only (``holders[r] == (r,)``); ``groups[g]`` are the data ranks of group g (in share
    order; at most k of them, the last group perhaps fewer, coding with its own size as k);
    ``parity_holders[g][j]`` holds parity share j of group g (share number
    ``len(groups[g]) + j``). ``lengths[r]`` is rank r's blob length, known once the snapshot
    is taken (empty before): what a rebuilt blob is trimmed to."""

    hosts: tuple[str, ...]
    holders: tuple[tuple[int, ...], ...]
    erasure: tuple[int, int] | None = None
    groups: tuple[tuple[int, ...], ...] = ()
    parity_holders: tuple[tuple[int, ...], ...] = ()
    lengths: tuple[int, ...] = ()

    @property
    def world_size(self) -> int:
        return len(self.hosts)

    @property
    def parity_shares(self) -> int:
        return self.erasure[1] if self.erasure is not None else 0

    @property
    def cross_host(self) -> bool:
        """Whether the loss of any one host loses no blob: every blob has a replica on a
        host other than its rank's, or every group keeps at most m of its shares on one
        host."""
        if self.erasure is not None:
            return all(
                max(Counter(self.hosts[r] for r in (*group, *parity)).values())
                <= self.parity_shares
                for group, parity in zip(self.groups, self.parity_holders, strict=True)
            )
        return all(
            any(self.hosts[h] != self.hosts[rank] for h in holders[1:])
            for rank, holders in enumerate(self.holders)
        )

    def parity_held_by(self, rank: int) -> dict[int, list[int]]:
        """The parity shares ``rank`` holds: group -> parity indices."""
        held: dict[int, list[int]] = {}
        for group, holders in enumerate(self.parity_holders):
            for parity, holder in enumerate(holders):
                if holder == rank:
                    held.setdefault(group, []).append(parity)
        return held

    def to_bytes(self) -> bytes:
        """As the coordinator's registry keeps it."""
        obj: dict[str, Any] = {
            "version": PLACEMENT_VERSION,
            "hosts": list(self.hosts),
            "holders": [list(h) for h in self.holders],
        }
        if self.erasure is not None:
            obj["erasure"] = list(self.erasure)
            obj["groups"] = [list(g) for g in self.groups]
            obj["parity_holders"] = [list(p) for p in self.parity_holders]
            obj["lengths"] = list(self.lengths)
        return json.dumps(obj, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> SnapshotPlacement:
        obj = json.loads(data)
        version = obj.get("version", 1)
        if version not in (1, PLACEMENT_VERSION):
            raise ValueError(
                f"a snapshot placement of version {version}: this rallypoint reads versions "
                f"1 to {PLACEMENT_VERSION}"
            )
        hosts, holders = tuple(obj["hosts"]), tuple(tuple(h) for h in obj["holders"])
        if "erasure" not in obj:
            return cls(hosts, holders)
        k, m = obj["erasure"]
        return cls(
            hosts,
            holders,
            erasure=(int(k), int(m)),
            groups=tuple(tuple(g) for g in obj["groups"]),
            parity_holders=tuple(tuple(p) for p in obj["parity_holders"]),
            lengths=tuple(obj["lengths"]),
        )


def protectors(hosts: Sequence[str], copies: int) -> SnapshotPlacement:
    """The placement of a world whose rank r runs on ``hosts[r]``, each blob kept ``copies``
    times (its own rank's included).

    With at least ``copies`` hosts, the k-th rank of host h is protected by the k-th rank
    (modulo their counts) of hosts h+1, ..., h+copies-1 (hosts in order of their lowest
    rank): every copy on another host, and each rank holds about ``copies - 1`` replicas.
    With fewer hosts the replicas go to the next ranks in rank order (a lost process is
    survived, a lost host is not: ``SnapshotSnapshotPlacement.cross_host`` says so)."""
    world = len(hosts)
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    order: list[str] = []
    members: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        if host not in members:
            order.append(host)
            members[host] = []
        members[host].append(rank)
    holders: list[tuple[int, ...]] = []
    for rank, host in enumerate(hosts):
        chosen = [rank]
        if len(order) >= copies:
            h = order.index(host)
            k = members[host].index(rank)
            for j in range(1, copies):
                other = members[order[(h + j) % len(order)]]
                chosen.append(other[k % len(other)])
        else:
            for j in range(1, min(copies, world)):
                chosen.append((rank + j) % world)
        holders.append(tuple(chosen))
    return SnapshotPlacement(tuple(hosts), tuple(holders))


def forget_previous_world() -> None:
    """Clear torch's DTensor caches of the calling thread after the world was formed again.

    torch caches the sharding of DTensor operations by their specs, and a spec's mesh
    compares equal to the previous world's (same shape, ranks 0..n-1) although this
    process's coordinate in it may have changed; a cached answer then hands new DTensors
    the previous world's mesh, whose coordinate is stale: DCP reads the wrong shard (seen
    as a size mismatch, or worse). Call it after each re-formation, before the model of the
    new world is made (the elastic loop does)."""
    from torch.distributed.tensor import DTensor as _DTensor
    from torch.distributed.tensor import _redistribute

    clear_native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_native is not None:  # torch's C++ fast path keeps a cache of its own
        clear_native()
    propagator: Any = _DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    propagator._propagate_tensor_meta_cached.cache_clear()
    _redistribute._gen_transform_infos.cache_clear()


def erasure_protectors(
    hosts: Sequence[str], data_shares: int, parity_shares: int
) -> SnapshotPlacement:
    """The erasure-coded placement of a world whose rank r runs on ``hosts[r]``: groups of
    ``data_shares`` ranks, each with ``parity_shares`` parity shares (the rule:
    worker/erasure.py)."""
    validate_erasure((data_shares, parity_shares))
    groups = erasure_groups(hosts, data_shares)
    return SnapshotPlacement(
        tuple(hosts),
        tuple((rank,) for rank in range(len(hosts))),
        erasure=(data_shares, parity_shares),
        groups=groups,
        parity_holders=parity_holders(hosts, groups, parity_shares),
    )


def validate_erasure(erasure: tuple[int, int]) -> None:
    k, m = erasure
    if k < 1 or m < 1:
        raise ValueError(f"erasure needs k >= 1 data and m >= 1 parity shares, got {k}+{m}")
    if k + m > MAX_SHARES:
        raise ValueError(f"erasure {k}+{m}: zfec codes at most {MAX_SHARES} shares per group")


# -- the wire: one request per connection ----------------------------------------------------


def _send(sock: socket.socket, header: Mapping[str, Any], payload: Sequence[Any] = ()) -> None:
    packed = msgpack.packb(dict(header))
    sock.sendall(_HEADER.pack(len(packed)) + packed)
    for part in payload:
        sock.sendall(part)


def _recv_exactly(sock: socket.socket, length: int) -> bytearray:
    buffer = bytearray(length)
    _recv_into(sock, memoryview(buffer))
    return buffer


def _recv_into(sock: socket.socket, sink: memoryview) -> None:
    got, length = 0, len(sink)
    while got < length:
        n = sock.recv_into(sink[got:], length - got)
        if n == 0:
            raise ConnectionError(f"the peer closed the connection after {got} of {length} bytes")
        got += n


def _recv_header(sock: socket.socket) -> dict[str, Any]:
    (length,) = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    if length > _MAX_HEADER_BYTES:
        raise ConnectionError(f"a header of {length} bytes is over {_MAX_HEADER_BYTES}")
    header = msgpack.unpackb(_recv_exactly(sock, length))
    if not isinstance(header, dict):
        raise ConnectionError("a header is not a map")
    return header


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
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
        peer = sock.getpeername()
        try:
            header = _recv_header(sock)
            with self._lock:
                token = self._token
            offered = header.get("token")
            if not (isinstance(offered, bytes) and token and hmac.compare_digest(offered, token)):
                _send(sock, {"error": "refused: not a member of the current world"})
                log.warning("refused a snapshot request of %s: wrong or stale token", peer)
                return
            op = header.get("op")
            snapshot = SnapshotId(int(header["round"]), int(header["step"]))
            if op in ("put", "stage"):
                rank = int(header["rank"])
                length = int(header["length"])
                blob = _recv_exactly(sock, length)
                (self.put if op == "put" else self.stage)(snapshot, rank, blob)
                _send(sock, {"ok": True})
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
                    _send(sock, {"error": f"holds no {what} of {snapshot}"})
                    return
                view = memoryview(stored)
                ranges = [(int(offset), int(length)) for offset, length in header["ranges"]]
                if any(o < 0 or n < 0 or o + n > len(view) for o, n in ranges):
                    _send(sock, {"error": f"a range is outside the blob of {len(view)} bytes"})
                    return
                _send(sock, {"ok": True}, [view[o : o + n] for o, n in ranges])
            else:
                _send(sock, {"error": f"unknown operation {op!r}"})
        except (OSError, ConnectionError, KeyError, TypeError, ValueError) as error:
            log.warning("a snapshot request of %s failed: %s", peer, error)


def _request(
    address: str,
    header: Mapping[str, Any],
    payload: Sequence[Any] = (),
    answer_bytes: int = 0,
) -> bytearray:
    """One request to a snapshot server; the ``answer_bytes`` bytes of its answer."""
    if not answer_bytes:
        _request_parts(address, header, [], payload)
        return bytearray()
    (part,) = _request_parts(address, header, [answer_bytes], payload)
    assert isinstance(part, bytearray)  # a length's part is read into a new bytearray
    return part


def _request_parts(
    address: str,
    header: Mapping[str, Any],
    parts: Sequence[int | memoryview],
    payload: Sequence[Any] = (),
) -> list[Any]:
    """One request to a snapshot server whose answer comes in ``parts``: each a length (read
    into a new bytearray) or a memoryview (read straight into it); what was read, in order."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=REQUEST_TIMEOUT_S) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
        _send(sock, header, payload)
        answer = _recv_header(sock)
        if "error" in answer:
            raise SnapshotError(f"snapshot server {address}: {answer['error']}")
        read: list[Any] = []
        for part in parts:
            if isinstance(part, memoryview):
                _recv_into(sock, part)
                read.append(part)
            else:
                read.append(_recv_exactly(sock, part))
        return read


# -- DCP storage in memory ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Where:
    """Where DCP's item lives: in the blob of ``rank``, at ``offset``, ``length`` bytes."""

    rank: int
    offset: int
    length: int


def _raw(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().contiguous().reshape(-1)
    array: Any = flat.view(torch.uint8).numpy()
    return memoryview(array)


class _BlobWriter(StorageWriter):
    """DCP storage that packs this rank's items into one bytes object (``self.blob``)."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.blob = bytearray()

    def reset(self, checkpoint_id: Any = None) -> None:
        self.blob = bytearray()

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(
        self, plan: SavePlan, planner: SavePlanner
    ) -> torch.futures.Future[list[WriteResult]]:
        results = []
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                if not isinstance(data, io.BytesIO):
                    raise SnapshotError(f"{item.index.fqn}: expected bytes, got {type(data)}")
                raw: Any = data.getbuffer()
            else:
                if not isinstance(data, torch.Tensor):
                    raise SnapshotError(f"{item.index.fqn}: expected a tensor, got {type(data)}")
                raw = _raw(data.cpu())
            where = _Where(self.rank, len(self.blob), len(raw))
            self.blob += raw
            results.append(
                WriteResult(index=item.index, size_in_bytes=len(raw), storage_data=where)
            )
        done: torch.futures.Future[list[WriteResult]] = torch.futures.Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True

    def storage_meta(self) -> None:
        return None


class _PeerReader(StorageReader):
    """DCP storage that reads each stored item from the process holding its rank's blob."""

    def __init__(
        self,
        snapshot: SnapshotId,
        metadata: Metadata,
        local: SnapshotServer,
        sources: Mapping[int, str | None],
        token: bytes,
    ) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.metadata = metadata
        self.local = local
        # The address to read each old rank's blob from; None: this process holds it.
        self.sources = sources
        self.token = token
        self.bytes_from_peers = 0
        self.bytes_local = 0

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self.metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *a: Any) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def _fetch(
        self, rank: int, ranges: list[tuple[int, int]], sinks: list[memoryview | None]
    ) -> list[memoryview]:
        """The bytes of ``ranges`` of ``rank``'s blob: each written into its sink when it has
        one (a target tensor's memory: no copy in between), else returned."""
        source = self.sources[rank]
        parts: list[memoryview] = []
        if source is None:
            blob = self.local.blob(self.snapshot, rank)
            if blob is None:
                raise SnapshotError(f"this process no longer holds rank {rank} of {self.snapshot}")
            view = memoryview(blob)
            for (offset, length), sink in zip(ranges, sinks, strict=True):
                part = view[offset : offset + length]
                if sink is not None:
                    sink[:] = part
                parts.append(part)
            self.bytes_local += sum(n for _, n in ranges)
            return parts
        header = {
            "op": "read",
            "token": self.token,
            "round": self.snapshot.round,
            "step": self.snapshot.step,
            "rank": rank,
            "ranges": ranges,
        }
        wanted = [n if sink is None else sink for (_, n), sink in zip(ranges, sinks, strict=True)]
        return [memoryview(part) for part in _request_parts(source, header, wanted)]

    def _plan_read(self, item: Any, planner: LoadPlanner) -> tuple[int, int, Any, Any]:
        """Where one read item's bytes are in its blob (offset, length), and, when they can
        be written straight into the target tensor, the target and its bytes; else the
        stored chunk's shape (the chunk is read whole and narrowed)."""
        where: _Where = self.metadata.storage_data[item.storage_index]
        if item.type == LoadItemType.BYTE_IO:
            return where.offset, where.length, None, None
        stored = self.metadata.state_dict_metadata[item.storage_index.fqn]
        if not isinstance(stored, TensorStorageMetadata):
            raise SnapshotError(f"{item.storage_index.fqn} is not a stored tensor")
        (chunk,) = [c for c in stored.chunks if list(c.offsets) == list(item.storage_index.offset)]
        sizes, offsets, lengths = list(chunk.sizes), list(item.storage_offsets), list(item.lengths)
        target = planner.resolve_tensor(item).detach()
        # Rows of the stored chunk (narrowed in its first dimension only) are contiguous:
        # read just them, into the target when its memory is one block as well.
        if (
            sizes
            and all(o == 0 for o in offsets[1:])
            and lengths[1:] == sizes[1:]
            and list(target.size()) == lengths
            and target.is_contiguous()
        ):
            row = where.length // sizes[0] if sizes[0] else 0
            array: Any = target.reshape(-1).view(torch.uint8).numpy()
            sink = memoryview(array).cast("B")
            return where.offset + offsets[0] * row, lengths[0] * row, target, sink
        return where.offset, where.length, target, sizes

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future[None]:
        per_rank: dict[int, list[Any]] = {}
        for item in plan.items:
            where: _Where = self.metadata.storage_data[item.storage_index]
            per_rank.setdefault(where.rank, []).append(item)
        planned = {
            rank: [self._plan_read(item, planner) for item in items]
            for rank, items in per_rank.items()
        }

        def fetch(rank: int) -> list[memoryview]:
            reads = planned[rank]
            sinks = [sink if isinstance(sink, memoryview) else None for *_, sink in reads]
            return self._fetch(rank, [(offset, length) for offset, length, _, _ in reads], sinks)

        # Every peer holding blobs is read from at once (a connection each, the reads
        # waiting on their sockets), while this process copies what it holds itself.
        remote = [rank for rank in per_rank if self.sources[rank] is not None]
        fetched: dict[int, list[memoryview]] = {}
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(remote)))) as pool:
            pending = {rank: pool.submit(fetch, rank) for rank in remote}
            for rank in per_rank:
                if rank not in pending:
                    fetched[rank] = fetch(rank)
            for rank, future in pending.items():
                fetched[rank] = future.result()
                self.bytes_from_peers += sum(length for _, length, _, _ in planned[rank])
        for rank, items in per_rank.items():
            reads = planned[rank]
            parts = fetched[rank]
            for item, (_, _, target, how), raw in zip(items, reads, parts, strict=True):
                if item.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(item, io.BytesIO(bytes(raw)))
                    continue
                if not isinstance(how, memoryview):
                    stored: Any = self.metadata.state_dict_metadata[item.storage_index.fqn]
                    tensor = (
                        torch.frombuffer(bytearray(raw), dtype=torch.uint8)
                        .view(stored.properties.dtype)
                        .reshape(how)
                    )
                    for dim, (offset, length) in enumerate(
                        zip(item.storage_offsets, item.lengths, strict=True)
                    ):
                        tensor = tensor.narrow(dim, offset, length)
                    if target.size() != tensor.size():
                        raise SnapshotError(
                            f"{item.storage_index.fqn}: stored {tuple(tensor.size())}, "
                            f"wanted {tuple(target.size())}"
                        )
                    target.copy_(tensor)
                planner.commit_tensor(item, target)
        done: torch.futures.Future[None] = torch.futures.Future()
        done.set_result(None)
        return done

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True


# -- taking snapshots ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SnapshotTaken:
    """A snapshot every rank has protected; ``committed`` says whether ``on_complete``
    accepted it (always True without one)."""

    snapshot: SnapshotId
    placement: SnapshotPlacement
    blocked_s: float  # how long the training thread was held (the copy, and the step's wait)
    protect_s: float  # from the copy to every rank's protection agreed
    state_bytes: int  # this rank's part of the state
    committed: bool


class PendingSnapshot:
    """A snapshot being protected; ``wait()`` returns the outcome or raises its failure."""

    def __init__(self, snapshot: SnapshotId) -> None:
        self.snapshot = snapshot
        self._future: Future[SnapshotTaken] = Future()

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout_s: float | None = None) -> SnapshotTaken:
        return self._future.result(timeout=timeout_s)


# Called on rank 0 once every rank's blob of a snapshot is protected, with the snapshot, its
# world size and placement; returns whether it was registered (False: refused, never count it).
OnComplete = Callable[[SnapshotId, int, SnapshotPlacement], bool]


class MemorySnapshots:
    """One process's in-memory snapshots, across the rounds it takes part in.

    Make one per process (it starts the process's :class:`SnapshotServer`), call
    :meth:`attach` collectively after each (re-)formation of the world, :meth:`take` every
    step (or every K), and hand it to ``restore_state`` at the next formation."""

    def __init__(
        self,
        host: str,
        *,
        copies: int | None = None,
        erasure: tuple[int, int] | None = None,
        bind: str = "127.0.0.1",
        advertise: str | None = None,
    ) -> None:
        """``copies=r`` keeps every blob r times (its rank's own included; 2 if neither is
        given); ``erasure=(k, m)`` codes groups of k blobs with m parity shares instead."""
        if copies is not None and erasure is not None:
            raise ValueError("give copies or erasure, not both")
        if erasure is not None:
            validate_erasure(erasure)
        elif copies is None:
            copies = 2
        elif copies < 1:
            raise ValueError(f"copies must be >= 1, got {copies}")
        self.host = host
        self.copies = copies
        self.erasure = erasure
        self.server = SnapshotServer(bind, advertise)
        self._world: _World | None = None
        self._pending: PendingSnapshot | None = None
        # How long the last snapshot taken held the training thread (the copy).
        self.last_blocked_s = 0.0
        self._stager = Stager()
        # The background part of the latest snapshot's copy, and the optimizer whose step
        # waits for it (its hook's handle).
        self._copy: DeferredCopy | None = None
        self._hooked: tuple[torch.optim.Optimizer, Any] | None = None
        # Earlier worlds' groups (and groups made for a world that never attached), kept
        # until their pending work surely timed out (attach).
        self._retired: list[tuple[float, object]] = []
        # The groups make_groups() made for the next world, until attach() adopts them.
        self._made: _Groups | None = None

    def close(self) -> None:
        if self._world is not None:
            self._world.protection.stop()
        if self._hooked is not None:
            self._hooked[1].remove()
            self._hooked = None
        self.server.close()

    @property
    def token(self) -> bytes:
        if self._world is None:
            raise SnapshotError("attach() has not been called in this world")
        return self._world.token

    def make_groups(
        self,
        *,
        process_group: dist.ProcessGroup | None = None,
        connect_timeout: timedelta | None = None,
    ) -> None:
        """Make the next world's gloo groups now, for :meth:`attach` to adopt (collective
        over every rank of the default group, as torch's ``new_group`` is). Each connects
        through the default group's store within ``connect_timeout`` (torch's default group
        timeout if None); ``attach`` then gives them its ``timeout``.

        Why apart from ``attach``: making a gloo group is the one step here that goes through
        the store. When that store stops answering a rank half-way (the elastic loop's round
        store refuses every call once the round ended), that rank gives up, and a peer that
        already read its address waits in gloo's connect for about five times the group's
        timeout. The elastic loop therefore makes these groups while it makes its own process
        group, with the same short connect timeout and before the gate that every rank must
        pass before any synchronous collective (worker/elastic.py, "Formation")."""
        ranks = dist.get_process_group_ranks(process_group) if process_group else None
        made, self._made = self._made, None
        # Made for a world whose formation stopped before its attach.
        self._retire(made, connect_timeout)
        self._made = _Groups(ranks, *_new_groups(process_group, connect_timeout))

    def _retire(self, held: object, timeout: timedelta | None) -> None:
        """Keep ``held`` (groups, or a world holding them) until work on them surely timed
        out: dropping a group runs gloo's destructor, which waits for its pending work. Drops
        what was kept long enough."""
        now = time.monotonic()
        self._retired = [(until, kept) for until, kept in self._retired if until > now]
        if held is not None:
            timeout_s = timeout.total_seconds() if timeout is not None else DEFAULT_GROUP_TIMEOUT_S
            self._retired.append((now + timeout_s + 5.0, held))

    def attach(
        self,
        round_number: int,
        *,
        process_group: dist.ProcessGroup | None = None,
        on_complete: OnComplete | None = None,
        timeout: timedelta | None = None,
    ) -> SnapshotPlacement:
        """Join the current world (collective over ``process_group``, the default group if
        None): learn every rank's host and server, adopt the world's token, make the group
        the background protection runs its collectives on (their ``timeout``: a protection
        stuck on a dead peer ends by it), or adopt the groups :meth:`make_groups` made for
        this world. Returns the placement."""
        # The previous world's snapshot may still be copying the model, which this world's
        # restore is about to overwrite.
        self.copied()
        rank = dist.get_rank(process_group)
        token = [secrets.token_bytes(16) if rank == 0 else b""]
        dist.broadcast_object_list(
            token,
            src=dist.get_global_rank(process_group, 0) if process_group else 0,
            group=process_group,
        )
        peers: list[Any] = [None] * dist.get_world_size(process_group)
        dist.all_gather_object(peers, (self.host, self.server.address), group=process_group)
        hosts = [host for host, _ in peers]
        if self.erasure is not None:
            placement = erasure_protectors(hosts, *self.erasure)
        else:
            placement = protectors(hosts, self.copies or 1)
        ranks = dist.get_process_group_ranks(process_group) if process_group else None
        made, self._made = self._made, None
        if made is not None and made.ranks == ranks:
            group, control = made.group, made.control
            for made_group in {group, control} - {process_group, dist.group.WORLD}:
                made_group.set_timeout(timeout or timedelta(seconds=DEFAULT_GROUP_TIMEOUT_S))
        else:
            self._retire(made, timeout)
            group, control = _new_groups(process_group, timeout)
        self.server.set_token(token[0])
        # The previous world's groups may hold work stuck on a peer that is gone (an
        # abandoned agreement, a protection's collective): dropping them would run gloo's
        # destructor, which joins that work, for up to its timeout. Kept until it passed.
        if self._world is not None:
            self._world.protection.stop()
            self._retire(self._world, timedelta(seconds=self._world.timeout_s))
        self._world = _World(
            round_number=round_number,
            rank=rank,
            token=token[0],
            addresses=tuple(address for _, address in peers),
            placement=placement,
            group=group,
            control=control,
            on_complete=on_complete,
            timeout_s=timeout.total_seconds() if timeout is not None else DEFAULT_GROUP_TIMEOUT_S,
            protection=_Worker(f"rallypoint-snapshots-{round_number}"),
        )
        self._pending = None
        # A new world's meshes: its staging buffers start afresh.
        self._stager = Stager()
        return placement

    def take(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        sampler: ElasticSampler | None = None,
        extra: Any = None,
        wait_collective: Callable[[dist.Work], bool] | None = None,
        overlap: bool = True,
    ) -> PendingSnapshot | None:
        """Copy the state and protect it in the background. Collective: every rank of the
        world calls it for the same step. Returns None (the snapshot is skipped, on every
        rank alike) while the previous one is still being protected, or when
        ``wait_collective`` gives up on the one small collective this makes (the elastic
        loop passes its abandonable wait, which returns False when the round ended); by
        default ``work.wait()``.

        With ``overlap`` (the default) only the model's buffers are copied before this
        returns; parameters and optimizer state are copied in the background while the
        next forward and backward run, and ``optimizer.step()`` waits for that copy (a
        pre-hook this installs). Whoever changes parameters or optimizer state outside
        ``optimizer.step()`` calls :meth:`copied` first, or passes ``overlap=False``
        (everything copied before this returns)."""
        from .checkpoint import MODEL_KEY, OPTIMIZER_KEY, PROGRESS_KEY, _pack_progress

        world = self._world
        if world is None:
            raise SnapshotError("attach() has not been called in this world")
        previous = self._pending
        busy = torch.tensor([1 if previous is not None and not previous.done() else 0])
        # Every rank must skip alike (the save below is collective): agree on it first, on
        # a group only this (the training) thread uses; the protection thread has its own.
        work = dist.all_reduce(busy, op=dist.ReduceOp.MAX, group=world.control, async_op=True)
        if work is None:
            raise AssertionError("an async all_reduce returned no work")
        if not (wait_collective or _wait)(work):
            return None
        if busy.item():
            return None
        started = time.monotonic()
        self.copied()
        copies: list[Any] = []
        deferred: list[Any] | None = [] if overlap else None
        staged_model, staged_optimizer = self._stager.stage_state(
            model, optimizer, lambda: get_state_dict(model, optimizer), copies, deferred
        )
        staged = {
            MODEL_KEY: staged_model,
            OPTIMIZER_KEY: staged_optimizer,
            PROGRESS_KEY: _pack_progress(step, sampler, extra),
        }
        copy_all(copies)
        background = DeferredCopy(deferred or [])
        if deferred:
            self._copy = background
            self._hook(optimizer)
        blocked_s = self.last_blocked_s = time.monotonic() - started
        snapshot = SnapshotId(world.round_number, step)
        pending = PendingSnapshot(snapshot)
        self._pending = pending
        world.protection.submit(
            self._protect, world, snapshot, staged, background, pending, blocked_s, started
        )
        return pending

    def copied(self) -> None:
        """Wait until the latest snapshot's background copy is done: parameters and
        optimizer state may change from then on (``optimizer.step()`` waits by itself)."""
        copy = self._copy
        if copy is not None:
            self.last_blocked_s += copy.wait()  # returns once the copy is done
            self._copy = None

    def _hook(self, optimizer: torch.optim.Optimizer) -> None:
        """Have ``optimizer.step()`` wait for the background copy (once per optimizer)."""
        if self._hooked is not None:
            if self._hooked[0] is optimizer:
                return
            self._hooked[1].remove()
        handle = optimizer.register_step_pre_hook(lambda *_: self.copied())
        self._hooked = (optimizer, handle)

    def wait(self) -> SnapshotTaken | None:
        """Wait for the snapshot in flight, if any; its outcome (re-raises its failure)."""
        pending = self._pending
        return pending.wait() if pending is not None else None

    def _protect(
        self,
        world: _World,
        snapshot: SnapshotId,
        staged: dict[str, Any],
        background: DeferredCopy,
        pending: PendingSnapshot,
        blocked_s: float,
        started: float,
    ) -> None:
        try:
            background.run()
            # What the training thread waited for the copy (the step's pre-hook).
            blocked_s += background.waited_s()
            writer = _BlobWriter(world.rank)
            metadata = dcp_save(staged, storage_writer=writer, process_group=world.group)
            blob = bytes(writer.blob)
            held_bytes = state_bytes(staged)
            del staged
            self.server.put(snapshot, world.rank, blob)
            self.server.put_metadata(snapshot, metadata)
            placement = world.placement
            if placement.erasure is not None:
                placement = replace(placement, lengths=_blob_lengths(metadata, len(blob), world))
                ok = self._protect_by_parity(world, snapshot, placement, blob)
            else:
                ok = self._protect_by_replicas(world, snapshot, blob)
            self.server.put_placement(snapshot, placement)
            agreed = torch.tensor([ok])
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=world.group)
            if not agreed.item():
                raise SnapshotError(f"{snapshot}: a rank's blob could not be protected")
            committed = torch.tensor([1])
            if world.rank == 0 and world.on_complete is not None:
                committed[0] = (
                    1 if world.on_complete(snapshot, placement.world_size, placement) else 0
                )
            dist.broadcast(committed, src=dist.get_global_rank(world.group, 0), group=world.group)
            # Newer snapshots (of a later world, if this one ended meanwhile) are never
            # touched: only what this outcome makes useless is dropped.
            if committed.item():
                self.server.drop_older(snapshot)
            else:
                self.server.drop(snapshot)
            pending._future.set_result(
                SnapshotTaken(
                    snapshot=snapshot,
                    placement=placement,
                    blocked_s=blocked_s,
                    protect_s=time.monotonic() - started - blocked_s,
                    state_bytes=held_bytes,
                    committed=bool(committed.item()),
                )
            )
        except BaseException as failure:
            pending._future.set_exception(failure)

    def _protect_by_replicas(self, world: _World, snapshot: SnapshotId, blob: bytes) -> int:
        """Push ``blob`` to the ranks holding its replicas; 1 if every one acked."""
        ok = 1
        for holder in world.placement.holders[world.rank][1:]:
            ok &= _ship(world, snapshot, holder, "put", blob)
        return ok

    def _protect_by_parity(
        self, world: _World, snapshot: SnapshotId, placement: SnapshotPlacement, blob: bytes
    ) -> int:
        """Ship ``blob`` to its group's parity holders, then code this rank's own parity
        shares from its groups' staged blobs and keep them; 1 if all of it succeeded."""
        ok = 1
        (group,) = [g for g, ranks in enumerate(placement.groups) if world.rank in ranks]
        for holder in sorted(set(placement.parity_holders[group])):
            if holder == world.rank:
                self.server.stage(snapshot, world.rank, blob)
            else:
                ok &= _ship(world, snapshot, holder, "stage", blob)
        for coded, parities in sorted(placement.parity_held_by(world.rank).items()):
            try:
                blobs = self.server.take_staged(
                    snapshot, placement.groups[coded], REQUEST_TIMEOUT_S
                )
            except SnapshotError as error:
                log.warning(
                    "%s: rank %d cannot code group %d: %s", snapshot, world.rank, coded, error
                )
                ok = 0
                continue
            shares = encode_parity(blobs, placement.parity_shares, parities)
            del blobs
            for parity, share in zip(parities, shares, strict=True):
                self.server.put_parity(snapshot, coded, parity, share)
        return ok


@dataclass(frozen=True, slots=True)
class _Groups:
    """The groups make_groups() made, over ``ranks`` of the default group (None: all)."""

    ranks: list[int] | None
    group: dist.ProcessGroup
    control: dist.ProcessGroup


def _new_groups(
    process_group: dist.ProcessGroup | None, timeout: timedelta | None
) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """A world's two gloo groups: the protection thread's and the training thread's. The
    latter is the world's own group when that is gloo (the training thread issues its
    collectives in one order on every rank, the snapshot's among them): one group less to
    connect at every formation. Only the protection group is ours to set a timeout on."""
    ranks = dist.get_process_group_ranks(process_group) if process_group else None
    group = dist.new_group(ranks=ranks, backend="gloo", timeout=timeout)
    world = process_group if process_group is not None else dist.group.WORLD
    if world is not None and dist.get_backend(world) == "gloo":
        return group, world
    return group, dist.new_group(ranks=ranks, backend="gloo", timeout=timeout)


@dataclass(frozen=True, slots=True)
class _World:
    round_number: int
    rank: int
    token: bytes
    addresses: tuple[str, ...]
    placement: SnapshotPlacement
    # The protection thread's collectives (DCP's planning, the agreement, the commit).
    group: dist.ProcessGroup
    # The training thread's one collective per take (whether to skip).
    control: dist.ProcessGroup
    on_complete: OnComplete | None
    # The groups' collective timeout, in seconds.
    timeout_s: float
    # The thread protecting this world's snapshots, one after another.
    protection: _Worker


class _Worker:
    """One daemon thread running what it is given in order (a snapshot's protection): the
    training thread hands work over without starting a thread each time, and a process
    never waits at exit for a protection stuck on a dead peer."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, function: Callable[..., None], *args: Any) -> None:
        self._queue.put(lambda: function(*args))

    def stop(self) -> None:
        """End the thread once what it was given is done."""
        self._queue.put(None)

    def _run(self) -> None:
        while (work := self._queue.get()) is not None:
            work()


def _wait(work: dist.Work) -> bool:
    work.wait()
    return True


def _ship(world: _World, snapshot: SnapshotId, holder: int, op: str, blob: bytes) -> int:
    """Send this rank's ``blob`` to rank ``holder`` to keep (``put``: a replica) or to code
    (``stage``); 1 once it acked, 0 (logged) if it could not be reached or refused."""
    header = {
        "op": op,
        "token": world.token,
        "round": snapshot.round,
        "step": snapshot.step,
        "rank": world.rank,
        "length": len(blob),
    }
    try:
        _request(world.addresses[holder], header, [blob])
    except (OSError, SnapshotError) as error:
        log.warning(
            "%s: rank %d could not %s its blob on rank %d: %s",
            snapshot,
            world.rank,
            op,
            holder,
            error,
        )
        return 0
    return 1


def _blob_lengths(metadata: Metadata, own_length: int, world: _World) -> tuple[int, ...]:
    """Every rank's blob length, from the save's global metadata (a blob is its items end to
    end, so its length is where its last item ends)."""
    lengths = [0] * world.placement.world_size
    for where in metadata.storage_data.values():
        lengths[where.rank] = max(lengths[where.rank], where.offset + where.length)
    if lengths[world.rank] != own_length:
        raise SnapshotError(
            f"rank {world.rank}'s blob is {own_length} bytes, its metadata says "
            f"{lengths[world.rank]}"
        )
    return tuple(lengths)


# -- restoring -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryHolding:
    """What one process of the new world holds of the snapshot to restore (gathered)."""

    address: str
    held: tuple[int, ...]  # the old world's ranks whose blobs it holds
    has_metadata: bool
    # The (group, parity index) shares it holds, and the snapshot's placement (erasure-coded
    # snapshots; every process that took part keeps the placement).
    parity: tuple[tuple[int, int], ...] = ()
    placement: SnapshotPlacement | None = None


def holding(memory: MemorySnapshots | None, snapshot: SnapshotId | None) -> MemoryHolding | None:
    if memory is None or snapshot is None:
        return None
    return MemoryHolding(
        memory.server.address,
        memory.server.held(snapshot),
        memory.server.metadata(snapshot) is not None,
        memory.server.held_parity(snapshot),
        memory.server.placement(snapshot),
    )


def _coded_placement(holdings: Sequence[MemoryHolding | None]) -> SnapshotPlacement | None:
    """The snapshot's placement if it is erasure-coded (from any process that kept it)."""
    for h in holdings:
        if h is not None and h.placement is not None and h.placement.erasure is not None:
            return h.placement
    return None


def memory_blocker(
    snapshot: SnapshotId, world_size: int, holdings: Sequence[MemoryHolding | None]
) -> str | None:
    """Why ``snapshot`` (of a world of ``world_size``) cannot be restored from the new
    world's memory, or None when it can (erasure-coded: every group keeps at least as many
    shares as it has data ranks, so its lost blobs can be rebuilt)."""
    held: set[int] = set()
    for h in holdings:
        if h is not None:
            held.update(h.held)
    placement = _coded_placement(holdings)
    if placement is not None:
        short = _short_groups(snapshot, placement, holdings)
        if short:
            return "; ".join(short)
    else:
        missing = sorted(set(range(world_size)) - held)
        if missing:
            lost = ", ".join(map(str, missing))
            return f"no process holds rank(s) {lost} of the memory snapshot ({snapshot})"
    if not any(h is not None and h.has_metadata for h in holdings):
        return f"no process holds the memory snapshot's metadata ({snapshot})"
    return None


def _short_groups(
    snapshot: SnapshotId, placement: SnapshotPlacement, holdings: Sequence[MemoryHolding | None]
) -> list[str]:
    """What each group that kept fewer than k shares lost (empty: every group can be
    rebuilt)."""
    held = {rank for h in holdings if h is not None for rank in h.held}
    parity_held = {share for h in holdings if h is not None for share in h.parity}
    short = []
    for group, ranks in enumerate(placement.groups):
        lost = [rank for rank in ranks if rank not in held]
        lost_parity = [j for j in range(placement.parity_shares) if (group, j) not in parity_held]
        kept = len(ranks) - len(lost) + placement.parity_shares - len(lost_parity)
        if kept < len(ranks):
            short.append(
                f"group {group} (ranks {', '.join(map(str, ranks))}) of the memory snapshot "
                f"({snapshot}) keeps {kept} of the {len(ranks)} shares it needs: lost the "
                f"blobs of rank(s) {', '.join(map(str, lost))} and parity share(s) "
                f"{', '.join(map(str, lost_parity)) or 'none'}"
            )
    return short


@dataclass(frozen=True, slots=True)
class _Rebuild:
    """One damaged group's rebuild: process ``rebuilder`` (a rank of the new world) decodes
    the blobs of ``lost`` (old ranks) from ``shares``: (share number, the index of the new
    world's process to read it from) for k of the group's shares."""

    group: int
    rebuilder: int
    lost: tuple[int, ...]
    shares: tuple[tuple[int, int], ...]


def rebuild_plan(
    placement: SnapshotPlacement, holdings: Sequence[MemoryHolding | None]
) -> list[_Rebuild]:
    """Who rebuilds which group's lost blobs from which shares; deterministic, so every rank
    computes the same plan from the gathered holdings. The rebuilder is the process holding
    most of the group's shares (the fewest to fetch; the lowest rank among equals); it uses
    its own shares first, then the others' in share order (data blobs before parity)."""
    plan = []
    for group, ranks in enumerate(placement.groups):
        k = len(ranks)
        # Share number -> the processes holding it.
        where: dict[int, list[int]] = {}
        for index, h in enumerate(holdings):
            if h is None:
                continue
            for number, rank in enumerate(ranks):
                if rank in h.held:
                    where.setdefault(number, []).append(index)
            for coded, parity in h.parity:
                if coded == group:
                    where.setdefault(k + parity, []).append(index)
        lost = tuple(rank for number, rank in enumerate(ranks) if number not in where)
        if not lost:
            continue
        if len(where) < k:
            raise SnapshotError(f"group {group} keeps {len(where)} of the {k} shares it needs")
        counts = Counter(index for holders in where.values() for index in holders)
        rebuilder = min(counts, key=lambda index: (-counts[index], index))
        own = [n for n in sorted(where) if rebuilder in where[n]]
        others = [n for n in sorted(where) if rebuilder not in where[n]]
        shares = tuple(
            (n, rebuilder if rebuilder in where[n] else where[n][0]) for n in (own + others)[:k]
        )
        plan.append(_Rebuild(group, rebuilder, lost, shares))
    return plan


def _rebuild_lost_blobs(
    memory: MemorySnapshots,
    snapshot: SnapshotId,
    holdings: Sequence[MemoryHolding | None],
    process_group: dist.ProcessGroup | None,
) -> tuple[list[MemoryHolding | None], int]:
    """Rebuild every lost blob of an erasure-coded ``snapshot`` into its rebuilder's server
    (collective: every rank calls it with the same holdings); returns the holdings as they
    are then and the bytes this process fetched from peers for it. A replicated snapshot
    needs no rebuild."""
    placement = _coded_placement(holdings)
    if placement is None:
        return list(holdings), 0
    plan = rebuild_plan(placement, holdings)
    if not plan:
        return list(holdings), 0
    rank = dist.get_rank(process_group)
    ok, fetched = 1, 0
    for rebuild in plan:
        if rebuild.rebuilder != rank:
            continue
        try:
            fetched += _rebuild_group(memory, snapshot, placement, holdings, rebuild)
        except (OSError, SnapshotError) as error:
            log.warning("%s: group %d could not be rebuilt: %s", snapshot, rebuild.group, error)
            ok = 0
    # Every rebuilt blob is in place before any rank reads it.
    agreed = torch.tensor([ok])
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=process_group)
    if not agreed.item():
        raise SnapshotError(f"{snapshot}: a lost blob could not be rebuilt from its group")
    rebuilt = list(holdings)
    for rebuild in plan:
        mine = rebuilt[rebuild.rebuilder]
        if mine is None:
            raise AssertionError("a rebuilder holds nothing")
        rebuilt[rebuild.rebuilder] = replace(mine, held=tuple(sorted({*mine.held, *rebuild.lost})))
    return rebuilt, fetched


def _rebuild_group(
    memory: MemorySnapshots,
    snapshot: SnapshotId,
    placement: SnapshotPlacement,
    holdings: Sequence[MemoryHolding | None],
    rebuild: _Rebuild,
) -> int:
    """Fetch k shares of one group, decode its lost blobs and keep them in this server;
    returns the bytes fetched from peers."""
    ranks = placement.groups[rebuild.group]
    k = len(ranks)
    lengths = [placement.lengths[rank] for rank in ranks]
    padded = max(lengths)
    shares: dict[int, bytes | bytearray] = {}
    fetched = 0
    for number, index in rebuild.shares:
        holder = holdings[index]
        if holder is None:
            raise AssertionError("a share's holder holds nothing")
        local = holder.address == memory.server.address
        header: dict[str, Any] = {
            "token": memory.token,
            "round": snapshot.round,
            "step": snapshot.step,
        }
        if number < k:
            stored = memory.server.blob(snapshot, ranks[number]) if local else None
            header.update(op="read", rank=ranks[number], ranges=[(0, lengths[number])])
            length = lengths[number]
        else:
            parity = number - k
            stored = memory.server.parity(snapshot, rebuild.group, parity) if local else None
            header.update(op="read-parity", group=rebuild.group, parity=parity)
            header["ranges"] = [(0, padded)]
            length = padded
        if stored is None:
            if local:
                raise SnapshotError(f"this process no longer holds share {number} of {snapshot}")
            stored = _request(holder.address, header, answer_bytes=length)
            fetched += length
        shares[number] = stored
    blobs = decode_blobs(shares, lengths, placement.parity_shares)
    for number, rank in enumerate(ranks):
        if rank in rebuild.lost:
            memory.server.put(snapshot, rank, blobs[number])
    log.info(
        "%s: rebuilt the blob(s) of rank(s) %s from %d shares of group %d",
        snapshot,
        ", ".join(map(str, rebuild.lost)),
        k,
        rebuild.group,
    )
    return fetched


def restore_from_memory(
    memory: MemorySnapshots,
    snapshot: SnapshotId,
    holdings: Sequence[MemoryHolding | None],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    sampler: ElasticSampler | None = None,
    process_group: dist.ProcessGroup | None = None,
) -> tuple[int, Any, int]:
    """Load ``snapshot`` from the new world's memory into this rank's model and optimizer,
    laid out for this world (collective; ``holdings`` gathered from every rank, all of
    them able to serve: see :func:`memory_blocker`; an erasure-coded snapshot's lost blobs
    are rebuilt first). Returns the step, the extra state and the bytes fetched from peers."""
    from .checkpoint import _install, _targets

    rank = dist.get_rank(process_group)
    source_rank = min(i for i, h in enumerate(holdings) if h is not None and h.has_metadata)
    shipped: list[Any] = [memory.server.metadata(snapshot) if rank == source_rank else None]
    dist.broadcast_object_list(
        shipped,
        src=dist.get_global_rank(process_group, source_rank) if process_group else source_rank,
        group=process_group,
    )
    metadata: Metadata = shipped[0]
    holdings, rebuild_fetched = _rebuild_lost_blobs(memory, snapshot, holdings, process_group)
    sources: dict[int, str | None] = {}
    mine = holdings[rank]
    for old_rank in sorted(metadata_ranks(metadata)):
        if mine is not None and old_rank in mine.held:
            sources[old_rank] = None
            continue
        candidates = [h.address for h in holdings if h is not None and old_rank in h.held]
        # Spread the readers of one blob over its holders.
        sources[old_rank] = candidates[rank % len(candidates)]
    reader = _PeerReader(snapshot, metadata, memory.server, sources, memory.token)
    state = _targets(model, optimizer, metadata)
    # Every rank reads what its own state dict needs (a DTensor's shard, by its placement),
    # knowing where every item is from the metadata: DCP's planning collectives (plans
    # gathered, checked, scattered back, then results gathered) add nothing to a load
    # (a quarter of a restore here), so each rank loads on its own and one all-reduce
    # tells every rank whether all of them succeeded.
    failure: BaseException | None = None
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp_load(state, storage_reader=reader, no_dist=True)
    except (Exception, CheckpointException) as error:
        # Raised below, once every rank knows, always as a SnapshotError. DCP wraps a failed
        # read in CheckpointException, a BaseException: let through, it left this rank out
        # of the agreement below and the others waiting in it.
        if isinstance(error, SnapshotError):
            failure = error
        else:
            causes = (
                [str(cause) for cause, _ in error.failures.values()]
                if isinstance(error, CheckpointException)
                else [f"{type(error).__name__}: {error}"]
            )
            failure = SnapshotError(
                f"{snapshot}: this rank could not load its part from memory: " + "; ".join(causes)
            )
            failure.__cause__ = error
    loaded = torch.tensor([0 if failure is not None else 1])
    world = memory._world
    agreement = world.control if world is not None else process_group
    dist.all_reduce(loaded, op=dist.ReduceOp.MIN, group=agreement)
    if failure is not None:
        raise failure
    if not loaded.item():
        raise SnapshotError(f"{snapshot}: another rank failed to load its part from memory")
    step, extra = _install(model, optimizer, state, sampler)
    if step != snapshot.step:
        raise SnapshotError(
            f"the memory snapshot says step {step}, its registry entry {snapshot.step}"
        )
    return step, extra, rebuild_fetched + reader.bytes_from_peers


def metadata_ranks(metadata: Metadata) -> set[int]:
    return {where.rank for where in metadata.storage_data.values()}
