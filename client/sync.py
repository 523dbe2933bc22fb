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
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from .aio import Client
from .errors import LeaseNotFoundError
from .lease import Lease
from .rendezvous_values import RoundInfo
from .sync_rendezvous import SyncCheckpointRegistry, SyncParticipant, SyncRoundStore
from .values import Fence, KeyValue, WatchEvent
from .watch import Watcher

P = ParamSpec("P")
T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="rallypoint-client", daemon=True
        )
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self.thread:
            coroutine.close()
            raise RuntimeError(
                "a SyncClient method was called from the client's own thread (a lease "
                "callback?); that would wait forever for itself"
            )
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def stop(self) -> None:
        """Cancel what still runs on the loop (background watchers and mirrors), then stop."""

        async def cancel_pending() -> None:
            current = asyncio.current_task()
            tasks = [task for task in asyncio.all_tasks() if task is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(cancel_pending(), self.loop).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def _blocking(
    method: Callable[Concatenate[Client, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[SyncClient, P], T]:
    def call(self: SyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._runner.run(method(self._client, *args, **kwargs))

    call.__name__ = method.__name__
    call.__doc__ = method.__doc__
    return call


class SyncLease:
    """A :class:`Lease` seen from threads."""

    def __init__(self, lease: Lease, runner: _LoopThread) -> None:
        self._lease = lease
        self._runner = runner
        self._lost = threading.Event()
        runner.loop.call_soon_threadsafe(lease.on_lost, lambda _lease: self._lost.set())

    @property
    def lease_id(self) -> int:
        return self._lease.lease_id

    @property
    def fencing_token(self) -> int:
        return self._lease.fencing_token

    @property
    def fence(self) -> Fence:
        return self._lease.fence

    @property
    def ttl_s(self) -> float:
        return self._lease.ttl_s

    @property
    def alive(self) -> bool:
        return self._lease.alive

    @property
    def lost_reason(self) -> str | None:
        return self._lease.lost_reason

    @property
    def lease(self) -> Lease:
        return self._lease

    def wait_lost(self, timeout_s: float | None = None) -> bool:
        """Block until the lease is lost (True) or ``timeout_s`` passed (False)."""
        return self._lost.wait(timeout_s)

    def on_lost(self, callback: Callable[[SyncLease], object]) -> None:
        """Call ``callback(sync_lease)`` on the client's thread when the lease is lost."""
        self._runner.loop.call_soon_threadsafe(self._lease.on_lost, lambda _: callback(self))

    def revoke(self) -> None:
        self._runner.run(self._lease.revoke())


class SyncWatcher:
    """``for event in watcher``; ``close()`` (from any thread) ends the iteration."""

    def __init__(self, watcher: Watcher, runner: _LoopThread) -> None:
        self._watcher = watcher
        self._runner = runner
        self._closed = False

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        try:
            return self._runner.run(self._watcher.__anext__())
        except (StopAsyncIteration, concurrent.futures.CancelledError):
            raise StopIteration from None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            asyncio.run_coroutine_threadsafe(self._watcher.aclose(), self._runner.loop).result()

    def __enter__(self) -> SyncWatcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncClient:
    """The blocking client: ``SyncClient(endpoints, **options)`` takes :class:`Client`'s
    options and connects at once; ``close()`` (or ``with``) ends it."""

    def __init__(self, endpoints: str | Sequence[str], **options: Any) -> None:
        self._runner = _LoopThread()
        try:
            self._client = Client(endpoints, **options)
            self._runner.run(self._client.connect())
        except BaseException:
            with contextlib.suppress(Exception):
                self._runner.run(self._client.close())
            self._runner.stop()
            raise
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._runner.run(self._client.close())
            finally:
                self._runner.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def endpoints(self) -> list[str]:
        return self._client.endpoints

    @property
    def session_id(self) -> int:
        return self._client.session_id

    put = _blocking(Client.put)
    get = _blocking(Client.get)
    get_with_header = _blocking(Client.get_with_header)
    range = _blocking(Client.range)
    delete = _blocking(Client.delete)
    compare_and_set = _blocking(Client.compare_and_set)
    add = _blocking(Client.add)
    revoke_lease = _blocking(Client.revoke_lease)
    keep_alive_once = _blocking(Client.keep_alive_once)
    lease_list = _blocking(Client.lease_list)
    lease_time_to_live = _blocking(Client.lease_time_to_live)
    member_list = _blocking(Client.member_list)
    member_add = _blocking(Client.member_add)
    member_remove = _blocking(Client.member_remove)
    member_promote = _blocking(Client.member_promote)
    transfer_leader = _blocking(Client.transfer_leader)
    snapshot = _blocking(Client.snapshot)
    member_status = _blocking(Client.member_status)
    status = _blocking(Client.status)
    configure = _blocking(Client.configure)
    get_job = _blocking(Client.get_job)
    list_jobs = _blocking(Client.list_jobs)
    job_statuses = _blocking(Client.job_statuses)
    evict = _blocking(Client.evict)
    close_job = _blocking(Client.close_job)
    prune_jobs = _blocking(Client.prune_jobs)
    latest_checkpoint = _blocking(Client.latest_checkpoint)

    def range_pages(self, prefix: bytes | str = b"", **options: Any) -> Iterator[KeyValue]:
        """Every key under ``prefix``, a page at a time (see ``Client.range_pages``)."""
        pages = self._client.range_pages(prefix, **options)

        async def next_key() -> KeyValue:
            return await anext(pages)

        while True:
            try:
                yield self._runner.run(next_key())
            except StopAsyncIteration:
                return

    def grant_lease(self, ttl_s: float, **options: Any) -> SyncLease:
        return SyncLease(self._runner.run(self._client.grant_lease(ttl_s, **options)), self._runner)

    def keep_alive_lease(self, lease_id: int, **options: Any) -> SyncLease:
        lease = self._runner.run(self._client.keep_alive_lease(lease_id, **options))
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
            watcher = self._client.watch(key, **options)
            await watcher.start()
            return watcher

        return SyncWatcher(self._runner.run(make()), self._runner)

    def join(self, job: str, name: str, **options: Any) -> SyncParticipant:
        """``Client.join`` from a thread: a participant heartbeating on the client's loop."""
        participant = self._runner.run(self._client.join(job, name, **options))
        return SyncParticipant(participant, self._runner)

    def round_store(self, job: str, round_number: int, participant_id: int) -> SyncRoundStore:
        return SyncRoundStore(
            self._client.round_store(job, round_number, participant_id), self._runner
        )

    def checkpoint_registry(self, info: RoundInfo) -> SyncCheckpointRegistry:
        return SyncCheckpointRegistry(self._client.checkpoint_registry(info), self._runner)
