"""`compile-in-steps`: torch.compile compiling inside the recorded steps. Committed recordings
of compiled models (compilation settled before recording) are clear and eager ones not
assessed; a small synthetic trace with a recompile inside a step is a finding; and under
`stallscope run` (slow tier) recompiles of a real script are found with their compile ids.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stallscope.diagnose.rules.compile_in_steps import compile_in_steps
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from tests.conftest import write_trace
from tests.rules.builders import SYNTH, sample, step
from tests.test_compile import _run


@pytest.mark.parametrize("name", ["real-h200-r1-w8-compile", "real-h100-r2-w8-compile",
                                  "real-h200-xfmr-compile"])
def test_compiled_models_recorded_after_compilation_are_clear(name: str) -> None:
    a = compile_in_steps(sample(f"{name}.pt.trace.json.gz"))
    assert a.status == "clear"
    assert "compilation had settled before recording" in a.detail


def test_an_eager_model_is_not_assessed() -> None:
    a = compile_in_steps(sample("real-h200-r1-w8.pt.trace.json.gz"))
    assert a.status == "not_assessed" and "eager model" in a.detail


def _op(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def test_a_recompile_inside_a_step_is_a_finding_with_its_compile_id(tmp_path: Path) -> None:
    # Four 10 ms steps each running frame 0's compiled region; step 3 recompiles it (a new
    # shape): 4 ms of compilation, compile id 0/1.
    events = []
    for i in range(4):
        start = 1000.0 + i * 10_000.0
        events += [step(i, start, 10_000.0), _op("Torch-Compiled Region: 0/0", start + 100, 500)]
    events.append(_op("_compile.compile_inner (dynamo_timed) compile_id=0/1", 31_000.0, 4000.0))
    path = write_trace(tmp_path / "synthetic-recompile.pt.trace.json", events, **SYNTH)
    a = compile_in_steps(build_model(load_trace(path)))
    assert a.status == "finding", a.detail
    ev = a.finding.evidence
    assert ev["compile_ids"] == ["0/1"] and ev["steps_with_compilation"] == 1
    assert "recompiled in 1 of" in a.finding.title and "mark_dynamic" in a.finding.snippet


@pytest.mark.slow
def test_recompiles_inside_the_recorded_steps_are_a_finding(tmp_path: Path) -> None:
    report = _run(tmp_path, "--skip", "12", script_args=("64",))
    f = next(f for f in report["findings"] if f["id"] == "compile-in-steps")
    ev = f["evidence"]
    assert ev["steps_with_compilation"] >= 3 and "recompile_limit_hit" not in ev
    assert all(int(i.split("/")[1]) >= 1 for i in ev["compile_ids"])  # recompiles of frame 0
    assert ev["compile_share_pct"] > 0 and "mark_dynamic" in f["snippet"]
    assert "recompiled" in report["verdict"]["text"]


@pytest.mark.slow
def test_recompile_limit_reached_is_said(tmp_path: Path) -> None:
    # dynamo's default limit (8 recompiles) is reached while recording, or before it.
    report = _run(tmp_path, "--skip", "12")
    f = next(f for f in report["findings"] if f["id"] == "compile-in-steps")
    said = f["evidence"].get("recompile_limit_hit") or "ran no compiled code" in f["title"]
    assert said, f
    assert "eager" in f["recommendation"]
