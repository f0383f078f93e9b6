"""Acceptance on real GPU traces recorded by others (sample_traces/public, committed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import all_real_traces, recorded_gpu_samples


@pytest.mark.parametrize("path", all_real_traces() + recorded_gpu_samples(), ids=lambda p: p.name)
def test_every_real_trace_analyses_and_says_what_it_could_not_assess(path: Path, analysed):
    result, out = analysed(path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    data = json.loads((out / "report.json").read_text())
    assert data["steps"], "every trace yields at least one window"
    statuses = {a["status"] for a in data["assessments"]}
    assert statuses <= {"finding", "clear", "not_assessed"}
    if not data["traces"][0]["gpu_devices"]:
        assert any(a["status"] == "not_assessed" for a in data["assessments"])
    for step in data["steps"]:
        assert sum(step["breakdown_us"].values()) == pytest.approx(step["duration_us"], rel=1e-6)


def test_all_real_traces_are_committed():
    assert len(all_real_traces()) >= 21
