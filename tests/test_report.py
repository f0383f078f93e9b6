"""Writers: hostile names from traces stay inert in HTML, Markdown and the terminal."""

from __future__ import annotations

import json
from pathlib import Path

from stallscope.commands.pipeline import analyze_paths
from stallscope.report.html import render_html
from stallscope.report.json_writer import render_json
from stallscope.report.markdown import render_markdown
from stallscope.report.terminal import render_terminal
from tests.conftest import write_trace

HOSTILE = '</script><img src=x onerror=alert(1)>|`rm`\x1b[31m'


def hostile_report(tmp_path: Path):
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
         "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 0, "dur": 800,
         "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"},
    ]
    path = write_trace(tmp_path / f"{'x'}.pt.trace.json", events,
                       distributedInfo={"rank": 0, "backend": HOSTILE})
    report = analyze_paths([path])
    report.findings[0].trace = HOSTILE  # a trace label is user data too
    return report


def test_html_escapes_hostile_strings(tmp_path: Path):
    html = render_html(hostile_report(tmp_path))
    assert "<img src=x" not in html
    assert html.count("</script>") == 1  # only the data block's own closing tag
    data = html.split('id="stallscope-data">')[1].split("</script>")[0]
    assert json.loads(data)["findings"][0]["trace"] == HOSTILE


def test_markdown_and_terminal_neutralise_hostile_strings(tmp_path: Path):
    report = hostile_report(tmp_path)
    md = render_markdown(report)
    assert "<img" not in md and "\x1b" not in md
    assert "\\|" in md  # a pipe cannot break the findings table
    assert "\x1b" not in render_terminal(report)


def test_json_round_trips_and_is_stable(tmp_path: Path):
    report = hostile_report(tmp_path)
    first = render_json(report)
    assert json.loads(first)["schema_version"] == 1
    assert render_json(report) == first
