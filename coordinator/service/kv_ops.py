"""The unary KV calls' checks and answers that the batch stream shares with them: each
operation of a batch is checked and answered exactly as its unary RPC."""

from __future__ import annotations

from rallypoint.proto.v1 import common_pb2, kv_pb2
from rallypoint.proto.v1.defaults import MAX_DELETE_KEYS, MAX_LEASE_KEYS

from ..node.api import ServerNode
from ..state.commands import CompareAndSet, Delete, Put
from ..state.results import CompareAndSetResult, DeleteResult, PutResult
from . import validate
from .common import fill_kv, header_pb
from .errors import InvalidArgument


def put_command(
    request: kv_pb2.PutRequest, node: ServerNode
) -> tuple[common_pb2.RequestHeader, Put]:
    """The validated session header and command of a put (raises InvalidArgument)."""
    limits = node.state.limits
    header = validate.session_header(request.HasField("header"), request.header)
    command = Put(
        key=validate.key(request.key, limits),
        value=validate.value(request.value, limits),
        lease_id=lease_with_room(request.lease_id, node),
        fence=validate.fence(request.HasField("fence"), request.fence),
        return_prev=request.prev_kv,
        keep_lease=request.keep_lease,
    )
    return header, command


def put_answer(
    result: PutResult, node: ServerNode, response: kv_pb2.PutResponse | None = None
) -> kv_pb2.PutResponse:
    """The answer to a put, written into ``response`` when given (a batch answer's field,
    filled in place: making the answer and copying it in cost twice as much)."""
    if response is None:
        response = kv_pb2.PutResponse()
    response.header.CopyFrom(header_pb(node.header()))
    fill_kv(response.kv, result.kv)
    if result.prev is not None:
        fill_kv(response.prev_kv, result.prev)
    return response


def get_answer(key: bytes, node: ServerNode) -> kv_pb2.GetResponse:
    """The applied state's answer for ``key`` (after the read barrier, if any)."""
    kv = node.state.get(key)
    response = kv_pb2.GetResponse(header=header_pb(node.header()))
    if kv is not None:
        fill_kv(response.kv, kv)
    return response


def delete_command(
    request: kv_pb2.DeleteRequest, node: ServerNode
) -> tuple[common_pb2.RequestHeader, Delete]:
    header = validate.session_header(request.HasField("header"), request.header)
    if not request.key and not request.prefix:
        raise InvalidArgument("key", "must not be empty (set prefix to delete every key)")
    key = validate.key(request.key, node.state.limits, allow_empty=True)
    if request.prefix:
        # Checked against this member's applied state, before proposing: keys written while
        # the delete is in flight may take it a little past the bound, never far.
        covered = node.state.count_prefix(key)
        if covered > MAX_DELETE_KEYS:
            raise InvalidArgument(
                "prefix",
                f"{key[:64]!r} covers {covered} keys, more than the {MAX_DELETE_KEYS} one "
                "delete may remove: delete it by narrower prefixes",
            )
        most = node.state.limits.max_answer_keys
        if request.prev_kv and covered > most:
            # The answer would list every one (and the session caches it until acknowledged).
            raise InvalidArgument(
                "prev_kv",
                f"{key[:64]!r} covers {covered} keys, more than the {most} an answer may list: "
                "read them with Range first, or delete without prev_kv",
            )
    command = Delete(
        key=key,
        prefix=request.prefix,
        fence=validate.fence(request.HasField("fence"), request.fence),
        return_prev=request.prev_kv,
    )
    return header, command


def delete_answer(
    result: DeleteResult, node: ServerNode, response: kv_pb2.DeleteResponse | None = None
) -> kv_pb2.DeleteResponse:
    """The answer to a delete, written into ``response`` when given (as ``put_answer``)."""
    if response is None:
        response = kv_pb2.DeleteResponse()
    response.header.CopyFrom(header_pb(node.header()))
    response.deleted = result.deleted
    for kv in result.prev:
        fill_kv(response.prev_kvs.add(), kv)
    return response


def compare_and_set_command(
    request: kv_pb2.CompareAndSetRequest, node: ServerNode
) -> tuple[common_pb2.RequestHeader, CompareAndSet]:
    limits = node.state.limits
    header = validate.session_header(request.HasField("header"), request.header)
    key = validate.key(request.key, limits)
    comparison = request.WhichOneof("compare")
    if comparison is None:
        raise InvalidArgument(
            "compare",
            "exactly one comparison is required "
            "(value_equals, mod_revision_equals or must_not_exist)",
        )
    if comparison == "must_not_exist" and not request.must_not_exist:
        raise InvalidArgument("must_not_exist", "must be true when set")
    if comparison == "mod_revision_equals":
        validate.non_negative(request.mod_revision_equals, "mod_revision_equals")
    command = CompareAndSet(
        key=key,
        value=validate.value(request.value, limits),
        expected_value=request.value_equals if comparison == "value_equals" else None,
        expected_mod_revision=(
            request.mod_revision_equals if comparison == "mod_revision_equals" else None
        ),
        must_not_exist=comparison == "must_not_exist",
        lease_id=lease_with_room(request.lease_id, node),
        fence=validate.fence(request.HasField("fence"), request.fence),
    )
    return header, command


def lease_with_room(lease_id: int, node: ServerNode) -> int:
    """``lease_id`` (0: none), checked, if the lease may hold one more key: its expiry
    deletes every key it holds in one step, so it holds at most ``MAX_LEASE_KEYS``."""
    lease_id = validate.optional_lease_id(lease_id)
    if lease_id and node.state.lease_key_count(lease_id) >= MAX_LEASE_KEYS:
        raise InvalidArgument(
            "lease_id",
            f"lease {lease_id} holds {MAX_LEASE_KEYS} keys, the most one lease may hold: "
            "attach the key to another lease",
        )
    return lease_id


def compare_and_set_answer(
    result: CompareAndSetResult,
    node: ServerNode,
    response: kv_pb2.CompareAndSetResponse | None = None,
) -> kv_pb2.CompareAndSetResponse:
    """The answer to a compare-and-set, written into ``response`` when given (as
    ``put_answer``)."""
    if response is None:
        response = kv_pb2.CompareAndSetResponse()
    response.header.CopyFrom(header_pb(node.header()))
    response.succeeded = result.succeeded
    if result.kv is not None:
        fill_kv(response.kv, result.kv)
    return response
