"""Restoring a memory snapshot into a new world: what each process holds of it
(:class:`MemoryHolding`, gathered from every rank), whether the new world can restore it
(:func:`memory_blocker`), the rebuild of an erasure-coded snapshot's lost blobs
(:func:`rebuild_plan`), and the load itself (:func:`restore_from_memory`), resharded to the
new world by DCP's load planner over a :class:`~.storage.PeerReader`."""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from ..sampler import ElasticSampler
from ..state_io import install, targets
from .erasure import decode_blobs
from .lifecycle import MemorySnapshots
from .placement import RegisteredSnapshot, SnapshotError, SnapshotId, SnapshotPlacement
from .protocol import request
from .storage import PeerReader

log = logging.getLogger("rallypoint.worker.snapshots")


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


def holding(
    memory: MemorySnapshots | None, snapshot: RegisteredSnapshot | SnapshotId | None
) -> MemoryHolding | None:
    """What this process holds of ``snapshot`` (None: it keeps no snapshots, or none is
    registered). Given the registered snapshot, the files of it a process before this one
    left in host memory are taken up first (``MemorySnapshots.recover``)."""
    if memory is None:
        return None
    if not isinstance(snapshot, SnapshotId):
        memory.recover(snapshot)
        if snapshot is None:
            return None
        snapshot = snapshot.snapshot
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
    shares: dict[int, bytes | bytearray | memoryview] = {}
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
            stored = request(holder.address, header, answer_bytes=length)
            fetched += length
        shares[number] = memoryview(stored)
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
    reader = PeerReader(snapshot, metadata, memory.server, sources, memory.token)
    state = targets(model, optimizer, metadata)
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
    control = memory.control_group
    agreement = control if control is not None else process_group
    dist.all_reduce(loaded, op=dist.ReduceOp.MIN, group=agreement)
    if failure is not None:
        raise failure
    if not loaded.item():
        raise SnapshotError(f"{snapshot}: another rank failed to load its part from memory")
    step, extra = install(model, optimizer, state, sampler)
    if step != snapshot.step:
        raise SnapshotError(
            f"the memory snapshot says step {step}, its registry entry {snapshot.step}"
        )
    return step, extra, rebuild_fetched + reader.bytes_from_peers


def metadata_ranks(metadata: Metadata) -> set[int]:
    return {where.rank for where in metadata.storage_data.values()}
