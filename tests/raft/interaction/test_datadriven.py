"""The data-driven file format: parsing, comparing and rewriting in place."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.raft.interaction.datadriven import (
    CmdArg,
    DataDrivenSyntaxError,
    Directive,
    ScenarioMismatch,
    parse_line,
    run_file,
)

SCRIPT = """\
# A comment, kept on rewrite.
echo a b
----
a b

# Two directives, the second with an input line.
echo key=(1, 2) x=y
----
stale

count
line one
line two
----
2
"""


def echo(d: Directive) -> str:
    if d.cmd == "count":
        return str(len(d.input_lines))
    return " ".join(a.key if not a.vals else f"{a.key}={'|'.join(a.vals)}" for a in d.args)


def test_parse_line_splits_keys_values_and_lists() -> None:
    cmd, args = parse_line("deliver-msgs drop=(2, 3) type=MsgApp 1")
    assert cmd == "deliver-msgs"
    assert args == (CmdArg("drop", ("2", "3")), CmdArg("type", ("MsgApp",)), CmdArg("1"))


def test_parse_line_rejects_unbalanced_parentheses() -> None:
    with pytest.raises(DataDrivenSyntaxError):
        parse_line("add-nodes 3 voters=(1,2")


def test_mismatch_names_the_line_and_shows_a_diff(tmp_path: Path) -> None:
    path = tmp_path / "s.txt"
    path.write_text(SCRIPT)
    with pytest.raises(ScenarioMismatch) as info:
        run_file(path, echo, rewrite=False)
    message = str(info.value)
    assert f"{path}:7: echo key=(1, 2) x=y" in message
    assert "-stale" in message and "+key=1|2 x=y" in message


def test_rewrite_replaces_outputs_and_keeps_everything_else(tmp_path: Path) -> None:
    path = tmp_path / "s.txt"
    path.write_text(SCRIPT)
    run_file(path, echo, rewrite=True)
    assert path.read_text() == SCRIPT.replace("stale", "key=1|2 x=y")
    run_file(path, echo, rewrite=False)  # now it matches


def test_a_directive_without_separator_is_a_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "s.txt"
    path.write_text("echo a\n\necho b\n----\nb\n")
    with pytest.raises(DataDrivenSyntaxError, match=r"s\.txt:1"):
        run_file(path, echo, rewrite=False)


def test_blank_output_lines_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.txt"
    path.write_text("echo a\n----\na\n")
    with pytest.raises(ScenarioMismatch, match="blank"):
        run_file(path, lambda d: "a\n\nb", rewrite=True)
