"""torch.distributed.checkpoint (DCP) storage in memory: :class:`BlobWriter` packs a rank's
saved items into one bytes object (its *blob*) and records where each item lives;
:class:`PeerReader` reads each stored item back from the process holding its rank's blob
(its own memory, or a peer's server: only the rows the item needs, straight into the target
tensor where it can)."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
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
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult

from .hostfiles import Buffer
from .placement import SnapshotError, SnapshotId
from .protocol import request_parts
from .server import SnapshotServer


@dataclass(frozen=True, slots=True)
class ItemLocation:
    """Where DCP's item lives: in the blob of ``rank``, at ``offset``, ``length`` bytes."""

    rank: int
    offset: int
    length: int


def _raw(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().contiguous().reshape(-1)
    array: Any = flat.view(torch.uint8).numpy()
    return memoryview(array)


class BlobWriter(StorageWriter):
    """DCP storage that packs this rank's items into one buffer (``self.blob``), made by
    ``allocate(length)`` once their total length is known (a file's mapping in host memory:
    the items are written straight into it)."""

    def __init__(self, rank: int, allocate: Callable[[int], Buffer] = bytearray) -> None:
        super().__init__()
        self.rank = rank
        self.allocate = allocate
        self.blob: Buffer = bytearray()

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
        raws: list[Any] = []
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                if not isinstance(data, io.BytesIO):
                    raise SnapshotError(f"{item.index.fqn}: expected bytes, got {type(data)}")
                raws.append(data.getbuffer())
            else:
                if not isinstance(data, torch.Tensor):
                    raise SnapshotError(f"{item.index.fqn}: expected a tensor, got {type(data)}")
                raws.append(_raw(data.cpu()))
        # Sized once, written in place (no growing buffer, no copy of it afterwards).
        self.blob = self.allocate(sum(len(raw) for raw in raws))
        view = memoryview(self.blob)
        results = []
        offset = 0
        for item, raw in zip(plan.items, raws, strict=True):
            view[offset : offset + len(raw)] = raw
            where = ItemLocation(self.rank, offset, len(raw))
            offset += len(raw)
            results.append(
                WriteResult(index=item.index, size_in_bytes=len(raw), storage_data=where)
            )
        view.release()
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


class PeerReader(StorageReader):
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
        return [memoryview(part) for part in request_parts(source, header, wanted)]

    def _plan_read(self, item: Any, planner: LoadPlanner) -> tuple[int, int, Any, Any]:
        """Where one read item's bytes are in its blob (offset, length), and, when they can
        be written straight into the target tensor, the target and its bytes; else the
        stored chunk's shape (the chunk is read whole and narrowed)."""
        where: ItemLocation = self.metadata.storage_data[item.storage_index]
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
            where: ItemLocation = self.metadata.storage_data[item.storage_index]
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
