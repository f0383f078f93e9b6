"""Steady-state windows: inferred iterations, start-up and outlier steps set aside, and windows
too small to judge (trace/windows.py, docs/metrics.md "Steps")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stallscope.diagnose import diagnose
from stallscope.report.build import build_report
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from tests.conftest import real_trace

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"


def _verdict(path: Path) -> str:
    model = build_model(load_trace(path))
    return build_report([model], [diagnose(model)], [str(path)]).verdict


def test_iterations_inferred_from_optimizer_step_on_gp100() -> None:
    model = build_model(load_trace(real_trace("hta/gp100_gpu_user_annotation.pt.trace.json.gz")))
    assert model.steps_source == "inferred: Optimizer.step#SGD.step"
    # Five Optimizer.step ranges close four whole iterations of ~1.5 ms each.
    assert len(model.steps) == 4
    durations = [s.duration_us for s in model.steps]
    assert 1400 < np.median(durations) < 1700
    assert any("inferred from 'Optimizer.step#SGD.step'" in n for n in model.notes)


def test_the_replay_follows_the_inferred_iterations() -> None:
    from stallscope.diagnose.plan import make_plan

    model = build_model(load_trace(real_trace("hta/gp100_gpu_user_annotation.pt.trace.json.gz")))
    plan = make_plan(model, diagnose(model), None)
    assert plan is not None
    # One replayed iteration (~1.5 ms), not the 10 ms whole trace the replay saw before.
    assert 1400 < plan.measured_step_us < 1700
    assert plan.measured_step_us == pytest.approx(
        np.median([s.duration_us for s in model.steps]), rel=0.05)


def test_iterations_inferred_from_dataloader_in_cpu_inference_loop() -> None:
    path = SAMPLES / "cpu-inference-loop.pt.trace.json.gz"
    model = build_model(load_trace(path))
    assert model.steps_source.startswith("inferred: enumerate(DataLoader)#")
    assert len(model.steps) == 8  # 8 batches: 9 __next__ calls, the last one ends the loop
    ev = model.trace.events
    starts = np.sort(ev.loc[ev["name"].astype(str).str.startswith("enumerate(DataLoader)"),
                            "ts"].to_numpy())
    assert [s.start_us for s in model.steps] == pytest.approx(starts[:-1].tolist())
    assert np.median([s.duration_us for s in model.steps]) == pytest.approx(
        np.median(np.diff(starts)))


def test_alexnet_startup_is_set_aside_not_the_verdict() -> None:
    path = real_trace("hta/a100_alexnet_pageable_htod.pt.trace.json.gz")
    model = build_model(load_trace(path))
    assert model.steps_source == "whole-trace"  # nothing repeats: two forwards, unlike names
    startup = model.startup
    assert startup is not None and startup["duration_us"] > 40e6
    assert "CUDA context creation" in startup["what"] and "cuDNN" in startup["what"]
    # The judged window is what follows start-up: well under a second of the 43 s trace.
    assert model.steps[0].duration_us < 1e6
    assert any(n.startswith("Start-up set aside: 43.") for n in model.notes)
    assert "99.5%" not in _verdict(path)


def test_slow_first_step_is_left_out_with_a_note() -> None:
    path = SAMPLES / "cpu-slow-first-step.pt.trace.json.gz"
    model = build_model(load_trace(path))
    assert [s.name for s in model.steps][0] == "ProfilerStep#1"
    assert len(model.steps) == 5  # 6 recorded
    assert model.set_aside[0]["name"] == "ProfilerStep#0"
    assert model.set_aside[0]["duration_us"] > 1.4e6
    assert any("ProfilerStep#0 is left out of the verdict" in n for n in model.notes)
    assert max(s.duration_us for s in model.steps) < 0.5e6


def test_fewer_than_three_steps_are_all_kept_and_said() -> None:
    model = build_model(load_trace(real_trace("hta/amd_mi250_rocm62_minitoy.pt.trace.json.gz")))
    assert len(model.steps) == 2 and not model.set_aside
    assert any("all are kept" in n for n in model.notes)


@pytest.mark.parametrize(
    ("name", "kernels"), [("a100_triton_kernel_small", 1), ("a100_event_sync_small", 4),
     ("legacy_schema_inference_rank1", 4)]
)
def test_tiny_windows_are_too_little_to_judge(name: str, kernels: int) -> None:
    path = real_trace(f"hta/{name}.pt.trace.json.gz")
    verdict = _verdict(path)
    assert verdict.startswith(f"Too little to judge: {kernels} kernel(s)")
    assert "us of GPU work in a " in verdict
    assert "prof.step()" in verdict
    assert "idle" not in verdict
    model = build_model(load_trace(path))
    assert not [a for a in diagnose(model) if a.finding is not None]
