"""The kernel-type chart and the GPU summary table of report.html, from report.json's figures
(report/kernel_mix.py computes them; this only lays them out).

One bar per rank (the GPU its step waits on), or per trace and GPU when the traces have no
ranks: the judged steps' wall time split into compute, communication hidden under compute,
communication exposed, copies and memsets, and idle. Big jobs show the ranks the rank table
shows (report/rank_table.py).
"""

from __future__ import annotations

from typing import Any

from stallscope.report.build import Report
from stallscope.report.kernel_mix import SPLIT
from stallscope.report.rank_table import ROWS_SHOWN, rank_view
from stallscope.units import percent

SPLIT_NAMES = {
    "compute": "compute",
    "comm_hidden": "communication hidden under compute",
    "comm_exposed": "communication exposed (no compute running)",
    "memory": "copies and memsets",
    "idle": "idle",
}
SPLIT_COLORS = {
    "compute": "#2ca02c",
    "comm_hidden": "#aec7e8",
    "comm_exposed": "#e377c2",
    "memory": "#17becf",
    "idle": "#e5e5e5",
}
# SVG geometry: a 1000-unit-wide chart, text at 14 units (11 px or more at 800 px wide).
WIDTH = 1000
LABEL_W = 150
VALUE_W = 160
ROW = 30
FONT = 15


def kernel_rows(report: Report) -> list[dict[str, Any]]:
    """(label, mix) per bar: ranks as the rank table shows them, else traces and their GPUs."""
    if report.ranks:
        return [{"label": f"rank {r['rank']}", "title": r["label"], "mix": r["kernel_mix"]}
                for r in rank_view(report)["rows"] if r.get("kernel_mix")]
    rows = []
    for t in report.traces[:ROWS_SHOWN]:
        mixes = t.get("kernel_mix") or []
        for m in mixes:
            label = f"GPU {m['device']}" if len(report.traces) == 1 else t["label"]
            if len(mixes) > 1 and len(report.traces) > 1:
                label = f"{t['label']}, GPU {m['device']}"
            rows.append({"label": label, "title": t["label"], "mix": m})
    return rows


def kernel_chart(report: Report) -> dict[str, Any] | None:
    """Bars in SVG units; None when no trace ran GPU work inside its steps, or when one GPU
    alone ran no communication (its compute, copies and idle are the GPU breakdown's already)."""
    rows = kernel_rows(report)
    if not rows or (len(rows) == 1 and rows[0]["mix"]["comm_hidden_pct"] is None):
        return None
    plot_w = WIDTH - LABEL_W - VALUE_W
    bars = []
    for i, row in enumerate(rows):
        x, parts = float(LABEL_W), []
        for key in SPLIT:
            share = row["mix"]["split_pct"][key]
            w = plot_w * share / 100.0
            if w > 0:
                parts.append({"key": key, "x": x, "width": w, "pct": share})
            x += w
        hidden = row["mix"].get("comm_hidden_pct")
        bars.append({**row, "y": i * ROW, "parts": parts,
                     "value": "no communication" if hidden is None
                     else f"{percent(hidden)} hidden"})
    return {"bars": bars, "width": WIDTH, "label_w": LABEL_W, "plot_w": plot_w, "row": ROW,
            "font": FONT, "height": len(bars) * ROW + 4, "names": SPLIT_NAMES,
            "colors": SPLIT_COLORS, "ranks": bool(report.ranks)}


def gpu_summary_rows(report: Report) -> list[dict[str, Any]]:
    """One row per trace and GPU that has a summary (the first ROWS_SHOWN traces)."""
    rows = []
    for t in report.traces[:ROWS_SHOWN]:
        for g in t.get("gpu_summary") or []:
            none = "no tensor cores" in (g.get("missing") or "")
            rows.append({"trace": t["label"], **g, "tensor_core_text": (
                "no tensor cores" if none else "not in the trace")})
    return rows


def host_rows(report: Report) -> list[dict[str, Any]]:
    """CPU-only ranks (or traces) with host collectives: label and figures, as the rank table
    shows them."""
    if report.ranks:
        return [{"label": f"rank {r['rank']}", "title": r["label"], "comm": r["host_comm"]}
                for r in rank_view(report)["rows"] if r.get("host_comm")]
    return [{"label": t["label"], "title": t["label"], "comm": t["host_comm"]}
            for t in report.traces[:ROWS_SHOWN] if t.get("host_comm")]
