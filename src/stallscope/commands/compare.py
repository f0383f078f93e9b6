"""`stallscope compare A B`: did a change help? Step time, breakdown and findings, before/after.

Each side is a stallscope output folder (its report.json) or traces, analysed on the spot into
the same report data, so both kinds compare the same way. The comparison itself is plain data
(no torch): the writers in `report/compare_writers.py` render it.

Step time: each side's per-step samples give a seeded bootstrap interval for the speedup of the
mean step (throughput; steps resampled in whole rounds of the training loader's workers:
`commands/stats.py`). There is one recording per side, so the A/A noise a change must exceed is
each side against itself (the mean of its first half of steps against its second half, the
larger of the two); the speedup itself must also clear a run-to-run floor (`--noise-floor`),
since two recordings of one unchanged script differ by more than either shows inside itself.
A change that does not clear both is "no measurable difference"; so is any change when either
side was recorded on a busy machine (`_step_time` says why).

Findings are matched by cause (rule, device, rank: `commands/compare_causes.py`), never by
file, so each cause appears once; a side of several recordings pools a cause's figure as the
median over them. A cause on both sides is worse, better or unchanged by what it measures (its
time per step: `commands/compare_metrics.py`), never by severity or saving, which are shares of
the step and grow when the step shrinks.

The step-time verdict reads the mean step (throughput) and the median step, each with its
interval, and names the one step that decides the mean when one does
(`commands/compare_steps.py`).

`--fail-on slower|new|worse|cause-worse` turns the comparison into a CI gate: exit EXIT_SLOWER
(6), EXIT_NEW (7), EXIT_WORSE (8: the step measurably slower, or a cause's time per step grown
by more than the step gained) or EXIT_CAUSE_WORSE (9: any cause worse), the first that applies
in that order, after writing the files; stderr names the line that fired, and compare.json's
`gates` holds each gate's line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallscope import __version__
from stallscope.commands import COMMANDS, compare_steps, stats
from stallscope.commands.compare_causes import (
    Key,
    SideCause,
    absent_cause,
    how_pooled,
    place,
    pooled,
    side_causes,
)
from stallscope.commands.compare_metrics import (
    BETTER,
    MS,
    WORSE,
    change_text,
    judge,
    metric_of,
)
from stallscope.errors import (
    EXIT_CAUSE_WORSE,
    EXIT_NEW,
    EXIT_OK,
    EXIT_SLOWER,
    EXIT_WORSE,
    InputError,
    OutputError,
)
from stallscope.text import plain as plain_text
from stallscope.text import speedup_range_text, speedup_text
from stallscope.trace.otherload import OTHER_LOAD_PCT
from stallscope.units import ms, percent

NAME = "compare"
TAKES_SCRIPT = False
# 3: findings judged by their measured quantity (`metric`, `judged`, the `better` group),
# rows in AFTER's words, `speedup` of the mean step (the verdict's) with `speedup_text`.
# 4: rows are causes (rule, device, rank) pooled over recordings, the `unsteady` group; the
# median step's reading, the outlier and `decided_by`; `gates` with each gate's line.
SCHEMA_VERSION = 4
COMPARE_FILES = ("compare.json", "compare.html", "compare.md")
# The groups of compare.json's `findings`, in the order every view lists them.
GROUPS = ("resolved", "new", "worse", "better", "unchanged", "unsteady", "not_assessed")
FAIL_ON = {"slower": EXIT_SLOWER, "new": EXIT_NEW, "worse": EXIT_WORSE,
           "cause-worse": EXIT_CAUSE_WORSE}
# The least speedup (or slowdown) claimed between two recordings, in percent. One recording's halves
# see the drift of a second or so, not the machine's between two runs (the pairs of runs of one
# unchanged script this was set from: docs/performance.md, "Figures behind the code"). 20% keeps
# those from being called a change; `--noise-floor` sets it for a quieter machine. The interval must
# still clear the sides' own noise.
NOISE_FLOOR_PCT = 20.0


@dataclass
class Side:
    """One input of the comparison: where it came from and its report data."""

    path: str
    kind: str  # "report" (an output folder's report.json) or "traces" (analysed now)
    data: dict[str, Any]


def load_side(path: Path) -> Side:
    """A report folder (or its report.json) is read; anything else is analysed as traces."""
    if not path.exists():
        raise InputError(f"no such file or folder: {path}")
    report_json = path / "report.json" if path.is_dir() else path
    if report_json.name == "report.json" and report_json.is_file():
        return Side(str(path), "report", _read_report(report_json))
    from stallscope.commands.pipeline import analyze_paths
    from stallscope.report.json_writer import report_data

    return Side(str(path), "traces", report_data(analyze_paths([path])))


def _read_report(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    from stallscope.commands.compare_input import validate_report

    return validate_report(data, path)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks, as numpy's default (and report.json's p90)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def step_stats(durations: list[float]) -> dict[str, float]:
    """Centre and spread of one side's step times; p10-p90 ignores one odd step in ten."""
    return {
        "median": percentile(durations, 50),
        "mean": sum(durations) / len(durations),
        "p10": percentile(durations, 10),
        "p90": percentile(durations, 90),
        "min": min(durations),
        "max": max(durations),
    }


