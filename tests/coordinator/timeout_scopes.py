"""Counting ``asyncio.timeout`` scopes: the peer connection's hot paths must open none per
frame (one watchdog and one keepalive timer per connection do that work)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import pytest


class TimeoutScopes:
    """From construction on, ``count`` is the number of ``asyncio.timeout`` scopes opened."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real: Callable[[float | None], AbstractAsyncContextManager[None]] = asyncio.timeout

        def counted(delay: float | None) -> AbstractAsyncContextManager[None]:
            self.count += 1
            return real(delay)

        monkeypatch.setattr(asyncio, "timeout", counted)
