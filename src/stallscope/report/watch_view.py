"""report.json's `watch` section: the whole run's steps (capture/steplog.py), analysed for
regimes and periodic stalls (stallscope/wholerun/), beside the diagnosis of the steps recorded
under the profiler, which is the run's first capture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def watch_section(log: Path, report: Any) -> dict[str, Any]:
    """The `watch` section of `report`, a `stallscope watch` run's, from its step log."""
    section = run_section(log)
    window = (report.run or {}).get("window") or {}
    section["captures"] = [{"first_step": window.get("first_step"), "verdict": report.verdict}]
    return section
