"""A blocking client for threaded code (training loops, torch worker threads).

:class:`SyncClient` runs a :class:`Client` on a private event loop in a daemon thread and
blocks the calling thread on each call, so it works from any thread, with or without an event
loop of its own, and from several threads at once. Its methods are the async client's, minus
``await``. Lease-lost callbacks run on the client's thread and must not call the SyncClient
(that would wait for the very thread that runs them); use ``SyncLease.wait_lost`` or hand the
work to another thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .aio import Client
from .blocking import Blocking, LoopThread, Runner, blocking
from .errors import LeaseNotFoundError
from .lease import Lease
from .rendezvous_values import RoundInfo, RoundMember
from .sync_rendezvous import SyncCheckpointRegistry, SyncParticipant, SyncRoundStore
from .values import Fence, KeyValue, WatchEvent
from .watch import Watcher


class SyncLease(Blocking[Lease]):
    """A :class:`Lease` seen from threads."""

    def __init__(self, lease: Lease, runner: Runner) -> None:
        super().__init__(lease, runner)
        self._lost = threading.Event()
        runner.loop.call_soon_threadsafe(lease.on_lost, lambda _lease: self._lost.set())

    @property
    def lease_id(self) -> int:
        return self._target.lease_id

    @property
    def fencing_token(self) -> int:
        return self._target.fencing_token

    @property
    def fence(self) -> Fence:
        return self._target.fence

    @property
    def ttl_s(self) -> float:
        return self._target.ttl_s

    @property
    def alive(self) -> bool:
        return self._target.alive

    @property
    def lost_reason(self) -> str | None:
        return self._target.lost_reason

    @property
    def lease(self) -> Lease:
        return self._target

    def wait_lost(self, timeout_s: float | None = None) -> bool:
        """Block until the lease is lost (True) or ``timeout_s`` passed (False)."""
        return self._lost.wait(timeout_s)

    def on_lost(self, callback: Callable[[SyncLease], object]) -> None:
        """Call ``callback(sync_lease)`` on the client's thread when the lease is lost."""
        self._runner.loop.call_soon_threadsafe(self._target.on_lost, lambda _: callback(self))

    revoke = blocking(Lease.revoke)


