"""Waiting for the coordinator while no member answers, for as long as the caller allows.

Theory of operation. A worker may start before its coordinator does, or while every member
restarts. The client gives each call a deadline (``timeout_s``, 10 s by default) and retries
inside it; that is right for a call in a running job, but a worker that gave up at launch
after one deadline would end a job that torchrun (``timeout``, 900 s) or the job's own
``join_timeout_s`` allows to wait far longer. So the calls a worker cannot start without
(opening its session and joining the job) go through :meth:`Patience.call`:

- an attempt is one client call, bounded by the client's deadline and by what is left of the
  patience;
- an attempt that fails because no member could serve it (UnavailableError: nobody answered,
  or members answered without a leader; DeadlineExceededError: nobody answered in time) is
  made again: at once when it took its whole deadline (the client backed off inside it),
  else once ``MIN_ATTEMPT_INTERVAL_S`` has passed since it started, so a failure that comes
  at once cannot spin (the client's backoff policy, ``ATTEMPT_PACING``: a fixed interval,
  no jitter, since each attempt backs off with jitter inside it); a line in the log says
  for how long the coordinator has been silent, at most every ``LOG_EVERY_S``;
- any other failure (a refused token, a closed job, a config conflict) is the answer: it is
  raised at once;
- when the patience is spent, :class:`CoordinatorUnreachableError`: one line saying what
  happened and what to check. An uncaught one ends the process with that line and no
  traceback (:func:`one_line_at_exit`): it is an expected condition, not a bug.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TypeVar

from rallypoint.client import Backoff, DeadlineExceededError, RallypointError, UnavailableError

from .errors import WorkerError

T = TypeVar("T")

# Attempts start at least this far apart, and progress is logged at most this often.
MIN_ATTEMPT_INTERVAL_S = 1.0
LOG_EVERY_S = 10.0
ATTEMPT_PACING = Backoff(base_s=MIN_ATTEMPT_INTERVAL_S, cap_s=MIN_ATTEMPT_INTERVAL_S, jitter=False)

# The server's reasons for "I answer, but there is no leader to serve you" (common.proto).
_NO_LEADER_REASONS = frozenset({"NO_LEADER", "NOT_LEADER"})


class CoordinatorUnreachableError(UnavailableError, WorkerError):
    """No coordinator member could serve the worker for as long as its patience allowed.
    The message is one line: what was tried, for how long, and what to check; the client's
    last error is kept in ``last_error`` (and in the debug log)."""

    def __init__(self, message: str, last_error: RallypointError) -> None:
        super().__init__(message, reason=last_error.reason)
        self.last_error = last_error


def _one_line_hook(
    previous: Callable[[type[BaseException], BaseException, TracebackType | None], object],
    classes: tuple[type[BaseException], ...],
) -> Callable[[type[BaseException], BaseException, TracebackType | None], object]:
    def hook(
        kind: type[BaseException], value: BaseException, traceback: TracebackType | None
    ) -> None:
        if isinstance(value, classes):
            print(f"rallypoint: {value}", file=sys.stderr, flush=True)
        else:
            previous(kind, value, traceback)

    hook.__rallypoint_one_line__ = classes  # type: ignore[attr-defined]
    return hook


def one_line_at_exit(*classes: type[BaseException]) -> None:
    """Make an uncaught exception of ``classes`` end the process with its message on one line
    of stderr (prefixed ``rallypoint:``) instead of a traceback; any other exception goes to
    the hook in place before. Called just before raising one, so a program that catches it
    is not affected."""
    current = sys.excepthook
    known: tuple[type[BaseException], ...] = getattr(current, "__rallypoint_one_line__", ())
    if all(cls in known for cls in classes):
        return
    sys.excepthook = _one_line_hook(current, (*known, *classes))


class Patience:
    """Retries a call while no coordinator member can serve it, up to ``timeout_s``; see the
    module docstring. ``who`` names the caller in messages (``job 'x'``), ``attempt_s`` is
    the client's own deadline for one call, ``pacing`` how far apart attempts start (from
    one's start to the next's)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout_s: float,
        attempt_s: float,
        who: str,
        log: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        pacing: Backoff = ATTEMPT_PACING,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"the coordinator connect timeout must be positive, got {timeout_s}")
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self.attempt_s = attempt_s
        self.who = who
        self._log = log
        self._clock = clock
        self._sleep = sleep
        self._pacing = pacing
        self._rng = random.Random()

    def call(self, doing: str, attempt: Callable[[float], T]) -> T:
        """``attempt(timeout_s)`` until it returns, fails otherwise than by the coordinator
        being unreachable, or the patience is spent (CoordinatorUnreachableError).
        ``doing`` says what the call is for (``joining``)."""
        started = self._clock()
        deadline = started + self.timeout_s
        logged_at = started
        retry = 0
        while True:
            attempt_started = self._clock()
            try:
                return attempt(max(0.001, min(self.attempt_s, deadline - attempt_started)))
            except (UnavailableError, DeadlineExceededError) as error:
                self._log.debug("%s: %s failed: %s", self.who, doing, error)
                now = self._clock()
                if now >= deadline:
                    raise self._gave_up(doing, error) from None
                if now - logged_at >= LOG_EVERY_S:
                    logged_at = now
                    self._log.warning(
                        "%s: waiting for the coordinator: %s for %.0f s; retrying for up to "
                        "%.0f s more",
                        self.who,
                        self._what_failed(error),
                        now - started,
                        deadline - now,
                    )
                pause_s = self._pacing.delay_s(retry, self._rng) - (now - attempt_started)
                retry += 1
                if pause_s > 0:
                    self._sleep(min(pause_s, deadline - now))

    def _what_failed(self, error: RallypointError) -> str:
        if error.reason in _NO_LEADER_REASONS:
            return "members answer but none leads (no quorum)"
        return "no member answered"

    def _gave_up(self, doing: str, error: RallypointError) -> CoordinatorUnreachableError:
        endpoints = ", ".join(self.endpoints)
        if error.reason in _NO_LEADER_REASONS:
            check = (
                "a majority of the members must be up and reach each other: check "
                "`rallypoint status` and the members' logs"
            )
        else:
            check = (
                "check that the members are running and that this host reaches their client "
                "ports (not the peer ports)"
            )
        one_line_at_exit(CoordinatorUnreachableError)
        return CoordinatorUnreachableError(
            f"{self.who}: gave up {doing} after {self.timeout_s:g} s: "
            f"{self._what_failed(error)} at {endpoints}; {check}",
            error,
        )
