"""The KV write answers, built in place into a batch answer's field (``kv_ops.py``), say what
the plain construction says: every field of the header and of each key-value, with and
without the previous values, for the unary calls and the batch stream alike."""

from __future__ import annotations

from dataclasses import dataclass

from rallypoint.coordinator.node.api import Header
from rallypoint.coordinator.service.common import header_pb
from rallypoint.coordinator.service.kv_ops import (
    compare_and_set_answer,
    delete_answer,
    put_answer,
)
from rallypoint.coordinator.state.results import CompareAndSetResult, DeleteResult, PutResult
from rallypoint.coordinator.state.values import KeyValue
from rallypoint.proto.v1 import common_pb2, kv_pb2


@dataclass
class FakeNode:
    revision: int = 41

    def header(self) -> Header:
        return Header(revision=self.revision, raft_term=7, leader_id=2, member_id=3)


NEW = KeyValue(b"key", b"value", 30, 41, 4, 9)
OLD = KeyValue(b"key", b"before", 30, 35, 3, 0)


def plain_kv(kv: KeyValue) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(
        key=kv.key,
        value=kv.value,
        create_revision=kv.create_revision,
        mod_revision=kv.mod_revision,
        version=kv.version,
        lease_id=kv.lease_id,
    )


HEADER = common_pb2.ResponseHeader(revision=41, raft_term=7, leader_id=2, member_id=3)


def test_put_answers_match_the_plain_construction() -> None:
    node = FakeNode()
    for prev in (None, OLD):
        expected = kv_pb2.PutResponse(header=HEADER, kv=plain_kv(NEW))
        if prev is not None:
            expected.prev_kv.CopyFrom(plain_kv(prev))
        result = PutResult(NEW, prev)
        assert put_answer(result, node) == expected  # type: ignore[arg-type]
        batch = kv_pb2.BatchResult(id=5)
        put_answer(result, node, batch.put)  # type: ignore[arg-type]
        assert batch == kv_pb2.BatchResult(id=5, put=expected)


def test_delete_and_compare_and_set_answers_match_the_plain_construction() -> None:
    node = FakeNode()
    deleted = DeleteResult(2, (OLD, NEW))
    expected_delete = kv_pb2.DeleteResponse(
        header=HEADER, deleted=2, prev_kvs=[plain_kv(OLD), plain_kv(NEW)]
    )
    assert delete_answer(deleted, node) == expected_delete  # type: ignore[arg-type]
    batch = kv_pb2.BatchResult(id=6)
    delete_answer(DeleteResult(0, ()), node, batch.delete)  # type: ignore[arg-type]
    assert batch.WhichOneof("result") == "delete"
    assert batch.delete == kv_pb2.DeleteResponse(header=HEADER, deleted=0)
    for succeeded, kv in ((True, NEW), (False, None)):
        expected = kv_pb2.CompareAndSetResponse(header=HEADER, succeeded=succeeded)
        if kv is not None:
            expected.kv.CopyFrom(plain_kv(kv))
        got = compare_and_set_answer(CompareAndSetResult(succeeded, kv), node)  # type: ignore[arg-type]
        assert got == expected


def test_each_answer_carries_the_header_of_its_moment() -> None:
    """The header message is reused while the header is the same, and never one that is
    out of date: the revision moves, the answer follows."""
    node = FakeNode()
    first = put_answer(PutResult(NEW, None), node)  # type: ignore[arg-type]
    node.revision = 42
    second = put_answer(PutResult(NEW, None), node)  # type: ignore[arg-type]
    assert (first.header.revision, second.header.revision) == (41, 42)
    same = Header(revision=42, raft_term=7, leader_id=2, member_id=3)
    assert header_pb(same) is header_pb(Header(42, 7, 2, 3))
    assert header_pb(Header(42, 8, 2, 3)).raft_term == 8
