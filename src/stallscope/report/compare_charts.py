"""The before/after charts of compare.html, as geometry for inline SVG (no script, no network).

Three charts, each on one time axis so a reader sees the change by bar length:
- step time: each side's mean step (the verdict's quantity) as a bar, its median as a tick and
  its p10-p90 as a whisker;
- where the step's time goes: each side's mean step split by host category, stacked;
- findings: each finding's measured quantity before and after (compare_metrics.py), for the
  findings measured in milliseconds per step.

The viewBox is CHART_WIDTH units wide and the page keeps the SVG at most that many pixels wide,
so 13-unit text is 13 px at full width and stays 11 px or more down to an 800 px window.
"""

from __future__ import annotations

from typing import Any

from stallscope.report.html import COLORS, round_ticks
from stallscope.trace.model import HOST_CATEGORIES

CHART_WIDTH = 720
FONT = 13
CHAR_WIDTH = 7.2  # average width of a 13-unit system-ui glyph: sizes the label column
VALUE_W = 96  # room after a bar for "79.0 ms"
ROW = 24
MAX_LABEL = 34


def _label(text: str) -> tuple[str, str]:
    """(full, shown): long finding ids and words are cut with an ellipsis, full on hover."""
    return text, text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "\u2026"


def _axis(label_w: float, plot_w: float, longest_us: float, y: float) -> dict[str, Any]:
    ticks = [{"x": label_w + plot_w * t / longest_us, "ms": f"{t / 1000.0:.6g}"}
             for t in round_ticks(longest_us)]
    return {"y": y, "ticks": ticks, "x0": label_w}


def _frame(labels: list[str], longest_us: float, rows: int) -> dict[str, Any]:
    label_w = max((len(t) for t in labels), default=6) * CHAR_WIDTH + 12
    plot_w = CHART_WIDTH - label_w - VALUE_W
    axis_y = rows * ROW + 4
    return {"width": CHART_WIDTH, "row": ROW, "font": FONT, "label_w": label_w,
            "plot_w": plot_w, "longest": longest_us or 1.0, "height": axis_y + 20,
            "axis": _axis(label_w, plot_w, longest_us or 1.0, axis_y)}


def step_chart(data: dict[str, Any]) -> dict[str, Any]:
    """Mean step bars with median ticks and p10-p90 whiskers, before above after."""
    sides = [("before", data["before"]["step_time_us"]), ("after", data["after"]["step_time_us"])]
    longest = max(max(s["mean"], s["p90"]) for _, s in sides)
    frame = _frame([name for name, _ in sides], longest, len(sides))
    scale = frame["plot_w"] / frame["longest"]
    x0 = frame["label_w"]
    frame["bars"] = [{
        "label": name, "x": x0, "width": s["mean"] * scale, "mean_us": s["mean"],
        "median_x": x0 + s["median"] * scale, "median_us": s["median"],
        "p10_x": x0 + s["p10"] * scale, "p90_x": x0 + s["p90"] * scale,
        "p10_us": s["p10"], "p90_us": s["p90"],
        "end": x0 + max(s["mean"], s["p90"]) * scale,
    } for name, s in sides]
    return frame


def breakdown_chart(data: dict[str, Any]) -> dict[str, Any]:
    """Each side's mean step split by host category (ms per step), stacked in HOST_CATEGORIES
    order so the same colour sits at the same place on both bars."""
    rows = {r["category"]: r for r in data["breakdown"]}
    order = [c for c in HOST_CATEGORIES if c in rows] + [c for c in rows
                                                          if c not in HOST_CATEGORIES]
    totals = {side: sum(rows[c][f"{side}_us"] for c in order) for side in ("before", "after")}
    frame = _frame(["before", "after"], max(totals.values()), 2)
    scale = frame["plot_w"] / frame["longest"]
    bars = []
    for side in ("before", "after"):
        x, parts = frame["label_w"], []
        for c in order:
            w = rows[c][f"{side}_us"] * scale
            if w > 0:
                parts.append({"category": c, "color": COLORS.get(c, "#999"), "x": x,
                              "width": w, "us": rows[c][f"{side}_us"],
                              "pct": rows[c][f"{side}_pct"]})
            x += w
        bars.append({"label": side, "parts": parts, "end": x, "total_us": totals[side]})
    frame["bars"] = bars
    frame["categories"] = [c for c in order if any(rows[c][f"{s}_us"] > 0
                                                   for s in ("before", "after"))]
    return frame


def findings_chart(data: dict[str, Any]) -> dict[str, Any] | None:
    """Each finding's time per step before and after, two thin bars per finding, coloured by
    what compare judged (worse, better, resolved, new, unchanged); None when no finding has a
    time per step on either side."""
    items = []
    for group, rows in data["findings"].items():
        for r in rows:
            m = r.get("metric")
            if not m or m["unit"] != "ms per step" or (m["before"] is None and m["after"] is None):
                continue
            full, shown = _label(f"{r['id']} ({r['trace']})" if r["trace"] not in
                                 ("trace", "job", "all recordings") else r["id"])
            items.append({"group": group, "full": full, "label": shown, "what": m["what"],
                          "before_us": None if m["before"] is None else m["before"] * 1000.0,
                          "after_us": None if m["after"] is None else m["after"] * 1000.0})
    if not items:
        return None
    longest = max(max(i["before_us"] or 0.0, i["after_us"] or 0.0) for i in items)
    frame = _frame([i["label"] for i in items], longest or 1.0, 2 * len(items))
    scale = frame["plot_w"] / frame["longest"]
    for i in items:
        i["bars"] = [{"side": side, "us": i[f"{side}_us"],
                      "width": (i[f"{side}_us"] or 0.0) * scale} for side in ("before", "after")]
    frame["items"] = items
    return frame
