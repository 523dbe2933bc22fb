"""Checks of the numbers a caller hands the client, made before anything is sent.

A TTL of -5 s, a timeout of 0 or a page size of 0 is the caller's mistake, not the server's:
it is refused here, at once, with :class:`InvalidValueError` (an ``InvalidArgumentError`` and
a ``ValueError``) naming the argument, the range and the value given, instead of being
rounded into something the server accepts (``lease grant -5`` once granted a lease of 1 ms).
"""

from __future__ import annotations

import math

from .errors import InvalidValueError

# The wire carries durations as int64 milliseconds.
MAX_SECONDS = 2**62 / 1000


def _shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def positive_seconds(
    value: float, name: str, *, least_s: float = 0.0, most_s: float = MAX_SECONDS
) -> float:
    """``value`` if it is a finite number of seconds above 0 (and at least ``least_s``, at
    most ``most_s``)."""
    if not _is_number(value):
        raise InvalidValueError(f"{name} must be a number of seconds, got {value!r}")
    if math.isfinite(value) and most_s < value <= MAX_SECONDS:
        raise InvalidValueError(f"{name} must be at most {most_s:g} seconds, got {_shown(value)}")
    if not math.isfinite(value) or value <= 0 or value < least_s or value > MAX_SECONDS:
        floor = f"at least {least_s:g}" if least_s else "above 0"
        raise InvalidValueError(f"{name} must be {floor} seconds, got {_shown(value)}")
    return value


def non_negative_seconds(value: float, name: str) -> float:
    """``value`` if it is a finite number of seconds, 0 or more."""
    if not _is_number(value) or not math.isfinite(value) or not 0 <= value <= MAX_SECONDS:
        raise InvalidValueError(f"{name} must be 0 or more seconds, got {_shown(value)}")
    return value


def count(value: int, name: str, *, least: int = 1) -> int:
    """``value`` if it is an integer of at least ``least`` (and fits the wire's int64)."""
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value < 2**63:
        raise InvalidValueError(f"{name} must be an integer of at least {least}, got {value!r}")
    return value
