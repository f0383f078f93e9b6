"""The lightest recording (issue 33): `run` records no input shapes unless asked, since no rule
reads them and they cost every recorded op; the report says what the recording cost."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest
from torch.profiler import ProfilerActivity

from stallscope.capture import opcost
from stallscope.cli import build_parser
from stallscope.report.recording import recording_cost, recording_text
from stallscope.trace.load import load_trace
from stallscope.trace.model import build_model

from .test_run import FAILING, report_of, stallscope


def trace_text(out: Path) -> str:
    """The recorded original trace `run` wrote (the profiler's own bytes)."""
    (path,) = (out / "tensorboard" / "train").glob("*.original.json.gz")
    return gzip.decompress(path.read_bytes()).decode()


@pytest.mark.slow
def test_run_records_no_input_shapes_and_says_what_recording_cost(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(FAILING)
    proc = stallscope("run", "train.py", "never", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "stallscope-train"
    assert '"Input Dims"' not in trace_text(out)
    report = report_of(out)
    assert report["run"]["record_shapes"] is False
    rec = report["traces"][0]["recording"]
    assert rec["record_shapes"] is False and rec["op_us"] is not None
    assert rec["ops_per_step"] > 10 and rec["estimated_share_pct"] is not None
    assert rec["op_us_per_event"] is not None and rec["op_us_per_event"] < rec["op_us"]
    md = (out / "report.md").read_text()
    assert "## Recording" in md and "without input shapes" in md and "estimated" in md
    html = (out / "report.html").read_text()
    assert 'id="recording-cost"' in html and "per tiny <code>torch.add</code> call" in html


@pytest.mark.slow
def test_record_shapes_puts_input_dims_in_the_trace(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(FAILING)
    proc = stallscope("run", "--record-shapes", "train.py", "never", "0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "stallscope-train"
    assert '"Input Dims"' in trace_text(out)
    report = report_of(out)
    assert report["run"]["record_shapes"] is True
    assert report["traces"][0]["recording"]["record_shapes"] is True
    assert "with input shapes (`--record-shapes`)" in (out / "report.md").read_text()


def test_record_shapes_is_an_option_whose_help_says_its_cost() -> None:
    args = build_parser().parse_args(["run", "--record-shapes", "train.py"])
    assert args.record_shapes is True
    assert build_parser().parse_args(["run", "train.py"]).record_shapes is False
    help_text = subprocess.run([sys.executable, "-m", "stallscope", "run", "--help"],
                               capture_output=True, text=True, check=True).stdout
    flat = " ".join(help_text.split())
    # It says that shapes cost every recorded op and where the measured figures are; the figures
    # themselves live in docs/ beside their benchmark, so the help never contradicts the docs.
    assert "--record-shapes" in flat and "recorded op's cost" in flat
    assert "docs/performance.md" in flat and " us " not in flat
    docs = (Path(__file__).resolve().parent.parent / "docs" / "performance.md").read_text()
    assert "bench_profiler_cost.py" in docs and "us added per CPU op with shapes" in docs


def test_the_cost_is_measured_with_the_setting_used_and_per_recorded_event() -> None:
    """`torch.add(y, 1)` on the CPU records five op events (aten::add and the scalar's cast):
    the cost per event is the per-call cost over the events counted."""
    for shapes in (False, True):
        cost = opcost.measure([ProfilerActivity.CPU], shapes, "cpu")
        assert cost.record_shapes is shapes
        assert cost.events_per_op is not None and cost.events_per_op >= 1
        d = cost.to_dict()
        assert d["added_us_per_event"] == pytest.approx(cost.added_us / cost.events_per_op,
                                                        abs=1e-3)


def test_the_report_states_the_cost_as_an_estimate_with_the_measured_gap() -> None:
    rec = {"record_shapes": False, "op_us": 1.8, "op_us_per_event": 0.36, "launch_op_us": None,
           "ops_per_step": 1200.0, "estimated_step_cost_us": 432.0, "estimated_share_pct": 4.3,
           "estimate_per": "event",
           "unprofiled_step_us": 8000.0, "recorded_above_unprofiled_pct": 25.0}
    text = recording_text(rec, 10_000.0)
    assert text is not None
    assert "without input shapes" in text and "1.80 us per tiny `torch.add` call" in text
    assert "0.36 us per op event" in text and "1,200 recorded host ops per step" in text
    assert "an estimated 0.43 ms per step, 4% of the median recorded step of 10.0 ms" in text
    assert "(a prediction: the cost per op event" in text
    assert "took 8.0 ms (median, measured): the recorded steps are 25% above them" in text
    # A trace that does not say what its recording cost is not given a figure.
    assert recording_text({**rec, "op_us": None}, 10_000.0) is None
    assert recording_text(None, 10_000.0) is None


@pytest.mark.parametrize("name, per", [("real-h100-r1-hostbound", "call"),
                                       ("cpu-loader-bound", "event")])
def test_the_estimate_is_per_call_with_cuda_and_per_event_on_the_cpu(name: str, per: str) -> None:
    """A kernel-launching call records one op event: per-event costs taken from the CPU
    calibration (five events a call) said 1.4 ms of a host-bound H100 step whose plain runs
    were 6.1-6.8 ms shorter; the per-call cost said 7.2 ms."""
    path = Path(__file__).resolve().parents[1] / "sample_traces" / f"{name}.pt.trace.json.gz"
    model = build_model(load_trace(path))
    cost = model.trace.capture.setdefault("profiler_cost", {})
    cost["cpu_op"] = {**(cost.get("cpu_op") or {}), "added_us": 10.0, "added_us_per_event": 2.0}
    rec = recording_cost(model)
    assert rec["estimate_per"] == per
    per_op = 10.0 if per == "call" else 2.0
    assert rec["estimated_step_cost_us"] == pytest.approx(rec["ops_per_step"] * per_op, rel=1e-3)
