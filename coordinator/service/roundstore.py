"""The RoundStore service: the c10d store of one (job, round), for that round's members.

Theory of operation. Writes (Set, Add, CompareSet, Delete) are replicated commands; the
state machine's ``Rendezvous.member_store`` refuses them with STALE_ROUND unless the round is
the job's current ACTIVE round and the participant one of its members. Reads (Get, Wait,
NumKeys, Check) are answered from this member's applied state after a read barrier (so they
see every write acknowledged before they started), and go through the same check
(``readable_store``), with one exception: the round that ended last stays readable, frozen,
by its members until the next round ends (state/roundstore.py, "Ended, read-only"), so ranks
that were inside ``init_process_group`` when it ended all get the same answers. A read of a
key that frozen store lacks is refused with STALE_ROUND at once (it can never appear).

Waiting (Get with ``timeout_ms``, Wait) re-checks after every batch of applied entries
(``node.wait_for_apply``) until the keys exist or the deadline passes: the check and the
call that starts waiting run with no await between them, so no applied entry is missed.
The membership check is part of each re-check, so a round that ends during the wait ends
it with STALE_ROUND (if the keys are still missing) rather than leaving the worker waiting on
a world that is gone. The
deadline is ``timeout_ms``, bounded by the client's own deadline.

MultiGet serves many reads (groups of keys, each answered all or nothing) behind one read
barrier and one gRPC call: process-group bootstrap is mostly reads (gloo's full mesh is N^2
gets per round), and the per-call cost, not the store, bounded them. It waits like Wait for
every group; with ``partial`` the deadline answers with the complete groups instead of
failing, which is what a caller batching unrelated requests (the TCPStore bridge) needs: one
missing key must not fail or hold the others. Every value comes from one applied state, read
after the barrier, so each group is as linearizable as a Get issued when the call started.

Cache leases (``store_cache.py``): a complete group that asks for ``cache`` is answered with a
lease on its values when this member leads (granted with no await after the read), and every
write goes through ``StoreCacheLeases.write``: served by the leader only, held while a lease
on its key lasts, proposed bound to the leader's term. A set that asks for ``cache`` is
answered with a lease on the value it wrote, if its key still holds it once applied.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

from rallypoint.proto.v1 import common_pb2, rendezvous_pb2, rendezvous_pb2_grpc

from ..node.api import ServerNode
from ..state.commands import StoreAdd, StoreCompareSet, StoreDelete, StoreSet
from ..state.errors import Failure, LimitExceeded
from ..state.jobs import RendezvousLimits
from ..state.results import (
    StoreAddResult,
    StoreCompareSetResult,
    StoreDeleteResult,
    StoreSetResult,
)
from ..state.view import RoundStoreView
from . import validate
from .common import Context, SuccessT, header_pb, propose, read_barrier
from .errors import InvalidArgument, RequestFailed, WaitTimedOut
from .store_batch import serve_store_batch
from .store_cache import StoreCacheLeases
from .validate import CheckedMultiGet

T = TypeVar("T")

# Bounds of one MultiGet: keys over all groups, and bytes of values in the answer (a store
# may hold 64 MiB; an answer that large would stall the member's event loop while encoded).
MAX_MULTI_GET_KEYS = 65_536
MAX_MULTI_GET_ANSWER_BYTES = 32 * 1024 * 1024


class RoundStoreServicer(rendezvous_pb2_grpc.RoundStoreServicer):
    def __init__(self, node: ServerNode) -> None:
        self.node = node
        self.cache = StoreCacheLeases(node)

    # ----------------------------------------------------------------- reads

    def _store(self, scope: validate.Scope) -> RoundStoreView:
        """The scope's store if its participant may read it now (an ended round's,
        read-only, included); else the fencing failure."""
        store = self.node.state.rendezvous.readable_store(
            scope.job, scope.round, scope.participant_id
        )
        if isinstance(store, Failure):
            raise RequestFailed(store)
        return store

    async def _wait_for(
        self,
        scope: validate.Scope,
        found: Callable[[RoundStoreView], T | None],
        timeout_ms: int,
        context: Context,
        what: str,
        at_deadline: Callable[[RoundStoreView], T] | None = None,
        barrier: bool = True,
    ) -> T:
        """``found(store)`` once it is not None, re-checked after every apply until
        ``timeout_ms`` (bounded by the client's deadline) passes; then ``at_deadline(store)``
        if given, else WaitTimedOut. ``barrier=False``: the caller took the read barrier."""
        loop = asyncio.get_running_loop()
        remaining_s: float | None = context.time_remaining()
        wait_s = timeout_ms / 1000 if remaining_s is None else min(timeout_ms / 1000, remaining_s)
        deadline_s = loop.time() + wait_s
        if barrier:
            await read_barrier(self.node, context, serializable=False)
        while True:
            store = self._store(scope)
            answer = found(store)
            if answer is not None:
                return answer
            left_s = deadline_s - loop.time()
            if store.ended is not None:
                # An ended round's store: what it lacks will never be written.
                if at_deadline is not None:
                    return at_deadline(store)
                raise RequestFailed(store.ended)
            if left_s <= 0:
                if at_deadline is not None:
                    return at_deadline(store)
                raise WaitTimedOut(
                    f"job {scope.job!r} round {scope.round}: {what} after {timeout_ms} ms"
                )
            await self.node.wait_for_apply(left_s)

    async def Get(
        self, request: rendezvous_pb2.StoreGetRequest, context: Context
    ) -> rendezvous_pb2.StoreGetResponse:
        scope = validate.store_scope(request.HasField("scope"), request.scope)
        key = validate.store_key(request.key, self.node.state.limits.rendezvous)
        timeout_ms = validate.non_negative(request.timeout_ms, "timeout_ms")
        value = await self._wait_for(
            scope, lambda store: store.get(key), timeout_ms, context, f"key {key!r} is missing"
        )
        return rendezvous_pb2.StoreGetResponse(header=header_pb(self.node.header()), value=value)

    async def Wait(
        self, request: rendezvous_pb2.StoreWaitRequest, context: Context
    ) -> rendezvous_pb2.StoreWaitResponse:
        scope = validate.store_scope(request.HasField("scope"), request.scope)
        limits = self.node.state.limits.rendezvous
        keys = [validate.store_key(key, limits, f"keys[{i}]") for i, key in enumerate(request.keys)]
        timeout_ms = validate.non_negative(request.timeout_ms, "timeout_ms")

        def all_present(store: RoundStoreView) -> bool | None:
            return True if store.check(keys) else None

        await self._wait_for(scope, all_present, timeout_ms, context, "keys are still missing")
        return rendezvous_pb2.StoreWaitResponse(header=header_pb(self.node.header()))

    async def MultiGet(
        self, request: rendezvous_pb2.StoreMultiGetRequest, context: Context
    ) -> rendezvous_pb2.StoreMultiGetResponse:
        return await self.multi_get(self.check_multi_get(request), context)

    def check_multi_get(self, request: rendezvous_pb2.StoreMultiGetRequest) -> CheckedMultiGet:
        """The MultiGet request past its checks (raises what the call is refused with)."""
        return CheckedMultiGet(
            scope=validate.store_scope(request.HasField("scope"), request.scope),
            groups=_key_groups(request.groups, self.node.state.limits.rendezvous),
            timeout_ms=validate.non_negative(request.timeout_ms, "timeout_ms"),
            partial=request.partial,
            cache=[group.cache for group in request.groups],
        )

    async def multi_get(
        self, checked: CheckedMultiGet, context: Context, barrier: bool = True
    ) -> rendezvous_pb2.StoreMultiGetResponse:
        """A checked MultiGet's answer (``barrier=False``: the caller took the barrier)."""
        groups = checked.groups

        def read(store: RoundStoreView) -> list[list[bytes] | None]:
            answer: list[list[bytes] | None] = []
            for keys in groups:
                values = [value for key in keys if (value := store.get(key)) is not None]
                answer.append(values if len(values) == len(keys) else None)
            return answer

        def complete(store: RoundStoreView) -> list[list[bytes] | None] | None:
            answer = read(store)
            return None if None in answer else answer

        answer = await self._wait_for(
            checked.scope,
            complete,
            checked.timeout_ms,
            context,
            "keys are still missing",
            at_deadline=read if checked.partial else None,
            barrier=barrier,
        )
        # No await since the values were read: a lease granted now covers them (none for an
        # ended round's store: its reads are for a formation that is over).
        live = self._store(checked.scope).ended is None
        leases = [
            self.cache.grant(checked.scope, keys, values)
            if live and wanted and values is not None
            else 0
            for keys, values, wanted in zip(groups, answer, checked.cache, strict=True)
        ]
        size = sum(len(value) for values in answer if values is not None for value in values)
        if size > MAX_MULTI_GET_ANSWER_BYTES:
            raise RequestFailed(
                LimitExceeded("bytes of values in one MultiGet answer", MAX_MULTI_GET_ANSWER_BYTES)
            )
        response = rendezvous_pb2.StoreMultiGetResponse(header=header_pb(self.node.header()))
        for values, lease_ms in zip(answer, leases, strict=True):
            if values is None:
                response.groups.add()
            else:
                response.groups.add(complete=True, values=values, cache_ms=lease_ms)
        return response

    async def NumKeys(
        self, request: rendezvous_pb2.StoreNumKeysRequest, context: Context
    ) -> rendezvous_pb2.StoreNumKeysResponse:
        scope = validate.store_scope(request.HasField("scope"), request.scope)
        await read_barrier(self.node, context, serializable=False)
        return rendezvous_pb2.StoreNumKeysResponse(
            header=header_pb(self.node.header()), num_keys=self._store(scope).num_keys()
        )

    async def Check(
        self, request: rendezvous_pb2.StoreCheckRequest, context: Context
    ) -> rendezvous_pb2.StoreCheckResponse:
        scope = validate.store_scope(request.HasField("scope"), request.scope)
        limits = self.node.state.limits.rendezvous
        keys = [validate.store_key(key, limits, f"keys[{i}]") for i, key in enumerate(request.keys)]
        await read_barrier(self.node, context, serializable=False)
        return rendezvous_pb2.StoreCheckResponse(
            header=header_pb(self.node.header()), all_exist=self._store(scope).check(keys)
        )

    def Batch(
        self,
        request_iterator: AsyncIterator[rendezvous_pb2.StoreBatchRequest],
        context: Context,
    ) -> AsyncIterator[rendezvous_pb2.StoreBatchResponse]:
        return serve_store_batch(self, request_iterator, context)

    # ----------------------------------------------------------------- writes

    async def _propose(
        self,
        scope: validate.Scope,
        command: StoreSet | StoreAdd | StoreCompareSet | StoreDelete,
        context: Context,
        kind: type[SuccessT],
        header: common_pb2.RequestHeader,
    ) -> SuccessT:
        """Propose a write through the cache leases' gate (leader only; see the docstring)."""
        return await self.cache.write(
            scope,
            command.key,
            lambda term: propose(self.node, command, context, kind, header, term=term),
            unchanged=lambda: self._unchanged(scope, command),
            sets=command.value if isinstance(command, StoreSet) else None,
        )

    def _unchanged(
        self, scope: validate.Scope, command: StoreSet | StoreAdd | StoreCompareSet | StoreDelete
    ) -> bool:
        """Whether ``command`` would leave its key's applied value as it is (so a value
        cached under a lease stays right): a set of the value it holds (every rank of c10d's
        store-based barrier that sees the full count sets the last-worker key), an add of 0,
        a compare-and-set that does not swap or swaps in the same value, a delete of a key
        that is not there."""
        store = self.node.state.rendezvous.member_store(
            scope.job, scope.round, scope.participant_id
        )
        if isinstance(store, Failure):
            return False
        current = store.get(command.key)
        if isinstance(command, StoreSet):
            return current == command.value
        if isinstance(command, StoreAdd):
            return command.delta == 0 and current is not None
        if isinstance(command, StoreCompareSet):
            swaps = current == command.expected or (current is None and command.expected == b"")
            return current is not None and (not swaps or command.desired == current)
        return current is None

    async def Set(
        self, request: rendezvous_pb2.StoreSetRequest, context: Context
    ) -> rendezvous_pb2.StoreSetResponse:
        limits = self.node.state.limits.rendezvous
        header = validate.session_header(request.HasField("header"), request.header)
        scope = validate.store_scope(request.HasField("scope"), request.scope)
        command = StoreSet(
            job=scope.job,
            round=scope.round,
            participant_id=scope.participant_id,
            key=validate.store_key(request.key, limits),
            value=validate.store_value(request.value, limits),
        )
        await self._propose(scope, command, context, StoreSetResult, header)
        response = rendezvous_pb2.StoreSetResponse(header=header_pb(self.node.header()))
        if request.cache:
            response.cache_ms = self._lease_written(scope, command.key, command.value)
        return response

    def _lease_written(self, scope: validate.Scope, key: bytes, value: bytes) -> int:
        """A lease on ``value`` at ``key`` for the writer that just set it, in ms: granted
        if the key still holds it in a live round (no await since the check); else 0."""
        store = self.node.state.rendezvous.readable_store(
            scope.job, scope.round, scope.participant_id
        )
        if isinstance(store, Failure) or store.ended is not None or store.get(key) != value:
            return 0
        return self.cache.grant(scope, [key], [value])

    async def Add(
        self, request: rendezvous_pb2.StoreAddRequest, context: Context
    ) -> rendezvous_pb2.StoreAddResponse:
        header = validate.session_header(request.HasField("header"), request.header)
        scope = validate.store_scope(request.HasField("scope"), request.scope)
        command = StoreAdd(
            job=scope.job,
            round=scope.round,
            participant_id=scope.participant_id,
            key=validate.store_key(request.key, self.node.state.limits.rendezvous),
            delta=request.delta,
        )
        result = await self._propose(scope, command, context, StoreAddResult, header)
        return rendezvous_pb2.StoreAddResponse(
            header=header_pb(self.node.header()), value=result.value
        )

    async def CompareSet(
        self, request: rendezvous_pb2.StoreCompareSetRequest, context: Context
    ) -> rendezvous_pb2.StoreCompareSetResponse:
        limits = self.node.state.limits.rendezvous
        header = validate.session_header(request.HasField("header"), request.header)
        scope = validate.store_scope(request.HasField("scope"), request.scope)
        command = StoreCompareSet(
            job=scope.job,
            round=scope.round,
            participant_id=scope.participant_id,
            key=validate.store_key(request.key, limits),
            expected=validate.store_value(request.expected, limits),
            desired=validate.store_value(request.desired, limits),
        )
        result = await self._propose(scope, command, context, StoreCompareSetResult, header)
        response = rendezvous_pb2.StoreCompareSetResponse(
            header=header_pb(self.node.header()), swapped=result.swapped
        )
        if result.value is not None:
            response.value = result.value
        return response

    async def Delete(
        self, request: rendezvous_pb2.StoreDeleteRequest, context: Context
    ) -> rendezvous_pb2.StoreDeleteResponse:
        header = validate.session_header(request.HasField("header"), request.header)
        scope = validate.store_scope(request.HasField("scope"), request.scope)
        command = StoreDelete(
            job=scope.job,
            round=scope.round,
            participant_id=scope.participant_id,
            key=validate.store_key(request.key, self.node.state.limits.rendezvous),
        )
        result = await self._propose(scope, command, context, StoreDeleteResult, header)
        return rendezvous_pb2.StoreDeleteResponse(
            header=header_pb(self.node.header()), existed=result.existed
        )


def _key_groups(
    groups: Sequence[rendezvous_pb2.StoreKeyGroup], limits: RendezvousLimits
) -> list[list[bytes]]:
    """A MultiGet's groups of keys, checked: at least one group, none empty, keys valid,
    at most MAX_MULTI_GET_KEYS in all."""
    if not groups:
        raise InvalidArgument("groups", "must name at least one group of keys")
    total = sum(len(group.keys) for group in groups)
    if total > MAX_MULTI_GET_KEYS:
        raise RequestFailed(LimitExceeded("keys in one MultiGet", MAX_MULTI_GET_KEYS))
    checked = []
    for i, group in enumerate(groups):
        if not group.keys:
            raise InvalidArgument(f"groups[{i}].keys", "must not be empty")
        checked.append(
            [
                validate.store_key(key, limits, f"groups[{i}].keys[{j}]")
                for j, key in enumerate(group.keys)
            ]
        )
    return checked
