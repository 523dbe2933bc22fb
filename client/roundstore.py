"""The round store: the c10d store of one (job, round), for that round's members.

Every call names (job, round, participant id) and is refused with :class:`StaleRoundError`
once the round is not the job's current ACTIVE round or the participant not one of its
members (rendezvous.proto, service RoundStore). Writes and reads go through the client's
:class:`Caller` (a retried write applies once).

Get and Wait block on the server for up to the caller's timeout, so they do not use the
transport's per-attempt timeout (which would cut a long wait short and retry it, or retry a
server's "still missing" answer as if the member had not answered): each attempt asks the
server to wait for what is left of the caller's timeout and allows ``attempt_timeout_s``
more for the answer. Only UNAVAILABLE (not the leader, no leader, member down) is retried,
following the leader hint or backing off; DEADLINE_EXCEEDED means a key was still missing.

Many reads in one call: :meth:`RoundStore.multi_get` (torch's ``multi_get``: every key, one
wait) and :meth:`RoundStore.read_groups` (several independent reads, each answered all or
nothing, a missing key failing only its own group) are the MultiGet RPC: one gRPC call and
one read barrier for all of them, as linearizable as a Get issued when the call started.
They travel on the client's ``RoundStore/Batch`` stream to the member (one stream per member,
kept by the client's Caller; ``kv_stream.BatchStreams``): the TCPStore bridge's reads then
cost a stream message each instead of a gRPC call. Writes (set, add, compare_set, delete)
travel on the same stream with their session headers, retried as the unary call would be
(the same sequence, so a retried write applies once). A member that answers UNIMPLEMENTED is
served by the unary calls from then on; every other answer and error is the unary call's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import grpc.aio

from rallypoint.proto.v1 import common_pb2, rendezvous_pb2

from .arguments import non_negative_seconds
from .caller import Caller
from .errors import (
    DeadlineExceededError,
    InternalError,
    RallypointError,
    UnavailableError,
    map_rpc_error,
)
from .jobs import RendezvousStubs, services
from .kv_stream import BatchStreams
from .rendezvous_errors import refine, refined
from .transport import Deadline, Method

# The requests the server holds (both carry timeout_ms).
WriteRequest = TypeVar(
    "WriteRequest",
    rendezvous_pb2.StoreSetRequest,
    rendezvous_pb2.StoreAddRequest,
    rendezvous_pb2.StoreCompareSetRequest,
    rendezvous_pb2.StoreDeleteRequest,
)
Request = TypeVar(
    "Request",
    rendezvous_pb2.StoreGetRequest,
    rendezvous_pb2.StoreWaitRequest,
    rendezvous_pb2.StoreMultiGetRequest,
)
Response = TypeVar("Response")
Bytes = bytes | str


# The share of a cache lease given up for clock drift: the leader's clock may run this much
# faster than the client's (the leader's StoreCacheLeases waits as much longer on its side).
CACHE_LEASE_DRIFT = 0.05


def _store_operation(
    operation_id: int, kind: str, request: Any, timeout_s: float
) -> rendezvous_pb2.StoreBatchOperation:
    """A round-store batch operation (the member bounds its wait by the request's own
    ``timeout_ms``, as the unary call's)."""
    return rendezvous_pb2.StoreBatchOperation(id=operation_id, **{kind: request})


def _bytes(data: Bytes) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


@dataclass(frozen=True, slots=True)
class CompareSetResult:
    # The key was set to the desired value.
    swapped: bool
    # What the key holds now; None when it does not exist.
    value: bytes | None


class RoundStore:
    """The store of ``round`` of ``job``, used as ``participant_id``."""

    def __init__(
        self,
        caller: Caller,
        job: str,
        round_number: int,
        participant_id: int,
        *,
        stream: bool = True,
    ) -> None:
        self.caller = caller
        # MultiGets (multi_get, read_groups) and writes (set, add, compare_set, delete) travel
        # on the client's RoundStore/Batch stream to the member (one per member, many
        # operations per message); False: unary calls.
        self.stream = stream
        self.scope = rendezvous_pb2.StoreScope(
            job=job, round=round_number, participant_id=participant_id
        )

    @property
    def job(self) -> str:
        return self.scope.job

    @property
    def round(self) -> int:
        return self.scope.round

    @property
    def namespace(self) -> str:
        return f"{self.scope.job}/{self.scope.round}"

    def __repr__(self) -> str:
        return f"RoundStore({self.namespace}, participant={self.scope.participant_id})"

    # -------------------------------------------------------------- writes

    async def _write(
        self,
        kind: str,
        method: Method[WriteRequest, Response],
        build: Callable[[common_pb2.RequestHeader], WriteRequest],
        timeout_s: float | None,
    ) -> Response:
        """A write on the client's RoundStore/Batch stream to the member (with the unary
        call's session header, so a retry applies once), or a unary call (``stream``
        off)."""
        if not self.stream:
            return await self.caller.write(method, build, timeout_s)
        return await self.caller.write_on(self._streams(), kind, method, build, timeout_s)

    async def set(self, key: Bytes, value: Bytes, *, timeout_s: float | None = None) -> None:
        await self._set(key, value, False, timeout_s)

    async def set_leased(
        self, key: Bytes, value: Bytes, *, timeout_s: float | None = None
    ) -> float:
        """:meth:`set`, asking for a cache lease on the value written: how many seconds,
        counted from before this call, the key keeps ``value`` (0: no lease), less
        ``CACHE_LEASE_DRIFT`` of them, as :meth:`read_leased` answers (see
        ``coordinator/service/store_cache.py``)."""
        response = await self._set(key, value, True, timeout_s)
        return response.cache_ms / 1000 * (1 - CACHE_LEASE_DRIFT)

    async def _set(
        self, key: Bytes, value: Bytes, cache: bool, timeout_s: float | None
    ) -> rendezvous_pb2.StoreSetResponse:
        return await refined(
            self._write(
                "set",
                lambda s: services(s).store.Set,
                lambda header: rendezvous_pb2.StoreSetRequest(
                    header=header,
                    scope=self.scope,
                    key=_bytes(key),
                    value=_bytes(value),
                    cache=cache,
                ),
                timeout_s,
            )
        )

    async def add(self, key: Bytes, delta: int, *, timeout_s: float | None = None) -> int:
        """Add ``delta`` to the decimal integer at ``key`` (missing counts as 0); the sum."""
        response = await refined(
            self._write(
                "add",
                lambda s: services(s).store.Add,
                lambda header: rendezvous_pb2.StoreAddRequest(
                    header=header, scope=self.scope, key=_bytes(key), delta=delta
                ),
                timeout_s,
            )
        )
        return response.value

    async def compare_set(
        self, key: Bytes, expected: Bytes, desired: Bytes, *, timeout_s: float | None = None
    ) -> CompareSetResult:
        """torch semantics: set ``key`` to ``desired`` if it holds ``expected``, or if it is
        absent and ``expected`` is empty."""
        response = await refined(
            self._write(
                "compare_set",
                lambda s: services(s).store.CompareSet,
                lambda header: rendezvous_pb2.StoreCompareSetRequest(
                    header=header,
                    scope=self.scope,
                    key=_bytes(key),
                    expected=_bytes(expected),
                    desired=_bytes(desired),
                ),
                timeout_s,
            )
        )
        value = response.value if response.HasField("value") else None
        return CompareSetResult(response.swapped, value)

    async def append(self, key: Bytes, value: Bytes, *, timeout_s: float | None = None) -> None:
        """Append ``value`` to the value at ``key`` (a missing key counts as empty), by
        compare-and-set retried until no other writer came in between (c10d's ``append``;
        the store has no append of its own)."""
        suffix = _bytes(value)
        current = b""
        while True:
            result = await self.compare_set(key, current, current + suffix, timeout_s=timeout_s)
            if result.swapped:
                return
            current = result.value or b""

    async def delete(self, key: Bytes, *, timeout_s: float | None = None) -> bool:
        """Delete ``key``; whether it existed."""
        response = await refined(
            self._write(
                "delete",
                lambda s: services(s).store.Delete,
                lambda header: rendezvous_pb2.StoreDeleteRequest(
                    header=header, scope=self.scope, key=_bytes(key)
                ),
                timeout_s,
            )
        )
        return response.existed

    async def multi_set(
        self, items: Sequence[tuple[Bytes, Bytes]], *, timeout_s: float | None = None
    ) -> None:
        """Set every (key, value): all at once when no key repeats (the writes then
        commute, and the member's Raft core batches concurrent proposals), else in order."""
        if len({_bytes(key) for key, _ in items}) == len(items):
            await asyncio.gather(*(self.set(k, v, timeout_s=timeout_s) for k, v in items))
        else:
            for key, value in items:
                await self.set(key, value, timeout_s=timeout_s)

    # -------------------------------------------------------------- reads

    async def get(self, key: Bytes, *, wait: bool = True, timeout_s: float | None = None) -> bytes:
        """The value at ``key``, waiting up to ``timeout_s`` (default: the client's timeout)
        for it to be set; ``wait=False`` does not wait. A key still missing raises
        DeadlineExceededError."""
        wait_s = self._wait_s(timeout_s) if wait else 0.0
        response = await self._blocking(
            lambda stubs: stubs.store.Get,
            rendezvous_pb2.StoreGetRequest(scope=self.scope, key=_bytes(key)),
            wait_s,
        )
        return response.value

    async def wait(self, keys: Sequence[Bytes], *, timeout_s: float | None = None) -> None:
        """Wait up to ``timeout_s`` (default: the client's timeout) for every key to exist;
        DeadlineExceededError if one is still missing."""
        encoded = [_bytes(key) for key in keys]
        await self._blocking(
            lambda stubs: stubs.store.Wait,
            rendezvous_pb2.StoreWaitRequest(scope=self.scope, keys=encoded),
            self._wait_s(timeout_s),
        )

    async def multi_get(
        self, keys: Sequence[Bytes], *, wait: bool = True, timeout_s: float | None = None
    ) -> list[bytes]:
        """Every key's value in one call, waiting up to ``timeout_s`` (default: the client's
        timeout; ``wait=False``: not at all) for all of them to be set; DeadlineExceededError
        if one is still missing."""
        if not keys:
            return []
        answer = await self._multi_get(
            [keys], wait_s=self._wait_s(timeout_s) if wait else 0.0, partial=False
        )
        values = answer[0][0]
        assert values is not None, "a complete MultiGet answer has every group"
        return values

    async def read_groups(
        self, groups: Sequence[Sequence[Bytes]], *, wait_s: float = 0.0
    ) -> list[list[bytes] | None]:
        """Each group's values (in its keys' order), or None for a group with a key still
        missing after ``wait_s`` (0: no wait): independent reads in one call."""
        if not groups:
            return []
        return [values for values, _ in await self._multi_get(groups, wait_s=wait_s, partial=True)]

    async def read_leased(
        self,
        groups: Sequence[Sequence[Bytes]],
        *,
        wait_s: float = 0.0,
        lease: Sequence[bool] | None = None,
    ) -> list[tuple[list[bytes] | None, float]]:
        """:meth:`read_groups` asking for cache leases: each group's values (or None) and
        how many seconds, counted from before this call, its lease lasts (0: none). While it
        lasts no key of the group changes, so its values may answer later reads of those
        keys (see ``coordinator/service/store_cache.py``). The seconds are the leader's
        less ``CACHE_LEASE_DRIFT`` of them, for clocks that do not tick at the same rate.
        ``lease``: which groups ask for one (default: all)."""
        if not groups:
            return []
        wanted = [True] * len(groups) if lease is None else lease
        if len(wanted) != len(groups):
            raise ValueError(f"lease names {len(wanted)} groups, not {len(groups)}")
        return await self._multi_get(groups, wait_s=wait_s, partial=True, lease=wanted)

    async def _multi_get(
        self,
        groups: Sequence[Sequence[Bytes]],
        *,
        wait_s: float,
        partial: bool,
        lease: Sequence[bool] | None = None,
    ) -> list[tuple[list[bytes] | None, float]]:
        """Each group's values (None: incomplete) and its lease in seconds (0: none);
        ``lease``: which groups ask for one (None: none do)."""
        request = rendezvous_pb2.StoreMultiGetRequest(scope=self.scope, partial=partial)
        for i, keys in enumerate(groups):
            group = request.groups.add(cache=lease is not None and lease[i])
            group.keys.extend(_bytes(key) for key in keys)
        response = await self._blocking(
            lambda stubs: stubs.store.MultiGet, request, wait_s, kind="multi_get"
        )
        if len(response.groups) != len(groups):
            raise InternalError(
                f"{self.namespace}: MultiGet answered {len(response.groups)} groups for "
                f"{len(groups)}"
            )
        return [
            (list(group.values), group.cache_ms / 1000 * (1 - CACHE_LEASE_DRIFT))
            if group.complete
            else (None, 0.0)
            for group in response.groups
        ]

    async def num_keys(self, *, timeout_s: float | None = None) -> int:
        response = await refined(
            self.caller.read(
                lambda s: services(s).store.NumKeys,
                rendezvous_pb2.StoreNumKeysRequest(scope=self.scope),
                timeout_s,
            )
        )
        return response.num_keys

    async def check(self, keys: Sequence[Bytes], *, timeout_s: float | None = None) -> bool:
        """Whether every key exists, without waiting."""
        response = await refined(
            self.caller.read(
                lambda s: services(s).store.Check,
                rendezvous_pb2.StoreCheckRequest(
                    scope=self.scope, keys=[_bytes(key) for key in keys]
                ),
                timeout_s,
            )
        )
        return response.all_exist

    def _streams(self) -> BatchStreams:
        """The client's round-store batch streams (made on first use)."""
        caller = self.caller
        if caller.store_streams is None:
            transport = caller.transport
            caller.store_streams = BatchStreams(
                transport,
                lambda address: services(transport.stubs(address)).store.Batch(
                    None, metadata=transport.metadata
                ),
                _store_operation,
                rendezvous_pb2.StoreBatchRequest,
            )
        return caller.store_streams

    async def _send(
        self,
        address: str,
        method: Callable[[RendezvousStubs], grpc.aio.UnaryUnaryMultiCallable[Request, Response]],
        request: Request,
        timeout_s: float,
        kind: str | None,
    ) -> Response:
        """One attempt: on ``address``'s batch stream if ``kind`` may travel there and the
        member knows the stream, else the unary call."""
        transport = self.caller.transport
        if kind is not None and self.stream:
            answered = await self._streams().answer(address, kind, request, timeout_s)
            if answered is not None:
                answer: Response = answered
                return answer
        return await method(services(transport.stubs(address)))(
            request, timeout=timeout_s, metadata=transport.metadata
        )

    def _wait_s(self, timeout_s: float | None) -> float:
        wait_s = self.caller.timeout_s if timeout_s is None else timeout_s
        return non_negative_seconds(wait_s, "timeout_s")

    async def _blocking(
        self,
        method: Callable[[RendezvousStubs], grpc.aio.UnaryUnaryMultiCallable[Request, Response]],
        request: Request,
        wait_s: float,
        kind: str | None = None,
    ) -> Response:
        """A read the server holds for up to ``wait_s``; see the module docstring. ``kind``:
        the request's operation on the batch stream, if it may travel there."""
        transport = self.caller.transport
        answer_s = transport.attempt_timeout_s
        deadline = Deadline(wait_s + answer_s)
        retrier = self.caller.retrier()
        while True:
            address = transport.pick()
            left_s = max(0.0, deadline.remaining_s() - answer_s)
            request.timeout_ms = int(left_s * 1000)
            timeout_s = max(0.001, min(left_s + answer_s, deadline.remaining_s()))
            try:
                response: Response = await self._send(address, method, request, timeout_s, kind)
            except grpc.aio.AioRpcError as rpc_error:
                error: RallypointError = refine(map_rpc_error(rpc_error, address))
            except RallypointError as stream_error:
                error = refine(stream_error)
            else:
                transport.note_success(address)
                return response
            if not isinstance(error, UnavailableError):
                raise error
            if deadline.remaining_s() <= 0:
                raise DeadlineExceededError(
                    f"{self.namespace}: no member could answer within {wait_s:g} s; last "
                    f"error: {error}"
                )
            await retrier.after_failure(address, error, max_sleep_s=deadline.remaining_s())
