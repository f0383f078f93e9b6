"""One story in the numbers: "time in the loader" (all of DataLoader `__next__`, the breakdown)
and "loader wait (no GPU work)" (the dataloader-bound figure the verdict uses) are named the same
in the terminal, Markdown, HTML and report.json, and explained where both appear (the ResNet
trace's verdict said 33.9% and the line below "dataloader 39.64%")."""

from __future__ import annotations

import json

from stallscope.report.html import render_html
from stallscope.report.json_writer import render_json
from stallscope.report.markdown import render_markdown
from stallscope.report.terminal import render_terminal
from tests.conftest import real_trace, report_of

RESNET = "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"


def test_both_loader_figures_are_named_and_explained_in_every_view():
    report = report_of(real_trace(RESNET))
    f = next(f for f in report.findings if f.id == "dataloader-bound")
    time_pct, wait_pct = f.evidence["loader_share_pct"], f.evidence["wait_share_pct"]
    assert time_pct - wait_pct > 5  # the two differ on this trace: the reader must be told why
    story = (f"time in the loader: {time_pct:.1f}% of the step; loader wait (no gpu work): "
             f"{wait_pct:.1f}%")
    views = {
        "terminal": render_terminal(report),
        "markdown": " ".join(render_markdown(report).split()),  # unwrapped
        "html": render_html(report),
    }
    for name, text in views.items():
        assert story in text.lower(), name
    assert "- time in the loader: 39.6%" in views["markdown"]
    assert "host time: time in the loader 39.6%" in views["terminal"]
    data = json.loads(render_json(report))
    assert data["category_names"]["dataloader"] == "time in the loader"
    assert data["summary"]["breakdown_pct"]["dataloader"] == round(time_pct, 2)


def test_markdown_has_the_gpu_busy_idle_line_and_human_category_names():
    report = report_of(real_trace(RESNET))
    text = " ".join(render_markdown(report).split())  # unwrapped
    gpu = report.summary["gpu_pct"]["0"]
    assert (f"GPU 0: busy {100 - gpu['idle']:.1f}% of the step (GPU kernels "
            f"{gpu['kernel']:.1f}%") in text
    assert f"idle {gpu['idle']:.1f}%." in text
    assert "host_compute" not in text and "- host compute: " in text
