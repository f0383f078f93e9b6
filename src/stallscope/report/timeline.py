"""The representative-step timeline: what ran on each lane during one typical step.

Built from the model (never the trace file) so every writer can draw it. A step holds tens of
thousands of events; a reader sees about a thousand pixels. Intervals closer than a pixel's worth
of time are merged and each lane is capped, so the page stays small on the largest traces.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from stallscope.report.loader_work import inside_loader
from stallscope.trace.model import LOADER_NAME, TraceModel
from stallscope.trace.names import name_matches

# Horizontal resolution the merge is sized for (the SVG draws about this many pixels).
PIXELS = 1000
# At most this many rectangles per lane and kind; the merge coarsens until it fits.
MAX_RECTS = 400
# Only the longest few rectangles per lane keep a name (as a tooltip): names are long.
NAMED_PER_LANE = 25


def representative_step(models: list[TraceModel]) -> tuple[TraceModel, int] | None:
    """The median-duration step of rank 0's trace (else the first trace with steps)."""
    with_steps = [m for m in models if m.steps]
    if not with_steps:
        return None
    model = next((m for m in with_steps if m.trace.rank == 0), with_steps[0])
    return model, median_step(model)


def median_step(model: TraceModel) -> int:
    """The index of the trace's median-duration step (the lower one of an even count)."""
    order = sorted(range(len(model.steps)), key=lambda i: model.steps[i].duration_us)
    return order[(len(order) - 1) // 2]


def step_timeline(models: list[TraceModel]) -> dict[str, Any]:
    """Lanes of merged intervals (microseconds from the step's start) for one typical step."""
    picked = representative_step(models)
    if picked is None:
        return {}
    return trace_timeline(*picked)


def trace_timeline(model: TraceModel, index: int | None = None) -> dict[str, Any]:
    """The timeline of step `index` of one trace (default: its median step); {} without steps."""
    if not model.steps:
        return {}
    step = model.steps[median_step(model) if index is None else index]
    start, end = step.start_us, step.end_us
    resolution = max((end - start) / PIXELS, 1e-3)
    lanes: list[dict[str, Any]] = []

    def add(label: str, kind: str, frame: pd.DataFrame, names: pd.Series | None) -> None:
        rects = _merge(frame["ts"].to_numpy(float), frame["end"].to_numpy(float),
                       None if names is None else names.astype(str).to_numpy(),
                       start, end, resolution)
        lane = next((x for x in lanes if x["label"] == label), None)
        if lane is None:
            lane = {"label": label, "rects": []}
            lanes.append(lane)
        lane["rects"].extend({**r, "kind": kind} for r in rects)

    # The step's own events first: the text tests below then read thousands of rows, not
    # every event of the trace.
    ev = _within(model.trace.events, start, end)
    on_main = (ev["tid"].astype(str) == str(model.main_tid)) & ev["cat"].isin(
        ["user_annotation", "cpu_op"]
    )
    loader = ev[on_main & name_matches(ev["name"], LOADER_NAME)]
    add("data loader", "dataloader", loader, loader["name"])
    ops = _within(model.ops, start, end)
    ops = ops[ops["tid"].astype(str) == str(model.main_tid)]
    ops = ops[~inside_loader(model, ops)]  # the dataset's work is the loader lane's
    top = _top_level(ops)
    add("host compute", "host_compute", top, top["name"])
    copies = _within(model.copies, start, end)
    for direction, kind in (("HtoD", "h2d_copy"), ("DtoH", "other_copy")):
        part = copies[copies["direction"] == direction]
        add("copies (host)", kind, part, part["name_gpu"])
    rest = copies[~copies["direction"].isin(["HtoD", "DtoH"])]
    add("copies (host)", "other_copy", rest, rest["name_gpu"])
    syncs = _within(model.syncs, start, end)
    add("syncs", "sync", syncs, syncs["name"])
    gpu = _within(model.gpu, start, end)
    for device in model.gpu_devices:
        mine = gpu[gpu["device"] == device]
        for kind in ("kernel", "memcpy", "memset"):
            part = mine[mine["kind"] == kind]
            add(f"GPU {device}", kind, part, part["name"])
        if not any(x["label"] == f"GPU {device}" for x in lanes):
            lanes.append({"label": f"GPU {device}", "rects": []})
    for lane in lanes:
        busy = _union_us(lane["rects"])
        lane["busy_pct"] = round(100.0 * busy / (end - start), 1) if end > start else 0.0
    return {
        "trace": model.trace.label,
        "step": step.name,
        "duration_us": round(end - start, 3),
        "resolution_us": round(resolution, 3),
        "lanes": lanes,
    }


def _within(frame: pd.DataFrame, start: float, end: float) -> pd.DataFrame:
    if len(frame) == 0:
        return frame
    return frame[(frame["end"] > start) & (frame["ts"] < end)]


def _top_level(ops: pd.DataFrame) -> pd.DataFrame:
    """Ops not nested inside an earlier op on the same thread (the outermost calls)."""
    if len(ops) == 0:
        return ops
    ops = ops.sort_values(["ts", "dur"], ascending=[True, False])
    ends = ops["end"].to_numpy(float)
    covered = np.concatenate([[-np.inf], np.maximum.accumulate(ends)[:-1]])
    return ops[ops["ts"].to_numpy(float) >= covered]


def _merge(
    ts: np.ndarray,
    te: np.ndarray,
    names: np.ndarray | None,
    start: float,
    end: float,
    resolution: float,
) -> list[dict[str, Any]]:
    """Clip to the step, merge intervals whose gap is under `resolution`, cap the count."""
    if len(ts) == 0:
        return []
    order = np.argsort(ts, kind="stable")
    ts, te = np.clip(ts[order], start, end), np.clip(te[order], start, end)
    names = names[order] if names is not None else None
    gap = resolution
    while True:
        reach = np.maximum.accumulate(te)
        new_group = np.concatenate([[True], ts[1:] - reach[:-1] > gap])
        group = np.cumsum(new_group) - 1
        if group[-1] + 1 <= MAX_RECTS:
            break
        gap *= 2
    n = group[-1] + 1
    g_start = ts[new_group]
    g_end = np.zeros(n)
    np.maximum.at(g_end, group, te)
    # Each merged rectangle is named after its longest member.
    dur = te - ts
    longest = pd.Series(dur).groupby(group).idxmax().to_numpy()
    widths = g_end - g_start
    widest = np.argsort(-widths, kind="stable")[:NAMED_PER_LANE]
    named = set(widest.tolist()) if names is not None else set()
    out = []
    for i in range(n):
        rect: dict[str, Any] = {
            "start_us": round(float(g_start[i] - start), 3),
            "dur_us": round(float(widths[i]), 3),
        }
        if i in named and names is not None:
            rect["name"] = str(names[longest[i]])
            rect["count"] = int(np.count_nonzero(group == i))
        out.append(rect)
    return out


def _union_us(rects: list[dict[str, Any]]) -> float:
    """Time covered by a lane's rectangles (kinds may overlap)."""
    if not rects:
        return 0.0
    spans = sorted((r["start_us"], r["start_us"] + r["dur_us"]) for r in rects)
    total, cur_s, cur_e = 0.0, spans[0][0], spans[0][1]
    for s, e in spans[1:]:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + cur_e - cur_s
