"""What a `stallscope watch` report leads with (report/watch_lead.py, report/watch_view.py): the
stretch of the run that lost the most time, with the diagnosis and plan of the capture recorded
in it, on the page, in its title, in report.md and in the terminal; every capture's plan listed;
stretches the machine's load explains never lead.

The runs here are the committed H100 `watch` recordings (trace and step log), and a run that
slows down after its first capture: a fast, unremarkable capture (cpu-no-schedule) for its first
300 steps, a loader-bound capture (cpu-loader-bound) in its slow second half. The browser test
of the same pages is in tests/test_browser.py."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from stallscope.commands.pipeline import analyze_paths
from stallscope.report.build import Report, attach_run
from stallscope.report.html import render_html
from stallscope.report.json_writer import render_json, verdict_data
from stallscope.report.markdown import render_markdown
from stallscope.report.schema import check
from stallscope.report.terminal import render_terminal
from stallscope.report.watch_chart import MARK_GAP, watch_chart
from stallscope.report.watch_lead import headline, stretches
from stallscope.report.watch_view import watch_report
from stallscope.runfacts import RunContext
from tests.conftest import SAMPLES

FAST = SAMPLES / "cpu-no-schedule.pt.trace.json.gz"
SLOW = SAMPLES / "cpu-loader-bound.pt.trace.json.gz"
CASES = ("slowdown", "save", "hostbound")


def _with_run(report: Report, first_step: int, folder: Path) -> Report:
    ctx = RunContext(command=["stallscope", "watch", "train.py"], target="train.py",
                     steps_requested=5, steps_recorded=5, window={"first_step": first_step})
    attach_run(report, [ctx], folder / "traces", folder)
    return report


def slows_later(folder: Path) -> Report:
    """A watched run of 600 steps: 8.5 ms a step, then from step 301 11.5 ms, most of it
    waiting for the DataLoader. Its first capture (steps 20-24) is a fast trace with nothing
    worth fixing; the capture the trigger took at step 350 is a loader-bound trace."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "steps.jsonl"
    rng = random.Random(0)
    start = 0.0
    with log.open("w") as fh:
        for i in range(1, 601):
            slow = i > 300
            ms = (11.5 if slow else 8.5) * rng.uniform(0.95, 1.05)
            wait = (9.0 if slow else 0.4) * rng.uniform(0.9, 1.1)
            fh.write(json.dumps({"step": i, "start_s": start, "step_ms": ms,
                                 "loader_wait_ms": wait, "cpu_ms": 0.9 * ms, "epoch": 0,
                                 "profiled": 20 <= i < 25 or 350 <= i < 355}) + "\n")
            start += ms / 1000
    first = _with_run(analyze_paths([FAST]), 20, folder)
    second = analyze_paths([SLOW])
    later = [{"first_step": 350, "kind": "regime", "why": "the step went from 8.5 to 11.5 ms",
              "traces": [str(SLOW)], "verdict": verdict_data(second), "report": second}]
    return watch_report(log, first, later)


def committed(case: str, folder: Path) -> Report:
    """A committed H100 `watch` run as the command reports it: its one capture's trace, its
    step log (the first profiled step is where the capture began)."""
    log = SAMPLES / f"real-h100-watch-{case}.steps.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    first = min(r["step"] for r in rows if r["profiled"])
    report = _with_run(analyze_paths([SAMPLES / f"real-h100-watch-{case}.pt.trace.json.gz"]),
                       first, folder)
    return watch_report(log, report)


