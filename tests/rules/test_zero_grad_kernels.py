"""`zero-grad-kernels` on real traces: torch 1.8's zero_grad() fills every gradient with a
kernel, torch 2's set_to_none launches nothing."""

from __future__ import annotations

from pathlib import Path

from stallscope.diagnose.finding import Assessment
from stallscope.diagnose.rules.zero_grad_kernels import zero_grad_kernels
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from tests.conftest import SAMPLES, real_trace


def _assess(path: Path) -> Assessment:
    return zero_grad_kernels(build_model(load_trace(path)))


def test_resnet50_on_torch_1_8_zeroes_161_gradients_every_step() -> None:
    a = _assess(real_trace(
        "kineto/resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz"))
    assert a.status == "finding"
    ev = a.finding.evidence
    # ResNet50 has 161 parameter tensors: one fill kernel each, 6.5 ms of a 141 ms step.
    assert ev["launches_per_zero_grad"] == 161 and ev["optimizer"] == "SGD"
    assert 4.0 < ev["zero_grad_share_pct"] < 5.5
    assert a.finding.severity == "low"
    assert "set_to_none=True" in a.finding.snippet


def test_set_to_none_launches_nothing_and_is_clear() -> None:
    a = _assess(real_trace("hta/a100_rank3of8_trace_diff_control.pt.trace.json.gz"))
    assert a.status == "clear" and "launches 0 kernels" in a.detail


def test_cpu_training_is_not_assessed() -> None:
    assert _assess(SAMPLES / "cpu-loader-bound.pt.trace.json.gz").status == "not_assessed"
