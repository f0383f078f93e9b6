"""report.json's `watch` section: the whole run's steps (capture/steplog.py) beside the
diagnosis of the steps recorded under the profiler, which is the run's first capture."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from stallscope.capture.steplog import read_steps


def watch_section(log: Path, report: Any) -> dict[str, Any]:
    """report.json's `watch`: every step of the run and its summary; the recorded window is
    the first capture."""
    steps = read_steps(log)
    plain = [s["step_ms"] for s in steps if not s.get("profiled")]
    first = (report.run or {}).get("window", {}) or {}
    section: dict[str, Any] = {
        "step_log": str(log),
        "steps": steps,
        "summary": {
            "steps": len(steps),
            "wall_s": round(sum(s["step_ms"] for s in steps) / 1e3, 3),
            "median_step_ms": round(statistics.median(plain), 3) if plain else None,
            "loader_wait_share": round(sum(s["loader_wait_ms"] for s in steps)
                                       / max(sum(s["step_ms"] for s in steps), 1e-9), 4)
            if steps else None,
        },
        "captures": [{"first_step": first.get("first_step"), "verdict": report.verdict}],
    }
    return section
