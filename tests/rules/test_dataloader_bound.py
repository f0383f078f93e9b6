"""`dataloader-bound`: the training step waits for the next batch, on real GPU and CPU traces
(sample_traces/public, committed)."""

from __future__ import annotations

import pytest

from tests.conftest import real_trace, report_of

NW0 = "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
NW4 = [
    "kineto/resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz",
    "kineto/resnet50_num_workers_4__worker0.1623213129365.pt.trace.json.gz",
]


def findings(report, rule: str) -> list:
    return [f for f in report.findings if f.id == rule]


def test_resnet50_single_process_loader_is_dataloader_bound():
    report = report_of(real_trace(NW0))
    (f,) = findings(report, "dataloader-bound")
    # The TensorBoard plugin's own figure for this span: DataLoader 33.37% of the step.
    assert abs(f.evidence["wait_share_pct"] - 33.4) <= 3.0
    assert f.evidence["loader_share_pct"] >= f.evidence["wait_share_pct"]
    assert f.evidence["loader_kind"] == "single-process"
    assert "num_workers=" in f.snippet
    assert f.severity == "high"


@pytest.mark.parametrize("name", NW4)
def test_resnet50_multi_process_loader_is_not_dataloader_bound(name: str):
    report = report_of(real_trace(name))
    assert not findings(report, "dataloader-bound")
    verdict = {a["rule"]: a["status"] for a in report.assessments}
    assert verdict["dataloader-bound"] == "clear"


def test_a_torch2_cpu_trace_with_a_dominant_loader_is_dataloader_bound():
    from tests.conftest import SAMPLES

    report = report_of(SAMPLES / "cpu-loader-bound.pt.trace.json.gz")
    (f,) = findings(report, "dataloader-bound")
    # CPU-only: no GPU to overlap with, so the wait is the whole loader share.
    assert f.evidence["wait_share_pct"] == f.evidence["loader_share_pct"]
    assert f.evidence["wait_share_pct"] > 50
    statuses = {a["rule"]: a["status"] for a in report.assessments}
    assert statuses["pageable-h2d-copy"] == "not_assessed"
    assert statuses["host-device-sync"] == "not_assessed"
