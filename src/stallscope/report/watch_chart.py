"""The whole run drawn for report.html (`stallscope watch`): step time over the run, the DataLoader
wait under it, the regimes shaded, epochs, captures and periodic stalls marked.

A run of days has millions of steps and the page must stay small: the steps are put in at most
MAX_POINTS buckets, each drawn as its median (the line) and its slowest step (a faint line above:
a stall every 500 steps still shows when 500 steps share a pixel).

Every word on the chart stays readable where the page is narrowest (800 px shows the 920-unit
chart about 0.8x: FONT units print at 9.6 px) and never covers another: the periodic stalls'
marks sit in a band above the plot, one per MARK_GAP units; a regime's label is written only
where its band holds it (its number alone where only that fits), its whole name in the tooltip.
"""

from __future__ import annotations

import statistics
from typing import Any

from markupsafe import Markup

from stallscope.report.watch_lead import is_load, regime_labels
from stallscope.units import millis

WIDTH, HEIGHT = 920.0, 252.0
LEFT, RIGHT, TOP, BOTTOM = 56.0, 12.0, 26.0, 36.0
MAX_POINTS = 600
FONT = 12.0  # every text on the chart, in chart units
CHAR_W = 0.62 * FONT  # a generous width per character of the sans-serif face, for fitting
MARK_GAP = 12.0  # least distance between two periodic-stall marks


def watch_chart(watch: dict[str, Any]) -> dict[str, Any] | None:
    """Geometry for the template, or None when there are too few steps to draw."""
    steps = [s for s in watch.get("steps") or [] if s.get("step_ms")]
    if len(steps) < 2:
        return None
    # The steps may be a sample of a long run (wholerun/summary.py keeps every k-th step and
    # every spike past 20,000): positions come from step numbers, and a bucket's median from
    # its steps that are not spikes (kept whole, spikes would outnumber the sampled steps).
    n = int(steps[-1]["step"])
    size = max(1, -(-len(steps) // MAX_POINTS))  # kept steps per bucket
    buckets = [steps[i:i + size] for i in range(0, len(steps), size)]
    mid = [statistics.median(s["step_ms"] for s in ([s for s in b if not s.get("spike")] or b))
           for b in buckets]
    top = [max(s["step_ms"] for s in b) for b in buckets]
    wait = [statistics.median(s.get("loader_wait_ms") or 0.0 for s in b) for b in buckets]
    # The y range holds the typical steps and rare stalls without a single outlier flattening
    # the rest: up to 1.3x the 99th percentile, at least 3x the median, of the steps outside the
    # captures (a capture's steps, and the one writing its trace, are the profiler's); taller
    # steps are clipped at the top and say so in their tooltip.
    ordered = sorted(s["step_ms"] for s in steps if not s.get("profiled")) or sorted(
        s["step_ms"] for s in steps)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    y_max = max(p99 * 1.3, statistics.median(ordered) * 3, 1e-3)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(step: float) -> float:
        return LEFT + plot_w * (step - 1) / max(n - 1, 1)

    def y_of(ms: float) -> float:
        return TOP + plot_h * (1 - min(ms, y_max) / y_max)

    xs = [x_of((b[0]["step"] + b[-1]["step"]) / 2) for b in buckets]
    line = " ".join(f"{x:.1f},{y_of(v):.1f}" for x, v in zip(xs, mid, strict=True))
    peaks = " ".join(f"{x:.1f},{y_of(v):.1f}" for x, v in zip(xs, top, strict=True))
    area = (f"{xs[0]:.1f},{y_of(0):.1f} "
            + " ".join(f"{x:.1f},{y_of(v):.1f}" for x, v in zip(xs, wait, strict=True))
            + f" {xs[-1]:.1f},{y_of(0):.1f}")
    epochs = [x_of(s["step"]) for prev, s in zip(steps, steps[1:], strict=False)
              if s.get("epoch") is not None and prev.get("epoch") is not None
              and s["epoch"] != prev["epoch"]]
    profiled = [s["step"] for s in steps if s.get("profiled")]
    captures = [{"x": x_of(a), "w": _span(x_of, a, b, 2.0), "first": a, "last": b}
                for a, b in _runs(profiled)]
    regimes = _regimes(watch.get("regimes") or [], x_of)
    marks = _thinned([{"x": x_of(st), "every": p.get("every_steps"),
                       "what": "epoch start" if p.get("kind") == "epoch_start"
                       else "periodic stall"}
                      for p in watch.get("periodic") or [] for st in (p.get("steps") or [])[:200]])
    ticks = [{"y": y_of(v), "ms": millis(v, "axis")} for v in (0, y_max / 2, y_max)]
    step_ticks = [{"x": x_of(v), "step": v} for v in _step_ticks(n)]
    return {"width": WIDTH, "height": HEIGHT, "left": LEFT, "right": WIDTH - RIGHT, "top": TOP,
            # Markup: numbers this module formats, so the page prints them whole (a printed
            # string is cut at html.MAX_TEXT, which broke the line of any run past ~100 steps)
            "bottom": TOP + plot_h, "line": Markup(line), "peaks": Markup(peaks),
            "area": Markup(area),
            "epochs": epochs, "captures": captures, "regimes": regimes, "marks": marks,
            "ticks": ticks, "step_ticks": step_ticks, "bucket": size, "steps": n, "font": FONT,
            "clipped": sum(1 for v in ordered if v > y_max)}


def _fits(text: str, width: float) -> bool:
    return len(text) * CHAR_W + 6.0 <= width


def _regimes(found: list[dict[str, Any]], x_of: Any) -> list[dict[str, Any]]:
    """Each regime's band; its label ("regime N", "other load") where the band holds it, its
    number (or "load") where only that fits, none where nothing does."""
    out = []
    for i, (r, name) in enumerate(zip(found, regime_labels(found), strict=True)):
        if r.get("first_step") is None or r.get("last_step") is None:
            continue
        w = _span(x_of, r["first_step"], r["last_step"])
        short = "load" if is_load(r) else name.split()[-1]
        shown = next((t for t in (name, short) if _fits(t, w)), "")
        out.append({"x": x_of(r["first_step"]), "w": w, "label": name, "shown": shown,
                    "load": is_load(r), "odd": i % 2 == 1, "first": r["first_step"],
                    "last": r["last_step"], "median_ms": r.get("median_step_ms")})
    return out


def _thinned(marks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At most one mark per MARK_GAP units, left to right: stalls closer than that on the
    chart would print one over another (every stall is in the list under the chart)."""
    kept: list[dict[str, Any]] = []
    for m in sorted(marks, key=lambda m: m["x"]):
        if not kept or m["x"] - kept[-1]["x"] >= MARK_GAP:
            kept.append(m)
    return kept


def _runs(steps: list[int]) -> list[tuple[int, int]]:
    """Consecutive step numbers as (first, last) runs: one per capture."""
    runs: list[tuple[int, int]] = []
    for s in steps:
        if runs and s == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], s)
        else:
            runs.append((s, s))
    return runs


def _span(x_of: Any, first: float, last: float, least: float = 1.0) -> float:
    return max(least, x_of(last) - x_of(first))


def _step_ticks(n: int) -> list[int]:
    """About five round step numbers across 1..n."""
    raw = max(1, n // 5)
    mag = 10 ** (len(str(raw)) - 1)
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [1, *range(step, n + 1, step)]
