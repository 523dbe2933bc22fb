"""The lifecycle of one process's memory snapshots: :class:`MemorySnapshots` attaches to each
world, takes a snapshot (the copy: worker/snapshots/staging.py), protects it in the
background (DCP's save into a blob, shipped to its replicas' holders or coded into parity
shares, agreed by every rank), registers it through ``on_complete`` and drops what it made
useless. The package docstring (worker/snapshots/__init__.py) tells the whole story."""

from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ..sampler import ElasticSampler
from ..state_io import MODEL_KEY, OPTIMIZER_KEY, PROGRESS_KEY, pack_progress
from .erasure import encode_parity
from .hostfiles import Buffer, HostFiles, world_of
from .placement import (
    RegisteredSnapshot,
    SnapshotError,
    SnapshotId,
    SnapshotPlacement,
    erasure_protectors,
    protectors,
    validate_erasure,
)
from .protocol import REQUEST_TIMEOUT_S, request
from .server import SnapshotServer
from .staging import DeferredCopy, Stager, copy_all, state_bytes
from .storage import BlobWriter

log = logging.getLogger("rallypoint.worker.snapshots")

# torch's default timeout of a gloo group, when attach() is given none.
DEFAULT_GROUP_TIMEOUT_S = 1800.0


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
        directory: str | os.PathLike[str] | None = None,
    ) -> None:
        """``copies=r`` keeps every blob r times (its rank's own included; 2 if neither is
        given); ``erasure=(k, m)`` codes groups of k blobs with m parity shares instead.
        ``directory`` (in host memory: a tmpfs such as /dev/shm; one per process, e.g.
        hostfiles.job_directory) keeps what this process holds in files there, so that a
        process started after it died can restore from them (worker/snapshots/hostfiles.py);
        None keeps it in this process's memory."""
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
        files = HostFiles.open(directory) if directory is not None else None
        self.server = SnapshotServer(bind, advertise, files)
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

    def close(self, *, keep_files: bool = False) -> None:
        """Stop; ``keep_files`` leaves the snapshot files in the directory for a process
        started after this one (the elastic loop keeps them when its job stays open for this
        worker to come back), else they are removed."""
        if self._world is not None:
            self._world.protection.stop()
        if self._hooked is not None:
            self._hooked[1].remove()
            self._hooked = None
        self.server.close(keep_files=keep_files)

    def recover(self, registered: RegisteredSnapshot | None) -> tuple[int, ...]:
        """Take up the files of the ``registered`` snapshot (the coordinator's: only it, and
        only of its world) that a process before this one left in the directory, and remove
        every other file it left; the old ranks whose blobs were taken up. Called by the
        first restore (``holding``); nothing to do after it, or without a directory."""
        if registered is None:
            return self.server.recover(None, "")
        return self.server.recover(registered.snapshot, registered.world)

    @property
    def token(self) -> bytes:
        if self._world is None:
            raise SnapshotError("attach() has not been called in this world")
        return self._world.token

    @property
    def control_group(self) -> dist.ProcessGroup | None:
        """The group the training thread's collectives of the attached world go over (None
        before :meth:`attach`): a restore agrees on its outcome over it."""
        return self._world.control if self._world is not None else None

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
        pass before any synchronous collective (worker/elastic/, "Formation")."""
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
        # One exchange (two collectives; a broadcast of the token, then this, were four):
        # every rank's host and server, and the world's token, rank 0's.
        peers: list[Any] = [None] * dist.get_world_size(process_group)
        mine = (self.host, self.server.address, secrets.token_bytes(16) if rank == 0 else b"")
        dist.all_gather_object(peers, mine, group=process_group)
        token: bytes = peers[0][2]
        hosts = [host for host, _, _ in peers]
        if self.erasure is not None:
            placement = erasure_protectors(hosts, *self.erasure)
        else:
            placement = protectors(hosts, self.copies or 1)
        placement = replace(placement, world=world_of(token))
        ranks = dist.get_process_group_ranks(process_group) if process_group else None
        made, self._made = self._made, None
        if made is not None and made.ranks == ranks:
            group, control = made.group, made.control
            for made_group in {group, control} - {process_group, dist.group.WORLD}:
                made_group.set_timeout(timeout or timedelta(seconds=DEFAULT_GROUP_TIMEOUT_S))
        else:
            self._retire(made, timeout)
            group, control = _new_groups(process_group, timeout)
        self.server.set_token(token, round_number)
        # The previous world's groups may hold work stuck on a peer that is gone (an
        # abandoned agreement, a protection's collective): dropping them would run gloo's
        # destructor, which joins that work, for up to its timeout. Kept until it passed.
        if self._world is not None:
            self._world.protection.stop()
            self._retire(self._world, timedelta(seconds=self._world.timeout_s))
        self._world = _World(
            round_number=round_number,
            rank=rank,
            token=token,
            addresses=tuple(address for _, address, _ in peers),
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
            PROGRESS_KEY: pack_progress(step, sampler, extra),
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

    def wait(self, timeout_s: float | None = None) -> SnapshotTaken | None:
        """Wait for the snapshot in flight, if any (up to ``timeout_s``: TimeoutError after
        it); its outcome (re-raises its failure)."""
        pending = self._pending
        return pending.wait(timeout_s) if pending is not None else None

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
            writer = BlobWriter(
                world.rank, lambda length: self.server.allocate(snapshot, world.rank, length)
            )
            metadata = dcp_save(staged, storage_writer=writer, process_group=world.group)
            blob = writer.blob
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

    def _protect_by_replicas(self, world: _World, snapshot: SnapshotId, blob: Buffer) -> int:
        """Push ``blob`` to the ranks holding its replicas; 1 if every one acked."""
        ok = 1
        for holder in world.placement.holders[world.rank][1:]:
            ok &= _ship(world, snapshot, holder, "put", blob)
        return ok

    def _protect_by_parity(
        self, world: _World, snapshot: SnapshotId, placement: SnapshotPlacement, blob: Buffer
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
            shares = encode_parity(
                [memoryview(blob) for blob in blobs], placement.parity_shares, parities
            )
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


def _ship(world: _World, snapshot: SnapshotId, holder: int, op: str, blob: Buffer) -> int:
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
        request(world.addresses[holder], header, [blob])
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
