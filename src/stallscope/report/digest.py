"""What the report needs of one trace, small enough for a worker to send back.

A job of thousands of ranks cannot keep every rank's step model in one process (a 1.8 MB rank
file's model pickles to about 0.5 MB). So each file is digested where it was analysed: its steps
as report.json holds them, its traces[] entry, its notes, its hotspot totals by name, its
rank-imbalance row and, for the trace whose step the report draws, that step's timeline. The
report is built from digests alone, kilobytes per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stallscope.diagnose.hostload import other_load
from stallscope.diagnose.plan import Plan
from stallscope.diagnose.rules.rank_imbalance import RankWork, rank_work
from stallscope.report.hotspots import HotTotals, gpu_kernel_totals, host_op_totals
from stallscope.report.kernel_mix import gpu_summary, host_comm, kernel_mix
from stallscope.report.memory_view import trace_memory
from stallscope.report.recording import recording_cost
from stallscope.report.timeline import trace_timeline
from stallscope.trace.model import Step, TraceModel
from stallscope.units import ms

SPREAD_RATIO = 2.0  # p90 / p10 of the step times past which their spread is said
MIN_SPREAD_STEPS = 5
DEVICE_KEYS = ("name", "computeMajor", "computeMinor", "totalGlobalMem", "numSms")


@dataclass
class TraceDigest:
    """One trace as the report sees it. `entry` is its traces[] entry less `summary` and
    `findings` (which the report computes); `steps` are report.json's steps, without `trace`."""

    label: str
    rank: int | None
    path: str
    entry: dict[str, Any]
    steps: list[dict[str, Any]]
    notes: list[str]  # the model's notes, the other-load note and the step-spread note
    devices: list[dict[str, Any]]
    distributed: dict[str, Any]
    schema: str
    torch_label: str
    work: RankWork | None
    host_ops: HotTotals
    gpu_kernels: HotTotals
    timeline: dict[str, Any] | None = None  # drawn only where asked (see digest())
    # The machine and the clock time of the first event: which recordings can be one job's.
    origin: dict[str, Any] = field(default_factory=dict)

    def relabel(self, label: str) -> None:
        """Name the trace `label` everywhere this digest holds its name."""
        self.label = label
        self.entry["label"] = label
        if self.work is not None:
            self.work.row["trace"] = label
        if self.timeline:
            self.timeline["trace"] = label
        plan = self.entry.get("plan")
        if plan is not None and plan.get("trace") is not None:
            plan["trace"] = label


def digest(model: TraceModel, plan: Plan | None, draw: bool) -> TraceDigest:
    """Digest `model` (after its rules and plan ran: they add to its notes). `draw`: also draw
    its median step's timeline (the report draws one trace's; see `pick_drawn`)."""
    steps = [step_dict(s) for s in model.steps]
    notes = list(model.notes)
    busy = other_load(model)  # the one note; the findings it affects carry a caveat
    if busy is not None:
        notes.append(busy.note)
    spread = spread_note([s["duration_us"] for s in steps])
    if spread is not None:
        notes.append(spread)
    trace = model.trace
    return TraceDigest(
        label=trace.label,
        rank=trace.rank,
        path=str(trace.path),
        entry={
            "label": trace.label,
            "path": str(trace.path),
            "rank": trace.rank,
            "world_size": trace.world_size,
            "schema": trace.schema,
            "torch_version": trace.torch_info.label,
            "steps_source": model.steps_source,
            "workload": model.workload,
            "gpu_devices": model.gpu_devices,
            "dataloader": model.loader_kind,
            "skipped_events": trace.skipped_events,
            "notes": model.notes,
            "startup": model.startup,
            "set_aside_steps": model.set_aside,
            "too_little": model.too_little,
            "plan": plan_dict(plan),
            # Per device: the kernel-type split and the GPU summary (report/kernel_mix.py).
            "kernel_mix": kernel_mix(model),
            "gpu_summary": gpu_summary(model),
            "host_comm": host_comm(model),  # CPU-only traces' collectives
            # What recording cost: the profiler's settings and cost per op (report/recording.py).
            "recording": recording_cost(model),
            # Device and host memory (report/memory_view.py): report.json's `memory` is made
            # of these, and they leave the traces[] entry then.
            "memory": trace_memory(model),
        },
        steps=steps,
        notes=notes,
        devices=[{k: d.get(k) for k in DEVICE_KEYS if k in d} for d in trace.devices],
        distributed=dict(trace.distributed or {}),
        origin={"host": trace.host, "start_us": trace.t0_us},
        schema=trace.schema,
        torch_label=trace.torch_info.label,
        work=rank_work(model),
        host_ops=host_op_totals(model),
        gpu_kernels=gpu_kernel_totals(model),
        timeline=trace_timeline(model) if draw else None,
    )


def pick_drawn(digests: list[TraceDigest]) -> TraceDigest | None:
    """The trace whose median step the report draws: rank 0's, else the first with steps
    (digests in report order)."""
    with_steps = [d for d in digests if d.steps]
    if not with_steps:
        return None
    return next((d for d in with_steps if d.rank == 0), with_steps[0])


def step_dict(step: Step) -> dict[str, Any]:
    """One step as report.json holds it, times rounded to 1 ns."""
    return {
        "name": step.name,
        "duration_us": round(step.duration_us, 3),
        "breakdown_us": {k: round(v, 3) for k, v in step.breakdown_us.items()},
        "dataloader_us": round(step.loader_us, 3),
        "dataloader_wait_us": round(step.loader_wait_us, 3),
        "gpu_us": {
            dev: {k: round(v, 3) for k, v in parts.items()} for dev, parts in step.gpu_us.items()
        },
    }


def plan_dict(plan: Plan | None) -> dict[str, Any] | None:
    """The plan as report.json holds it, times rounded to 0.1 us."""
    if plan is None:
        return None
    out = plan.to_dict()
    for key in ("measured_step_us", "replayed_step_us", "floor_us"):
        out[key] = round(out[key], 1)
    return out


def spread_note(durations: list[float]) -> str | None:
    """Steps whose times spread over SPREAD_RATIO (p10 to p90) are said: every median and
    saving in the report assumes the steps alike, and a busy machine (or steps that differ:
    a loader delivering batches in rounds, an evaluation step) breaks that. tune and compare
    call such runs busy by the same ratio."""
    if len(durations) < MIN_SPREAD_STEPS:
        return None
    p10, p90 = (float(v) for v in np.percentile(durations, [10, 90]))
    if p10 <= 0 or p90 / p10 <= SPREAD_RATIO:
        return None
    return (f"Step times spread {p90 / p10:.1f}x (p10 {ms(p10, 'tenths')} ms, p90 "
            f"{ms(p90, 'tenths')} ms): a busy machine, or steps that do different work (a loader "
            "delivering batches in rounds); medians and savings are less certain.")
