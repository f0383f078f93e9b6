"""report.json: the Report serialised with sorted keys, for machines and CI gates."""

from __future__ import annotations

import json
import math
from typing import Any

from stallscope.report.build import Report
from stallscope.report.job_scale import at_job_scale
from stallscope.report.labels import CATEGORY_NAMES


def _clean(value: Any) -> Any:
    """Plain JSON types only: numpy scalars unwrapped; NaN/inf (unknown) and "" (absent: the
    in-memory objects default strings to "") become null, as the schema (report/schema.py)
    promises."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value == "":
        return None
    return value


def verdict_data(report: Report) -> dict[str, Any]:
    """report.json's `verdict` (schema.Verdict): the line, what it speaks of, its lead."""
    return {"text": report.verdict, "id": report.verdict_id,
            "finding": report.lead.id if report.lead else None}


def report_data(report: Report) -> dict[str, Any]:
    """The report as JSON-ready data (also what the HTML page embeds), with the verdict line,
    what it speaks of (`verdict.id`: a finding id or a no-finding kind) and the finding the
    page leads with (`verdict.finding`, Report.lead; null when nothing was found)."""
    data = report.to_dict()
    data["verdict"] = verdict_data(report)
    # The words every view uses for each breakdown key (report/labels.py).
    data["category_names"] = dict(CATEGORY_NAMES)
    return _clean(data)


def render_json(report: Report) -> str:
    """Indented for reading; a job beyond JOB_SCALE_TRACES traces is written on one line (its
    indentation was a third of its size: 22.8 -> 14.1 MB at 10,000 ranks)."""
    data = report_data(report)
    if at_job_scale(report.traces):
        return json.dumps(data, separators=(",", ":"), sort_keys=True, allow_nan=False) + "\n"
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"
