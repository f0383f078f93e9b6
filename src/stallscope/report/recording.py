"""What recording a trace cost: the profiler's settings, its measured cost per recorded op, the
ops per recorded step, and the share of the step that makes (an estimate).

The predictions are for the recorded steps, which ran under the profiler; a reader must know how
much of each step was the profiler's own bookkeeping before trusting a host-side figure. `run`
measures the cost per op at its start (capture/opcost.py) and writes it, with whether input
shapes were recorded, into the trace's stallscope metadata; this module puts those facts
together with the ops the judged steps hold. A trace recorded elsewhere says none of it: its
ops per step are still counted, and the rest is null.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stallscope.replay.unprofile import RECORDED_CATS
from stallscope.text import plural
from stallscope.trace.model import TraceModel
from stallscope.trace.names import column_isin
from stallscope.units import percent


def _mapping(value: Any) -> dict[str, Any]:
    """`value` when the metadata holds a dict there, else an empty one (older traces)."""
    return value if isinstance(value, dict) else {}


def recording_cost(model: TraceModel) -> dict[str, Any]:
    """traces[].recording of report.json (schema.Recording): times in microseconds."""
    capture = model.trace.capture
    cost = _mapping(capture.get("profiler_cost"))
    cpu = _mapping(cost.get("cpu_op"))
    shapes = capture.get("record_shapes")
    if not isinstance(shapes, bool):  # before it was metadata: opcost measured the setting used
        shapes = cpu.get("record_shapes")
    op = _us(cpu.get("added_us"))
    per_event = _us(cpu.get("added_us_per_event")) if op is not None else None
    ops = ops_per_step(model)
    durations = [s.duration_us for s in model.steps]
    median = float(np.median(durations)) if durations else None
    plain = _unprofiled(capture.get("unprofiled_steps_us"))

    # Per event on the CPU, where a tiny call records several events and a real op's nested
    # ones cost less; per call with CUDA, where a launching call records one event and the
    # calibration's per-event figure under-counts; the per-call figure fits plain runs of the
    # committed GPU recordings best (docs/performance.md, "Figures behind the code").
    by_event = per_event is not None and not model.has_gpu
    per_op = per_event if by_event else op
    estimate = None if per_op is None else ops * per_op
    return {
        "record_shapes": shapes if isinstance(shapes, bool) else None,
        "op_us": None if op is None else round(op, 3),
        "op_us_per_event": None if per_event is None else round(per_event, 3),
        "launch_op_us": _us(_mapping(cost.get("launch_op")).get("added_us")),
        "ops_per_step": round(ops, 1),
        "estimated_step_cost_us": None if estimate is None else round(estimate, 1),
        "estimated_share_pct": (round(100.0 * estimate / median, 1)
                                if estimate is not None and median else None),
        "estimate_per": None if per_op is None else ("event" if by_event else "call"),
        "unprofiled_step_us": None if plain is None else round(plain, 1),
        "recorded_above_unprofiled_pct": (round(100.0 * (median / plain - 1.0), 1)
                                          if plain and median else None),
    }


def _us(value: Any) -> float | None:
    """A measured cost in microseconds, or None where it is missing or absurd."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1000:
        return None
    return round(float(value), 3)


def _unprofiled(steps: Any) -> float | None:
    """The median of the steps timed without the profiler just before recording."""
    if not isinstance(steps, list) or not steps:
        return None
    try:
        values = [float(v) for v in steps]
    except (TypeError, ValueError):
        return None
    return float(np.median(values))


def ops_per_step(model: TraceModel) -> float:
    """Host ops the profiler recorded (replay/unprofile.py RECORDED_CATS, on every thread)
    per judged step: each paid the profiler's bookkeeping."""
    ev = model.trace.events
    if ev.empty or not model.steps:
        return 0.0
    recorded = column_isin(ev["cat"], RECORDED_CATS)
    ts = np.sort(ev["ts"].to_numpy(dtype=float)[recorded])
    starts = np.array([s.start_us for s in model.steps])
    ends = np.array([s.end_us for s in model.steps])
    inside = np.searchsorted(ts, ends, side="left") - np.searchsorted(ts, starts, side="left")
    return float(inside.sum()) / len(model.steps)


def recording_text(rec: dict[str, Any] | None, median_us: float | None) -> str | None:
    """The recording's cost in a paragraph, for report.md and report.html; None when the trace
    does not say what its recording cost (not recorded by `stallscope run`)."""
    if not rec or rec.get("op_us") is None:
        return None
    shapes = {True: "with input shapes (`--record-shapes`)",
              False: "without input shapes (`--record-shapes` adds them, for TensorBoard's "
                     "group-by-input-shape view)"}.get(rec.get("record_shapes") is True) \
        if isinstance(rec.get("record_shapes"), bool) else None
    text = f"Recorded {shapes}. " if shapes else ""
    text += (f"The profiler added {rec['op_us']:.2f} us per tiny `torch.add` call, measured by "
             "this run")
    if rec.get("op_us_per_event") is not None:
        text += f" ({rec['op_us_per_event']:.2f} us per op event it recorded)"
    if rec.get("launch_op_us") is not None:
        text += f", and {rec['launch_op_us']:.2f} us per kernel-launching call"
    text += (f". With {plural(round(rec['ops_per_step']), 'recorded host op')} per step, that "
             f"is an estimated {_ms(rec['estimated_step_cost_us'])} ms per step")
    if rec.get("estimated_share_pct") is not None and median_us:
        text += (f", {percent(rec['estimated_share_pct'], 0)} of the median recorded step of "
                 f"{_ms(median_us)} ms")
    text += (" (a prediction: the cost per op event, times the ops recorded; a real op can "
             "cost more than a tiny one, and the per-call figure bounds it)."
             if rec.get("estimate_per") == "event" else
             " (a prediction: the cost per tiny call, times the ops recorded; a call that "
             "launches a kernel records one event, and plain runs on GPU hosts fit it best: "
             "docs/replay.md).")
    if rec.get("unprofiled_step_us") and rec.get("recorded_above_unprofiled_pct") is not None:
        above = rec["recorded_above_unprofiled_pct"]
        text += (" The steps timed without the profiler just before recording took "
                 f"{_ms(rec['unprofiled_step_us'])} ms (median, measured): the recorded steps are "
                 f"{percent(abs(above), 0)} {'above' if above >= 0 else 'below'} them.")
    return text


def _ms(us: float | None) -> str:
    if us is None:
        return "?"
    value = us / 1000.0
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.2f}"


def recording_lines(traces: list[dict[str, Any]]) -> tuple[str, int] | None:
    """The paragraph the writers show, for the first trace whose recording cost is known (rank
    0's in a job), and how many other traces report.json describes as well."""
    for t in traces:
        steps = (t.get("summary") or {}).get("step_time_us") or {}
        text = recording_text(t.get("recording"), steps.get("median"))
        if text is not None:
            label = f"{t['label']}: " if len(traces) > 1 else ""
            return label + text, len(traces) - 1
    return None
