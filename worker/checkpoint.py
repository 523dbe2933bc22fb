"""Checkpoints of model, optimizer, sampler, step and extra state with torch.distributed.checkpoint.

Theory of operation. A checkpoint is one directory per step under a checkpoint root
(``root/step-000123``, or ``root/step-000123-round-7`` when the round is given, so a zombie of
an older round never writes into the directory of the current one). It holds DCP's files
(``.metadata`` and one or more ``__<rank>_<n>.distcp`` per rank) and a small JSON file,
``rallypoint-checkpoint.json``, written by rank 0 once DCP has finished: the step, the world
size, and the layout of the parameters (which are sharded DTensors, as FSDP2's
``fully_shard`` makes them, and which are replicated).

Saving (``Checkpointer.save_async``) takes the state dicts with
``get_state_dict(model, optimizer)`` (sharded: each rank its own shards, no gather), stages a
copy in memory and writes it on a background thread (``dcp.async_save``), so training goes on
as soon as ``save_async`` returns. DCP's writes run collectives (planning and the final
metadata exchange) from that thread; they go over a process group of the checkpointer's own,
so they never interleave with the training loop's collectives on the default group, and one
save at a time per checkpointer. ``PendingCheckpoint.wait()`` returns once DCP has written
and synced every rank's files and its ``.metadata`` (DCP's save ends in an all-reduce, so
"this rank's part is durable" and "every rank's part is durable" coincide), and on rank 0
also the JSON file. The elastic loop then reports the shard to the coordinator; rank 0
commits after its own ``wait()`` and every rank's report. Done-callbacks are the hooks for
that; the coordinator calls stay outside this module.

Restoring (``restore_checkpoint``) builds state dicts laid out for the *current* world and
model wrapping, and lets DCP read into them: each rank reads only the stored chunks that
overlap its own shards, so a checkpoint saved at any world size loads at any other
(resharding 4 -> 3 ranks is DCP's work, not ours), then ``set_state_dict`` installs them.

A plain data-parallel model (every rank a full replica) can instead receive the state from a
survivor over the process group (``broadcast_state``), and a model replicated across units
and sharded inside one its shards from the survivors that hold them (worker/replica_restore.py).
``restore_state`` gathers what every rank holds, makes the same choice on every rank
(``choose_restore_source``: keep, broadcast, replicas, memory, disk or fresh start:
worker/restore_choice.py) and says which it took and why.

Retention: the coordinator's registry keeps the last K committed checkpoints and returns the
ones it retired; ``delete_checkpoints`` removes their directories.

What is saved and loaded (model, optimizer, and step, sampler and extra state as one blob)
is worker/state_io.py's, shared with the memory snapshots (worker/snapshots/).
"""

from __future__ import annotations

import enum
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.tensor import DTensor, Shard
from torch.nn.parallel import DistributedDataParallel

from .replica_restore import HeldState, model_pieces, restore_from_replicas
from .restore_choice import PeerState, RestorePolicy, RestoreSource, choose_restore_source
from .sampler import ElasticSampler
from .snapshots import (
    MemorySnapshots,
    RegisteredSnapshot,
    SnapshotError,
    holding,
    restore_from_memory,
)
from .state_io import CheckpointError as CheckpointError
from .state_io import capture, install, targets

log = logging.getLogger("rallypoint.worker.checkpoint")

METADATA_FILE = "rallypoint-checkpoint.json"
METADATA_FORMAT = 1

# -- layout ---------------------------------------------------------------------------------


class Placement(enum.Enum):
    SHARDED = "sharded"  # a DTensor with a Shard placement: each rank holds a part
    REPLICATED = "replicated"  # every rank holds the whole tensor


@dataclass(frozen=True, slots=True)
class ParamLayout:
    name: str
    placement: Placement
    shape: tuple[int, ...]  # the global (unsharded) shape
    dtype: str
    # DTensor placements as torch prints them, e.g. "Shard(dim=0)"; "" for a plain tensor.
    placements: str


