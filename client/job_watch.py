"""Following a job from outside it: ``watch_job``, for dashboards and tools that observe.

Theory of operation. ``WatchJob`` (rendezvous.proto) sends the job's RoundInfo at once and
again whenever the job's revision moves; a participant follows it inside ``Participant``
(rendezvous.py), and this is the same stream for a caller that is not a participant. The
stream is reopened after any transport failure (a member killed, a leader change), on the
member the failure's leader hint names or the next endpoint, with the one retry policy
(the Caller's ``Retrier``). The first message of a new stream is the current state, so a
reconnect misses no change for good; a message older than one already yielded (a
lagging member answered the new stream) is skipped, so the revisions yielded never go back.
The iterator ends with :class:`JobNotFoundError` when the job is gone (pruned, never made)
and with the error itself for anything that is not a transport failure (a refused token).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc.aio

from rallypoint.proto.v1 import rendezvous_pb2

from .caller import Caller
from .errors import (
    DeadlineExceededError,
    InternalError,
    RallypointError,
    UnavailableError,
    map_rpc_error,
)
from .jobs import services
from .rendezvous_errors import refine
from .rendezvous_values import RoundInfo


async def watch_job(caller: Caller, job: str) -> AsyncIterator[RoundInfo]:
    """The job's RoundInfo now and after every change, newest revision last (see above)."""
    transport = caller.transport
    reconnector = caller.retrier()
    request = rendezvous_pb2.WatchJobRequest(job=job)
    newest_revision = -1
    while True:
        address = transport.pick()
        call = services(transport.stubs(address)).rendezvous.WatchJob(
            request, metadata=transport.metadata
        )
        error: RallypointError
        try:
            async for response in call:
                reconnector.answered()
                info = RoundInfo.from_proto(response.round)
                if info.job_revision < newest_revision:
                    continue
                newest_revision = info.job_revision
                yield info
            error = UnavailableError(f"{address} ended the round watch")
        except grpc.aio.AioRpcError as rpc_error:
            error = refine(map_rpc_error(rpc_error, address))
        finally:
            call.cancel()
        # INTERNAL comes from gRPC's core when a stream breaks mid-flight (its member was
        # killed): a transport failure like UNAVAILABLE, not a verdict on the job.
        if not isinstance(error, UnavailableError | DeadlineExceededError | InternalError):
            raise error
        await reconnector.after_failure(address, error)
