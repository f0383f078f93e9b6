"""Acceptance on real GPU traces recorded by others (sample_traces/public, committed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import all_real_traces, real_trace, recorded_gpu_samples, report_of

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


def test_alexnet_pageable_htod_is_start_up_not_a_step_cost():
    report = report_of(real_trace("hta/a100_alexnet_pageable_htod.pt.trace.json.gz"))
    # README: 150 MB at ~4.3 GB/s, but every copy is a one-off upload before the first forward
    # (the measured forward copies nothing): start-up, said as such, not a step's bottleneck.
    assert not findings(report, "pageable-h2d-copy")
    (trace,) = report.traces
    what = trace["startup"]["what"]
    assert "16 host-to-device copies from pageable memory" in what
    assert "at 4." in what and "GB/s" in what
    # The trace has no ProfilerStep markers: the report must say how it coped.
    assert any("No ProfilerStep" in n for n in report.notes)


def test_queue_wait_in_memcpy_is_sync_not_a_slow_copy():
    report = report_of(real_trace("hta/a100_80gb_rank0of16_queue_len.pt.trace.json.gz"))
    (sync,) = findings(report, "host-device-sync")
    top = sync.evidence["sources"][0]
    assert top["call"] == "cudaMemcpyAsync DtoH"
    assert 140 <= top["max_ms"] <= 150  # the ~147 ms calls
    assert top["bytes_max"] == 704
    assert top["gpu_copy_us_max"] < 20
    assert "not a slow transfer" in sync.recommendation
    assert not findings(report, "pageable-h2d-copy")


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
