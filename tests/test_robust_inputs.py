"""Robustness of the command line's edges (issue 19): wrong report.json types given to
`compare` and usage errors are one `stallscope:` line with exit 2, never a traceback or exit 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, run_cli

SAMPLE = SAMPLES / "cpu-loader-bound.pt.trace.json.gz"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("report")
    result = run_cli("analyze", str(SAMPLE), "-o", str(out), "--force", "-q")
    assert result.returncode == 0, result.stderr
    return json.loads((out / "report.json").read_text())


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("stallscope:")]


@pytest.mark.parametrize(("field", "value"), [
    ("summary", None), ("steps", {"a": 1}), ("findings", "x"), ("traces", 3),
])
def test_compare_names_the_wrong_field_of_a_report_json(
    tmp_path: Path, report: dict, field: str, value: object
):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "report.json").write_text(json.dumps({**report, field: value}))
    good = tmp_path / "good"
    good.mkdir()
    (good / "report.json").write_text(json.dumps(report))
    result = run_cli("compare", str(good), str(bad), "-o", str(tmp_path / "c"), "-q")
    assert result.returncode == 2, result.stderr
    lines = _error_lines(result.stderr)
    assert len(lines) == 1 and f"`{field}`" in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_a_step_without_a_numeric_duration_is_named(tmp_path: Path, report: dict):
    steps = [dict(s) for s in report["steps"]]
    steps[0]["duration_us"] = "slow"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "report.json").write_text(json.dumps({**report, "steps": steps}))
    result = run_cli("compare", str(bad), str(bad), "-o", str(tmp_path / "c"), "-q")
    assert result.returncode == 2
    assert "steps[0].duration_us" in result.stderr


def test_a_usage_error_is_one_line_without_the_usage_block():
    result = run_cli("analyze", "x", "--jobs", "0")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == _error_lines(result.stderr)
    assert "usage:" not in result.stderr and "--help" in result.stderr