def _steps(side: Side) -> list[dict[str, Any]]:
    steps = [s for s in side.data.get("steps", []) if isinstance(s, dict)]
    if not steps:
        raise InputError(f"{side.path} has no recorded training step: nothing to compare")
    return steps


def _workers(data: dict[str, Any]) -> int:
    """Steps per round of the training loader's workers (1 without workers or without a
    recorded DataLoader): the block the bootstrap keeps whole."""
    loaders = [d for d in data.get("dataloaders") or [] if isinstance(d, dict)]
    if not loaders:
        return 1
    loader = max(loaders, key=lambda d: (d.get("batches_recorded") or 0, d.get("batches") or 0))
    n = loader.get("num_workers")
    return n if isinstance(n, int) and n > 0 else 1


def _other_cpu_pct(data: dict[str, Any]) -> list[float]:
    """Other processes' share of the cores while `run` recorded (capture/hostload.py)."""
    host = ((data.get("environment") or {}).get("captured") or {}).get("host") or {}
    share = host.get("other_cpu_share_pct")
    return [float(share)] if isinstance(share, int | float) else []


def _side_info(side: Side, durations: list[float]) -> dict[str, Any]:
    data = side.data
    return {
        "path": side.path,
        "kind": side.kind,
        "traces": [t.get("label") for t in data.get("traces", [])],
        "steps": len(durations),
        "step_time_us": step_stats(durations),
        "partial": bool((data.get("run") or {}).get("partial")),
        "busy": stats.busy_reasons([durations], _workers(data), _other_cpu_pct(data),
                                   OTHER_LOAD_PCT),
    }


def _noise(db: list[float], da: list[float],
           blocks: tuple[int, int]) -> tuple[float, str, list[float | None]]:
    """The A/A noise the interval must clear: the larger of each side's halves against each
    other; infinite (nothing claimed) when a side is too short to split. Also how it was
    found, and each side's own figure."""
    (nb, _), (na, _) = stats.aa_noise([db], blocks[0]), stats.aa_noise([da], blocks[1])
    sides = [stats.noise_json(nb), stats.noise_json(na)]
    if math.isinf(nb) or math.isinf(na):
        return math.inf, "a side too short to split in two: not measured", sides
    which = "BEFORE" if nb >= na else "AFTER"
    return max(nb, na), f"{which}: the first half of its steps against its second half", sides


def _mean_said(blocks: tuple[int, int], floor: float) -> compare_steps.Said:
    """The mean step's verdict for two lists of steps: its interval against the larger of
    the two sides' A/A noise, its point against the floor."""
    def said(db: Sequence[float], da: Sequence[float]) -> str:
        interval = stats.speedup_interval([db], [da], *blocks)
        noise, _, _ = _noise(list(db), list(da), blocks)
        return stats.classify(interval, noise, floor)
    return said


def _median_reading(db: list[float], da: list[float], blocks: tuple[int, int],
                    floor: float) -> dict[str, Any]:
    """The median step's speedup, its seeded bootstrap interval, its A/A noise (each side's
    halves' medians, the larger) and its verdict."""
    interval = stats.median_interval(db, da, *blocks)
    nb, _ = stats.aa_noise([db], blocks[0], "median")
    na, _ = stats.aa_noise([da], blocks[1], "median")
    noise = max(nb, na)
    return {
        "speedup": stats.rnd(interval.point),
        "speedup_text": speedup_text(interval.point),
        "interval": interval.as_json(),
        "aa_noise": stats.noise_json(noise),
        "verdict": stats.classify(interval, noise, floor),
    }


