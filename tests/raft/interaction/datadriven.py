"""A reader, runner and rewriter for data-driven test files (the cockroachdb/datadriven format).

A file is a sequence of blocks separated by blank lines; lines starting with ``#`` outside a
block are comments::

    # a comment
    directive arg1 key=value key=(v1,v2)
    optional input line
    ----
    expected output
    line two

The runner hands each block's directive to a handler and compares the handler's output with
the expected text. The first mismatch fails the file: later blocks depend on the state the
earlier ones built, so their output would only add noise. In rewrite mode the expected
outputs are replaced by the actual ones and the file is written back, comments and spacing
untouched.

Output may not contain blank lines (a blank line ends a block); the handler is expected to
print ``ok`` when it has nothing to say.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SEPARATOR = "----"


class DataDrivenSyntaxError(ValueError):
    """The file does not follow the format (or an argument does not parse)."""


@dataclass(frozen=True, slots=True)
class CmdArg:
    """One argument of a directive: ``key`` alone, ``key=v`` or ``key=(v1,v2)``."""

    key: str
    vals: tuple[str, ...] = ()

    def single(self) -> str:
        if len(self.vals) != 1:
            raise DataDrivenSyntaxError(f"argument {self.key} needs exactly one value")
        return self.vals[0]


@dataclass(frozen=True, slots=True)
class Directive:
    """A parsed directive line with its optional input lines, and where it was in the file."""

    cmd: str
    args: tuple[CmdArg, ...]
    input_lines: tuple[str, ...]
    line_number: int
    """1-based line number of the directive line."""

    def positional(self) -> list[str]:
        """Arguments given without ``=`` (node ids, data), in order."""
        return [a.key for a in self.args if not a.vals]

    def keyed(self, key: str) -> CmdArg | None:
        for a in self.args:
            if a.key == key and a.vals:
                return a
        return None


def split_args(text: str) -> list[str]:
    """Whitespace-separated tokens, keeping ``key=(a, b)`` together."""
    tokens: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise DataDrivenSyntaxError(f"unbalanced ')' in {text!r}")
        if char.isspace() and depth == 0:
            if current:
                tokens.append("".join(current))
                current = []
            continue
        current.append(char)
    if depth != 0:
        raise DataDrivenSyntaxError(f"unbalanced '(' in {text!r}")
    if current:
        tokens.append("".join(current))
    return tokens


def parse_line(text: str) -> tuple[str, tuple[CmdArg, ...]]:
    """``cmd a key=v key=(v1,v2)`` -> the command name and its arguments."""
    tokens = split_args(text)
    if not tokens:
        raise DataDrivenSyntaxError("empty directive line")
    args: list[CmdArg] = []
    for token in tokens[1:]:
        key, eq, value = token.partition("=")
        if not eq:
            args.append(CmdArg(key))
        elif value.startswith("(") and value.endswith(")"):
            inner = value[1:-1]
            vals = tuple(v.strip() for v in inner.split(",")) if inner.strip() else ()
            args.append(CmdArg(key, vals))
        else:
            args.append(CmdArg(key, (value,)))
    return tokens[0], tuple(args)


@dataclass(slots=True)
class _Block:
    directive: Directive
    header_lines: list[str]
    """The directive and input lines exactly as written (kept verbatim on rewrite)."""
    expected: list[str]


@dataclass(slots=True)
class DataFile:
    """A parsed file: verbatim chunks of comments/blank lines interleaved with blocks."""

    path: Path
    items: list[list[str] | _Block] = field(default_factory=list)

    @classmethod
    def parse(cls, path: Path) -> DataFile:
        lines = path.read_text().split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # the newline ending the last line
        result = cls(path)
        i = 0
        while i < len(lines):
            line = lines[i]
            if not line.strip() or line.startswith("#"):
                result._verbatim(line)
                i += 1
                continue
            start = i
            header = [line]
            i += 1
            while i < len(lines) and lines[i] != SEPARATOR:
                if not lines[i].strip():
                    raise DataDrivenSyntaxError(
                        f"{path}:{start + 1}: directive {line!r} has no {SEPARATOR!r} line"
                    )
                header.append(lines[i])
                i += 1
            if i == len(lines):
                raise DataDrivenSyntaxError(
                    f"{path}:{start + 1}: directive {line!r} has no {SEPARATOR!r} line"
                )
            i += 1  # the separator
            expected: list[str] = []
            while i < len(lines) and lines[i].strip():
                expected.append(lines[i])
                i += 1
            try:
                cmd, args = parse_line(line)
            except DataDrivenSyntaxError as exc:
                raise DataDrivenSyntaxError(f"{path}:{start + 1}: {exc}") from exc
            directive = Directive(cmd, args, tuple(header[1:]), start + 1)
            result.items.append(_Block(directive, header, expected))
        return result

    def _verbatim(self, line: str) -> None:
        if self.items and isinstance(self.items[-1], list):
            self.items[-1].append(line)
        else:
            self.items.append([line])

    def render(self) -> str:
        out: list[str] = []
        for item in self.items:
            if isinstance(item, list):
                out.extend(item)
            else:
                out.extend([*item.header_lines, SEPARATOR, *item.expected])
        return "\n".join(out) + "\n"


class ScenarioMismatch(AssertionError):
    """A block's actual output differs from the expected one."""


def _normalize(output: str) -> list[str]:
    lines = output.rstrip("\n").split("\n")
    for n, line in enumerate(lines):
        if not line.strip():
            raise ScenarioMismatch(
                f"output line {n + 1} is blank; blank lines end a block, so the handler "
                f"must not print them:\n{output}"
            )
    return [line.rstrip() for line in lines]


def run_file(path: Path, handle: Callable[[Directive], str], rewrite: bool) -> None:
    """Run every block of ``path`` through ``handle``; compare, or rewrite the file.

    Raises :class:`ScenarioMismatch` at the first block whose output differs (unless
    ``rewrite``, in which case the file is rewritten with the actual outputs).
    """
    data = DataFile.parse(path)
    for item in data.items:
        if isinstance(item, list):
            continue
        actual = _normalize(handle(item.directive))
        if actual == item.expected:
            continue
        if rewrite:
            item.expected = actual
            continue
        diff = "\n".join(
            difflib.unified_diff(item.expected, actual, "expected", "actual", lineterm="")
        )
        raise ScenarioMismatch(
            f"{path}:{item.directive.line_number}: {item.header_lines[0]}\n"
            f"output differs from the expected (regenerate with RALLYPOINT_REWRITE=1 only "
            f"after checking the new output is right):\n{diff}"
        )
    if rewrite:
        path.write_text(data.render())