@dataclass(frozen=True, slots=True)
class CheckpointLayout:
    world_size: int
    params: tuple[ParamLayout, ...]

    @property
    def fully_replicated(self) -> bool:
        return all(param.placement is Placement.REPLICATED for param in self.params)

    def to_json(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "params": [
                {
                    "name": param.name,
                    "placement": param.placement.value,
                    "shape": list(param.shape),
                    "dtype": param.dtype,
                    "placements": param.placements,
                }
                for param in self.params
            ],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CheckpointLayout:
        params = tuple(
            ParamLayout(
                name=param["name"],
                placement=Placement(param["placement"]),
                shape=tuple(param["shape"]),
                dtype=param["dtype"],
                placements=param["placements"],
            )
            for param in obj["params"]
        )
        return cls(world_size=int(obj["world_size"]), params=params)

    def to_bytes(self) -> bytes:
        """The layout as the coordinator's checkpoint registry stores it."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()


def describe_layout(model: torch.nn.Module, world_size: int) -> CheckpointLayout:
    # Names as DCP stores them: DDP's "module." wrapper prefix is not part of them.
    inner = model.module if isinstance(model, DistributedDataParallel) else model
    params = []
    for name, param in inner.named_parameters():
        if isinstance(param, DTensor):
            sharded = any(isinstance(p, Shard) for p in param.placements)
            placements = ",".join(str(p) for p in param.placements)
        else:
            sharded, placements = False, ""
        params.append(
            ParamLayout(
                name=name,
                placement=Placement.SHARDED if sharded else Placement.REPLICATED,
                shape=tuple(param.shape),
                dtype=str(param.dtype).removeprefix("torch."),
                placements=placements,
            )
        )
    return CheckpointLayout(world_size=world_size, params=tuple(params))


@dataclass(frozen=True, slots=True)
class CheckpointMetadata:
    """The contents of ``rallypoint-checkpoint.json``."""

    step: int
    world_size: int
    round_number: int | None
    layout: CheckpointLayout
    bytes_total: int  # DCP's stored bytes over every rank
    save_duration_s: float  # from save_async's call to DCP's completion, on rank 0

    def to_json(self) -> dict[str, Any]:
        return {
            "format": METADATA_FORMAT,
            "step": self.step,
            "world_size": self.world_size,
            "round_number": self.round_number,
            "layout": self.layout.to_json(),
            "bytes_total": self.bytes_total,
            "save_duration_s": self.save_duration_s,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CheckpointMetadata:
        if obj.get("format") != METADATA_FORMAT:
            raise CheckpointError(f"unknown checkpoint metadata format {obj.get('format')!r}")
        return cls(
            step=int(obj["step"]),
            world_size=int(obj["world_size"]),
            round_number=obj["round_number"],
            layout=CheckpointLayout.from_json(obj["layout"]),
            bytes_total=int(obj["bytes_total"]),
            save_duration_s=float(obj["save_duration_s"]),
        )


def checkpoint_path(
    root: str | os.PathLike[str], step: int, round_number: int | None = None
) -> Path:
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    name = f"step-{step:06d}" if round_number is None else f"step-{step:06d}-round-{round_number}"
    return Path(root) / name


def read_metadata(path: str | os.PathLike[str]) -> CheckpointMetadata:
    """The metadata of a finished checkpoint; ``CheckpointError`` if it is not finished."""
    metadata_file = Path(path) / METADATA_FILE
    try:
        text = metadata_file.read_text()
    except FileNotFoundError:
        raise CheckpointError(f"{path} is not a finished checkpoint (no {METADATA_FILE})") from None
    obj: dict[str, Any] = json.loads(text)
    return CheckpointMetadata.from_json(obj)


def _write_atomically(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename, fsync the directory: a reader sees all of it or nothing."""
    temp = path.with_name(path.name + ".tmp")
    with open(temp, "wb") as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


# -- saving ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SavedCheckpoint:
    step: int
    path: Path
    world_size: int
    bytes_total: int
    duration_s: float  # from save_async's call until the save was durable


class PendingCheckpoint:
    """A save in progress; ``wait()`` blocks until it is durable (see the module's docstring)."""

    def __init__(self, step: int, path: Path, layout: CheckpointLayout) -> None:
        self.step = step
        self.path = path
        self.layout = layout
        self._future: Future[SavedCheckpoint] = Future()

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout_s: float | None = None) -> SavedCheckpoint:
        """The saved checkpoint; re-raises the save's failure; ``TimeoutError`` on timeout."""
        return self._future.result(timeout=timeout_s)

    def add_done_callback(self, callback: Callable[[PendingCheckpoint], None]) -> None:
        """Called once the save is durable or failed (on the writer's thread, or at once if it
        already is): the hook where the elastic loop reports its shard to the coordinator."""
        self._future.add_done_callback(lambda _: callback(self))


