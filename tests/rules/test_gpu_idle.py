"""`gpu-idle`: the GPU sits idle inside the training step, on real traces and on small
synthetic traces with known answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallscope.diagnose.rules.gpu_idle import gpu_idle, idle_gaps
from tests.rules.builders import kernel, real, step, synthetic

NW0 = "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"


def test_gpu_idle_num_workers_0_is_mostly_dataloader_wait():
    a = gpu_idle(real(NW0))
    assert a.status == "finding"
    ev = a.finding.evidence
    # TensorBoard plugin: GPU utilization 55.51% on this span, i.e. ~44.5% idle.
    assert 40.0 <= ev["idle_share_pct"] <= 48.0
    assert ev["idle_during_dataloader_pct"] > 50.0
    assert ev["dominant_cause"] == "dataloader"
    assert "dataloader-bound" in a.finding.recommendation
    # The DataLoader part is dataloader-bound's saving and is not counted again here.
    assert a.finding.estimated_saving_pct < ev["idle_share_pct"] - 20.0


def test_gpu_idle_gaps_sum_to_the_model_idle_time():
    model = real(NW0)
    gaps = idle_gaps(model, "0")
    assert gaps["us"].sum() == pytest.approx(sum(s.gpu_us["0"]["idle"] for s in model.steps))


def test_gpu_idle_clear_when_gpu_is_busy():
    a = gpu_idle(real("hta/v100_rank0_ns_resolution.pt.trace.json.gz"))
    assert a.status == "clear"


def test_gpu_idle_not_assessed_without_gpu():
    a = gpu_idle(real("hta/cpu_only_rank0_dataloader.pt.trace.json.gz"))
    assert a.status == "not_assessed"


def test_gpu_idle_splits_host_wait_from_queued_work(tmp_path: Path):
    events = [
        step(1, 0, 1000),
        *kernel("k1", 0, 100, 1, launch=0),
        # Gap 100..400: k2 launched at 300, after the GPU went idle: host-wait (300 us).
        *kernel("k2", 400, 100, 2, launch=300),
        # Gap 500..800: k3 launched at 200, long before: it waited on something else (300 us).
        *kernel("k3", 800, 100, 3, launch=200),
        # 900..1000: the step's tail: other (100 us).
    ]
    a = gpu_idle(synthetic(tmp_path, "idle", events))
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["idle_share_pct"] == pytest.approx(70.0)
    assert ev["host_wait_share_pct"] == pytest.approx(30.0)
    assert ev["other_share_pct"] == pytest.approx(40.0)
    assert a.finding.estimated_saving_pct == pytest.approx(70.0)


def test_gpu_idle_host_wait_dominant_gets_launch_advice(tmp_path: Path):
    events = [step(1, 0, 1000)]
    for i in range(10):  # 10 us kernels, each launched 100 us after the previous one ended
        events += kernel(f"k{i}", i * 100 + 50, 10, i + 1, launch=i * 100 + 40)
    a = gpu_idle(synthetic(tmp_path, "launch-bound", events))
    assert a.status == "finding"
    assert a.finding.evidence["dominant_cause"] == "host-wait"
    assert "torch.compile" in a.finding.snippet


def test_gpu_idle_names_cpu_work_that_launches_nothing(tmp_path: Path):
    """synthetic: between kernels the stepping thread tokenises for 3 ms on the CPU (an op with
    no runtime call under it), then launches: not launch overhead, and the advice says so."""
    events = []
    for i in range(3):
        t0 = i * 5_000.0
        events += [step(i + 1, t0, 5_000),
                   *kernel("k_fwd", t0 + 20, 500, 10 * i + 1, launch=t0 + 10),
                   {"ph": "X", "cat": "cpu_op", "name": "tokenize_requests", "pid": 1, "tid": 1,
                    "ts": t0 + 600, "dur": 3_000},
                   *kernel("k_head", t0 + 3_700, 1_000, 10 * i + 2, launch=t0 + 3_650)]
    a = gpu_idle(synthetic(tmp_path, "cpu-work", events))
    assert a.status == "finding"
    ev = a.finding.evidence
    assert ev["dominant_cause"] == "host-cpu-work"
    assert ev["cpu_work_ops"][0]["op"] == "tokenize_requests"
    assert ev["cpu_work_ops"][0]["ms_per_step"] == pytest.approx(3.0)
    assert "tokenize_requests" in a.finding.title
    assert "DataLoader workers" in a.finding.recommendation
    assert "reduce-overhead" not in a.finding.snippet  # no CUDA graphs for CPU work
