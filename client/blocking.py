"""Async objects seen from threads: the loop thread, and the one helper that makes an async
method blocking.

Theory of operation. A :class:`SyncClient` starts one :class:`LoopThread`: a private event
loop running in a daemon thread, on which its :class:`Client` and everything made from it
(participants, round stores, registries, leases, watches) live. Every blocking view is a
:class:`Blocking` of its async target and that runner; ``blocking(Target.method)`` is a method
that runs ``method(target, ...)`` on the loop and blocks the calling thread until it returns
(or raises). Any thread may call, several at once, except the loop's own: a callback running
there that waited for the loop would wait forever, so that is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
T = TypeVar("T")
Target = TypeVar("Target")
# A view of a subclass is a view of its base: SyncClient (a view of Client) takes the methods
# Client inherits (``blocking(Client.get_job)`` is typed by the base that defines it).
Target_co = TypeVar("Target_co", covariant=True)


class Runner(Protocol):
    """Where blocking views run their targets' coroutines (a :class:`LoopThread`)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T: ...


class LoopThread:
    """A private event loop running in a daemon thread until :meth:`stop`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="rallypoint-client", daemon=True
        )
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self.thread:
            coroutine.close()
            raise RuntimeError(
                "a SyncClient method was called from the client's own thread (a lease "
                "callback?); that would wait forever for itself"
            )
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def stop(self) -> None:
        """Cancel what still runs on the loop (background watchers and mirrors), then stop."""

        async def cancel_pending() -> None:
            current = asyncio.current_task()
            tasks = [task for task in asyncio.all_tasks() if task is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(cancel_pending(), self.loop).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class Blocking(Generic[Target_co]):
    """A blocking view of ``target``, whose coroutines run on ``runner``."""

    def __init__(self, target: Target_co, runner: Runner) -> None:
        self._target = target
        self._runner = runner


def blocking(
    method: Callable[Concatenate[Target, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Blocking[Target], P], T]:
    """``method`` of the target, as a method of its blocking view."""

    def call(self: Blocking[Target], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._runner.run(method(self._target, *args, **kwargs))

    call.__name__ = method.__name__
    call.__doc__ = method.__doc__
    return call
