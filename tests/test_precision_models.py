"""The mixed-precision and torch.compile replays (replay/models/no_mixed_precision.py,
replay/models/gpu_bound.py) against the recorded GPU pairs of a small CNN and of a small transformer
(sample_traces/README.md).

Transformer (real-h200-xfmr-*): kernel time only. Its fp32 and compiled recordings are not in a
steady state (the host ran ahead of 31 ms of GPU work per step until the launch queue filled:
first recorded steps 9-11 ms), so their kernels are compared per GEMM (72 per step in every
precision), over the whole trace, and their steps are not judged. The model's constants were
fitted on both workloads; fitted on the CNN alone (a first form), they predicted the
transformer's TF32 kernels +53% and bf16 kernels +21% off (fp32 SIMT GEMMs attain 0.71-0.87 of
the peak ratio there, not the CNN's 0.35, and autocast's casts were not counted).

Two levels. The GPU work each model predicts is held to the after recording's own kernel time
per step, which the recordings agree on (bf16: 7.10-7.18 ms on the three H200 sessions, 7.54-7.55
on the two H100 ones; the fp32 kernels 7.34-7.42 and 7.95-7.96): within 5% for bf16 and 10% for
compile (the model fuses by bytes, with no fitted factor: 0.285 and 0.271 of the chained
kernels' time predicted, 0.229 and 0.269 measured).

The predicted step is held to 15% of one of the after configuration's plain runs where the
recordings allow it: where the before recording, without the profiler's cost, starts near its
own plain runs (H200 r1: 15.1 ms against 17.9 and 17.1 ms; H100 r2: 13.4 against 12.7 and 15.4;
H200 r3: 23.4 against 17.3, 21.9 and 18.4, runs that spread 26% themselves). Not H200 r2 (18.7
ms against 13.7 and 16.8 ms plain; its `w8` and `w8-bf16` recordings are 20% apart on 3% less
kernel time) nor H100 r1 (17.3 against 12.2 and 12.2 ms plain, +42%): a prediction started
from them cannot be judged to 15%. The step barely moves with either change on this CNN (the
GPU kernels are 7-8 ms of a 13-23 ms step that waits on 25 MB pageable copies and the host),
while the plain runs of one configuration in one session spread by up to 21% (H100 r2 `w8`:
12.7 and 15.4 ms) and bf16's plain effect changes sign between hosts (-23% H200 r1, +23% H100 r1).
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from stallscope.commands.pipeline import analyze_paths
from stallscope.diagnose.fixes import Change, Context, apply
from stallscope.replay.graph import build_graph
from stallscope.replay.loader import LoaderFacts
from stallscope.replay.models.gpu_bound import compile_estimate
from stallscope.replay.models.no_mixed_precision import amp_factor
from stallscope.trace.kernels import device_major, kernel_class
from stallscope.trace.load import load_trace
from stallscope.trace.model import TraceModel, build_model
from tests.conftest import SAMPLES, real_trace

BF16_PAIRS = [("h200", "r1"), ("h200", "r2"), ("h200", "r3"), ("h100", "r1"), ("h100", "r2")]
COMPILE_PAIRS = [("h200", "r1"), ("h100", "r2")]
# Pairs whose before recording, without the profiler's cost, starts near its own plain runs
# (module docstring).
JUDGED_BF16 = [("h200", "r1"), ("h200", "r3"), ("h100", "r2")]
STEP_PCT = 15.0


def trace(gpu: str, session: str, name: str) -> Path:
    return SAMPLES / f"real-{gpu}-{session}-{name}.pt.trace.json.gz"


@cache
def model(path: Path) -> TraceModel:
    return build_model(load_trace(path))


def plain_runs(gpu: str, session: str, name: str) -> list[float]:
    measured = json.loads((SAMPLES / f"real-{gpu}-measured.json").read_text())
    return measured[session][name]["plain_mean_step_ms"]


def kernel_ms(m: TraceModel) -> float:
    g = m.gpu
    return float(g["dur"][(g["kind"] == "kernel") & (g["step"] >= 0)].sum()) / len(m.steps) / 1e3


def predicted_kernel_ms(m: TraceModel, change: Change) -> float:
    g = build_graph(m)
    assert g is not None
    ctx = Context(m, LoaderFacts.from_capture(m.trace.capture), np.zeros(g.steps))
    g2, _ = apply(g, ctx, [change])
    kernels = (g2.g_kind == "kernel") & (g2.g_step >= 0)
    return float(g2.g_dur[kernels].sum()) / g2.steps / 1e3


@pytest.mark.parametrize(("gpu", "session"), BF16_PAIRS)
def test_bf16_predicts_the_kernel_time_the_bf16_recording_shows(gpu: str, session: str) -> None:
    before = model(trace(gpu, session, "w8"))
    after = kernel_ms(model(trace(gpu, session, "w8-bf16")))
    predicted = predicted_kernel_ms(before, Change("amp", "bf16"))
    assert predicted == pytest.approx(after, rel=0.05)


@pytest.mark.parametrize(("gpu", "session"), COMPILE_PAIRS)
def test_compile_predicts_the_kernel_time_the_compiled_recording_shows(gpu: str,
                                                                       session: str) -> None:
    before = model(trace(gpu, session, "w8"))
    after = kernel_ms(model(trace(gpu, session, "w8-compile")))  # 3.55 and 3.95 ms
    predicted = predicted_kernel_ms(before, Change("compile", "true"))
    assert predicted == pytest.approx(after, rel=0.10)
    g = build_graph(before)
    est = compile_estimate(g, before)
    assert est is not None and 100 < est.kernels < 130  # cuDNN BN, ReLU, NCHW<->NHWC per step
    # the optimizer's multi-tensor kernels are not fused (the optimizer is not compiled)
    fused = {kernel_class(g.g_names[g.g_name[i]]) for i in np.flatnonzero(est.chain >= 0)}
    assert "optimizer" not in fused and not any(c.startswith("gemm") for c in fused)


@cache
def what_if(path: Path, change: str) -> dict:
    report = analyze_paths([path], what_if=[Change(*change.split("=", 1))])
    return report.plan["what_if"]


@pytest.mark.parametrize(("gpu", "session"), JUDGED_BF16)
def test_bf16_step_within_15pct_of_a_plain_run(gpu: str, session: str) -> None:
    pred = what_if(trace(gpu, session, "w8"), "amp=bf16")["predicted_step_us"] / 1e3
    runs = plain_runs(gpu, session, "w8-bf16")
    assert min(abs(pred - t) / t for t in runs) * 100 <= STEP_PCT, (pred, runs)


@pytest.mark.parametrize(("gpu", "session"), COMPILE_PAIRS)
def test_compile_step_within_15pct_of_a_plain_run(gpu: str, session: str) -> None:
    """The after recordings cannot judge it: compiled, the recorded steps ran 21.2 and 24.0 ms
    (19.2 and 21.4 without the profiler's cost) against 12.3-14.7 ms plain."""
    what = what_if(trace(gpu, session, "w8"), "compile=true")
    pred = what["predicted_step_us"] / 1e3
    runs = plain_runs(gpu, session, "w8-compile")
    assert min(abs(pred - t) / t for t in runs) * 100 <= STEP_PCT, (pred, runs)
    assert any("fuses" in a for a in what["assumptions"])


def per_gemm_step_ms(m: TraceModel, factor: dict[str, float] | None = None) -> float:
    """Kernel time of the whole trace per 72 GEMM/conv kernels (one transformer step), each
    kernel times `factor[name]` when given."""
    k = m.gpu[m.gpu["kind"] == "kernel"]
    names = k["name"].astype(str)
    gemms = names.map(lambda n: kernel_class(n).startswith("gemm")).sum()
    scale = names.map(factor).to_numpy(dtype=float) if factor else 1.0
    return float((k["dur"].to_numpy() * scale).sum()) / (gemms / XFMR_GEMMS) / 1e3


XFMR_GEMMS = 72  # 4 blocks x (qkv, q@k, att@v, proj, fc1, fc2) x (forward + 2 backward)


@pytest.mark.parametrize(("value", "pct"), [("bf16", 8.0), ("tf32", 5.0)])
def test_amp_predicts_the_transformer_kernel_time(value: str, pct: float) -> None:
    """fp32 (TF32 off) 31.0 ms of kernels per step; TF32 9.8 ms, bf16 7.5 ms recorded; the
    model 9.9 (+1%) and 7.1 ms (-5%)."""
    before = model(SAMPLES / "real-h200-xfmr-fp32.pt.trace.json.gz")
    after = model(SAMPLES / f"real-h200-xfmr-{value}.pt.trace.json.gz")
    names = before.gpu["name"].astype(str).unique()
    predicted = per_gemm_step_ms(before, {n: amp_factor(n, 9, value) for n in names})
    assert predicted == pytest.approx(per_gemm_step_ms(after), rel=pct / 100)
    assert per_gemm_step_ms(before) > 3 * predicted  # 26 ms of fp32 SIMT GEMMs move


def test_compile_predicts_the_transformer_kernel_time() -> None:
    """fp32 31.0 -> compiled 29.5 ms of kernels per step: the GEMMs (26.1 ms) unchanged, the
    fusible kernels (elementwise, layout, norm, reduction, softmax: 3.5 ms) fused to 0.49 of
    their time by the bytes model: 29.2 ms predicted (-0.7%)."""
    before = model(SAMPLES / "real-h200-xfmr-fp32.pt.trace.json.gz")
    after = model(SAMPLES / "real-h200-xfmr-compile.pt.trace.json.gz")
    g = build_graph(before)
    est = compile_estimate(g, before)
    assert est is not None
    ratio = est.after_us / est.before_us
    fusible = {n: ratio for n in before.gpu["name"].astype(str).unique()
               if kernel_class(n) in ("elementwise", "pooling", "reduction", "layout", "norm",
                                      "softmax") and "mse" not in n}
    factor = {n: fusible.get(n, 1.0) for n in before.gpu["name"].astype(str).unique()}
    assert per_gemm_step_ms(before, factor) == pytest.approx(per_gemm_step_ms(after), rel=0.05)


def test_device_generation_from_kernel_names_without_device_properties(tmp_path: Path) -> None:
    """An H200 trace stripped of deviceProperties: its cuDNN kernels name sm80_ and sm90_
    (cuDNN ships sm80 kernels that run on Hopper): the highest, 9, is the device."""
    src = trace("h200", "r1", "w8")
    doc = json.loads(gzip.decompress(src.read_bytes()))
    assert doc["deviceProperties"][0]["computeMajor"] == 9
    doc["deviceProperties"] = []
    stripped = tmp_path / "real-h200-r1-w8-no-device-properties.pt.trace.json.gz"
    stripped.write_bytes(gzip.compress(json.dumps(doc).encode()))
    m = build_model(load_trace(stripped))
    assert m.compute_major == {}
    assert device_major(m) == (9, "kernel names")
    assert device_major(model(src)) == (9, "deviceProperties")
    # the same prediction as with the deviceProperties
    assert what_if(stripped, "amp=bf16")["predicted_step_us"] == pytest.approx(
        what_if(src, "amp=bf16")["predicted_step_us"], rel=1e-6)


def test_amp_on_a_pre_volta_gpu_is_not_modelled() -> None:
    what = what_if(real_trace("hta/gp100_gpu_user_annotation.pt.trace.json.gz"), "amp=fp16")
    assert what["predicted_step_us"] is None
    assert "no tensor cores" in what["not_replayed"] and "6" in what["not_replayed"]


def test_peak_ratios_by_generation() -> None:
    """GEMM/conv speed-ups follow the vendors' peak rates per generation times the attained
    share (0.87 of it from fp32 SIMT to bf16/fp16, 0.71 to TF32, all of it from TF32 to bf16),
    with autocast's casts (+60% of the reduced-precision time) for bf16/fp16; TF32 leaves
    memory-bound kernels alone."""
    simt = "volta_sgemm_128x64_nn"
    assert amp_factor(simt, 7, "fp16") == pytest.approx(1.6 / (125 / 15.7 * 0.87))
    assert amp_factor(simt, 8, "bf16") == pytest.approx(1.6 / (312 / 19.5 * 0.87))
    assert amp_factor(simt, 9, "tf32") == pytest.approx(1 / (495 / 67 * 0.71))
    tf32 = "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32"
    assert amp_factor(tf32, 9, "bf16") == pytest.approx(1.6 / (989 / 495))
    assert amp_factor(tf32, 9, "tf32") == 1.0  # already on TF32 tensor cores
    cutlass_tf32 = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_256x128_16x3_nt_align4>"
    assert kernel_class(cutlass_tf32) == "gemm_tf32"
    relu = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float>"
    assert amp_factor(relu, 8, "bf16") == 0.65 and amp_factor(relu, 8, "tf32") == 1.0
    adam = "void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdam>"
    assert amp_factor(adam, 9, "bf16") == 1.0  # fp32 weights


def test_compile_is_its_own_what_if_change() -> None:
    from stallscope.diagnose.fixes import parse_what_if
    from stallscope.errors import StallscopeError

    assert [c.text for c in parse_what_if(["compile=true", "cuda_graphs=true"])] == [
        "compile=true", "cuda_graphs=true"]
    with pytest.raises(StallscopeError, match="compile takes true"):
        parse_what_if(["compile=max-autotune"])
    # a step that already runs compiled code is not compiled again
    what = what_if(trace("h200", "r1", "w8-compile"), "compile=true")
    assert what["predicted_step_us"] is None and "Triton" in what["not_replayed"]
