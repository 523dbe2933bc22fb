"""The KV batch stream (``KV/Batch``): many operations per message, each answered on its own.

Theory of operation. A client library multiplexes its concurrent callers onto one stream and
sends, while earlier messages are in flight, whatever callers queued meanwhile as one message
(``client/kv_stream.py``). Each message is served by its own task, so a later message is not
held behind an earlier one's commit:

- every operation is checked first, exactly as its unary RPC (``kv_ops.py``: the same
  validation; the same authorization under the unary method's rule, ``authz.OPERATION_GUARD``);
  a refused operation is answered at once with the status the unary call would end with
  (:class:`~rallypoint.proto.v1.kv_pb2.BatchError`, from :func:`.errors.status_for`) and
  the others go on;
- the message's writes are proposed one after another without yielding to the event loop
  (a slice of them at a time, see below), so they reach the Raft core before the Ready loop
  runs again: one Ready, hence one log append and fsync and one MsgApp per follower, carries
  them all (when the leader is not already busy with an earlier Ready; then they ride in the
  next one). They are proposed with ``ServerNode.submit``, no task each: the message's task
  awaits their futures and answers them together. Each keeps its own session header,
  so a retried operation is answered from the session's cache, never applied twice;
- the message's linearizable reads share one read barrier (ReadIndex), taken after the
  message arrived, so each sees every write acknowledged before the client sent it;
  serializable reads are answered at once from the applied state.

No message holds the member's event loop: one holds at most ``MAX_BATCH_OPERATIONS``
operations (a longer one ends the stream with INVALID_ARGUMENT naming the bound), and its
operations are checked, its writes proposed and its reads answered ``SLICE_OPERATIONS`` at a
time with the loop let in between (one Ready then carries a slice's writes), so ticks,
heartbeats and other clients run while a large message is served.

Answers go out as groups complete (refusals and serializable reads, then the reads after the
barrier, then the writes), several messages per request message, through one queue that the
response stream drains. An operation waits at most its own ``timeout_ms`` (capped by
``common.MAX_WAIT_S``): a proposal or barrier that times out answers that operation
DEADLINE_EXCEEDED when its time is spent, UNAVAILABLE otherwise, as the unary calls do. When
the client half-closes the stream, the operations in flight are answered and the stream ends;
when it cancels, the tasks are cancelled (their proposals may still apply, as a cancelled
unary call's would).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from rallypoint.proto.v1 import common_pb2, kv_pb2
from rallypoint.proto.v1.defaults import MAX_BATCH_OPERATIONS

from ..node.api import ServerNode
from ..state.commands import Command
from ..state.results import CompareAndSetResult, DeleteResult, PutResult, Result, Success
from . import validate
from .authz import OPERATION_GUARD
from .common import Context, answered, read_barrier, wait_s
from .errors import InvalidArgument, status_for
from .kv_ops import (
    compare_and_set_answer,
    compare_and_set_command,
    delete_answer,
    delete_command,
    get_answer,
    put_answer,
    put_command,
)

# The unary method each kind of operation stands for (its authorization rule).
_METHODS = {
    "put": "/rallypoint.v1.KV/Put",
    "get": "/rallypoint.v1.KV/Get",
    "delete": "/rallypoint.v1.KV/Delete",
    "compare_and_set": "/rallypoint.v1.KV/CompareAndSet",
}


@dataclass(frozen=True, slots=True)
class _Write:
    """How one kind of write is checked, what it answers, and how the answer is built: the
    unary call's own functions (``kv_ops.py``; ``answer`` writes into the batch answer's
    field it is given)."""

    command: Callable[[Any, ServerNode], tuple[common_pb2.RequestHeader, Command]]
    result: type[Success]
    answer: Callable[[Any, ServerNode, Any], Message]


_WRITES = {
    "put": _Write(put_command, PutResult, put_answer),
    "delete": _Write(delete_command, DeleteResult, delete_answer),
    "compare_and_set": _Write(compare_and_set_command, CompareAndSetResult, compare_and_set_answer),
}

# A message's operations are checked, and its reads answered, this many at a time, with the
# event loop let in between: 200,000 gets in one message held a leader's loop for 2 s, past
# its election timeout (issue 33). One slice costs a few milliseconds; a message of the client
# library's default size (512) is one slice, so its writes share one Ready.
SLICE_OPERATIONS = 512


async def pace(position: int) -> None:
    """Let the event loop in before the operation at ``position`` starts a new slice."""
    if position and position % SLICE_OPERATIONS == 0:
        await asyncio.sleep(0)


# How a write proposed by ``BatchServer.start`` ends: its applied result, or the error that
# refused it at once.
_Outcome = asyncio.Future[Result] | Exception

# What the response queue carries: an answer, the error that ends the stream, or the end.
_Item = Message | BaseException | None


@dataclass(frozen=True, slots=True)
class _Operation:
    """One operation past its checks. ``deadline`` is on the loop's clock. A write has its
    ``command`` and session ``header``; a read its ``key``."""

    id: int
    kind: str
    deadline: float
    command: Command | None = None
    header: common_pb2.RequestHeader | None = None
    key: bytes = b""
    serializable: bool = False


def error_result(operation_id: int, error: Exception, deadline_passed: bool) -> kv_pb2.BatchResult:
    """The per-operation form of the status the unary call would end with."""
    status = status_for(error, deadline_passed)
    return kv_pb2.BatchResult(
        id=operation_id,
        error=kv_pb2.BatchError(
            code=status.code.value[0],
            message=status.message,
            reason=status.reason,
            leader=status.leader_address or "",
        ),
    )


class BatchServer:
    """Serves one batch stream: each request message in its own task (``serve``), answers
    through one queue. Subclasses (``store_batch.py``) serve other kinds of operations."""

    # The response message (its ``results`` field carries the answers).
    response_type: Callable[..., Message] = kv_pb2.BatchResponse

    def __init__(self, node: ServerNode, context: Context) -> None:
        self.node = node
        self.context = context
        self.answers: asyncio.Queue[_Item] = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        # Tasks serving messages; each removes itself when done.
        self.tasks: set[asyncio.Task[None]] = set()

    def answer(self, results: list[Any]) -> None:
        if results:
            self.answers.put_nowait(self.response_type(results=results))

    async def intake(self, requests: AsyncIterator[Any]) -> None:
        """Serve each message in its own task; at the client's half-close, let them finish
        and end the response stream (or end it with the error that broke the intake)."""
        try:
            async for message in requests:
                if len(message.operations) > MAX_BATCH_OPERATIONS:
                    raise InvalidArgument(
                        "operations",
                        f"a batch message holds at most {MAX_BATCH_OPERATIONS} operations, "
                        f"got {len(message.operations)}: send more messages",
                    )
                task = asyncio.create_task(self.serve(message))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            while self.tasks:
                await asyncio.wait(set(self.tasks))
        except Exception as error:
            self.answers.put_nowait(error)
        else:
            self.answers.put_nowait(None)

    async def serve(self, message: Any) -> None:
        cap_s = wait_s(self.context)
        now = self.loop.time()
        at_once: list[kv_pb2.BatchResult] = []
        reads: list[_Operation] = []
        writes: list[_Operation] = []
        guard = OPERATION_GUARD.get()
        for position, operation in enumerate(message.operations):
            await pace(position)
            timeout_s = min(operation.timeout_ms / 1000, cap_s) if operation.timeout_ms else cap_s
            try:
                kind = self.kind_of(operation)
                if guard is not None:
                    await guard(_METHODS[kind], getattr(operation, kind))
                checked = self.check(operation, kind, now + timeout_s)
            except Exception as error:
                at_once.append(error_result(operation.id, error, deadline_passed=False))
                continue
            if checked.command is not None:
                writes.append(checked)
            elif checked.serializable:
                at_once.append(
                    kv_pb2.BatchResult(id=checked.id, get=get_answer(checked.key, self.node))
                )
            else:
                reads.append(checked)
        # A slice's writes are proposed here, one after another with no task each, before
        # the Ready loop's wake-up runs (see the module docstring): one Ready carries them.
        # Later slices start a turn apart, so proposing 10,000 writes does not hold the loop
        # in one turn.
        pending = [self.start(writes[:SLICE_OPERATIONS])] if writes else []
        self.answer(at_once)
        for start in range(SLICE_OPERATIONS, len(writes), SLICE_OPERATIONS):
            await asyncio.sleep(0)
            pending.append(self.start(writes[start : start + SLICE_OPERATIONS]))
        try:
            if reads:
                await self.read_all(reads)
            for started in pending:
                self.answer(await self.finish(started))
        except asyncio.CancelledError:
            # The stream ended: stop waiting (the proposals may still apply, as a cancelled
            # unary call's would).
            for started in pending:
                for _, outcome in started:
                    if isinstance(outcome, asyncio.Future) and not outcome.cancel():
                        outcome.exception()  # ended already: nobody will read it
            raise

    @staticmethod
    def kind_of(operation: kv_pb2.BatchOperation) -> str:
        """The operation's kind (raises what the unary call would refuse it with)."""
        if operation.id == 0:
            raise InvalidArgument("operations.id", "must not be 0 (it matches the answer)")
        kind: str | None = operation.WhichOneof("operation")
        if kind is None:
            raise InvalidArgument(
                "operations.operation", "one of put, get, delete or compare_and_set is required"
            )
        return kind

    def check(self, operation: kv_pb2.BatchOperation, kind: str, deadline: float) -> _Operation:
        """The operation of ``kind`` (``kind_of``) past its checks, its authorization (the
        guard) already passed (raises what the unary call would refuse it with)."""
        request = getattr(operation, kind)
        write = _WRITES.get(kind)
        if write is not None:
            header, command = write.command(request, self.node)
            return _Operation(operation.id, kind, deadline, command=command, header=header)
        key = validate.key(request.key, self.node.state.limits)
        return _Operation(operation.id, kind, deadline, key=key, serializable=request.serializable)

    def start(self, writes: list[_Operation]) -> list[tuple[_Operation, _Outcome]]:
        """Propose ``writes`` now (``ServerNode.submit``); each with what will answer it."""
        node, now = self.node, self.loop.time()
        started: list[tuple[_Operation, _Outcome]] = []
        for write in writes:
            header = write.header
            assert write.command is not None and header is not None
            outcome: _Outcome
            try:
                outcome = node.submit(
                    write.command,
                    session_id=header.session_id,
                    sequence=header.sequence,
                    first_unacked=header.first_unacked,
                    timeout_s=max(0.0, write.deadline - now),
                )
            except Exception as error:
                outcome = error
            started.append((write, outcome))
        return started

    async def finish(self, started: list[tuple[_Operation, _Outcome]]) -> list[Any]:
        """The answers of ``started`` writes, once each is applied (or failed), in order."""
        node = self.node
        answers: list[Any] = []
        for write, outcome in started:
            kind = _WRITES[write.kind]
            header = write.header
            assert header is not None
            try:
                if isinstance(outcome, Exception):
                    raise outcome
                result = answered(await outcome, kind.result, header.session_id, header.sequence)
            except Exception as error:
                answers.append(error_result(write.id, error, self.loop.time() >= write.deadline))
                continue
            answer = kv_pb2.BatchResult(id=write.id)
            kind.answer(result, node, getattr(answer, write.kind))
            answers.append(answer)
        return answers

    async def read_all(self, reads: list[_Operation]) -> None:
        """One barrier for every linearizable read of the message, then their answers, a
        slice at a time (each slice its own answer message, the loop free in between)."""
        deadline = max(read.deadline for read in reads)
        try:
            await read_barrier(
                self.node, self.context, False, timeout_s=max(0.0, deadline - self.loop.time())
            )
        except Exception as error:
            passed = self.loop.time() >= deadline
            self.answer([error_result(read.id, error, passed) for read in reads])
            return
        for start in range(0, len(reads), SLICE_OPERATIONS):
            if start:
                await asyncio.sleep(0)
            # The applied state may move on between slices: each read still sees at least the
            # barrier's index, which is all a linearizable read promises.
            self.answer(
                [
                    kv_pb2.BatchResult(id=read.id, get=get_answer(read.key, self.node))
                    for read in reads[start : start + SLICE_OPERATIONS]
                ]
            )


def serve_batch(
    node: ServerNode, requests: AsyncIterator[kv_pb2.BatchRequest], context: Context
) -> AsyncIterator[kv_pb2.BatchResponse]:
    """The answers of a batch stream; see the module docstring."""
    return run_batch(BatchServer(node, context), requests)


async def run_batch(server: BatchServer, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The answers ``server`` gives to the stream of ``requests``."""
    intake = asyncio.create_task(server.intake(requests))
    try:
        while True:
            item = await server.answers.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        intake.cancel()
        for task in list(server.tasks):
            task.cancel()
