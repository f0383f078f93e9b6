"""`gpu-bound`: the GPU is busy nearly all of the step, on real traces and small synthetic
ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallscope.diagnose.rules.gpu_bound import gpu_bound
from stallscope.diagnose.rules.gpu_idle import gpu_idle
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from tests.conftest import REAL, real_trace, run_cli


def model_of(relative: str):
    return build_model(load_trace(real_trace(relative)))


V100_NS = "hta/v100_rank0_ns_resolution.pt.trace.json.gz"


def test_gpu_bound_with_full_launch_queue_on_v100():
    a = gpu_bound(model_of(V100_NS))
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["gpu_busy_share_pct"] > 95.0
    # 46% of the step is spent inside cudaLaunchKernel calls over 50 us, all while the GPU ran.
    queue = ev["launch_queue_full"]
    assert 40.0 <= queue["share_of_step_pct"] <= 50.0
    assert queue["gpu_busy_during_pct"] > 95.0
    assert ev["levers"][0] == "mixed-precision"  # fp32 SGEMM/conv on a V100
    assert ev["top_kernels"] and ev["top_kernels"][0]["share_pct"] > 0
    rec = a.finding.recommendation
    assert "not launch overhead" in rec
    assert a.finding.estimated_saving_pct == 0.0  # never more than mixed precision's model
    assert "reduce-overhead" not in a.finding.snippet  # no CUDA graphs for a busy GPU


def test_gpu_bound_is_the_verdict_on_v100(tmp_path: Path):
    out = tmp_path / "out"
    proc = run_cli("analyze", str(real_trace(V100_NS)), "-q", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    verdict = " ".join((out / "report.md").read_text().split("\n\n")[1].split())  # unwrapped
    assert "The GPU is the bottleneck" in verdict
    assert "full launch queue" in verdict and "mixed precision" in verdict
    assert "No bottleneck worth fixing" not in verdict


@pytest.mark.parametrize("trace", sorted(
    str(p.relative_to(REAL)) for p in REAL.glob("kineto/resnet50_*.pt.trace.json.gz")))
def test_gpu_bound_not_found_on_resnet50(trace: str):
    """The kineto ResNet50 runs wait on their loader or host: the GPU is not the bottleneck."""
    model = model_of(trace)
    assert gpu_bound(model).status == "clear"
    if "num_workers_0" in trace:
        assert gpu_idle(model).finding.evidence["dominant_cause"] == "dataloader"


def test_gpu_bound_not_assessed_without_gpu():
    assert gpu_bound(model_of("hta/cpu_only_rank0_dataloader.pt.trace.json.gz")).status == (
        "not_assessed")