class Checkpointer:
    """Saves checkpoints under ``root`` for one world (make a new one after re-forming).

    Creating it is collective over the default process group: it makes the gloo group that
    DCP's background writes use (``process_group`` overrides that)."""

    def __init__(
        self, root: str | os.PathLike[str], *, process_group: dist.ProcessGroup | None = None
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("Checkpointer needs an initialised default process group")
        self.root = Path(root)
        self._group = process_group if process_group is not None else dist.new_group(backend="gloo")
        self._lock = threading.Lock()
        # The last save started. Invariant: a new save starts only after it is done, since two
        # saves' collectives on one group from two writer threads could interleave.
        self._pending: PendingCheckpoint | None = None

    @property
    def busy(self) -> bool:
        """A save is in flight (its writer thread may be inside a collective on the group)."""
        pending = self._pending
        return pending is not None and not pending.done()

    def save_async(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        sampler: ElasticSampler | None = None,
        extra: Any = None,
        round_number: int | None = None,
    ) -> PendingCheckpoint:
        """Start saving; returns once the state is staged in memory and training may go on.

        Collective: every rank of the world calls it for the same step."""
        with self._lock:
            if self._pending is not None:
                # Its outcome, failed or not, went to whoever waited on it; only its end matters.
                futures_wait([self._pending._future])
            started = time.monotonic()
            path = checkpoint_path(self.root, step, round_number)
            path.mkdir(parents=True, exist_ok=True)
            is_writer = dist.get_rank() == 0
            if is_writer:
                # A directory written before for this step (by a world that failed before
                # committing) must not look finished while it is being overwritten.
                (path / METADATA_FILE).unlink(missing_ok=True)
            world_size = dist.get_world_size()
            layout = describe_layout(model, world_size)
            state = capture(model, optimizer, step, sampler, extra)
            upload = dcp_async_save(state, checkpoint_id=str(path), process_group=self._group)
            if not isinstance(upload, Future):
                raise AssertionError(f"dcp.async_save returned {type(upload).__name__}")
            pending = PendingCheckpoint(step, path, layout)

            def finish(done: Future[Any]) -> None:
                try:
                    dcp_metadata = done.result()
                    bytes_total = sum(info.length for info in dcp_metadata.storage_data.values())
                    duration_s = time.monotonic() - started
                    if is_writer:
                        metadata = CheckpointMetadata(
                            step, world_size, round_number, layout, bytes_total, duration_s
                        )
                        data = json.dumps(metadata.to_json(), indent=1).encode()
                        _write_atomically(path / METADATA_FILE, data)
                    saved = SavedCheckpoint(step, path, world_size, bytes_total, duration_s)
                    pending._future.set_result(saved)
                except BaseException as failure:
                    pending._future.set_exception(failure)

            upload.add_done_callback(finish)
            self._pending = pending
            return pending

    def wait(self) -> None:
        """Wait for the last save (if any) to be durable; re-raises its failure."""
        with self._lock:
            if self._pending is not None:
                self._pending.wait()


# -- restoring ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RestoreResult:
    source: RestoreSource
    reason: str
    step: int
    extra: Any
    bytes_moved: int  # read from disk by this rank, or broadcast, in bytes
    duration_s: float

    @property
    def bytes_per_s(self) -> float | None:
        return self.bytes_moved / self.duration_s if self.duration_s > 0 else None


class _CountingReader(FileSystemReader):
    """A FileSystemReader that counts the stored bytes this rank reads."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self.bytes_read = 0

    def read_data(self, plan: Any, planner: Any) -> Any:
        for item in plan.items:
            self.bytes_read += self.storage_data[item.storage_index].length
        return super().read_data(plan, planner)


def restore_checkpoint(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    sampler: ElasticSampler | None = None,
    process_group: dist.ProcessGroup | None = None,
) -> RestoreResult:
    """Load a checkpoint saved at any world size into the current world. Collective."""
    started = time.monotonic()
    metadata = read_metadata(path)
    reader = _CountingReader(path)
    state = targets(model, optimizer, reader.read_metadata())
    dcp_load(state, storage_reader=reader, process_group=process_group)
    step, extra = install(model, optimizer, state, sampler)
    if step != metadata.step:
        raise CheckpointError(f"{path}: metadata says step {metadata.step}, state says {step}")
    return RestoreResult(
        source=RestoreSource.DISK,
        reason=f"read {path} (saved by {metadata.world_size} ranks)",
        step=step,
        extra=extra,
        bytes_moved=reader.bytes_read,
        duration_s=time.monotonic() - started,
    )


@dataclass(frozen=True, slots=True)
class _TensorSpec:
    """Where a tensor was in a broadcast state dict: its place in its dtype's flat buffer."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int


def _split_tensors(obj: Any, buffers: dict[torch.dtype, list[torch.Tensor]]) -> Any:
    """``obj`` with every tensor replaced by a ``_TensorSpec``; the tensors go to ``buffers``."""
    if isinstance(obj, DTensor):
        raise ValueError("broadcast_state needs a replicated model; this state holds DTensors")
    if isinstance(obj, torch.Tensor):
        parts = buffers.setdefault(obj.dtype, [])
        offset = sum(part.numel() for part in parts)
        parts.append(obj.detach().reshape(-1))
        return _TensorSpec(obj.dtype, tuple(obj.shape), offset)
    if isinstance(obj, dict):
        return {key: _split_tensors(value, buffers) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_split_tensors(value, buffers) for value in obj)
    return obj


def _join_tensors(obj: Any, flat: dict[torch.dtype, torch.Tensor]) -> Any:
    if isinstance(obj, _TensorSpec):
        numel = 1
        for size in obj.shape:
            numel *= size
        return flat[obj.dtype][obj.offset : obj.offset + numel].view(obj.shape).clone()
    if isinstance(obj, dict):
        return {key: _join_tensors(value, flat) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_join_tensors(value, flat) for value in obj)
    return obj


def broadcast_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    src: int,
    step: int = 0,
    extra: Any = None,
    sampler: ElasticSampler | None = None,
    process_group: dist.ProcessGroup | None = None,
    receivers: Sequence[int] | None = None,
) -> RestoreResult:
    """Copy a replicated model's and optimizer's state (and step, sampler, extra) from rank
    ``src`` (a global rank) to every rank of the group, or to ``receivers`` only. Collective.

    ``step``, ``extra`` and ``sampler``'s state are taken from ``src``; elsewhere they are
    replaced. One object broadcast carries the structure, then one tensor broadcast per
    dtype carries the values, bit for bit.

    ``receivers``: the ranks that need the state (``RestoreDecision.receivers``); every
    other rank holds it already and keeps its own (its ``step`` and ``extra`` are returned,
    nothing is moved). When they are few (at most the depth of a tree broadcast over the
    group: 1 for 2 ranks, 2 for 3-4, 3 for 5-8, ...), ``src`` sends each dtype's values to
    each of them directly, once over the wire, instead of broadcasting to every rank."""
    started = time.monotonic()
    structure: list[Any] = [None]
    buffers: dict[torch.dtype, list[torch.Tensor]] = {}
    me = dist.get_rank()
    if me == src:
        skeleton = _split_tensors(capture(model, optimizer, step, sampler, extra), buffers)
        sizes = {dtype: sum(part.numel() for part in parts) for dtype, parts in buffers.items()}
        structure = [(skeleton, sizes)]
    dist.broadcast_object_list(structure, src=src, group=process_group)
    skeleton, sizes = structure[0]
    world = dist.get_world_size(process_group)
    direct = receivers is not None and len(receivers) <= max(1, (world - 1).bit_length())
    if direct and me != src and me not in (receivers or ()):
        return RestoreResult(
            RestoreSource.BROADCAST, f"held already (rank {src} sent it)", step, extra, 0, 0.0
        )
    flat: dict[torch.dtype, torch.Tensor] = {}
    bytes_moved = 0
    # Sorted by name, so every rank issues the broadcasts in the same order.
    for dtype in sorted(sizes, key=str):
        if me == src:
            buffer = torch.cat(buffers[dtype])
        else:
            buffer = torch.empty(sizes[dtype], dtype=dtype)
        if not direct:
            dist.broadcast(buffer, src=src, group=process_group)
        elif me == src:
            sends = [dist.isend(buffer, dst, group=process_group) for dst in receivers or ()]
            for send in sends:
                if send is not None:
                    send.wait()
        else:
            dist.recv(buffer, src, group=process_group)
        flat[dtype] = buffer
        bytes_moved += buffer.numel() * buffer.element_size()
    received_step, received_extra = install(
        model, optimizer, _join_tensors(skeleton, flat), sampler
    )
    return RestoreResult(
        source=RestoreSource.BROADCAST,
        reason=f"received from rank {src}",
        step=received_step,
        extra=received_extra,
        bytes_moved=bytes_moved,
        duration_s=time.monotonic() - started,
    )


