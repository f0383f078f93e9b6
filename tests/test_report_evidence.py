"""A finding's evidence in report.html: small tables with units, never JSON cut mid-string."""

from __future__ import annotations

import re

import pytest

from stallscope.report.evidence_view import figure, unit_of
from stallscope.report.html import render_html
from tests.conftest import real_trace, report_of

QUEUE = "hta/a100_80gb_rank0of16_queue_len.pt.trace.json.gz"


def test_one_precision_rule():
    assert [figure(v) for v in (9.503, 84.69, 176078.0, 0.0190, 0.0, 12)] == [
        "9.50", "84.7", "176078", "0.0190", "0", "12"]
    assert figure(84.6853, percent=True) == "84.7"


def test_units_come_from_the_key():
    assert unit_of("wait_ms_per_step") == " ms"
    assert unit_of("idle_share_pct") == "%"
    assert unit_of("gpu_copy_us_max") == " µs"
    assert unit_of("bytes_per_step") == " B"
    assert unit_of("kernels_per_step") == ""


def evidence_tables(html: str) -> list[str]:
    return re.findall(r'<table class="evidence">(.*?)</table>\s*(?:</div>|</details>|<p)', html,
                      re.S)


def test_nested_evidence_is_a_table_with_units_not_raw_json():
    """The queue-wait trace's sync finding lists its sources (a list of dicts): they were one
    JSON line per source, cut mid-string; now a table with a column per key and units."""
    report = report_of(real_trace(QUEUE))
    html = render_html(report).replace("<wbr>", "")  # keys may wrap after an underscore
    assert 'class="json"' not in html
    sync = next(f for f in report.findings if f.id == "host-device-sync")
    sources = sync.evidence["sources"]
    assert isinstance(sources, list) and isinstance(sources[0], dict)
    (card,) = [t for t in evidence_tables(html) if "sources" in t]
    nested = re.search(r'<table class="evidence nested">(.*?)</table>', card, re.S).group(1)
    header = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<th>(.*?)</th>", nested)]
    # In words, the unit with the value; report.json's key in the tooltip.
    assert {"kind", "call", "Total", "Max"} <= set(header)
    assert 'title="total_ms"' in nested and 'title="max_ms"' in nested
    first = sources[0]
    assert f"{figure(first['total_ms'])} ms" in nested  # the biggest source's total, with unit
    assert "{" not in re.sub(r"<[^>]+>", "", nested)  # no JSON left in the cells
    top = [t for t in evidence_tables(html) if 'title="sync_share_pct"' in t][0]
    assert "Sync share" in top
    assert f"{figure(sync.evidence['sync_share_pct'], percent=True)}%" in top


@pytest.mark.parametrize("value", [[], {}, None])
def test_empty_evidence_reads_none(value):
    from stallscope.report.evidence_view import evidence_value

    assert str(evidence_value("sources", value)) == '<span class="muted">none</span>'


def test_evidence_keys_read_as_words_with_the_key_on_hover():
    from stallscope.report.evidence_view import key_text, label_of

    assert label_of("gpu_idle_share_of_step_pct") == "GPU idle share of step"
    assert label_of("host_blocked_ms_per_step") == "Host blocked per step"
    assert label_of("suggested_num_workers") == "Suggested number of workers"
    assert label_of("aten::copy_") == "aten::copy_"  # a name used as a key stays whole
    assert label_of("kind") == "kind"
    assert str(key_text("wait_ms_per_step")) == (
        '<span title="wait_ms_per_step">Loader wait (no GPU work) per step</span>')
    assert str(key_text("host_wait_ms_per_step")) == (
        '<span title="host_wait_ms_per_step">Host wait per step</span>')
    # no snake_case key left in the visible text of a real report's evidence
    html = render_html(report_of(real_trace(QUEUE)))
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)  # the page's data
    shown = re.sub(r"<[^>]+>", " ", re.sub(r'title="[^"]*"', "", html))
    cards = shown[shown.index("Why it matters"):]
    assert not re.search(r"\b[a-z]+_[a-z]+_(?:ms|pct|us)\b", cards)
