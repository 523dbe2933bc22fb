"""The Lease service. Grant and Revoke are replicated; keep-alives and remaining time are
the leader's soft state (its lessor), never in the log: followers cannot answer them, and
the member raises NotLeaderError, which ends the call with the leader hint."""

from __future__ import annotations

from collections.abc import AsyncIterator

from rallypoint.proto.v1 import lease_pb2, lease_pb2_grpc
from rallypoint.proto.v1.defaults import MAX_LEASE_TTL_MS

from ..node.api import ServerNode
from ..state.commands import LeaseGrant, LeaseRevoke
from ..state.errors import LeaseNotFound
from ..state.results import LeaseEndResult, LeaseGrantResult
from . import validate
from .common import Context, header_pb, propose, read_barrier
from .errors import RequestFailed
from .kv_batch import error_result


class LeaseServicer(lease_pb2_grpc.LeaseServicer):
    def __init__(self, node: ServerNode) -> None:
        self.node = node

    async def Grant(
        self, request: lease_pb2.LeaseGrantRequest, context: Context
    ) -> lease_pb2.LeaseGrantResponse:
        header = validate.session_header(request.HasField("header"), request.header)
        command = LeaseGrant(
            ttl_ms=validate.bounded(
                request.ttl_ms, "ttl_ms", MAX_LEASE_TTL_MS, "7 days, the longest lease TTL"
            )
        )
        result = await propose(self.node, command, context, LeaseGrantResult, header)
        return lease_pb2.LeaseGrantResponse(
            header=header_pb(self.node.header()),
            lease_id=result.lease_id,
            fencing_token=result.fencing_token,
            ttl_ms=result.ttl_ms,
        )

    async def KeepAlive(
        self,
        request_iterator: AsyncIterator[lease_pb2.LeaseKeepAliveRequest],
        context: Context,
    ) -> AsyncIterator[lease_pb2.LeaseKeepAliveResponse]:
        async for request in request_iterator:
            lease_id = validate.lease_id(request.lease_id)
            ttl_ms = self.node.lease_keep_alive(lease_id)
            response = lease_pb2.LeaseKeepAliveResponse(
                header=header_pb(self.node.header()),
                lease_id=lease_id,
                ttl_ms=0 if ttl_ms is None else ttl_ms,
            )
            if ttl_ms is None:
                # Answered on the stream, not by ending it: it carries the caller's other
                # leases too. The status is the one Revoke or TimeToLive would end with.
                not_found = error_result(lease_id, RequestFailed(LeaseNotFound(lease_id)), False)
                response.error.CopyFrom(not_found.error)
            yield response

    async def Revoke(
        self, request: lease_pb2.LeaseRevokeRequest, context: Context
    ) -> lease_pb2.LeaseRevokeResponse:
        header = validate.session_header(request.HasField("header"), request.header)
        command = LeaseRevoke(lease_id=validate.lease_id(request.lease_id))
        result = await propose(self.node, command, context, LeaseEndResult, header)
        return lease_pb2.LeaseRevokeResponse(
            header=header_pb(self.node.header()), deleted_keys=list(result.deleted_keys)
        )

    async def List(
        self, request: lease_pb2.LeaseListRequest, context: Context
    ) -> lease_pb2.LeaseListResponse:
        await read_barrier(self.node, context, request.serializable)
        return lease_pb2.LeaseListResponse(
            header=header_pb(self.node.header()),
            leases=[
                lease_pb2.LeaseStatus(
                    lease_id=lease.lease_id,
                    fencing_token=lease.fencing_token,
                    granted_ttl_ms=lease.ttl_ms,
                )
                for lease in self.node.state.lease_list()
            ],
        )

    async def TimeToLive(
        self, request: lease_pb2.LeaseTimeToLiveRequest, context: Context
    ) -> lease_pb2.LeaseTimeToLiveResponse:
        lease_id = validate.lease_id(request.lease_id)
        await read_barrier(self.node, context, serializable=False)
        # No await between these two reads: the state and the lessor agree on which leases
        # exist (the member updates the lessor as it applies grants and ends).
        info = self.node.state.lease_info(lease_id)
        remaining_ms = self.node.lease_remaining_ms(lease_id)
        if info is None or remaining_ms is None:
            raise RequestFailed(LeaseNotFound(lease_id))
        return lease_pb2.LeaseTimeToLiveResponse(
            header=header_pb(self.node.header()),
            lease_id=lease_id,
            fencing_token=info.fencing_token,
            granted_ttl_ms=info.ttl_ms,
            remaining_ttl_ms=remaining_ms,
            keys=list(info.keys) if request.keys else [],
        )
