"""docs/usage.md documents the command line as the parser builds it: every option of `run`,
`watch`, `analyze`, `compare` and `tune`, and exactly the exit codes stallscope.errors defines
(which cli.py's docstring lists too). A flag added without a word in the usage guide, or an exit
code added without its row, fails here rather than surprising a user."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from stallscope import cli, errors

USAGE = Path(__file__).resolve().parent.parent / "docs" / "usage.md"
COMMANDS = ("run", "watch", "analyze", "compare", "tune")


def _command_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _defined_codes() -> set[int]:
    return {v for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)}


def _usage_exit_codes(text: str) -> set[int]:
    """The numbers in the first column of the usage guide's exit-code table (rows like `*n*`, the
    script's own status, name no constant and are skipped)."""
    section = text.split("\n## Exit codes", 1)[1]
    rows = re.findall(r"^\| ([^|]+) \|", section.split("\n\n", 2)[1], flags=re.MULTILINE)
    return {int(c) for row in rows for c in re.findall(r"\b\d+\b", row)}


def _docstring_exit_codes(doc: str) -> set[int]:
    """The codes cli.py's "Exit codes" paragraph lists: each after `:`, `;` or `,` and before
    its meaning."""
    para = doc.split("Exit codes", 1)[1].split("\n\n", 1)[0]
    return {int(c) for c in re.findall(r"[:;,]\s+(\d+)(?=[ ,])", para)}


def test_the_parser_has_the_four_commands() -> None:
    assert set(COMMANDS) <= set(_command_parsers())


@pytest.mark.parametrize("command", COMMANDS)
def test_usage_names_every_option(command: str) -> None:
    text = USAGE.read_text(encoding="utf-8")
    options = sorted({o for a in _command_parsers()[command]._actions
                      if not isinstance(a, argparse._HelpAction) for o in a.option_strings})
    assert options, command
    missing = [o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)]
    assert missing == [], f"`stallscope {command}` options docs/usage.md never names: {missing}"


def test_usage_exit_code_table_lists_exactly_the_defined_codes() -> None:
    listed = _usage_exit_codes(USAGE.read_text(encoding="utf-8"))
    assert listed == _defined_codes()


def test_cli_docstring_lists_every_defined_exit_code() -> None:
    assert cli.__doc__ is not None
    assert _docstring_exit_codes(cli.__doc__) == _defined_codes()
