"""The round-store batch stream (``RoundStore/Batch``): many store operations per message.

Theory of operation. The TCPStore bridge (``worker/tcpstore/coalescing.py``) coalesces its
connections' reads into one MultiGet at a time; as unary calls each costs the member (and the
bridge) a gRPC call's CPU, which bounded process-group bootstrap. On one stream per member
the same reads cost a message each. The stream is KV/Batch's (``kv_batch.BatchServer``: a
task per message, answers through one queue, per-operation errors with the status the unary
call would end with); what differs is what an operation is:

- ``multi_get``: checked as the unary MultiGet (``RoundStoreServicer.check_multi_get``); the
  message's multi-gets share one read barrier taken after the message arrived, then each waits
  on its own (its ``timeout_ms``, ``partial``), re-checking fencing (STALE_ROUND) at every
  check exactly as the unary call does; the ones complete at once leave together in one
  answer message, a blocked one does not hold the others, nor the message's writes;
- ``set``, ``add``, ``compare_set``, ``delete``: the unary method itself, run as a task, so
  they are proposed together when the message is served; each keeps its session header, so a
  retried write is answered from the session's cache and applied once.

Every operation is authorized under its unary method's rule (``authz.OPERATION_GUARD``)
before it runs; a refused one is answered alone. Each is counted as its unary call would be
(``authz.OPERATION_COUNTER``: ``rallypoint_store_operations`` by method and outcome).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

from rallypoint.proto.v1 import rendezvous_pb2

from ..node.api import ServerNode
from .authz import OPERATION_COUNTER, OPERATION_GUARD, OperationGuard
from .common import Context, read_barrier
from .errors import InvalidArgument
from .kv_batch import SLICE_OPERATIONS, BatchServer, error_result, pace, run_batch
from .validate import CheckedMultiGet

_STORE = "/rallypoint.v1.RoundStore/"
# Each kind of operation: the unary method it stands for (its rule and its servicer method).
_METHODS = {
    "multi_get": "MultiGet",
    "set": "Set",
    "add": "Add",
    "compare_set": "CompareSet",
    "delete": "Delete",
}


def _error(operation_id: int, error: Exception) -> rendezvous_pb2.StoreBatchResult:
    return rendezvous_pb2.StoreBatchResult(
        id=operation_id, error=error_result(operation_id, error, deadline_passed=False).error
    )


class StoreOperations(Protocol):
    """What the stream runs its operations with: the round-store service (roundstore.py).
    Writes are run by their unary method's name (``Set``, ``Add``, ...)."""

    node: ServerNode

    def check_multi_get(self, request: rendezvous_pb2.StoreMultiGetRequest) -> CheckedMultiGet:
        """The MultiGet request past its checks (raises what the call is refused with)."""
        ...

    async def multi_get(
        self, checked: CheckedMultiGet, context: Context, barrier: bool = True
    ) -> rendezvous_pb2.StoreMultiGetResponse:
        """A checked MultiGet's answer (``barrier=False``: the caller took the barrier)."""
        ...


