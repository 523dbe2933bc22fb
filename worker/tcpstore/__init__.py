"""torch's TCPStore served from a torchrun agent, backed by a coordinator round store.

The modules, each with its theory of operation:

- ``protocol.py``: the wire protocol, sans IO (bytes in, requests out; answers to bytes);
- ``coalescing.py``: a round's reads, adds and writes, coalesced into few coordinator calls;
- ``lease_cache.py``: the values the leader leased to the bridge, and reading ahead;
- ``server.py``: the listener of one round at a time and its connections, on asyncio;
- ``bridge.py``: :class:`TCPStoreBridge`, the server on a thread of its own (the agent's).
"""

from __future__ import annotations

from .bridge import TCPStoreBridge
from .lease_cache import PREFETCH_BYTES, PREFETCH_KEYS
from .protocol import (
    VALIDATION_MAGIC,
    CheckResponse,
    ProtocolError,
    Query,
    WaitResponse,
)
from .server import NoFreePortError, PortRange, StoreBridge

__all__ = [
    "PREFETCH_BYTES",
    "PREFETCH_KEYS",
    "VALIDATION_MAGIC",
    "CheckResponse",
    "NoFreePortError",
    "PortRange",
    "ProtocolError",
    "Query",
    "StoreBridge",
    "TCPStoreBridge",
    "WaitResponse",
]
