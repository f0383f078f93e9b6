"""The code's shape, as a maintainer reads it: a rule's check is measure -> judge -> advise, no
function in diagnose/rules/ over MAX_RULE_FUNCTION lines; no class in capture/ over
MAX_CAPTURE_CLASS lines (the capture session split by what it owns)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

MAX_RULE_FUNCTION = 60
MAX_CAPTURE_CLASS = 250
RULES = ROOT / "src/stallscope/diagnose/rules"
CAPTURE = ROOT / "src/stallscope/capture"


def _longer(folder: Path, kinds: tuple[type, ...], limit: int) -> set[tuple[str, str]]:
    found = set()
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, kinds) and node.end_lineno - node.lineno + 1 > limit:
                found.add((path.name, node.name))
    return found


def test_no_function_in_the_rules_is_over_the_limit() -> None:
    long = _longer(RULES, (ast.FunctionDef, ast.AsyncFunctionDef), MAX_RULE_FUNCTION)
    assert long == set(), "split it: measure -> judge -> advise"


def test_no_class_in_capture_is_over_the_limit() -> None:
    long = _longer(CAPTURE, (ast.ClassDef,), MAX_CAPTURE_CLASS)
    assert long == set(), "split it by what it owns"
