"""The ``rallypoint`` command's argument parsing: one-line refusals and checked numbers.

argparse prints its usage block before an error; a person who typed ``lease grant -5`` needs
the one line that says what is wrong. :class:`Parser` does that (exit code 2, as argparse),
and the ``type=`` functions here check every number a command takes, so a value out of range
is refused before anything runs ("ttl must be at least 0.001 seconds, got -5"), never rounded
into something the cluster accepts.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import sys
from collections.abc import Callable
from typing import NoReturn

# The wire carries durations as int64 milliseconds, counts as int64.
_MAX_SECONDS = 2**62 / 1000
_MAX_COUNT = 2**63 - 1


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        one_line = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {one_line} (see {self.prog} --help)\n")


def version() -> str:
    """The installed package's version ("unknown" when run from a tree not installed)."""
    try:
        return importlib.metadata.version("rallypoint")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version", action="version", version=f"rallypoint {version()}", help="print the version"
    )


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def seconds(
    *, least_s: float = 0.0, allow_zero: bool = False, most_s: float | None = None
) -> Callable[[str], float]:
    """A ``type=`` for a duration in seconds: above 0 (or 0 and more), at least ``least_s``
    (and at most ``most_s``, when given)."""

    def parse(text: str) -> float:
        value = _number(text, "a number of seconds")
        if most_s is not None and most_s < value:
            raise argparse.ArgumentTypeError(f"must be at most {most_s:g} seconds, got {text}")
        low = value < least_s if least_s else (value < 0 if allow_zero else value <= 0)
        if low or value > _MAX_SECONDS:
            if least_s:
                bound = f"at least {least_s:g} seconds"
            else:
                bound = "0 or more seconds" if allow_zero else "above 0 seconds"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    return parse


def integer(*, least: int = 0, most: int = _MAX_COUNT) -> Callable[[str], int]:
    """A ``type=`` for a whole number in ``least..most``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not least <= value <= most:
            bound = f"from {least} to {most}" if most != _MAX_COUNT else f"{least} or more"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    return parse


def fail(prog: str, message: str) -> int:
    """Print a command's one-line refusal; the exit code of a usage error."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2
