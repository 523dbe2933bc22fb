"""The TCPStore bridge's former module path, kept so existing imports keep working; the
bridge is the package ``worker/tcpstore/`` (see its ``__init__``)."""

from __future__ import annotations

from .tcpstore import *  # noqa: F403
from .tcpstore import __all__ as __all__
