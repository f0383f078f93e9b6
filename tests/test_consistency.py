"""One figure per quantity in every view: the verdict sentence, the step time the first screen
states and the fix plan's predictions read the same in report.json, the terminal, report.html
and report.md, on every committed trace (docs/metrics.md defines each once)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from stallscope.report.terminal import render_terminal
from stallscope.units import ms
from tests.conftest import ROOT, committed_traces, report_of
from tests.test_one_verdict import pages

TRACES = committed_traces()


def _text(page: str) -> str:
    """report.html's visible text, one space between words."""
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())


def _flat(markdown: str) -> str:
    """report.md unwrapped, code spans and bold unmarked."""
    return " ".join(markdown.replace("`", "").replace("**", "").split())


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_view_states_the_same_figures(path: Path) -> None:
    data, page, text = pages(path)
    term = render_terminal(report_of(path))
    verdict = " ".join(data["verdict"]["text"].split())
    # The verdict, word for word (the terminal's first line is never cut: its end is the fix).
    assert term.splitlines()[0] == f"stallscope: {verdict}"
    assert verdict in _text(page)
    assert verdict.replace("`", "") in _flat(text)
    summary = data["summary"]
    if summary["step_time_us"]:
        median = f"{summary['step_time_us']['median'] / 1000:.1f} ms"
        assert f"median {median}" in term
        assert median in _text(page)[: _text(page).index("Main bottleneck")]
        assert f"median {median}" in _flat(text)
    plan = data["plan"]
    if plan and plan["entries"]:
        for entry in plan["entries"][:3]:  # each predicted step, as the plan lists it
            shown = f"{ms(entry['predicted_step_us'])} ms"  # as every writer rounds it
            assert shown in term and shown in _text(page) and shown in _flat(text), (
                entry["id"], shown)
