"""Charts a reader can read values off: the step chart has an x axis, and both charts tick at
round milliseconds (1, 2, 2.5 or 5 times a power of ten), not at fifths of an odd step length
(the timeline ticked at 35.26, 70.52, ... ms)."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from stallscope.commands.pipeline import analyze_paths
from stallscope.report.html import render_html, round_ticks
from tests.conftest import SAMPLES, real_trace, report_of

RESNET = "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"


def is_round(label: str) -> bool:
    value = Decimal(label)
    if value == 0:
        return True
    mantissa = value.scaleb(-value.adjusted()).normalize()  # 0.25 -> 2.5, 50 -> 5
    return mantissa in {Decimal(1), Decimal(2), Decimal("2.5"), Decimal(5)}


def step_of(labels: list[str]) -> Decimal:
    return Decimal(labels[1]) - Decimal(labels[0])


@pytest.mark.parametrize("limit_us", [52.0, 950.0, 11_470.0, 176_078.0, 3e6])
def test_ticks_are_round_and_cover_the_range(limit_us: float):
    ticks = round_ticks(limit_us)
    assert ticks[0] == 0 and 3 <= len(ticks) <= 6
    assert ticks[-1] <= limit_us < ticks[-1] + (ticks[1] - ticks[0]) * 1.0001


@pytest.mark.parametrize("trace", [SAMPLES / "cpu-loader-bound.pt.trace.json.gz", RESNET])
def test_both_charts_have_round_tick_labels(trace):
    path = trace if not isinstance(trace, str) else real_trace(trace)
    html = render_html(analyze_paths([path]))
    for chart in ("steps-chart", "step-timeline"):
        svg = re.search(rf'<svg id="{chart}".*?</svg>', html, re.S).group(0)
        labels = [re.sub(r"\s*ms$", "", t)
                  for t in re.findall(r'class="tick"[^>]*>([^<]+)</text>', svg)]
        assert len(labels) >= 3, chart
        step = step_of(labels)
        assert is_round(str(step)), (chart, labels)
        assert all(Decimal(x) % step == 0 for x in labels), (chart, labels)
    assert 'class="x-axis"' in html


def test_trace_table_drops_columns_empty_in_every_row():
    """A CPU trace has no GPUs: the trace table leaves that column out instead of an empty one."""
    html = render_html(report_of(SAMPLES / "cpu-loader-bound.pt.trace.json.gz"))
    table = re.search(r'<table id="traces">.*?</table>', html, re.S).group(0)
    assert "<th>GPUs</th>" not in table and "<th>findings</th>" in table
    assert "<th class=\"num\">time in the loader %</th>" in table
    gpu = render_html(report_of(real_trace(RESNET)))
    assert "<th>GPUs</th>" in re.search(r'<table id="traces">.*?</table>', gpu, re.S).group(0)
