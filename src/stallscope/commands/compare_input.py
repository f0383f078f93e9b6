"""Checks on a report.json given to `compare`, before any statistic reads it.

A report.json edited by hand, cut short or written by another tool may hold `null` or a wrong
type where compare expects an object, a list or a number; without these checks that surfaced as
an internal error (exit 1). Each check names the field that is wrong so the user can fix it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from stallscope.errors import InputError


def _fail(path: Path, field: str, want: str, got: Any) -> InputError:
    return InputError(
        f"{path}: field `{field}` should be {want}, not {type(got).__name__}: "
        "not a stallscope report.json compare can read"
    )


def _number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def validate_report(data: Any, path: Path) -> dict[str, Any]:
    """Return `data` when every field compare reads has the type it needs; else InputError
    (exit 2) naming the first wrong field."""
    if not isinstance(data, dict):
        raise _fail(path, "(top level)", "an object", data)
    for key, kind, want in (
        ("summary", dict, "an object"),
        ("steps", list, "a list"),
        ("findings", list, "a list"),
    ):
        if key not in data:
            raise InputError(f"{path} is not a stallscope report.json (no {key})")
        if not isinstance(data[key], kind):
            raise _fail(path, key, want, data[key])
    for key in ("traces", "assessments"):
        if key in data and not isinstance(data[key], list):
            raise _fail(path, key, "a list", data[key])
    if "run" in data and data["run"] is not None and not isinstance(data["run"], dict):
        raise _fail(path, "run", "an object or null", data["run"])
    for key in ("breakdown_pct", "gpu_pct"):
        value = data["summary"].get(key)
        if value is not None and not isinstance(value, dict):
            raise _fail(path, f"summary.{key}", "an object", value)
    for i, step in enumerate(data["steps"]):
        if not isinstance(step, dict):
            raise _fail(path, f"steps[{i}]", "an object", step)
        if not _number(step.get("duration_us")):
            raise _fail(path, f"steps[{i}].duration_us", "a finite number",
                        step.get("duration_us"))
        if "breakdown_us" in step and not isinstance(step["breakdown_us"], dict):
            raise _fail(path, f"steps[{i}].breakdown_us", "an object", step["breakdown_us"])
    for key in ("findings", "traces", "assessments"):
        for i, item in enumerate(data.get(key, [])):
            if not isinstance(item, dict):
                raise _fail(path, f"{key}[{i}]", "an object", item)
    return data