def _state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    total: int = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for param_state in optimizer.state.values():
        for value in param_state.values():
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
    return total


def restore_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    checkpoint: str | os.PathLike[str] | None,
    survivor_step: int | None,
    extra: Any = None,
    sampler: ElasticSampler | None = None,
    policy: RestorePolicy | None = None,
    disk_bytes_per_s: float | None = None,
    broadcast_bytes_per_s: float | None = None,
    process_group: dist.ProcessGroup | None = None,
    memory: MemorySnapshots | None = None,
    memory_snapshot: RegisteredSnapshot | None = None,
    previous: HeldState | None = None,
) -> RestoreResult:
    """Bring every rank to the same state from the best source, and say which. Collective.

    ``previous``: for a sharded model, what this survivor held in the previous world
    (``replica_restore.held_state`` of its model and optimizer, taken before the new world's
    were built; None: a newcomer, or not taken). With it the survivors can restore the new
    world from their own shards at the step they trained to (source ``replicas``) when the
    state is replicated across units.

    ``memory`` is this process's in-memory snapshots (None if it keeps none) and
    ``memory_snapshot`` the newest one registered with the coordinator (the same on every
    rank) or None.

    ``checkpoint`` is the latest committed checkpoint (the same on every rank) or None;
    ``survivor_step`` is the step this rank's in-memory state is at if it trained in the
    previous world, else None (``extra`` is its extra state then). For a sharded model,
    whose shards were replaced for this world, it is the step it had trained to: no source
    by itself, it lets the choice say what a FRESH start loses. Survivors at different steps
    converge on the most advanced (``choose_restore_source`` says why that is consistent).
    A FRESH result moves nothing: the caller starts every rank from the same state (rank 0's
    for a replicated model, with its step, sampler position and extra state), and a FRESH
    start that loses what survivors trained is logged as a warning."""
    started = time.monotonic()
    replicated = not any(isinstance(param, DTensor) for param in model.parameters())
    survivor_holds = previous if survivor_step is not None and not replicated else None
    mine = PeerState(
        rank=dist.get_rank(),
        survivor=survivor_step is not None,
        replicated=replicated,
        step=survivor_step,
        state_bytes=_state_bytes(model, optimizer),
        disk_bytes_per_s=disk_bytes_per_s,
        broadcast_bytes_per_s=broadcast_bytes_per_s,
        memory=holding(memory, memory_snapshot),
        holds=survivor_holds.layout if survivor_holds is not None else None,
        needs=None if replicated else tuple(sorted(model_pieces(model))),
    )
    peers: list[Any] = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(peers, mine, group=process_group)
    checkpoint_step = read_metadata(checkpoint).step if checkpoint is not None else None
    decision = choose_restore_source(
        peers, checkpoint_step, policy or RestorePolicy(), memory_snapshot
    )
    source, reason = decision.source, decision.reason
    if source is RestoreSource.FRESH and decision.steps_rolled_back > 0:
        log.warning("restore: %s (%d steps lost)", reason, decision.steps_rolled_back)
    if source is RestoreSource.REPLICAS:
        if decision.plan is None:
            raise AssertionError("REPLICAS chosen without a plan")
        step, restored_extra, received = restore_from_replicas(
            decision.plan,
            survivor_holds,
            model,
            optimizer,
            step=survivor_step or 0,
            extra=extra,
            sampler=sampler,
            process_group=process_group,
        )
        result = RestoreResult(source, "", step, restored_extra, received, 0.0)
    elif source is RestoreSource.MEMORY:
        if memory is None or memory_snapshot is None:
            raise AssertionError("MEMORY chosen without a memory snapshot")
        try:
            step, restored_extra, fetched = restore_from_memory(
                memory,
                memory_snapshot.snapshot,
                [peer.memory for peer in peers],
                model,
                optimizer,
                sampler=sampler,
                process_group=process_group,
            )
            result = RestoreResult(source, "", step, restored_extra, fetched, 0.0)
        except SnapshotError as error:
            # Raised on every rank alike (restore_from_memory agrees on the outcome): all
            # fall back to the disk checkpoint together, or all fail.
            if checkpoint is None:
                raise
            source = RestoreSource.DISK
            reason = f"{reason}; loading it failed ({error}): the disk checkpoint instead"
            result = restore_checkpoint(
                checkpoint, model, optimizer, sampler=sampler, process_group=process_group
            )
    elif source is RestoreSource.DISK:
        if checkpoint is None:
            raise AssertionError("DISK chosen without a checkpoint")
        result = restore_checkpoint(
            checkpoint, model, optimizer, sampler=sampler, process_group=process_group
        )
    elif source is RestoreSource.BROADCAST:
        if decision.src_rank is None:
            raise AssertionError("BROADCAST chosen without a source rank")
        result = broadcast_state(
            model,
            optimizer,
            src=decision.src_rank,
            step=survivor_step or 0,
            extra=extra,
            sampler=sampler,
            process_group=process_group,
            receivers=decision.receivers,
        )
    elif source is RestoreSource.KEEP:
        result = RestoreResult(source, "", survivor_step or 0, extra, 0, 0.0)
    else:
        result = RestoreResult(source, "", 0, None, 0, 0.0)
    return RestoreResult(
        source=source,
        reason=reason,
        step=result.step,
        extra=result.extra,
        bytes_moved=result.bytes_moved,
        duration_s=time.monotonic() - started,
    )


# -- retention ------------------------------------------------------------------------------


def retired_beyond(committed: Sequence[str], keep: int) -> list[str]:
    """The checkpoints (oldest first) to retire so that the last ``keep`` remain."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    return list(committed[: max(0, len(committed) - keep)])


def _uri_to_path(uri: str | os.PathLike[str]) -> Path:
    text = os.fspath(uri)
    parsed = urlparse(text)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme:
        raise ValueError(f"not a local checkpoint: {text}")
    return Path(text)


def delete_checkpoints(
    root: str | os.PathLike[str], uris: Iterable[str | os.PathLike[str]]
) -> list[Path]:
    """Delete retired checkpoint directories (paths or ``file://`` URIs) and return those
    deleted. Only ``step-*`` directories directly under ``root`` are touched; a path elsewhere
    raises ``ValueError``; one already gone is skipped (retention may run twice)."""
    resolved_root = Path(root).resolve()
    deleted = []
    for uri in uris:
        path = _uri_to_path(uri).resolve()
        if path.parent != resolved_root or not path.name.startswith("step-"):
            raise ValueError(f"refusing to delete {path}: not a checkpoint under {resolved_root}")
        if path.exists():
            shutil.rmtree(path)
            deleted.append(path)
    return deleted