class SyncWatcher(Blocking[Watcher]):
    """``for event in watcher``; ``close()`` (from any thread) ends the iteration."""

    def __init__(self, watcher: Watcher, runner: Runner) -> None:
        super().__init__(watcher, runner)
        self._closed = False

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        try:
            return self._runner.run(self._target.__anext__())
        except (StopAsyncIteration, concurrent.futures.CancelledError):
            raise StopIteration from None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            asyncio.run_coroutine_threadsafe(self._target.aclose(), self._runner.loop).result()

    def __enter__(self) -> SyncWatcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncClient(Blocking[Client]):
    """The blocking client: ``SyncClient(endpoints, **options)`` takes :class:`Client`'s
    options and connects at once; ``close()`` (or ``with``) ends it."""

    def __init__(self, endpoints: str | Sequence[str], **options: Any) -> None:
        runner = LoopThread()
        client: Client | None = None
        try:
            client = Client(endpoints, **options)
            runner.run(client.connect())
        except BaseException:
            if client is not None:
                with contextlib.suppress(Exception):
                    runner.run(client.close())
            runner.stop()
            raise
        super().__init__(client, runner)
        self._loop_thread = runner
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._runner.run(self._target.close())
            finally:
                self._loop_thread.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def endpoints(self) -> list[str]:
        return self._target.endpoints

    @property
    def session_id(self) -> int:
        return self._target.session_id

    put = blocking(Client.put)
    get = blocking(Client.get)
    get_with_header = blocking(Client.get_with_header)
    range = blocking(Client.range)
    delete = blocking(Client.delete)
    compare_and_set = blocking(Client.compare_and_set)
    add = blocking(Client.add)
    revoke_lease = blocking(Client.revoke_lease)
    keep_alive_once = blocking(Client.keep_alive_once)
    lease_list = blocking(Client.lease_list)
    lease_time_to_live = blocking(Client.lease_time_to_live)
    member_list = blocking(Client.member_list)
    member_add = blocking(Client.member_add)
    member_remove = blocking(Client.member_remove)
    member_promote = blocking(Client.member_promote)
    transfer_leader = blocking(Client.transfer_leader)
    snapshot = blocking(Client.snapshot)
    snapshot_save = blocking(Client.snapshot_save)
    member_status = blocking(Client.member_status)
    status = blocking(Client.status)
    configure = blocking(Client.configure)
    get_job = blocking(Client.get_job)
    join_batch = blocking(Client.join_batch)
    list_members = blocking(Client.list_members)
    list_jobs = blocking(Client.list_jobs)
    job_statuses = blocking(Client.job_statuses)
    evict = blocking(Client.evict)
    close_job = blocking(Client.close_job)
    prune_jobs = blocking(Client.prune_jobs)
    latest_checkpoint = blocking(Client.latest_checkpoint)
    latest_memory_snapshot = blocking(Client.latest_memory_snapshot)
    drain = blocking(Client.drain)
    undrain = blocking(Client.undrain)
    drained = blocking(Client.drained)

    def range_pages(self, prefix: bytes | str = b"", **options: Any) -> Iterator[KeyValue]:
        """Every key under ``prefix``, a page at a time (see ``Client.range_pages``)."""
        pages = self._target.range_pages(prefix, **options)

        async def next_key() -> KeyValue:
            return await anext(pages)

        while True:
            try:
                yield self._runner.run(next_key())
            except StopAsyncIteration:
                return

    def all_members(self, job: str, **options: Any) -> Iterator[RoundMember]:
        """Every member (or waiter) of the round, a page at a time (``Client.all_members``)."""
        members = self._target.all_members(job, **options)

        async def next_member() -> RoundMember:
            return await anext(members)

        while True:
            try:
                yield self._runner.run(next_member())
            except StopAsyncIteration:
                return

    def grant_lease(self, ttl_s: float, **options: Any) -> SyncLease:
        return SyncLease(self._runner.run(self._target.grant_lease(ttl_s, **options)), self._runner)

    def keep_alive_lease(self, lease_id: int, **options: Any) -> SyncLease:
        lease = self._runner.run(self._target.keep_alive_lease(lease_id, **options))
        return SyncLease(lease, self._runner)

    @contextlib.contextmanager
    def lease(self, ttl_s: float, **options: Any) -> Iterator[SyncLease]:
        """``with c.lease(ttl_s) as lease:`` grants, keeps alive, revokes on exit."""
        lease = self.grant_lease(ttl_s, **options)
        try:
            yield lease
        finally:
            if lease.alive:
                with contextlib.suppress(LeaseNotFoundError):
                    lease.revoke()

    def watch(self, key: bytes | str, **options: Any) -> SyncWatcher:
        """A started watch (``start_revision`` 0 means changes after this call returns)."""

        async def make() -> Watcher:
            watcher = self._target.watch(key, **options)
            await watcher.start()
            return watcher

        return SyncWatcher(self._runner.run(make()), self._runner)

    def join(self, job: str, name: str, **options: Any) -> SyncParticipant:
        """``Client.join`` from a thread: a participant heartbeating on the client's loop."""
        participant = self._runner.run(self._target.join(job, name, **options))
        return SyncParticipant(participant, self._runner)

    def round_store(self, job: str, round_number: int, participant_id: int) -> SyncRoundStore:
        return SyncRoundStore(
            self._target.round_store(job, round_number, participant_id), self._runner
        )

    def checkpoint_registry(self, info: RoundInfo) -> SyncCheckpointRegistry:
        return SyncCheckpointRegistry(self._target.checkpoint_registry(info), self._runner)
