"""Advice spelled for the torch that recorded the trace: a torch 1.8 trace gets no torch.compile
and the torch.cuda.amp spellings; a trace of unknown version keeps today's spelling."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallscope.diagnose import diagnose
from stallscope.diagnose.rules.no_mixed_precision import no_mixed_precision
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from stallscope.trace.version import parse_version
from tests.conftest import SAMPLES, real_trace, write_trace
from tests.rules.test_pageable_d2h_copy import SYNTH

NW0 = "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
MODERN = "hta/a100_rank3of8_trace_diff_control.pt.trace.json.gz"


def _snippets(relative: str) -> dict[str, str]:
    model = build_model(load_trace(real_trace(relative)))
    return {a.rule: a.finding.snippet for a in diagnose(model) if a.finding is not None}


def test_parse_version():
    assert parse_version("2.4.1+cu121") == (2, 4)
    assert parse_version("1.8.0a0+gitabc") == (1, 8)
    assert parse_version("nightly") is None and parse_version(None) is None


def test_legacy_kineto_trace_reads_as_torch_1_8():
    trace = load_trace(real_trace(NW0))
    assert trace.torch_version == (1, 8)
    assert trace.torch_info.source == "legacy-categories"


def test_legacy_trace_snippets_use_torch_1_8_spellings():
    snippets = _snippets(NW0)
    # The code a user would paste, not the comments that say what this torch lacks.
    text = "\n".join(line for snippet in snippets.values() for line in snippet.split("\n")
                     if not line.lstrip().startswith("#"))
    assert "torch.compile" not in text
    assert "torch.amp.GradScaler" not in text and "torch.autocast" not in text
    assert "set_float32_matmul_precision" not in text
    assert "foreach=True" not in text
    amp = snippets["no-mixed-precision"]
    assert "torch.cuda.amp.GradScaler()" in amp and "torch.cuda.amp.autocast()" in amp
    assert "torch.optim._multi_tensor.SGD" in snippets["single-tensor-optimizer"]
    assert "torch 1.8" in snippets["gpu-idle"]


def test_modern_trace_of_unknown_version_keeps_modern_spellings():
    trace = load_trace(real_trace(MODERN))
    assert trace.torch_version is None
    model = build_model(trace)
    snippets = [a.finding.snippet for a in diagnose(model) if a.finding is not None]
    code = "\n".join(line for snippet in snippets for line in snippet.split("\n")
                     if not line.lstrip().startswith("#"))
    assert "torch.compile(model" in code  # gpu-idle's launch advice, modern spelling
    assert "torch.cuda.amp" not in code and "_multi_tensor" not in code
    assert any(s.startswith("# torch 2.x spelling") for s in snippets)


def _fp32_gemm_trace(tmp_path: Path, name: str, **meta: object):
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1,
               "tid": 1, "ts": 0, "dur": 1000}]
    for i in range(10):
        events.append({"ph": "X", "cat": "kernel", "name": "volta_sgemm_128x64_nn", "pid": 0,
                       "tid": 7, "ts": 10 + 90 * i, "dur": 85,
                       "args": {"correlation": i, "device": 0, "stream": 7}})
    devices = [{"id": 0, "name": "NVIDIA A100", "computeMajor": 8, "computeMinor": 0}]
    path = write_trace(tmp_path / f"synthetic-{name}.pt.trace.json", events, **SYNTH,
                       deviceProperties=devices, **meta)
    return build_model(load_trace(path))


def test_recorded_version_picks_the_spelling(tmp_path: Path):
    old = _fp32_gemm_trace(tmp_path, "t111", stallscope={"torch": "1.11.0+cu113"})
    new = _fp32_gemm_trace(tmp_path, "t24", stallscope={"torch": "2.4.1+cu121"})
    unknown = _fp32_gemm_trace(tmp_path, "tnone")
    assert old.trace.torch_version == (1, 11) and new.trace.torch_version == (2, 4)
    s_old = no_mixed_precision(old).finding.snippet
    s_new = no_mixed_precision(new).finding.snippet
    s_unknown = no_mixed_precision(unknown).finding.snippet
    assert "torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16)" in s_old
    assert "torch.backends.cuda.matmul.allow_tf32 = True" in s_old
    assert "set_float32_matmul_precision" not in s_old
    assert "set_float32_matmul_precision" in s_new and "torch 2.4.1" in s_new
    assert "torch 2.x" in s_unknown


@pytest.mark.slow
def test_stallscope_run_records_the_torch_version_in_the_trace_and_report(tmp_path: Path):
    import torch

    from tests.test_run import PROBE, report_of, stallscope

    (tmp_path / "train.py").write_text(PROBE)
    proc = stallscope("run", "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "stallscope-train"
    trace = load_trace(next(out.rglob("*.pt.trace.json*")))
    assert trace.torch_info.source == "recorded"
    assert trace.torch_version == parse_version(torch.__version__)
    label = f"torch {torch.__version__} (recorded by stallscope run)"
    assert report_of(out)["environment"]["torch_versions"] == [label]
    assert f"**Recorded with:** {label}" in (out / "report.md").read_text().replace("\\", "")


def test_the_recording_scripts_torch_version_is_read_from_the_metadata() -> None:
    # cpu-loader-bound's recording script wrote `stallscope_sample.torch`: the report said
    # "torch version unknown (the trace does not record it)".
    trace = load_trace(SAMPLES / "cpu-loader-bound.pt.trace.json.gz")
    assert trace.torch_version == (2, 13)
    assert trace.torch_info.label == "torch 2.13.0+cpu (the trace's recording metadata)"
