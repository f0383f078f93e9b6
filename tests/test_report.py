"""Writers: hostile names from traces stay inert in HTML, Markdown and the terminal; the fix
plan and --what-if read the same in Markdown and the terminal as in report.json."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stallscope.commands.pipeline import analyze_paths
from stallscope.diagnose.fixes import parse_what_if
from stallscope.report.html import render_html
from stallscope.report.json_writer import render_json
from stallscope.report.markdown import render_markdown
from stallscope.report.terminal import render_terminal
from tests.conftest import SAMPLES, real_trace, report_of, write_trace

HOSTILE = '</script><img src=x onerror=alert(1)>|`rm`\x1b[31m'


def hostile_report(tmp_path: Path):
    # Two steps: a single step of two events is too little to judge (test_model.py).
    events = [
        e
        for n in (1, 2)
        for e in (
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1,
             "tid": 1, "ts": (n - 1) * 1000, "dur": 1000},
            {"ph": "X", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": (n - 1) * 1000,
             "dur": 800, "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"},
        )
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
    assert "\x1b" not in md
    assert "\n|" not in md  # no table for a pipe to break
    # Where a name is shown it sits in a code span: both renderers show it as text.
    markdown, markdown_it = pytest.importorskip("markdown"), pytest.importorskip("markdown_it")
    for page in (markdown.markdown(md, extensions=["fenced_code"]),
                 markdown_it.MarkdownIt("commonmark").render(md)):
        assert "<img" not in page and "<script" not in page
    assert "\x1b" not in render_terminal(report)


def test_json_round_trips_and_is_stable(tmp_path: Path):
    report = hostile_report(tmp_path)
    first = render_json(report)
    assert json.loads(first)["schema_version"] == 2  # 2: the replayed fix plan (build.py)
    assert render_json(report) == first


RESNET = "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"


def ms(us: float) -> str:
    return f"{us / 1000:.1f}"


@pytest.fixture(scope="module")
def planned():
    """A real GPU trace with a multi-step fix plan, and two --what-if changes."""
    return analyze_paths([real_trace(RESNET)],
                         what_if=parse_what_if(["num_workers=4", "amp=fp16"]))


def plan_lines(report) -> list[str]:
    """The fix plan as the writers should print it: previous step -> predicted, each change."""
    out, before = [], report.plan["baseline_step_us"]
    for i, e in enumerate(report.plan["entries"], 1):
        lo, hi = e["predicted_range_us"]
        assert lo <= e["predicted_step_us"] <= hi
        # Each line's drop, and the change's share of the plan's saving where they differ.
        drop = 100 * (before - e["predicted_step_us"]) / report.plan["baseline_step_us"]
        saving = (f"-{e['saving_pct']:.1f}%" if abs(drop - e["saving_pct"]) < 0.5 else
                  f"-{drop:.1f}% here; its share of the plan: -{e['saving_pct']:.1f}%")
        out.append(f"{i}. {e['change']} ({e['id']}): {ms(before)} -> about "
                   f"{ms(e['predicted_step_us'])} ms ({ms(lo)}-{ms(hi)}) ({saving})")
        before = e["predicted_step_us"]
    return out


def about(item) -> str:
    """A prediction with its range, as the writers print it: about X ms (lo-hi)."""
    lo, hi = item["predicted_range_us"]
    return f"about {ms(item['predicted_step_us'])} ms ({ms(lo)}-{ms(hi)})"


def test_markdown_shows_the_fix_plan_what_if_and_labelled_savings(planned):
    report = planned
    text = render_markdown(report)
    assert text.index("## Fix plan") < text.index("## What if") < text.index("## Findings")
    # Unwrapped (a wrapped line goes on four spaces past its item), without code spans' ticks.
    text = re.sub(r"\n {4,}(?!- )", " ", text).replace("`", "")
    plan = text[text.index("## Fix plan"): text.index("## What if")]
    expected = plan_lines(report)
    assert len(expected) >= 2
    got = [line for line in plan.splitlines() if line[:1].isdigit()]
    assert got == expected
    first = report.plan["entries"][0]
    assert f"\n    - assumes: {first['assumptions'][0]}" in plan
    assert f"Floor: {ms(report.plan['floor_us'])} ms per step, the busiest GPU's" in plan
    assert "- gpu-idle: an effect of dataloader-bound" in plan
    assert "ProfilerStep#6 ... ProfilerStep#10 (5 of 6 recorded steps" in " ".join(plan.split())
    what_if = text[text.index("## What if"): text.index("## Findings")]
    together = report.what_if
    assert f"- all together: {about(together)}," in what_if
    assert f"- num_workers=4 alone: {about(together['each'][0])}," in what_if
    found = text[text.index("## Findings"): text.index("### Top recommendation")]
    top = report.findings[0]
    first = report.plan["entries"][0]
    assert (f"saves {top.estimated_saving_pct:.1f}% (replayed), step 1 of the fix plan: "
            f"{ms(report.plan['baseline_step_us'])} -> {ms(first['predicted_step_us'])} ms"
            ) in found
    assert "counted in dataloader-bound's fix" in found
    assert "*Estimate (replayed prediction):* step 1 of the fix plan" in text


def test_terminal_shows_the_fix_plan_what_if_and_labelled_savings(planned):
    report = planned
    lines = render_terminal(report).splitlines()
    start = lines.index(next(line for line in lines if line.startswith("  fix plan")))
    assert "replayed predictions" in lines[start]
    n = min(len(report.plan["entries"]), 5)
    assert [line.strip() for line in lines[start + 1: start + 1 + n]] == plan_lines(report)[:n]
    assert lines[start + 1 + n].strip() == (
        f"floor {ms(report.plan['floor_us'])} ms (busiest GPU's remaining work)")
    w = report.what_if
    assert lines[start + 2 + n].startswith("  what if (replayed")
    assert lines[start + 3 + n].strip().startswith(f"num_workers=4: {about(w['each'][0])} (")
    assert lines[start + 5 + n].strip().startswith(f"all together: {about(w)} (")
    top = report.findings[0]
    assert f"{top.id}: " in lines[start + 6 + n]
    assert lines[start + 6 + n].endswith(f"(replayed: saves {top.estimated_saving_pct:.1f}%)")
    assert any(line.endswith("(counted in dataloader-bound's fix)") for line in lines)


def test_without_a_plan_markdown_and_terminal_give_upper_bounds():
    report = report_of(SAMPLES / "cpu-persistent-workers.pt.trace.json.gz")
    assert report.plan is not None and not report.plan["entries"]
    pct = f"{report.findings[0].estimated_saving_pct:.1f}%"
    text = render_markdown(report)
    assert "## Fix plan" not in text and "## What if" not in text
    flat = " ".join(text.split())  # unwrapped
    assert f"saves {pct} (upper bound)." in flat and "change alone" not in flat
    assert f"*Estimate (upper bound, not replayed):* up to {pct}" in flat
    terminal = render_terminal(report)
    assert "fix plan" not in terminal and f"(upper bound {pct})" in terminal


def test_a_cause_comes_before_its_effect_when_their_savings_tie():
    """An effect's saving is its cause's: they tie, and the tie used to fall to the ids'
    alphabetical order, listing `gpu-idle` above `host-device-sync`, the effect before its cause."""
    from stallscope.diagnose import Assessment, ranked_findings
    from stallscope.diagnose.finding import Finding
    from stallscope.report.build import causes_first

    def finding(fid: str, caused_by: str = "") -> Finding:
        return Finding(id=fid, title=fid, evidence={}, recommendation="", snippet="",
                       precondition="", estimated_saving_pct=12.0, saving_basis="",
                       trace="t", caused_by=caused_by)

    flat = [Assessment.found(finding("host-device-sync")),
            Assessment.found(finding("gpu-idle", caused_by="host-device-sync"))]
    assert [f.id for f in ranked_findings(flat)] == ["gpu-idle", "host-device-sync"]
    assert [f.id for f in causes_first(ranked_findings(flat))] == ["host-device-sync",
                                                                   "gpu-idle"]
