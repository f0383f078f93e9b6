"""report.json: the Report serialised with sorted keys, for machines and CI gates."""

from __future__ import annotations

import json
import math
from typing import Any

from stallscope.report.build import Report
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


def report_data(report: Report) -> dict[str, Any]:
    """The report as JSON-ready data (also what the HTML page embeds), with the verdict line
    and what it speaks of (`verdict.id`: a finding id or a no-finding kind)."""
    data = report.to_dict()
    data["verdict"] = {"text": report.verdict, "id": report.verdict_id}
    # The words every view uses for each breakdown key (report/labels.py).
    data["category_names"] = dict(CATEGORY_NAMES)
    return _clean(data)


def render_json(report: Report) -> str:
    return json.dumps(report_data(report), indent=2, sort_keys=True, allow_nan=False) + "\n"
