"""report.json's `watch` section: the whole run's steps (capture/steplog.py), analysed for
regimes and periodic stalls (stallscope/wholerun/), beside each capture's diagnosis and plan;
and which capture the report leads with (report/watch_lead.py): the one recorded in the
stretch that lost the most time, not the first one taken."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stallscope.report.build import Report
from stallscope.report.json_writer import verdict_data
from stallscope.report.labels import with_before
from stallscope.report.watch_lead import diagnosed, headline, lead_sentence
from stallscope.wholerun.series import StepSeries
from stallscope.wholerun.summary import summarise


def run_section(log: Path) -> dict[str, Any]:
    """The whole run's analysis from its step log (also the live page's: report/watch_live.py);
    the captures are left to the caller."""
    try:
        series = StepSeries.from_jsonl(log)
    except OSError:  # no step was logged (the script ended before its second boundary)
        series = StepSeries.from_records([])
    section = summarise(series)
    section["step_log"] = str(log)
    return section


def plan_steps(plan: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """A capture's fix plan as the watch section keeps it: each change with the step before it
    and the step the replay predicts after it (diagnose/plan.py; null without a plan)."""
    if not plan:
        return None
    return [{"id": e["id"], "change": e["change"], "before_us": round(before, 1),
             "predicted_step_us": e["predicted_step_us"],
             "predicted_range_us": e.get("predicted_range_us")}
            for e, before in with_before(plan)]


def _diagnosed_later(later: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [rec for rec in later or [] if rec.get("verdict") is not None]


def watch_section(log: Path, report: Any,
                  later: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The `watch` section of `report`, a `stallscope watch` run's, from its step log: the
    first capture is the report's own diagnosis; `later` are the captures after it
    (commands/run.py `later_captures`: each with its `report` where it was analysed), those
    skipped or failed becoming notes. `headline` is the stretch the report leads with and
    `diagnosed` the capture its sections describe."""
    section = run_section(log)
    window = (report.run or {}).get("window") or {}
    first = {"first_step": window.get("first_step"), "verdict": verdict_data(report),
             "kind": "first", "why": "the first steady steps", "trace": None, "stall": None,
             "plan": plan_steps(report.plan)}
    section["captures"] = [first]
    for rec in later or []:
        if rec.get("verdict") is not None:
            own = rec.get("report")
            section["captures"].append({
                "first_step": rec.get("first_step"), "verdict": rec["verdict"],
                "kind": rec.get("kind"), "why": rec.get("why"),
                "trace": (rec.get("traces") or [None])[0], "stall": rec.get("stall"),
                "plan": plan_steps(own.plan) if own is not None else rec.get("plan")})
        elif rec.get("skipped"):
            section["notes"].append(f"not captured at step {rec.get('at_step')} "
                                    f"({rec['skipped']}): {rec.get('why')}")
        elif rec.get("failed"):
            section["notes"].append(f"a later capture failed: {rec['failed']}")
        elif rec.get("off"):
            section["notes"].append(f"no capture after the first: {rec['off']}")
    section["headline"] = headline(section)
    return section


def watch_report(log: Path, report: Report,
                 later: list[dict[str, Any]] | None = None) -> Report:
    """The report a `stallscope watch` run writes: its whole-run section, and the findings,
    plan and charts of the capture its headline names. That is the first capture's report
    (`report`, which holds how the script ran) unless a later capture recorded the stretch
    that lost the most: then that capture's report, given the run's facts and the section."""
    section = watch_section(log, report, later)
    reports = [report, *(rec.get("report") for rec in _diagnosed_later(later))]
    k = diagnosed(section)
    chosen = reports[k - 1] if k <= len(reports) else None
    if chosen is None or chosen is report:
        section["diagnosed"] = 1
        if section["headline"].get("capture") not in (None, 1):
            # its capture's report is not at hand (a section rebuilt from report.json)
            section["headline"]["capture"] = None
            section["headline"]["text"] = lead_sentence(section, section["headline"])
        report.watch = section
        return report
    section["diagnosed"] = k
    # The first capture's trace is no longer the report's own: name it in its entry.
    section["captures"][0]["trace"] = (report.traces[0].get("path") if report.traces
                                       else None)
    chosen.run = report.run
    chosen.watch = section
    return chosen
