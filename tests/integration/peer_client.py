"""A hand-driven peer: sends raw requests to a member's peer port, signed or not.

Tests play an outsider (no secret, or a wrong one) and a member gone wrong (the right secret,
malformed content) with it; the fuzzer builds on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import grpc

from rallypoint.coordinator.peer_auth import (
    BATCH_TAG,
    CHUNK_TAG,
    PeerKey,
    batch_fields,
    chunk_fields,
    cluster_id_for,
)
from rallypoint.proto.peer.v1 import peer_pb2, peer_pb2_grpc
from rallypoint.raft.codec import encode_message
from rallypoint.raft.types import Message


class PeerClient:
    def __init__(
        self,
        address: str,
        secret: bytes | None,
        cluster_name: str = "rallypoint",
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.address = address
        self.credentials = credentials
        self.key = PeerKey(secret) if secret is not None else None
        self.cluster_id = cluster_id_for(secret, cluster_name) if secret is not None else 1

    def _channel(self) -> grpc.Channel:
        if self.credentials is None:
            return grpc.insecure_channel(self.address)
        return grpc.secure_channel(self.address, self.credentials)

    def batch(
        self,
        from_id: int,
        to_id: int,
        messages: Sequence[Message | bytes],
        *,
        incarnation: int = 99,
        sign: bool = True,
    ) -> peer_pb2.MessageBatch:
        encoded = [m if isinstance(m, bytes) else encode_message(m) for m in messages]
        batch = peer_pb2.MessageBatch(
            cluster_id=self.cluster_id,
            from_id=from_id,
            to_id=to_id,
            messages=encoded,
            incarnation=incarnation,
        )
        if sign and self.key is not None:
            batch.mac = self.key.sign(BATCH_TAG, batch_fields(batch))
        return batch

    def sign_chunk(self, chunk: peer_pb2.SnapshotChunk) -> peer_pb2.SnapshotChunk:
        if self.key is not None:
            chunk.mac = self.key.sign(CHUNK_TAG, chunk_fields(chunk))
        return chunk

    def send(
        self, batches: Iterable[peer_pb2.MessageBatch], timeout_s: float = 5.0
    ) -> tuple[grpc.StatusCode, str]:
        """The status the member ends the stream with (OK when it took every batch), and
        its message."""
        with self._channel() as channel:
            stub = peer_pb2_grpc.RaftStub(channel)  # type: ignore[arg-type]
            try:
                stub.Send(iter(list(batches)), timeout=timeout_s)
            except grpc.RpcError as exc:
                return exc.code(), exc.details() or ""  # type: ignore[return-value]
            return grpc.StatusCode.OK, ""

    def install(
        self, chunks: Iterable[peer_pb2.SnapshotChunk], timeout_s: float = 10.0
    ) -> tuple[grpc.StatusCode, str]:
        with self._channel() as channel:
            stub = peer_pb2_grpc.RaftStub(channel)  # type: ignore[arg-type]
            try:
                stub.InstallSnapshot(iter(list(chunks)), timeout=timeout_s)
            except grpc.RpcError as exc:
                return exc.code(), exc.details() or ""  # type: ignore[return-value]
            return grpc.StatusCode.OK, ""
