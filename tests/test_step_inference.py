"""Step inference without ProfilerStep markers (trace/windows.py, docs/metrics.md "Steps"): the
iteration markers torch writes are preferred over ops that repeat inside an iteration, and a cut
that the markers show to be a piece of an iteration is refused, not diagnosed."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from stallscope.errors import EXIT_NO_STEPS, NoStepsError
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model
from tests.conftest import SAMPLES, real_trace, report_of, run_cli, write_trace

NO_SCHEDULE = SAMPLES / "cpu-no-schedule.pt.trace.json.gz"
STEP = "Optimizer.step#SGD.step"
NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _doc() -> dict:
    with gzip.open(NO_SCHEDULE, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def _edited(tmp_path: Path, doc: dict, name: str) -> Path:
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    return write_trace(tmp_path / name, doc["traceEvents"], **meta)


def _starts(doc: dict, name: str) -> list[float]:
    return sorted(e["ts"] for e in doc["traceEvents"] if e.get("name") == name)


def test_the_recording_holds_21_iterations_and_a_per_sample_op_that_repeats_more() -> None:
    doc = _doc()
    assert doc["stallscope_sample"]["iterations"] == 21
    names = [e.get("name") for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert names.count(STEP) == 21
    assert names.count(NEXT) == 22  # the 22nd ends the loop (StopIteration)
    assert not any(str(n).startswith("ProfilerStep#") for n in names)
    # 32 samples per batch: the trap the old inference fell into (hundreds of "steps").
    assert names.count("aten::empty") > 21 * 32


def _loaded(model, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends (trace time, as the model reads it) of the ranges called `name`."""
    ev = model.trace.events
    rows = ev[ev["name"].astype(str) == name].sort_values("ts")
    return rows["ts"].to_numpy(), rows["end"].to_numpy()


def test_no_schedule_trace_is_cut_at_its_21_optimizer_steps() -> None:
    model = build_model(load_trace(NO_SCHEDULE))
    assert model.steps_source == f"inferred: {STEP}"
    # 21 optimizer steps close 21 iterations; the first opens at the loop's first __next__.
    assert len(model.steps) == 21
    nexts, _ = _loaded(model, NEXT)
    _, ends = _loaded(model, STEP)
    assert model.steps[0].start_us == pytest.approx(nexts[0])
    assert [s.end_us for s in model.steps] == pytest.approx(ends.tolist())
    # Every iteration holds exactly one batch fetch: none is a piece of an iteration.
    for s in model.steps:
        assert ((nexts >= s.start_us) & (nexts < s.end_us)).sum() == 1
    note = next(n for n in model.notes if n.startswith("No ProfilerStep#N markers"))
    assert f"21 iterations were inferred from '{STEP}'" in note
    assert NEXT in note  # how the first iteration was opened
    assert "they range from" in note  # bucketed lengths: iterations are not regular


def test_no_schedule_report_judges_whole_iterations() -> None:
    report = report_of(NO_SCHEDULE)
    (trace,) = report.traces
    assert len(report.steps) == 21
    durations = [s["duration_us"] for s in report.steps]
    assert np.median(durations) > 3000  # each iteration is milliseconds, not 0.01 ms
    assert "100.0% less" not in report.verdict and "0.0 ms per step" not in report.verdict
    assert any(f"inferred from '{STEP}'" in n for n in trace["notes"])


def _drop(doc: dict, keep: callable) -> dict:
    out = copy.deepcopy(doc)
    out["traceEvents"] = [e for e in out["traceEvents"] if keep(e)]
    return out


def _without_markers(doc: dict, steps_kept: int) -> dict:
    """The recording with no DataLoader or zero_grad ranges and only `steps_kept` optimizer
    steps: too few markers to cut at, while per-sample ops still repeat every few us."""
    kept = set(sorted(_starts(doc, STEP))[:steps_kept])
    return _drop(doc, lambda e: e.get("name") not in (NEXT,)
                 and not str(e.get("name", "")).startswith("Optimizer.zero_grad#")
                 and (e.get("name") != STEP or e["ts"] in kept))