def _outlier_json(found: compare_steps.Outlier | None, names: tuple[list[str], list[str]],
                  traces: tuple[list[str], list[str]]) -> dict[str, Any] | None:
    if found is None:
        return None
    k = 0 if found.side == "before" else 1
    return {
        "side": found.side,
        "step": names[k][found.index],
        "trace": traces[k][found.index],
        "duration_us": round(found.duration_us, 1),
        "median_us": round(found.median_us, 1),
        "speedup_without": stats.rnd(found.speedup_without),
        "speedup_without_text": speedup_text(found.speedup_without),
        "decides": found.decides,
    }


def _step_time(before: dict[str, float], after: dict[str, float], sb: list[dict[str, Any]],
               sa: list[dict[str, Any]], blocks: tuple[int, int], busy: bool,
               floor: float = NOISE_FLOOR_PCT / 100) -> dict[str, Any]:
    """Ratio after/before of the medians (and means), the ratio's range when the two p10-p90
    spreads are set against each other, and the verdict: the mean step's and the median step's
    readings (each a seeded bootstrap interval against its A/A noise, `_noise`, and its point
    against the run-to-run floor), combined by commands/compare_steps.py, which names the one
    step that decides the mean when there is one. Ratios to stats.RATIO_DIGITS.

    With one recording per side, the interval and the noise see only step-to-step variation,
    not what changes between two runs; on a busy machine that is the larger part (measured:
    two runs of one unchanged script, 37 ms and 650 ms mean steps, under other helpers'
    load), so there a difference is not claimed: `interval_verdict` keeps what the readings
    alone said."""
    db, da = [float(s["duration_us"]) for s in sb], [float(s["duration_us"]) for s in sa]
    interval = stats.speedup_interval([db], [da], *blocks)
    noise, how, sides = _noise(db, da, blocks)
    mean_said = stats.classify(interval, noise, floor)
    median = _median_reading(db, da, blocks, floor)
    found = compare_steps.find_outlier(db, da, floor, _mean_said(blocks, floor),
                                       median["verdict"], median["speedup"])
    said, decided_by = compare_steps.combine(mean_said, median["verdict"], found)
    r = stats.rnd
    names = ([str(s.get("name")) for s in sb], [str(s.get("name")) for s in sa])
    traces = ([str(s.get("trace")) for s in sb], [str(s.get("trace")) for s in sa])
    return {
        "ratio": r(after["median"] / before["median"]),
        # The mean step's speedup (throughput); the median's is `median.speedup`.
        "speedup": interval.as_json()["speedup"],
        "speedup_text": speedup_text(interval.point),
        "ratio_mean": r(after["mean"] / before["mean"]),
        "ratio_range": [r(after["p10"] / before["p90"]), r(after["p90"] / before["p10"])],
        "delta_us": round(after["median"] - before["median"], 1),
        "interval": interval.as_json(),  # of the mean step's speedup (throughput)
        "aa_noise": stats.noise_json(noise),
        "aa_noise_from": how,
        "aa_noise_sides": sides,  # BEFORE's and AFTER's halves, as fractions
        "noise_floor": r(floor),
        "mean_verdict": mean_said,
        "median": median,
        "outlier": _outlier_json(found, names, traces),
        "decided_by": decided_by,
        "verdict": stats.SAME if busy else said,
        "interval_verdict": said,
        "ratio_digits": stats.RATIO_DIGITS,
    }


def _per_step_us(steps: list[dict[str, Any]], category: str) -> float:
    return sum(float(s["breakdown_us"].get(category, 0.0)) for s in steps) / len(steps)