class _StoreBatchServer(BatchServer):
    response_type = rendezvous_pb2.StoreBatchResponse

    def __init__(self, servicer: StoreOperations, context: Context) -> None:
        super().__init__(servicer.node, context)
        self.servicer = servicer
        self._counter = OPERATION_COUNTER.get()

    def count(self, kind: str | None, error: Exception | None = None) -> None:
        """One operation of ``kind`` ended (``error``: how it failed), for the metrics."""
        if self._counter is not None and kind in _METHODS:
            self._counter(_STORE + _METHODS[kind], error)

    async def serve(self, message: rendezvous_pb2.StoreBatchRequest) -> None:
        guard = OPERATION_GUARD.get()
        at_once: list[rendezvous_pb2.StoreBatchResult] = []
        reads: list[tuple[int, CheckedMultiGet]] = []
        # (id, kind, request): coroutines are made as their slice starts, so none is left
        # unawaited if the stream is cancelled in between.
        writes: list[tuple[int, str, Any]] = []
        for position, operation in enumerate(message.operations):
            await pace(position)
            try:
                kind = await self.admit(operation, guard)
                if kind == "multi_get":
                    reads.append((operation.id, self.servicer.check_multi_get(operation.multi_get)))
                else:
                    writes.append((operation.id, kind, getattr(operation, kind)))
            except Exception as error:
                self.count(operation.WhichOneof("operation"), error)
                at_once.append(_error(operation.id, error))
        # The writes' tasks start (validate, propose) in the loop's next turn, a slice of
        # them together, and are answered when applied: never held by a read of the same
        # message, which may wait for a key the caller sets only once one of these writes is
        # answered. Later slices start a loop turn apart (kv_batch.SLICE_OPERATIONS).
        started = [self.start_writes(writes[:SLICE_OPERATIONS])] if writes else []
        self.answer(at_once)
        for start in range(SLICE_OPERATIONS, len(writes), SLICE_OPERATIONS):
            await asyncio.sleep(0)
            started.append(self.start_writes(writes[start : start + SLICE_OPERATIONS]))
        work = [self.answer_writes(pending) for pending in started]
        if reads:
            work.append(self.read_store(reads))
        await asyncio.gather(*work)

    def start_writes(self, writes: list[tuple[int, str, Any]]) -> asyncio.Future[list[Any]]:
        """Run ``writes`` (id, kind, request) as tasks, from the loop's next turn."""
        return asyncio.gather(*(self.write(*write) for write in writes))

    async def answer_writes(self, pending: asyncio.Future[list[Any]]) -> None:
        self.answer(list(await pending))

    async def admit(
        self, operation: rendezvous_pb2.StoreBatchOperation, guard: OperationGuard | None
    ) -> str:
        """The operation's kind, once it may run (raises what the unary call would)."""
        if operation.id == 0:
            raise InvalidArgument("operations.id", "must not be 0 (it matches the answer)")
        kind = operation.WhichOneof("operation")
        if kind is None:
            raise InvalidArgument(
                "operations.operation",
                "one of multi_get, set, add, compare_set or delete is required",
            )
        if guard is not None:
            await guard(_STORE + _METHODS[kind], getattr(operation, kind))
        return str(kind)

    async def write(
        self, operation_id: int, kind: str, request: Any
    ) -> rendezvous_pb2.StoreBatchResult:
        try:
            response = await getattr(self.servicer, _METHODS[kind])(request, self.context)
        except Exception as error:
            self.count(kind, error)
            return _error(operation_id, error)
        self.count(kind)
        answer = rendezvous_pb2.StoreBatchResult(id=operation_id)
        getattr(answer, kind).CopyFrom(response)
        return answer

    async def read_store(self, reads: list[tuple[int, CheckedMultiGet]]) -> None:
        """One barrier for the message's multi-gets; then each answered when it completes,
        those completing together in one answer."""
        try:
            await read_barrier(self.node, self.context, serializable=False)
        except Exception as error:
            for _ in reads:
                self.count("multi_get", error)
            self.answer([_error(operation_id, error) for operation_id, _ in reads])
            return
        pending = {
            asyncio.ensure_future(self.read(operation_id, checked))
            for operation_id, checked in reads
        }
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            self.answer([task.result() for task in done])

    async def read(
        self, operation_id: int, checked: CheckedMultiGet
    ) -> rendezvous_pb2.StoreBatchResult:
        try:
            response = await self.servicer.multi_get(checked, self.context, barrier=False)
        except Exception as error:
            self.count("multi_get", error)
            return _error(operation_id, error)
        self.count("multi_get")
        return rendezvous_pb2.StoreBatchResult(id=operation_id, multi_get=response)


def serve_store_batch(
    servicer: StoreOperations,
    requests: AsyncIterator[rendezvous_pb2.StoreBatchRequest],
    context: Context,
) -> AsyncIterator[rendezvous_pb2.StoreBatchResponse]:
    """The answers of a round-store batch stream; see the module docstring."""
    return run_batch(_StoreBatchServer(servicer, context), requests)
