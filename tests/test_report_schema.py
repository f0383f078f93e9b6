"""report.json as a contract: the JSON Schema made from report/schema.py's typed definitions is
shipped current (in the package and in docs/), and every shared real trace's report.json
validates against it, with absent values as null rather than "" and the verdict on top."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallscope.report.json_writer import render_json
from stallscope.report.schema import SCHEMA_FILE, check, render_schema
from tests.conftest import ROOT, SAMPLES, all_real_traces, recorded_gpu_samples, report_of

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the test extra")

DOCS_COPY = ROOT / "docs" / "report-schema.json"
REGENERATE = ("regenerate with: python -c 'from stallscope.report.schema import render_schema; "
              "print(render_schema(), end=\"\")' > FILE")


@pytest.mark.parametrize("path", [SCHEMA_FILE, DOCS_COPY], ids=["package", "docs"])
def test_shipped_schema_is_the_one_the_definitions_make(path: Path):
    assert path.is_file(), f"{path} missing; {REGENERATE}"
    assert path.read_text() == render_schema(), f"{path} is stale; {REGENERATE}"


def validate(text: str) -> dict:
    data = json.loads(text)
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data),
                    key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:5])
    check(data)  # and the typed definitions decode it
    return data


def no_empty_strings(value, where: str = "") -> list[str]:
    if isinstance(value, dict):
        return [w for k, v in value.items() for w in no_empty_strings(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [w for i, v in enumerate(value) for w in no_empty_strings(v, f"{where}[{i}]")]
    return [where] if value == "" else []


def test_cpu_sample_report_is_valid_with_null_for_absent_values():
    data = validate(render_json(report_of(SAMPLES / "cpu-loader-bound.pt.trace.json.gz")))
    assert data["verdict"]["id"] == "dataloader-bound" and data["verdict"]["text"]
    # A finding with no cause says null, not "" (CI scripts test `is None`).
    assert data["findings"][0]["caused_by"] is None
    assert not no_empty_strings(data), no_empty_strings(data)


def test_the_schema_rejects_a_report_that_breaks_the_contract():
    data = json.loads(render_json(report_of(SAMPLES / "cpu-loader-bound.pt.trace.json.gz")))
    schema = json.loads(SCHEMA_FILE.read_text())
    broken = {k: v for k, v in data.items() if k != "verdict"}
    assert not jsonschema.Draft202012Validator(schema).is_valid(broken)
    data["findings"][0]["severity"] = "critical"
    assert not jsonschema.Draft202012Validator(schema).is_valid(data)


@pytest.mark.parametrize("path", all_real_traces() + recorded_gpu_samples(), ids=lambda p: p.name)
def test_every_real_trace_report_validates(path: Path):
    data = validate(render_json(report_of(path)))
    assert not no_empty_strings(data), no_empty_strings(data)


def test_real_traces_are_there_to_validate():
    assert len(all_real_traces()) >= 21