# With one optimizer step left the trace reads as one iteration (a profiler opened around each
# step does record one), judged whole: tests/test_own_profiler.py's autograd-profiler case.
@pytest.mark.parametrize("steps_kept", [2])
def test_a_sub_millisecond_cut_inside_long_iterations_is_refused(
        tmp_path: Path, steps_kept: int) -> None:
    path = _edited(tmp_path, _without_markers(_doc(), steps_kept), "edited.pt.trace.json.gz")
    with pytest.raises(NoStepsError, match="piece of an iteration"):
        build_model(load_trace(path))
    done = run_cli("analyze", str(path), "-o", str(tmp_path / "out"))
    assert done.returncode == EXIT_NO_STEPS
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stallscope: no steps found in ")
    assert "prof.step()" in lines[0] and STEP in lines[0]


def test_without_any_marker_a_repeating_op_still_stands_in(tmp_path: Path) -> None:
    # Nothing says how long an iteration is: the cut is kept, and the note says what stood in.
    path = _edited(tmp_path, _without_markers(_doc(), 0), "edited.pt.trace.json.gz")
    model = build_model(load_trace(path))
    assert model.steps_source.startswith("inferred: aten::")
    assert any("the shallowest op that repeats regularly stands in" in n for n in model.notes)


def test_a_repeating_user_annotation_comes_before_ops(tmp_path: Path) -> None:
    doc = _without_markers(_doc(), 0)
    loop = [e for e in _doc()["traceEvents"] if e.get("name") == STEP]
    # One `train_step` annotation per iteration, ending at each optimizer step's end.
    starts = [doc["traceEvents"][0]["ts"]] + [e["ts"] + e["dur"] for e in loop[:-1]]
    for e, start in zip(loop, starts, strict=True):
        doc["traceEvents"].append({**e, "name": "train_step", "ts": start,
                                   "dur": e["ts"] + e["dur"] - start})
    model = build_model(load_trace(_edited(tmp_path, doc, "annotated.pt.trace.json.gz")))
    assert model.steps_source == "inferred: train_step"
    assert len(model.steps) == 20  # 21 annotations open 20 windows (from one start to the next)
    assert any("a repeating user annotation stands in" in n for n in model.notes)


def test_gradient_accumulation_steps_are_the_iterations(tmp_path: Path) -> None:
    # Every other optimizer step dropped: two batches per step, as under accumulation.
    kept = set(_starts(_doc(), STEP)[1::2])
    doc = _drop(_doc(), lambda e: e.get("name") != STEP or e["ts"] in kept)
    model = build_model(load_trace(_edited(tmp_path, doc, "accumulate.pt.trace.json.gz")))
    assert model.steps_source == f"inferred: {STEP}"
    assert len(model.steps) == 10  # 10 steps, the first opened at the first batch
    assert model.steps[0].start_us == pytest.approx(_loaded(model, NEXT)[0][0])


def test_several_optimizer_steps_per_batch_iterate_by_batch(tmp_path: Path) -> None:
    # A second optimizer (a GAN's generator and discriminator) stepping right after the first.
    doc = _doc()
    extra = [{**e, "ts": e["ts"] + e["dur"] + 1.0, "dur": 5.0}
             for e in doc["traceEvents"] if e.get("name") == STEP]
    doc["traceEvents"].extend(extra)
    model = build_model(load_trace(_edited(tmp_path, doc, "gan.pt.trace.json.gz")))
    assert model.steps_source == f"inferred: {NEXT}"
    assert len(model.steps) == 21  # 22 batch fetches open 21 iterations


@pytest.mark.parametrize(("trace", "source", "count"), [
    (real_trace("hta/gp100_gpu_user_annotation.pt.trace.json.gz"), f"inferred: {STEP}", 4),
    (SAMPLES / "cpu-inference-loop.pt.trace.json.gz", f"inferred: {NEXT}", 8),
    (real_trace("hta/legacy_schema_inference_rank1.pt.trace.json.gz"), "whole-trace", 1),
    (SAMPLES / "cpu-loader-bound.pt.trace.json.gz", "ProfilerStep", 5),
])
def test_traces_that_were_right_keep_their_steps(trace: Path, source: str, count: int) -> None:
    model = build_model(load_trace(trace))
    assert (model.steps_source, len(model.steps)) == (source, count)
