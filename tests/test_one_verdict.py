"""One verdict for the page: the first line, the HTML "Main bottleneck" and saving cards, the
page title and report.md's top recommendation speak of the same finding, on every committed
trace (report.json's `verdict.finding`)."""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path
from typing import Any

import pytest

from stallscope.report.html import render_html
from stallscope.report.json_writer import report_data
from stallscope.report.markdown import render_markdown
from tests.conftest import ROOT, committed_traces, report_of

TITLE = re.compile(r"<title>stallscope report(?:: (.*?))?</title>", re.DOTALL)
CARD = re.compile(r'<div class="tile" id="tile-(main|saving)"(?: data-finding="([^"]*)")?')
# The heading names the finding's id; its title follows in bold, wrapped, names in code spans.
TOP_REC = re.compile(r"^### Top recommendation: `([\w-]+)`\n\n\*\*(.+?)\*\*\n\n",
                     re.MULTILINE | re.DOTALL)


@functools.cache
def pages(path: Path) -> tuple[dict[str, Any], str, str]:
    """report.json's data, report.html and report.md of one committed trace, made once."""
    report = report_of(path)
    return report_data(report), render_html(report), render_markdown(report)


def page_choices(data: dict[str, Any], page: str, text: str) -> dict[str, Any]:
    """What each part of the page names: the finding ids of the cards, the titles of the page
    title and of report.md's top recommendation (None where the part is absent)."""
    title = TITLE.search(page)
    rec = TOP_REC.search(text)
    cards = {kind: html.unescape(fid) if fid else None for kind, fid in CARD.findall(page)}
    return {
        "title": html.unescape(title.group(1)) if title and title.group(1) else None,
        "main": cards.get("main"),
        "saving": cards.get("saving"),
        "top_rec": " ".join(rec.group(2).replace("`", "").split()) if rec else None,
        "top_rec_id": rec.group(1) if rec else None,
    }


def lead_of(data: dict[str, Any]) -> dict[str, Any] | None:
    """The finding report.json's verdict names, as the page lists it."""
    fid = data["verdict"].get("finding")
    if fid is None:
        return None
    return next(f for f in data["findings"] if f["id"] == fid)


TRACES = committed_traces()


def test_every_committed_trace_is_covered():
    assert len(TRACES) >= 60
    assert any(p.parent.name == "hta" for p in TRACES)
    assert any(p.name.startswith("synthetic-inference-serving") for p in TRACES)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_page_names_one_finding(path: Path):
    data, page, text = pages(path)
    got = page_choices(data, page, text)
    lead = lead_of(data)
    if lead is None:
        assert not data["findings"], data["verdict"]
        assert got == {"title": None, "main": None, "saving": None, "top_rec": None,
                       "top_rec_id": None}
        return
    assert got["main"] == lead["id"] and got["saving"] == lead["id"], (got, data["verdict"])
    assert got["title"] == lead["title"] == got["top_rec"], (got, lead["title"])
    assert got["top_rec_id"] == lead["id"]
    # The first line speaks of it: its title, lower-cased where the line quotes it.
    assert lead["title"].lower() in data["verdict"]["text"].lower(), data["verdict"]["text"]
    # Where its fix was replayed, the plan's first entry is that fix.
    plan = data["plan"]
    if plan and plan["entries"] and lead["plan_rank"] is not None:
        assert plan["entries"][0]["id"] == lead["id"]
