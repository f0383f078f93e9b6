"""report.json's `watch` section: the whole run's steps (capture/steplog.py), analysed for
regimes and periodic stalls (stallscope/wholerun/), beside the diagnosis of the steps recorded
under the profiler, which is the run's first capture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stallscope.report.json_writer import verdict_data
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


def watch_section(log: Path, report: Any,
                  later: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The `watch` section of `report`, a `stallscope watch` run's, from its step log: the
    first capture is the report's own diagnosis; `later` are the captures after it
    (commands/run.py `later_captures`), those skipped or failed becoming notes."""
    section = run_section(log)
    window = (report.run or {}).get("window") or {}
    first = {"first_step": window.get("first_step"), "verdict": verdict_data(report),
             "kind": "first", "why": "the first steady steps", "trace": None, "stall": None}
    section["captures"] = [first]
    for rec in later or []:
        if rec.get("verdict") is not None:
            section["captures"].append({
                "first_step": rec.get("first_step"), "verdict": rec["verdict"],
                "kind": rec.get("kind"), "why": rec.get("why"),
                "trace": (rec.get("traces") or [None])[0], "stall": rec.get("stall")})
        elif rec.get("skipped"):
            section["notes"].append(f"not captured at step {rec.get('at_step')} "
                                    f"({rec['skipped']}): {rec.get('why')}")
        elif rec.get("failed"):
            section["notes"].append(f"a later capture failed: {rec['failed']}")
        elif rec.get("off"):
            section["notes"].append(f"no capture after the first: {rec['off']}")
    return section
