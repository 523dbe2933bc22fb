"""The gRPC servicers of the public API (rallypoint.v1) over a running member.

``add_services(server, node, auth_token=...)`` registers them all, with the health service
and optional bearer-token auth. Status codes are chosen in one place, :mod:`.errors`.
"""

from .cluster import ClusterServicer
from .kv import KVServicer
from .lease import LeaseServicer
from .server import SERVICE_NAMES, add_services
from .session import SessionServicer
from .watch import WatchServicer

__all__ = [
    "SERVICE_NAMES",
    "ClusterServicer",
    "KVServicer",
    "LeaseServicer",
    "SessionServicer",
    "WatchServicer",
    "add_services",
]
