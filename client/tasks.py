"""Stopping asyncio tasks without losing the stopper's own cancellation.

Two standard idioms lose a cancellation, and a loop that loses the one meant to stop it runs
on for good (a client's ``close()`` then waits for it forever):

- ``asyncio.wait_for(x, timeout)`` (Python 3.11) returns ``x``'s result when the task is
  cancelled in the turn of the loop in which ``x`` completes: the cancellation is dropped.
  ``async with asyncio.timeout(...)`` has no such window; the packages use it instead.
- ``contextlib.suppress(CancelledError)`` around ``await task`` after ``task.cancel()``
  swallows the awaited task's cancellation, as meant, and also the awaiting task's own,
  should it be cancelled while it waits. :func:`cancel_and_wait` tells the two apart.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel ``tasks`` (None and the current task are skipped) and wait until every one
    has ended. Then raises CancelledError if the calling task was itself cancelled while it
    waited, else the first error a task ended with other than its cancellation (as
    ``await task`` would have)."""
    current = asyncio.current_task()
    stopping = [task for task in tasks if task is not None and task is not current]
    for task in stopping:
        task.cancel()
    cancelled = False
    for task in stopping:
        while not task.done():
            try:
                # asyncio.wait raises only the caller's cancellation, never the task's.
                await asyncio.wait([task])
            except asyncio.CancelledError:
                cancelled = True
    errors = [task.exception() for task in stopping if not task.cancelled()]
    if cancelled:
        raise asyncio.CancelledError
    first = next((error for error in errors if error is not None), None)
    if first is not None:
        raise first
