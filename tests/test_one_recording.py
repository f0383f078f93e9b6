"""One name, one value per quantity on a page: the step, the loader's share and wait, the GPU's
idle time and a batch's loading read the same wherever report.html and report.md say them.

A page over several recordings quotes one recording (the fix plan's) and names it; the other
recordings' figures sit under their own name (the per-trace table, a card's "Also in" line),
which these tests leave aside. Everything else a reader sees is read, as text.
"""

from __future__ import annotations

import html as html_text
import re
from pathlib import Path

import pytest

from stallscope.report.html import render_html
from stallscope.report.markdown import render_markdown
from tests.conftest import SAMPLES, real_trace, report_of

KINETO_PAIR = tuple(real_trace(f"kineto/resnet50_num_workers_0__worker0.{ts}.pt.trace.json.gz")
                    for ts in ("1623143089861", "1623143566756"))
H200 = (SAMPLES / "real-h200-r1-w0.pt.trace.json.gz",)

NUM = r"(\d+(?:\.\d+)?)"
# Each quantity by the words the page uses for it, wherever it says it.
QUANTITIES = {
    "step time": [rf"[Mm]edian step\W[^0-9]{{0,160}}?{NUM} ms", rf"[Ss]tep time: median {NUM} ms",
                  rf"\bmeasured {NUM} ms per step", rf"[Mm]ean step {NUM} ms",
                  rf"[Ss]tep mean {NUM} ms"],
    "mean step": [rf"\bmean {NUM} ms"],
    "time in the loader": [rf"[Tt]ime in the loader:? {NUM}%", rf"[Ll]oader share {NUM}%"],
    "loader wait": [rf"loader wait \(no GPU work\):? {NUM}%",
                    rf"waits on the DataLoader for {NUM}%", rf"(?<!\w )Wait share {NUM}%"],
    # ("Host wait of idle 97.9%", "unexplained idle share": shares of the idle time, named so)
    "GPU idle": [rf"(?<!of )\b[Ii]dle {NUM}%", rf"GPU is idle {NUM}%", rf"GPU idle {NUM}%",
                 rf"(?<!\w )Idle share {NUM}%"],
    "GPU busy": [rf"GPU busy(?: in steps| share)? {NUM}%", rf"\bbusy {NUM}% of the step"],
    "batch load": [rf"{NUM} ms of time in the loader per step",
                   rf"[Tt]ime in the loader per step:? {NUM} ms", rf"[Ll]oader per step {NUM} ms"],
}


def page_text(html: str) -> str:
    """What a reader of report.html sees, as one line of text: no markup, no data block, no
    tooltips; less the figures filed under another recording's name."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    for table in ("traces", "ranks", "gpu-kernel-mix", "gpu-summary"):
        html = re.sub(rf'<table id="{table}".*?</table>', " ", html, flags=re.S)
    html = re.sub(r'<p class="also".*?</p>', " ", html, flags=re.S)  # another recording's
    html = re.sub(r'<details class="section" id="(not-assessed|checks)".*?</details>', " ", html,
                  flags=re.S)  # each check under its trace's name
    text = re.sub(r"<[^>]+>", " ", html)
    return " ".join(html_text.unescape(text).split())


def markdown_text(md: str) -> str:
    """report.md as one line of text, less its per-trace list and other recordings' items."""
    md = re.sub(r"\n## Per (trace|rank)\n.*?(?=\n## )", "\n", md, flags=re.S)
    md = re.sub(r"\n {4}- also in .*?(?=\n\d+\. |\n {4}- also in |\n\n)", "\n", md, flags=re.S)
    md = re.sub(r"\n## What could not be assessed\n.*", "\n", md, flags=re.S)
    return " ".join(md.replace("`", "").replace("*", "").split())


def figures(text: str) -> dict[str, list[str]]:
    """Every figure each quantity reads in `text`, as printed."""
    return {q: [m for p in patterns for m in re.findall(p, text)]
            for q, patterns in QUANTITIES.items()}


def one_value(printed: list[str]) -> bool:
    """Whether the figures are one value: each the most precise one rounded as it is printed."""
    if not printed:
        return True
    exact = max(printed, key=lambda v: len(v.partition(".")[2]))
    return all(float(v) == round(float(exact), len(v.partition(".")[2])) for v in printed)


@pytest.mark.parametrize("paths", [KINETO_PAIR, H200], ids=["kineto-pair", "h200-r1-w0"])
def test_every_quantity_reads_one_value_on_the_page_and_in_report_md(paths: tuple[Path, ...]):
    report = report_of(*paths)
    lead = next(t for t in report.traces if t["label"] == report.plan["trace"])
    summary = lead["summary"]
    page, md = page_text(render_html(report)), markdown_text(render_markdown(report))
    seen = {"page": figures(page), "report.md": figures(md)}
    for where, found in seen.items():
        for quantity in ("step time", "time in the loader", "loader wait", "GPU idle",
                         "batch load"):
            assert found[quantity], f"{where} never says its {quantity}"
        for quantity, printed in found.items():
            assert one_value(printed), f"{where}: {quantity} reads {sorted(set(printed))}"
    # ... and it is the fix plan's recording's own: its median step, loader share, GPU idle.
    both = {q: seen["page"][q] + seen["report.md"][q] for q in QUANTITIES}
    assert float(both["step time"][0]) == round(summary["step_time_us"]["median"] / 1000, 1)
    loader = summary["breakdown_pct"]["dataloader"]
    assert all(float(v) == round(loader, 1) for v in both["time in the loader"])
    idle = next(iter(summary["gpu_pct"].values()))["idle"]
    assert all(abs(float(v) - idle) <= 0.05 for v in both["GPU idle"])
    # The two recordings' per-trace rows still say each one's own median step.
    if len(paths) > 1:
        rows = re.findall(r"median step " + NUM + " ms", " ".join(render_markdown(report).split()))
        medians = {f"{t['summary']['step_time_us']['median'] / 1000:.1f}" for t in report.traces}
        assert medians <= set(rows)


def test_one_finding_per_cause_with_each_recordings_figures_inside():
    """The kineto pair: 6 causes, each once in report.json, its fields the fix plan's
    recording's, and each recording's own figures in `recordings`."""
    report = report_of(*KINETO_PAIR)
    labels = [t["label"] for t in report.traces]
    assert len(report.findings) == len({f.id for f in report.findings}) == 6
    lead = report.plan["trace"]
    for f in report.findings:
        assert f.trace == lead
        assert [r["trace"] for r in f.recordings] == labels
        mine = next(r for r in f.recordings if r["trace"] == lead)
        assert mine["estimated_saving_pct"] == f.estimated_saving_pct
        assert mine["evidence"] == f.evidence
    # In the fix plan's order, with the plan's savings.
    planned = [f for f in report.findings if f.plan_rank is not None]
    assert [f.id for f in planned] == [e["id"] for e in report.plan["entries"]]
    assert all(f.estimated_saving_pct == e["saving_pct"]
               for f, e in zip(planned, report.plan["entries"], strict=True))
