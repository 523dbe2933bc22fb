"""The TCPStore bridge's former module path, kept so existing imports keep working; the
bridge is the package ``worker/tcpstore/`` (see its ``__init__``)."""

from __future__ import annotations

from .tcpstore import (
    PREFETCH_BYTES,
    PREFETCH_KEYS,
    VALIDATION_MAGIC,
    CheckResponse,
    NoFreePortError,
    PortRange,
    ProtocolError,
    Query,
    StoreBridge,
    TCPStoreBridge,
    WaitResponse,
)

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