def _breakdown(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Each host category's share of the step and its time per step, before and after."""
    pct_b = before["summary"].get("breakdown_pct") or {}
    pct_a = after["summary"].get("breakdown_pct") or {}
    rows = []
    for cat in dict.fromkeys([*pct_b, *pct_a]):
        b_us = _per_step_us(before["steps"], cat)
        a_us = _per_step_us(after["steps"], cat)
        b_pct, a_pct = float(pct_b.get(cat, 0.0)), float(pct_a.get(cat, 0.0))
        rows.append({
            "category": cat,
            "before_pct": b_pct, "after_pct": a_pct, "delta_pct": a_pct - b_pct,
            "before_us": b_us, "after_us": a_us, "delta_us": a_us - b_us,
        })
    return rows


def _gpu(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Busy/idle share per GPU; a device seen on one side only has None on the other."""
    gpu_b = before["summary"].get("gpu_pct") or {}
    gpu_a = after["summary"].get("gpu_pct") or {}
    rows = []
    for dev in sorted(dict.fromkeys([*gpu_b, *gpu_a])):
        b_idle = gpu_b.get(dev, {}).get("idle")
        a_idle = gpu_a.get(dev, {}).get("idle")
        b_busy = None if b_idle is None else 100.0 - b_idle
        a_busy = None if a_idle is None else 100.0 - a_idle
        rows.append({
            "device": dev,
            "before_busy_pct": b_busy, "after_busy_pct": a_busy,
            "before_idle_pct": b_idle, "after_idle_pct": a_idle,
            "delta_busy_pct": None if b_busy is None or a_busy is None else a_busy - b_busy,
        })
    return rows


def _side_fields(rule: str, cause: SideCause | None, data: dict[str, Any], key: Key,
                 side: str) -> tuple[tuple[float | None, float | None], dict[str, Any]]:
    """One side of a cause's row: its pooled figure and share, and the row's fields for that
    side (the quoted recording, its severity and saving, how the figure was pooled)."""
    cause = cause or absent_cause(key, data)
    figure, share, words, each = pooled(rule, cause)
    fields = {
        f"trace_{side}": words.get("trace") if words else None,
        f"severity_{side}": words.get("severity") if words else None,
        f"saving_{side}_pct": words.get("estimated_saving_pct") if words else None,
        # replayed / counted / upper_bound (reports before schema 2: upper bounds)
        f"saving_{side}_kind": (words.get("saving_kind") or "upper_bound") if words else None,
        f"caused_by_{side}": (words.get("caused_by") or None) if words else None,
        f"found_{side}": cause.count,
        f"recordings_{side}": len(cause.assessed),
        f"pooled_{side}": how_pooled(cause.count, len(cause.assessed)) if words else None,
        f"figures_{side}": each,
    }
    return (figure, share), {**fields, "_words": words}


def _row(key: Key, b: SideCause | None, a: SideCause | None, before: dict[str, Any],
         after: dict[str, Any]) -> dict[str, Any]:
    """One cause's row: AFTER's words where AFTER found it (a resolved one has only BEFORE's),
    each side's figure pooled over its recordings (compare_causes.py)."""
    rule = key[0]
    fig_b, side_b = _side_fields(rule, b, before, key, "before")
    fig_a, side_a = _side_fields(rule, a, after, key, "after")
    wb, wa = side_b.pop("_words"), side_a.pop("_words")
    ref = wa or wb
    assert ref is not None
    return {
        "id": rule,
        "trace": place(key),
        "device": key[1] or None,
        "rank": int(key[2]) if key[2].isdigit() else None,
        "title": ref.get("title"),
        "title_before": wb.get("title") if wb else None,
        **side_b, **side_a,
        "metric": metric_of(rule, fig_b, fig_a),
        "judged": None,  # worse / better / same / not measured, on both sides only
        "change": "",
        "worse_because": [],
    }


def _judged(row: dict[str, Any], floor: float, step_ms: float) -> str:
    """The group of a cause found on both sides, by its measured quantity
    (commands/compare_metrics.py); its severity, saving and cause are said, not judged."""
    judged = judge(row["metric"], floor, step_ms)
    row["judged"] = judged
    row["change"] = change_text(row["metric"])
    if judged == WORSE:
        m = row["metric"]
        grew = f"+{percent(100 * (m['after'] / m['before'] - 1), 0)}" if m["before"] else "from 0"
        row["worse_because"] = [f"{row['change']}: {grew}, past the {percent(100 * floor, None)} "
                                "run-to-run floor"]
    return {WORSE: "worse", BETTER: "better"}.get(judged, "unchanged")


def _one_sided(row: dict[str, Any], cause: SideCause, other: SideCause, before: bool) -> str:
    """The group of a cause one side found and the other did not: resolved or new when the
    side that found it did so in most of its recordings; not_assessed when the other side
    could not check the rule; unsteady when it was found in some recordings only."""
    row["change"] = change_text(row["metric"])
    if not other.assessed and other.not_assessed:
        return "not_assessed"
    if not cause.majority:
        return "unsteady"
    return "resolved" if before else "new"


def _findings(before: dict[str, Any], after: dict[str, Any], floor: float = 0.0,
              step_ms: float = 0.0) -> dict[str, list[dict[str, Any]]]:
    """Each cause once. Resolved: found before, assessed clear after. New: found after only.
    On both sides: worse, better or unchanged by its measured quantity (`_judged`). A cause
    gone because the rule could not be assessed on the other side is `not_assessed`; one found
    in only some recordings of one side and none of the other's is `unsteady`."""
    cb, ca = side_causes(before), side_causes(after)
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in GROUPS}
    for key in dict.fromkeys([*cb, *ca]):
        b, a = cb.get(key), ca.get(key)
        row = _row(key, b, a, before, after)
        if b and a:
            out[_judged(row, floor, step_ms)].append(row)
        elif b:
            out[_one_sided(row, b, absent_cause(key, after), True)].append(row)
        elif a:
            out[_one_sided(row, a, absent_cause(key, before), False)].append(row)
    return out


def _reading_text(st: dict[str, Any]) -> str:
    """Both readings with their intervals and noise, and the floor."""
    iv, med = st["interval"], st["median"]
    miv = med["interval"]
    return (f"mean step {speedup_text(iv['speedup'])}, 95% interval "
            f"{speedup_range_text(iv['low'], iv['high'])}, A/A noise "
            f"{stats.noise_text(st['aa_noise'])}; median step {speedup_text(med['speedup'])}, "
            f"95% interval {speedup_range_text(miv['low'], miv['high'])}, A/A noise "
            f"{stats.noise_text(med['aa_noise'])}; run-to-run floor "
            f"{percent(100 * st['noise_floor'], None)}")


def outlier_text(st: dict[str, Any]) -> str:
    """The one step that decides or pulls the mean, in words; "" when there is none, or when
    the mean and the median disagree for more than one step (said too)."""
    o = st.get("outlier")
    if st.get("decided_by") == compare_steps.DISAGREE:
        return (f"the mean ({st['mean_verdict']}) and the median ({st['median']['verdict']}) "
                "disagree and no single step explains it: slow steps recur, so no difference "
                "is claimed")
    if not o:
        return ""
    side = o["side"].upper()
    what = "decides" if o["decides"] else "pulls"
    return (f"one step {what} the mean: {side}'s {o['step']} ({o['trace']}) took "
            f"{ms(o['duration_us'], 'tenths')} ms against {side}'s median step of "
            f"{ms(o['median_us'], 'tenths')} ms; without it the mean step is "
            f"{o['speedup_without_text']}")


def verdict(step: dict[str, Any], findings: dict[str, list[dict[str, Any]]],
            busy: bool = False) -> str:
    """One sentence: faster, slower or no measurable difference, with the mean and the median
    step's speedups and intervals, the one step that decided the mean when one did, and what
    the causes did."""
    figures = _reading_text(step)
    if step["verdict"] == stats.FASTER:
        head = f"Faster: {figures}"
    elif step["verdict"] == stats.SLOWER:
        head = f"Slower: {figures}"
    elif busy and step["interval_verdict"] != stats.SAME:
        head = (f"No measurable difference in step time: the machine was busy, so the "
                f"{step['interval_verdict']} reading is not claimed ({figures})")
    else:
        head = f"No measurable difference in step time ({figures})"
    extra = step.get("note") or ""
    if extra:
        head += f"; {extra}"
    if busy:
        head += "; busy machine, see the inputs"
    kinds = ("resolved", "new", "worse", "better", "unchanged", "unsteady")
    words = {"unsteady": "in some recordings"}
    parts = [f"{len(findings[k])} {words.get(k, k)}" for k in kinds if findings[k]]
    tail = "; causes: " + ", ".join(parts) if parts else "; no findings on either side"
    return head + tail + "."


def compare_data(before: Side, after: Side,
                 noise_floor_pct: float = NOISE_FLOOR_PCT) -> dict[str, Any]:
    """The whole comparison as JSON-ready data: what compare.json holds."""
    sb, sa = _steps(before), _steps(after)
    db = [float(s["duration_us"]) for s in sb]
    da = [float(s["duration_us"]) for s in sa]
    info_b, info_a = _side_info(before, db), _side_info(after, da)
    busy = bool(info_b["busy"] or info_a["busy"])
    step = _step_time(info_b["step_time_us"], info_a["step_time_us"], sb, sa,
                      (_workers(before.data), _workers(after.data)), busy,
                      noise_floor_pct / 100)
    step["note"] = outlier_text(step)
    longest_ms = max(info_b["step_time_us"]["median"], info_a["step_time_us"]["median"]) / 1e3
    findings = _findings(before.data, after.data, noise_floor_pct / 100, longest_ms)
    data = {
        "schema_version": SCHEMA_VERSION,
        "stallscope_version": __version__,
        "before": info_b,
        "after": info_a,
        "step_time": step,
        "breakdown": _breakdown(before.data, after.data),
        "gpu": _gpu(before.data, after.data),
        "findings": findings,
        "verdict": verdict(step, findings, busy),
    }
    data["gates"] = gates(data)
    return data


def _step_line(data: dict[str, Any]) -> str:
    tb, ta, st = data["before"]["step_time_us"], data["after"]["step_time_us"], data["step_time"]
    return (f"step time: mean {ms(tb['mean'], 'tenths')} -> {ms(ta['mean'], 'tenths')} ms "
            f"({st['speedup_text']}, 95% interval "
            f"{speedup_range_text(st['interval']['low'], st['interval']['high'])}), median "
            f"{ms(tb['median'], 'tenths')} -> {ms(ta['median'], 'tenths')} ms "
            f"({st['median']['speedup_text']})")


def _cause_line(row: dict[str, Any]) -> str:
    where = "" if row["trace"] == "all recordings" else f" ({row['trace']})"
    return f"{row['id']}{where}: {row['change'] or 'not measured'}"


def step_gain_ms(data: dict[str, Any]) -> float:
    """What the step gained, ms: BEFORE's mean step less AFTER's (negative when slower)."""
    return (data["before"]["step_time_us"]["mean"] - data["after"]["step_time_us"]["mean"]) / 1e3


def _worse_than_gain(data: dict[str, Any]) -> list[str]:
    """The worse causes whose time per step grew by more than the mean step gained."""
    gain, lines = step_gain_ms(data), []
    for row in data["findings"]["worse"]:
        m = row["metric"]
        if m and m["unit"] == MS and m["after"] - m["before"] > gain:
            grew = m["after"] - m["before"]
            gained = (f"the step gained {ms(gain * 1e3, 'tenths')} ms" if gain > 0 else
                      f"the step lost {ms(-gain * 1e3, 'tenths')} ms")
            lines.append(f"{_cause_line(row)}: +{ms(grew * 1e3, 'tenths')} ms per step, more "
                         f"than {gained}")
    return lines


def gates(data: dict[str, Any]) -> dict[str, str | None]:
    """For each `--fail-on` gate, the line that fires it (None when it would pass): the
    step's figures for `slower`, the cause and its figures before -> after for the others."""
    st, f = data["step_time"], data["findings"]
    slower = _step_line(data) if st["verdict"] == stats.SLOWER else None
    worse = slower or next(iter(_worse_than_gain(data)), None)
    return {
        "slower": slower,
        "new": "; ".join(_cause_line(r) for r in f["new"]) or None,
        "worse": worse,
        "cause-worse": "; ".join(_cause_line(r) for r in f["worse"]) or None,
    }


def gate(data: dict[str, Any], fail_on: list[str]) -> tuple[int, str | None, str | None]:
    """The exit status `--fail-on` asks for, the gate and the line that fired it;
    (EXIT_OK, None, None) when none applies."""
    lines = data["gates"]
    for cond in FAIL_ON:  # fixed order: the status does not depend on the flags' order
        if cond in fail_on and lines[cond]:
            return FAIL_ON[cond], cond, lines[cond]
    return EXIT_OK, None, None


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The `compare` subcommand, added to the CLI's subparsers."""
    cmp = sub.add_parser(
        NAME,
        help=COMMANDS[NAME],
        description="Compare BEFORE and AFTER, each a stallscope output folder (holding "
        "report.json) or traces (a trace file or a folder of traces, analysed now): the mean "
        "and the median step's speedups with their bootstrap intervals (no measurable "
        "difference unless one clears both sides' own noise and the run-to-run floor, and the "
        "other agrees or one named step explains why not), where the step's time went, and "
        "which causes (rule, device, rank) were resolved, are new, got worse or better (by "
        "what each measures) or remain. Writes compare.json, compare.html and compare.md. "
        "Exit status: 0, or the --fail-on gate's (6 slower, 7 new, 8 worse, 9 cause-worse); "
        "2 for unreadable input.",
    )
    cmp.add_argument("before", type=Path, metavar="BEFORE", help="report folder or traces")
    cmp.add_argument("after", type=Path, metavar="AFTER", help="report folder or traces")
    cmp.add_argument("-o", "--out", type=Path, default=Path("stallscope-compare"),
                     help="output folder (default: ./stallscope-compare)")
    cmp.add_argument("--force", action="store_true", help="overwrite an existing comparison")
    cmp.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    cmp.add_argument("--noise-floor", type=_pct, default=NOISE_FLOOR_PCT, metavar="PCT",
                     help="the least step-time difference, in percent, that two recordings "
                     "must show to be called faster or slower (default "
                     f"{NOISE_FLOOR_PCT:g}: what two runs of one unchanged script differed "
                     "by on shared machines; lower it on a quiet, dedicated one)")
    cmp.add_argument("--fail-on", action="append", choices=list(FAIL_ON), default=[],
                     metavar="{slower,new,worse,cause-worse}",
                     help="CI gate, may be repeated; after writing the files, exit "
                     f"{EXIT_SLOWER} (slower) when AFTER's step is measurably slower, "
                     f"{EXIT_NEW} (new) when a cause is new, {EXIT_WORSE} (worse) when the step "
                     "is measurably slower or a cause's time per step grew by more than the "
                     f"mean step gained, {EXIT_CAUSE_WORSE} (cause-worse) when any cause got "
                     "worse by what it measures, however much the step gained; the first that "
                     "applies in that order, with the line that fired on stderr")
    return cmp


def _pct(text: str) -> float:
    """A percentage from 0 to 100, for argparse."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"must be 0-100, not {text}")
    return value


def _prepare(out: Path, force: bool) -> None:
    """Refuse to overwrite an earlier comparison; a report in the same folder is fine (the
    comparison does not touch report.*), so prepare_out_dir only creates and checks the folder."""
    from stallscope.outputs import prepare_out_dir

    existing = [f for f in COMPARE_FILES if (out / f).exists()]
    if existing and not force:
        raise OutputError(
            f"{out} already holds {', '.join(existing)}; use --force to overwrite or -o for "
            "another folder"
        )
    prepare_out_dir(out, force=True)


def main(args: argparse.Namespace, script_args: list[str], command: list[str]) -> int:
    """Load both sides, compare, write compare.json/html/md atomically, print a summary."""
    from stallscope import progress
    from stallscope.outputs import write_files
    from stallscope.report.compare_writers import (
        render_compare_html,
        render_compare_markdown,
        render_compare_terminal,
    )

    progress.configure(args.quiet, None)
    for p in (args.before, args.after):  # both checked before any slow analysis
        if not p.exists():
            raise InputError(f"no such file or folder: {p}")
    out: Path = args.out
    _prepare(out, args.force)
    data = compare_data(load_side(args.before), load_side(args.after), args.noise_floor)
    rendered = {
        "compare.json": json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n",
        "compare.html": render_compare_html(data),
        "compare.md": render_compare_markdown(data),
    }
    write_files(out, rendered)  # all three or none: a full disk never mixes old and new
    if not args.quiet:
        sys.stdout.write(render_compare_terminal(data, {k: str(out / k) for k in rendered}))
    status, why, line = gate(data, args.fail_on)
    if why is not None:
        sys.stderr.write(f"stallscope: --fail-on {why}: exit {status}: {plain_text(line)}\n")
    return status
