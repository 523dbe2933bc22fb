"""The KV service: validated requests become state-machine commands or reads of the
applied state (after a read barrier unless the client asked for a serializable read)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from rallypoint.proto.v1 import kv_pb2, kv_pb2_grpc

from ..node.api import ServerNode
from ..state.commands import Add
from ..state.results import AddResult, CompareAndSetResult, DeleteResult, PutResult
from . import validate
from .common import Context, header_pb, kv_pb, propose, read_barrier
from .kv_batch import serve_batch
from .kv_ops import (
    compare_and_set_answer,
    compare_and_set_command,
    delete_answer,
    delete_command,
    get_answer,
    lease_with_room,
    put_answer,
    put_command,
)


class KVServicer(kv_pb2_grpc.KVServicer):
    def __init__(self, node: ServerNode) -> None:
        self.node = node

    async def Put(self, request: kv_pb2.PutRequest, context: Context) -> kv_pb2.PutResponse:
        header, command = put_command(request, self.node)
        result = await propose(self.node, command, context, PutResult, header)
        return put_answer(result, self.node)

    async def Get(self, request: kv_pb2.GetRequest, context: Context) -> kv_pb2.GetResponse:
        key = validate.key(request.key, self.node.state.limits)
        await read_barrier(self.node, context, request.serializable)
        return get_answer(key, self.node)

    async def Range(self, request: kv_pb2.RangeRequest, context: Context) -> kv_pb2.RangeResponse:
        limits = self.node.state.limits
        prefix = validate.key(request.prefix, limits, "prefix", allow_empty=True)
        start_after = validate.key(request.start_after, limits, "start_after", allow_empty=True)
        limit = validate.non_negative(request.limit, "limit")
        # The member's cap bounds every answer, whatever the request asks; `more` says so.
        limit = min(limit or limits.max_answer_keys, limits.max_answer_keys)
        await read_barrier(self.node, context, request.serializable)
        kvs, more = self.node.state.range(
            prefix,
            limit,
            start_after,
            max_bytes=limits.max_answer_bytes,
            count_values=not request.keys_only,
        )
        return kv_pb2.RangeResponse(
            header=header_pb(self.node.header()),
            kvs=[kv_pb(kv, request.keys_only) for kv in kvs],
            more=more,
        )

    async def Delete(
        self, request: kv_pb2.DeleteRequest, context: Context
    ) -> kv_pb2.DeleteResponse:
        header, command = delete_command(request, self.node)
        result = await propose(self.node, command, context, DeleteResult, header)
        return delete_answer(result, self.node)

    async def CompareAndSet(
        self, request: kv_pb2.CompareAndSetRequest, context: Context
    ) -> kv_pb2.CompareAndSetResponse:
        header, command = compare_and_set_command(request, self.node)
        result = await propose(self.node, command, context, CompareAndSetResult, header)
        return compare_and_set_answer(result, self.node)

    async def Add(self, request: kv_pb2.AddRequest, context: Context) -> kv_pb2.AddResponse:
        header = validate.session_header(request.HasField("header"), request.header)
        command = Add(
            key=validate.key(request.key, self.node.state.limits),
            delta=request.delta,
            lease_id=lease_with_room(request.lease_id, self.node),
            fence=validate.fence(request.HasField("fence"), request.fence),
        )
        result = await propose(self.node, command, context, AddResult, header)
        return kv_pb2.AddResponse(
            header=header_pb(self.node.header()), value=result.value, kv=kv_pb(result.kv)
        )

    def Batch(
        self, request_iterator: AsyncIterator[kv_pb2.BatchRequest], context: Context
    ) -> AsyncIterator[kv_pb2.BatchResponse]:
        return serve_batch(self.node, request_iterator, context)