def write_pages(report: Report, out: Path) -> Path:
    """report.html, report.md and report.json of `report` in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.html").write_text(render_html(report))
    (out / "report.md").write_text(render_markdown(report))
    (out / "report.json").write_text(render_json(report))
    return out


def test_a_run_that_slows_after_its_first_capture_leads_with_the_slow_stretch(
        tmp_path: Path) -> None:
    report = slows_later(tmp_path / "run")
    w = report.watch
    assert w is not None
    lead = w["headline"]
    assert (lead["kind"], lead["first_step"], lead["capture"]) == ("regime", 301, 2)
    assert lead["basis"] == "measured" and 0 < lead["share_of_wall"] < 1
    assert w["diagnosed"] == 2
    # The report's own diagnosis is the slow capture's: its verdict, plan and findings.
    assert report.verdict_id == "dataloader-bound"
    assert report.plan and report.plan["entries"][0]["change"] == "num_workers=2"
    assert [c["verdict"]["id"] for c in w["captures"]] == ["no-bottleneck", "dataloader-bound"]
    assert w["captures"][0]["trace"] == str(FAST)  # no longer the report's own: named
    out = write_pages(report, tmp_path / "out")
    check(json.loads((out / "report.json").read_text()))

    page = (out / "report.html").read_text()
    title = re.search(r"<title>(.*?)</title>", page).group(1)  # type: ignore[union-attr]
    assert title.startswith("stallscope watch: steps 301–600 lost the most: Training waits on "
                            "the DataLoader")
    assert "2 regimes, 2 captures" in title
    lead_at, verdict_at = page.index('id="watch-lead"'), page.index('id="verdict"')
    assert lead_at < verdict_at < page.index('id="tile-saving"')
    assert "Steps 301–600 (regime 2) lost the most time" in page[lead_at:verdict_at]
    verdict = page[verdict_at:page.index("</p>", verdict_at)]
    assert "num_workers=2" in verdict and "6.1 ms" in verdict
    tile = page[page.index('id="tile-saving"'):]
    assert 'data-finding="dataloader-bound"' in tile[:200]
    assert "predicted 6.1 ms" in tile[:tile.index("</div></div>")]
    # Every capture's plan, and which capture the sections below describe.
    one = page[page.index('id="watch-capture-1"'):page.index('id="watch-capture-2"')]
    two = page[page.index('id="watch-capture-2"'):page.index("</ol>")]
    assert "No bottleneck worth fixing" in one and "no change to replay" in one
    assert "<code>num_workers=2</code> 10.5 → 6.1 ms" in two and "The diagnosis below" in two
    assert "describe <b>capture 2</b>, the steps recorded under the profiler from step 350" in page
    assert 'Findings <span class="muted">of capture 2</span>' in page

    md = " ".join((out / "report.md").read_text().split())  # its lines wrapped at 100
    assert md.startswith("# stallscope watch **The whole run:** 600 steps, 2 regimes, "
                         "2 captures, 0 recurring stalls. Steps 301–600 (regime 2) lost the "
                         "most time")
    verdict_md = md.index("**Verdict:** Training waits on the DataLoader")
    assert verdict_md < md.index("## The whole run") < md.index("## Fix plan")
    assert "`num_workers=2` 10.5 -> 6.1 ms" in md and "No bottleneck worth fixing" in md
    assert "The findings and fix plan below are capture 2's" in md

    lines = render_terminal(report).splitlines()
    assert "num_workers=2" in lines[0] and "6.1 ms" in lines[0]
    assert lines[1] == "  the whole run: 600 steps, 2 regimes, 2 captures, 0 recurring stalls"
    assert lines[2].startswith("  Steps 301–600 (regime 2) lost the most time")
    assert "Capture 2 (from step 350" in lines[4] and "num_workers=2 10.5 -> 6.1 ms" in lines[4]


@pytest.mark.parametrize("case", CASES)
def test_the_committed_watch_runs_lead_with_their_only_capture(case: str,
                                                               tmp_path: Path) -> None:
    """One regime each and one capture: the level the run holds leads, its first fix's
    predicted saving is what it loses; on `save` that beats the blocking save every 25 steps
    (measured 0.3 s), which is listed under the run."""
    report = committed(case, tmp_path)
    w = report.watch
    assert w is not None
    lead = w["headline"]
    assert (lead["kind"], lead["capture"], w["diagnosed"]) == ("steady", 1, 1)
    assert lead["basis"] == "predicted" and lead["lost_ms"] > 0
    assert lead["text"].startswith("The run held one level: a median step of ")
    assert "its first fix would save about" in lead["text"]
    md = render_markdown(report)
    assert md.startswith("# stallscope watch\n\n**The whole run:** ")
    assert "## The whole run" in md
    if case == "save":
        found = stretches(w)
        stall = next(s for s in found if s["kind"] == "periodic")
        assert stall["every_steps"] == 25 and stall["lost_ms"] < lead["lost_ms"]
        assert "Every 25 steps: 7 stalls" in md


def section(regimes: list[dict[str, Any]], periodic: list[dict[str, Any]] | None = None,
            captures: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"n_steps": 1000, "measured_steps": 1000, "wall_ms": 20_000.0,
            "median_step_ms": 12.0, "regimes": regimes, "periodic": periodic or [],
            "captures": captures or [{"first_step": 20, "kind": "first", "plan": [],
                                      "verdict": {"text": "x", "id": "no-bottleneck"}}]}


def regime(first: int, last: int, ms: float, **extra: Any) -> dict[str, Any]:
    return {"first_step": first, "last_step": last, "steps": last - first + 1,
            "median_step_ms": ms, "loader_wait_share": 0.1, "share_of_wall": 0.5,
            "change": None, **extra}


def test_a_stretch_the_machines_load_explains_never_leads_nor_sets_the_best_level() -> None:
    s = section([regime(1, 400, 10.0), regime(401, 700, 40.0, load=True),
                 regime(701, 1000, 15.0)])
    lead = headline(s)
    assert (lead["kind"], lead["first_step"], lead["label"]) == ("regime", 701, "regime 2")
    assert lead["lost_ms"] == pytest.approx(5.0 * 300)
    # every stretch the script's own is slower than the load's is measured against its best
    s = section([regime(1, 500, 30.0, load=True), regime(501, 1000, 12.0)])
    assert headline(s)["kind"] == "steady"
    chart = watch_chart({**s, "steps": [{"step": i, "step_ms": 12.0} for i in range(1, 1001)]})
    assert chart is not None
    assert [r["label"] for r in chart["regimes"]] == ["other load", "regime 1"]


def test_a_costly_recurring_stall_no_capture_recorded_leads_and_says_so() -> None:
    stall = {"kind": "periodic", "every_steps": 50, "first_step": 50, "last_step": 1000,
             "count": 20, "median_excess_ms": 300.0, "cost_ms": 6000.0, "share_of_wall": 0.3}
    lead = headline(section([regime(1, 1000, 12.0)], [stall]))
    assert (lead["kind"], lead["capture"], lead["share_of_wall"]) == ("periodic", None, 0.3)
    assert lead["text"] == (
        "A stall every 50 steps lost the most time: 20 stalls of 300.0 ms over a plain step, "
        "6.0 s, 30.0% of the run's time (measured). No capture recorded it; the diagnosis that "
        "follows is capture 1's (from step 20).")
    periodic_capture = {"first_step": 148, "kind": "periodic", "plan": [],
                        "verdict": {"text": "y", "id": "no-finding"}}
    s = section([regime(1, 1000, 12.0)], [stall],
                [section([])["captures"][0], periodic_capture])
    assert headline(s)["capture"] == 2


def test_the_chart_never_prints_a_label_over_another() -> None:
    """Eight regimes, some a few steps wide (what the machine's load made of one run), and a
    stall every 2 steps: a label only where its band holds it, one mark per MARK_GAP."""
    bounds = [1, 300, 305, 312, 330, 600, 604, 800, 1000]
    regimes = [regime(a, b - 1, 10.0 + i, load=i % 2 == 1)
               for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))]
    stall = {"kind": "periodic", "every_steps": 2, "steps": list(range(2, 401, 2))}
    s = {**section(regimes, [stall]), "steps": [{"step": i, "step_ms": 10.0}
                                                for i in range(1, 1000)]}
    chart = watch_chart(s)
    assert chart is not None
    shown = [(r["x"], r["x"] + 3 + len(r["shown"]) * 0.62 * chart["font"], r["x"] + r["w"])
             for r in chart["regimes"] if r["shown"]]
    assert all(end <= right for _, end, right in shown)  # inside its own band
    assert {r["shown"] for r in chart["regimes"]} >= {"regime 1", "other load", ""}
    xs = [m["x"] for m in chart["marks"]]
    assert all(b - a >= MARK_GAP for a, b in zip(xs, xs[1:], strict=False))
    assert chart["font"] >= 12  # 9.6 px where the page is 800 px wide


def test_the_machines_load_is_listed_apart_on_the_page_and_in_report_md(tmp_path: Path) -> None:
    """Steps 201-350 wait for a core (other processes held them): the whole-run analysis puts
    them in `watch.load`, and every surface lists them as the machine's, not a regime."""
    folder = tmp_path / "run"
    folder.mkdir()
    log = folder / "steps.jsonl"
    rng = random.Random(1)
    start = 0.0
    with log.open("w") as fh:
        for i in range(1, 601):
            busy = 200 < i <= 350
            runq = (12.0 if busy else 0.2) * rng.uniform(0.95, 1.05)
            ms = 8.5 * rng.uniform(0.97, 1.03) + (runq if busy else 0.0)
            fh.write(json.dumps({"step": i, "start_s": start, "step_ms": ms, "runq_ms": runq,
                                 "loader_wait_ms": 0.3, "cpu_ms": 8.0, "epoch": 0,
                                 "profiled": 20 <= i < 25}) + "\n")
            start += ms / 1000
    report = watch_report(log, _with_run(analyze_paths([FAST]), 20, folder))
    w = report.watch
    assert w is not None and len(w["regimes"]) == 1, w["regimes"]
    [load] = w["load"]
    assert abs(load["first_step"] - 201) <= 5 and abs(load["last_step"] - 350) <= 5, load
    out = write_pages(report, tmp_path / "out")
    html = (out / "report.html").read_text()
    assert 'id="watch-load"' in html and "Not the script: no regime, no capture" in html
    md = (out / "report.md").read_text()
    assert "Other load:" in md and f"Steps {load['first_step']}–" in md
