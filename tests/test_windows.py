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
from tests.conftest import real_trace, write_trace

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
    word = "kernel" if kernels == 1 else "kernels"
    assert verdict.startswith(f"Too little to judge: {kernels} {word} and ")
    assert "us of GPU work in a " in verdict
    assert "prof.step()" in verdict
    assert "idle" not in verdict
    model = build_model(load_trace(path))
    assert not [a for a in diagnose(model) if a.finding is not None]


def test_alexnet_one_off_uploads_are_start_up_with_their_evidence() -> None:
    # The 16 copies are AlexNet's 8 weights and biases (conv1 64x3x11x11 fp32 = 92,928 bytes;
    # fc6 4096x9216 = 150,994,944), uploaded once by aten::to before the warm-up forward: no size
    # recurs and neither forward copies anything, so they stay start-up, with their numbers.
    model = build_model(load_trace(real_trace("hta/a100_alexnet_pageable_htod.pt.trace.json.gz")))
    startup = model.startup
    assert startup is not None
    assert "CUDA context creation" in startup["what"] and "cuDNN" in startup["what"]
    uploads = startup["uploads"]
    assert uploads["copies"] == 16 and uploads["source"] == "Pageable"
    assert 244e6 < uploads["bytes"] < 245e6
    assert uploads["largest_bytes"] == 150_994_944
    assert 4.2 < uploads["largest_gbps"] < 4.5  # README: 150 MB at ~4.3 GB/s
    assert uploads["ops"] == ["aten::to"]
    assert "one-off uploads: no size recurs" in startup["what"]
    assert not (model.copies["step"] >= 0).any()
    # The note says which part was judged: the measured forward after start-up.
    note = next(n for n in model.notes if n.startswith("Judged window: "))
    assert "from the end of start-up to the end of the trace" in note
    assert "measure|forward" in note and "warmup" not in note


def _copy_loop_trace(path: Path, same_size: bool) -> Path:
    """A step-less GPU trace generated here: context creation (a 0.5 s first call), ten
    iterations of irregular length each copying a batch from pageable memory (2 ms on the GPU)
    and running two kernels, then an 80 ms cudaFree (a cache clear) and a short tail."""
    ev: list[dict] = []
    corr = iter(range(1, 10_000))

    def call(name: str, ts: float, dur: float) -> int:
        c = next(corr)
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1,
                   "ts": ts, "dur": dur, "args": {"correlation": c}})
        return c

    def on_gpu(cat: str, name: str, ts: float, dur: float, c: int, **args: object) -> None:
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts,
                   "dur": dur, "args": {"device": 0, "stream": 7, "correlation": c, **args}})

    call("cudaFree", 0.0, 500_000.0)
    t = 510_000.0
    for i, length_ms in enumerate([20, 35, 12, 50, 18, 27, 40, 15, 33, 22]):
        size = 8 << 20 if same_size else (8 << 20) + 4096 * i
        c = call("cudaMemcpyAsync", t, 2100.0)
        on_gpu("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", t + 50, 2000.0, c, bytes=size)
        for k in range(2):
            c = call("cudaLaunchKernel", t + 2200 + 100 * k, 10.0)
            on_gpu("kernel", "volta_sgemm_128x64_nn", t + 2250 + 3050 * k, 3000.0, c)
        t += length_ms * 1000
    call("cudaFree", t, 80_000.0)
    t += 81_000
    for k in range(2):
        c = call("cudaLaunchKernel", t + 100 * k, 10.0)
        on_gpu("kernel", "volta_sgemm_128x64_nn", t + 50 + 2600 * k, 2500.0, c)
    device = {"id": 0, "name": "synthetic GPU", "computeMajor": 8, "computeMinor": 0,
              "totalGlobalMem": 40 << 30, "numSms": 108}
    return write_trace(path, ev, deviceProperties=[device],
                       stallscope_synthetic="generated by tests/test_windows.py")


def test_repeated_copies_are_judged_not_set_aside_as_start_up(tmp_path: Path) -> None:
    path = _copy_loop_trace(tmp_path / "synthetic-copy-loop.pt.trace.json.gz", same_size=True)
    model = build_model(load_trace(path))
    assert model.steps_source == "whole-trace"
    # Start-up is the context creation only: the 80 ms cudaFree comes once the copies repeat,
    # so it is the work's own cost (judged), and so are all ten copies.
    assert model.startup is not None and len(model.startup["calls"]) == 1
    assert "CUDA context creation" in model.startup["what"]
    assert "uploads" not in model.startup and "one-off" not in model.startup["what"]
    assert (model.copies["step"] == 0).sum() == 10
    assert model.steps[0].start_us - model.trace.events["ts"].min() == pytest.approx(500_000)
    (copy_finding,) = [a.finding for a in diagnose(model)
                       if a.finding is not None and a.finding.id == "pageable-h2d-copy"]
    assert copy_finding.evidence["copies"] == 10
    assert copy_finding.evidence["bytes_per_step"] == 10 * (8 << 20)
    assert copy_finding.evidence["achieved_gbps"] == pytest.approx(8 * 2**20 / 2000 / 1e3,
                                                                   rel=0.01)
    assert any(n.startswith("Judged window: ") for n in model.notes)


def test_copies_that_never_recur_stay_start_up_before_a_late_long_call(tmp_path: Path) -> None:
    # Same trace, every copy a different size: nothing says the work repeats, so the 80 ms
    # cudaFree still ends the start-up and the copies before it are one-off uploads.
    path = _copy_loop_trace(tmp_path / "synthetic-distinct.pt.trace.json.gz", same_size=False)
    model = build_model(load_trace(path))
    assert model.startup is not None and len(model.startup["calls"]) == 2
    assert model.startup["uploads"]["copies"] == 10
    assert not (model.copies["step"] >= 0).any()
